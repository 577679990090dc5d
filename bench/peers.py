"""Switchboard next to its peers: claim+acknowledge throughput, one cluster, one run.

    python bench/peers.py --workers 1,4,8 --seconds 10

For each worker count, N processes drain a pre-filled queue of each system in
turn, all in the same run and on the same PostgreSQL cluster:

  bare          the machine's limit for one todo per statement: the single-
                statement claim (UPDATE ... WHERE id = (SELECT ... FOR UPDATE
                SKIP LOCKED LIMIT 1)) and the guarded complete, on a table with
                only the pending and dedupe indexes and no history
                (``peers_bare_todos`` in the benchmark database)
  store         todos.store: claim_next + complete_todo (with the lease token)
  store10       todos.store: claim_many(limit=10) + acknowledge_many of the 10
  http          the agent API under gunicorn (gunicorn.conf.py, as main serves
                it): POST /api/v1/todos/claim + POST /api/v1/todos/<id>/complete
  http10        one claim with max_todos 10 + one POST /api/v1/todos/batch of 10
  pgqueuer1     pgqueuer's QueueManager, batch_size 1 (psycopg driver, its own
                database ``<bench db>_pgqueuer``)
  pgqueuer10    the same with batch_size 10
  procrastinate procrastinate's worker (concurrency 1, psycopg connector, its
                own database ``<bench db>_procrastinate``)

Every process starts its system, then counts only the jobs it finishes inside
the measurement window (``--warmup`` seconds after all N were released at a
barrier, for ``--seconds``), so start-up and shut-down cost no system anything.
The order of the systems is shuffled per worker count and repetition; with
``--reps`` > 1 the median is reported. The load average is printed with each
run: the machine is shared, and the ratios are what to compare. Results go to
bench/results/peers-<time>.json; ``python bench/report.py`` prints them as
Markdown. pgqueuer and procrastinate are the ``bench`` extra of pyproject.toml
(``make bench`` installs it).
"""

import asyncio
import contextlib
import logging
import os
import random
import statistics
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import benchlib
import psycopg

BATCH = 10
BARE_TABLE = "peers_bare_todos"

# Every system, in the order of the table, with a rough ceiling of its rate on
# a small machine (todos/s), used only to size its pre-filled queue.
SYSTEMS = {
    "bare": 5_000,
    "store": 3_000,
    "store10": 12_000,
    "http": 2_500,
    "http10": 10_000,
    "pgqueuer1": 2_500,
    "pgqueuer10": 15_000,
    "procrastinate": 2_500,
}
LABELS = {
    "bare": "bare loop",
    "store": "store",
    "store10": "store batch 10",
    "http": "HTTP",
    "http10": "HTTP batch 10",
    "pgqueuer1": "pgqueuer batch 1",
    "pgqueuer10": "pgqueuer batch 10",
    "procrastinate": "procrastinate",
}
# The goals of issue #13 at 4 workers: (numerator, denominator, at least).
GOALS = (
    ("http", "pgqueuer1", 1.0),
    ("store10", "pgqueuer10", 1.0),
    ("http10", "pgqueuer10", 0.6),
    ("store", "bare", 0.6),
)


def sibling_url(url, suffix):
    """Return the URL of the database named like ``url``'s plus ``suffix``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path + suffix))


def load():
    """Return the 1-minute load average, rounded, for the progress lines."""
    return round(os.getloadavg()[0], 2)


# --- The bare loop --------------------------------------------------------------

BARE_SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS {BARE_TABLE} (
    id uuid PRIMARY KEY,
    endpoint_id uuid NOT NULL,
    queue text NOT NULL,
    title text NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL,
    owner text,
    attempt int NOT NULL,
    max_attempts int NOT NULL,
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    idempotency_key text,
    result jsonb,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {BARE_TABLE}_pending_idx
    ON {BARE_TABLE} (endpoint_id, queue, created_at) WHERE state = 'pending';
CREATE UNIQUE INDEX IF NOT EXISTS {BARE_TABLE}_dedupe_idx
    ON {BARE_TABLE} (endpoint_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('pending', 'claimed');
"""

BARE_FILL_SQL = f"""
INSERT INTO {BARE_TABLE} (id, endpoint_id, queue, title, payload, state, attempt,
                          max_attempts, created_at, updated_at)
SELECT gen_random_uuid(), %s, %s, 'bench ' || n, '{{}}'::jsonb, 'pending', 0, 5,
       clock_timestamp(), now()
  FROM generate_series(1, %s) AS n
"""

# One statement: take the oldest pending row nobody holds, and claim it.
BARE_CLAIM_SQL = f"""
UPDATE {BARE_TABLE}
   SET state = 'claimed', owner = %(worker)s, attempt = attempt + 1,
       claimed_at = now(), lease_expires_at = now() + interval '300 seconds',
       updated_at = now()
 WHERE id = (SELECT id FROM {BARE_TABLE}
              WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
                AND state = 'pending'
              ORDER BY created_at
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id
"""

# The guarded complete: only the claimant of a claimed row completes it.
BARE_COMPLETE_SQL = f"""
UPDATE {BARE_TABLE}
   SET state = 'done', result = %(result)s, lease_expires_at = NULL,
       updated_at = now()
 WHERE id = %(id)s AND state = 'claimed' AND owner = %(worker)s
RETURNING id
"""


def bare_prepare(url):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BARE_SCHEMA_SQL)


def bare_fill(url, endpoint_id, count):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {BARE_TABLE}")
        conn.execute(BARE_FILL_SQL, [endpoint_id, benchlib.QUEUE, count])
        conn.execute(f"VACUUM ANALYZE {BARE_TABLE}")
        conn.execute("CHECKPOINT")


def bare_step(url, endpoint_id, worker):
    conn = psycopg.connect(url, autocommit=True)
    claim = {"worker": worker, "endpoint_id": endpoint_id, "queue": benchlib.QUEUE}

    def step():
        row = conn.execute(BARE_CLAIM_SQL, claim).fetchone()
        if row is None:
            return 0
        done = conn.execute(
            BARE_COMPLETE_SQL, {"id": row[0], "worker": worker, "result": None}
        ).fetchone()
        if done is None:
            raise RuntimeError(f"bare complete matched no row: {row[0]}")
        return 1

    return step


# --- Switchboard: the store and the HTTP API ------------------------------------


def store_step(url, endpoint_id, worker, batch):
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id, None)
    connection.ensure_connection()

    def single():
        try:
            todo = store.claim_next(scope, worker, queue=benchlib.QUEUE)
        except store.NotFound:
            return 0
        store.complete_todo(scope, todo.id, worker, lease_token=todo.lease_token)
        return 1

    def many():
        todos = store.claim_many(scope, worker, limit=batch, queue=benchlib.QUEUE)
        if not todos:
            return 0
        acks = [
            store.Ack("complete", todo.id, worker=worker, lease_token=todo.lease_token)
            for todo in todos
        ]
        for outcome in store.acknowledge_many(scope, acks):
            if isinstance(outcome, Exception):
                raise RuntimeError(f"store acknowledge failed: {outcome!r}")
        return len(todos)

    return single if batch == 1 else many


def http_step(port, token, worker, batch):
    client = benchlib.Client(port, token)
    client.request("GET", "/api/v1/todos?limit=1")

    def single():
        status, data = client.request(
            "POST", "/api/v1/todos/claim", {"worker": worker, "queue": benchlib.QUEUE}
        )
        if status == 404:
            return 0
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {data}")
        todo = data["todo"]
        status, data = client.request(
            "POST",
            f"/api/v1/todos/{todo['id']}/complete",
            {"worker": worker, "lease_token": todo["lease_token"]},
        )
        if status != 200:
            raise RuntimeError(f"complete answered {status}: {data}")
        return 1

    def many():
        status, data = client.request(
            "POST",
            "/api/v1/todos/claim",
            {"worker": worker, "queue": benchlib.QUEUE, "max_todos": batch},
        )
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {data}")
        todos = data["todos"]
        if not todos:
            return 0
        actions = [
            {"op": "complete", "id": todo["id"], "lease_token": todo["lease_token"]}
            for todo in todos
        ]
        status, data = client.request(
            "POST", "/api/v1/todos/batch", {"worker": worker, "actions": actions}
        )
        if status != 200 or any(item["status"] != 200 for item in data["results"]):
            raise RuntimeError(f"batch answered {status}: {data}")
        return len(todos)

    return single if batch == 1 else many


def loop_until(step, window_start, stop_at):
    """Run ``step`` until ``stop_at``; count what it finished in the window."""
    done = total = dry = 0
    cpu = 0.0
    while (now := time.perf_counter()) < stop_at:
        counting = now >= window_start
        started = time.process_time()
        finished = step()
        if counting:
            cpu += time.process_time() - started
        if finished == 0:
            dry += counting
            time.sleep(0.001)
            continue
        total += finished
        if counting and time.perf_counter() <= stop_at:
            done += finished
    return {"done": done, "total": total, "dry": dry, "cpu": cpu}


# --- pgqueuer -------------------------------------------------------------------


async def pgqueuer_connect(url):
    from pgqueuer import PsycopgDriver, Queries

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return conn, Queries(PsycopgDriver(conn))


async def pgqueuer_prepare_async(url):
    conn, queries = await pgqueuer_connect(url)
    async with conn:
        if not await queries.schema_is_installed():
            await queries.install()


async def pgqueuer_fill_async(url, count):
    conn, queries = await pgqueuer_connect(url)
    async with conn:
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        for start in range(0, count, 10_000):
            size = min(10_000, count - start)
            await queries.enqueue(["bench"] * size, [None] * size, [0] * size)
        await conn.execute("VACUUM ANALYZE pgqueuer")
        await conn.execute("CHECKPOINT")


def pgqueuer_loop(url, batch, window_start, stop_at):
    """Run one QueueManager with ``batch_size`` until ``stop_at``."""
    from pgqueuer import QueueManager

    counts = {"done": 0, "total": 0, "dry": 0, "cpu": 0.0}

    async def main():
        _, queries = await pgqueuer_connect(url)
        manager = QueueManager(queries)

        @manager.entrypoint("bench")
        async def bench(job):
            counts["total"] += 1
            if window_start <= time.perf_counter() <= stop_at:
                counts["done"] += 1

        async def stop():
            await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
            cpu = time.process_time()
            await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
            counts["cpu"] = time.process_time() - cpu
            manager.shutdown.set()

        stopper = asyncio.create_task(stop())
        await manager.run(batch_size=batch)
        await stopper

    run_async(main())
    return counts


def run_async(coroutine):
    """Run a coroutine on uvloop when it is installed (pgqueuer's own choice)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


# --- procrastinate --------------------------------------------------------------


def procrastinate_app(url):
    import procrastinate

    # Its warning that the App lives in the __main__ module does not apply here.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


async def procrastinate_prepare_async(url):
    app = procrastinate_app(url)
    async with app.open_async():
        connector = app.connector
        installed = await connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed"
        )
        if not installed["installed"]:
            await app.schema_manager.apply_schema_async()


async def procrastinate_fill_async(url, count):
    app = procrastinate_app(url)

    @app.task(name="bench", queue="bench")
    async def bench():
        return None

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
    async with app.open_async():
        for start in range(0, count, 1_000):
            size = min(1_000, count - start)
            await bench.batch_defer_async(*({} for _ in range(size)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
        conn.execute("CHECKPOINT")


def procrastinate_loop(url, window_start, stop_at):
    """Run one procrastinate worker (concurrency 1) until ``stop_at``."""
    app = procrastinate_app(url)
    counts = {"done": 0, "total": 0, "dry": 0, "cpu": 0.0}

    @app.task(name="bench", queue="bench")
    async def bench():
        counts["total"] += 1
        if window_start <= time.perf_counter() <= stop_at:
            counts["done"] += 1

    async def main():
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=["bench"],
                    concurrency=1,
                    install_signal_handlers=False,
                    delete_jobs="never",
                )
            )
            await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
            cpu = time.process_time()
            await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
            counts["cpu"] = time.process_time() - cpu
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(main())
    return counts


# --- One measurement ------------------------------------------------------------


def worker(index, system, urls, endpoint_id, port, token, warmup):
    """Prepare one process of ``system``; return its loop for run_processes."""
    name = f"w{index}"
    if system == "bare":
        step = bare_step(urls["switchboard"], endpoint_id, name)
    elif system in ("store", "store10"):
        batch = BATCH if system == "store10" else 1
        step = store_step(urls["switchboard"], endpoint_id, name, batch)
    elif system in ("http", "http10"):
        step = http_step(port, token, name, BATCH if system == "http10" else 1)
    else:
        step = None

    def ready(stop_at):
        window_start = time.perf_counter() + warmup
        if system == "pgqueuer1":
            return pgqueuer_loop(urls["pgqueuer"], 1, window_start, stop_at)
        if system == "pgqueuer10":
            return pgqueuer_loop(urls["pgqueuer"], BATCH, window_start, stop_at)
        if system == "procrastinate":
            return procrastinate_loop(urls["procrastinate"], window_start, stop_at)
        return loop_until(step, window_start, stop_at)

    return ready


def fill(system, urls, endpoint_id, count):
    if system == "bare":
        bare_fill(urls["switchboard"], endpoint_id, count)
    elif system in ("store", "store10", "http", "http10"):
        benchlib.reset_todos(urls["switchboard"])
        benchlib.fill_pending(urls["switchboard"], endpoint_id, count)
    elif system in ("pgqueuer1", "pgqueuer10"):
        run_async(pgqueuer_fill_async(urls["pgqueuer"], count))
    else:
        asyncio.run(procrastinate_fill_async(urls["procrastinate"], count))


def measure(system, workers, args, urls, endpoint_id, server, token):
    """Fill the system's queue, run N processes, and return its figures."""
    count = int(SYSTEMS[system] * (args.seconds + args.warmup + 5) * args.fill)
    fill(system, urls, endpoint_id, count)
    port = server.port if server is not None else None
    before = server.cpu_seconds() if server is not None else None
    outcomes = benchlib.run_processes(
        worker,
        workers,
        args.seconds + args.warmup,
        (system, urls, endpoint_id, port, token, args.warmup),
    )
    done = sum(item["done"] for item in outcomes)
    total = sum(item["total"] for item in outcomes)
    figures = {
        "rate": done / args.seconds,
        "done": done,
        "dry": sum(item["dry"] for item in outcomes),
        "filled": count,
        "client_cpu_ms_per_todo": (
            sum(item["cpu"] for item in outcomes) / done * 1000 if done else None
        ),
    }
    if before is not None and system.startswith("http") and total:
        # gunicorn's CPU over the whole run, warm-up included, per todo it served.
        figures["server_cpu_ms_per_todo"] = (
            (server.cpu_seconds() - before) / total * 1000
        )
    if total >= count:
        figures["warning"] = "the queue ran dry: raise --fill"
    return figures


def prepare(args, systems):
    """Create and migrate every database the chosen systems use."""
    base = args.database_url
    urls = {
        "switchboard": base,
        "pgqueuer": sibling_url(base, "_pgqueuer"),
        "procrastinate": sibling_url(base, "_procrastinate"),
    }
    benchlib.prepare_database(base)
    endpoint_id, token = benchlib.ensure_endpoint(base, name="peers")
    if "bare" in systems:
        bare_prepare(base)
    if {"pgqueuer1", "pgqueuer10"} & set(systems):
        benchlib.create_database(urls["pgqueuer"])
        run_async(pgqueuer_prepare_async(urls["pgqueuer"]))
    if "procrastinate" in systems:
        benchlib.create_database(urls["procrastinate"])
        asyncio.run(procrastinate_prepare_async(urls["procrastinate"]))
    return urls, endpoint_id, token


def system_list(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown or not names:
        raise ValueError(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    return names


def run(args, systems):
    urls, endpoint_id, token = prepare(args, systems)
    info = benchlib.machine(args.database_url)
    versions = peer_versions()
    print(
        f"peers: {', '.join(systems)} at {args.workers} workers, {args.seconds:g} s "
        f"each (+{args.warmup:g} s warm-up), {args.reps} rep(s); "
        f"load {os.getloadavg()}; {versions}",
        flush=True,
    )
    samples = {}  # (workers, system) -> [figures, ...]
    uses_http = any(system.startswith("http") for system in systems)
    serving = (
        benchlib.gunicorn(args.database_url) if uses_http else contextlib.nullcontext()
    )
    with serving as server:
        for workers in args.workers:
            for rep in range(args.reps):
                order = list(systems)
                random.Random(f"{workers}-{rep}").shuffle(order)
                for system in order:
                    started = load()
                    figures = measure(
                        system, workers, args, urls, endpoint_id, server, token
                    )
                    figures["load"] = [started, load()]
                    samples.setdefault((workers, system), []).append(figures)
                    note = f"  ({figures['warning']})" if "warning" in figures else ""
                    print(
                        f"  {workers} workers, rep {rep + 1}: {system:13} "
                        f"{figures['rate']:9,.0f} todos/s  load {started:.2f}"
                        f"→{figures['load'][1]:.2f}{note}",
                        flush=True,
                    )
    runs = []
    for workers in args.workers:
        rates = {}
        detail = {}
        for system in systems:
            reps = samples[(workers, system)]
            rates[system] = statistics.median(item["rate"] for item in reps)
            detail[system] = reps
        ratios = {
            f"{top}/{bottom}": rates[top] / rates[bottom]
            for top, bottom, _ in GOALS
            if top in rates and bottom in rates and rates[bottom]
        }
        runs.append(
            {"workers": workers, "rates": rates, "ratios": ratios, "samples": detail}
        )
    return info, versions, runs


def peer_versions():
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pgqueuer", "procrastinate", "psycopg", "django", "gunicorn"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def print_report(args, systems, runs):
    benchlib.print_table(
        f"claim+acknowledge throughput, todos/s (median of {args.reps}), "
        f"{args.seconds:g} s per system",
        ["workers", *(LABELS[system] for system in systems)],
        [[run["workers"], *(run["rates"][s] for s in systems)] for run in runs],
    )
    goal_rows = []
    for run in runs:
        for top, bottom, goal in GOALS:
            key = f"{top}/{bottom}"
            if key in run["ratios"]:
                value = run["ratios"][key]
                goal_rows.append(
                    [
                        run["workers"],
                        f"{LABELS[top]} / {LABELS[bottom]}",
                        f"{value:.2f}",
                        f"≥ {goal:.1f}",
                        "met" if value >= goal else "not met",
                    ]
                )
    if goal_rows:
        benchlib.print_table(
            "ratios (the goals are for 4 workers)",
            ["workers", "ratio", "value", "goal", ""],
            goal_rows,
        )
    cpu_rows = [
        [
            run["workers"],
            LABELS[system],
            statistics.median(
                item["server_cpu_ms_per_todo"] for item in run["samples"][system]
            ),
        ]
        for run in runs
        for system in systems
        if "server_cpu_ms_per_todo" in run["samples"][system][0]
    ]
    if cpu_rows:
        benchlib.print_table(
            "gunicorn CPU per todo (ms; a single todo is a claim+complete pair)",
            ["workers", "path", "CPU ms/todo"],
            cpu_rows,
        )


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument(
        "--workers",
        type=benchlib.int_list,
        default=[1, 4, 8],
        help="worker process counts, e.g. 1,4,8",
    )
    parse.add_argument(
        "--seconds", type=float, default=10, help="measured seconds per system"
    )
    parse.add_argument(
        "--warmup",
        type=float,
        default=2,
        help="seconds each system runs before its window opens",
    )
    parse.add_argument("--reps", type=int, default=1, help="repetitions (median)")
    parse.add_argument(
        "--systems",
        type=system_list,
        default=list(SYSTEMS),
        help=f"comma-separated subset of: {','.join(SYSTEMS)}",
    )
    parse.add_argument(
        "--fill",
        type=float,
        default=1.0,
        help="scale each queue's pre-filled todos (if a queue runs dry)",
    )
    args = parse.parse_args()
    if args.reps < 1:
        parse.error("--reps must be at least 1")
    systems = args.systems
    if any(s.startswith(("pgqueuer", "procrastinate")) for s in systems):
        try:
            import pgqueuer  # noqa: F401
            import procrastinate  # noqa: F401
        except ImportError:
            sys.exit(
                "pgqueuer and procrastinate are missing: pip install -e '.[bench]' "
                "(or make bench), or pick --systems without them"
            )

    info, versions, runs = run(args, systems)
    print_report(args, systems, runs)
    benchlib.write_results(
        "peers",
        {
            "benchmark": "peers",
            "machine": info,
            "versions": versions,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "reps": args.reps,
            "systems": systems,
            "gunicorn": {
                "config": "gunicorn.conf.py",
                "workers": os.environ.get("GUNICORN_WORKERS", "(config default)"),
            },
            "command": " ".join(["python", "bench/peers.py", *sys.argv[1:]]),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
