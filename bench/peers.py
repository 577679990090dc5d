"""Every path side by side: what a todo costs through each way in, next to its peers.

Question: how many todos per second does each way of claiming and finishing work
move, next to pgqueuer and procrastinate on the same PostgreSQL, and what does
a request cost the server?

    python bench/peers.py                       # 4 workers, 3 repetitions
    python bench/peers.py --paths http,mcp,pgqueuer1 --reps 1

In one run, on one PostgreSQL, N worker processes (``--workers``, 4) drain a
pre-filled queue through each path in turn:

  bare          the limit: the one-statement claim (UPDATE ... WHERE id = (SELECT
                ... FOR UPDATE SKIP LOCKED LIMIT 1)) and a guarded complete, on a
                table with only its two indexes and no history
  pgqueuer1     pgqueuer's QueueManager, batch_size 1 (its own database)
  pgqueuer10    the same with batch_size 10
  procrastinate procrastinate's worker, concurrency 1 (its own database)
  store         todos.store in the worker: claim_next + complete_todo
  store10       todos.store: claim_many(limit=10) + acknowledge_many of the 10
  http          the JSON API under gunicorn: POST /api/v1/todos/claim +
                POST /api/v1/todos/<id>/complete
  http10        one claim with max_todos 10 + one POST /api/v1/todos/batch of 10
  sqs10         boto3 on the SQS surface: ReceiveMessage (10) + DeleteMessageBatch
  mcp           JSON-RPC on /mcp, as an agent's client sends it (MCP 2026-07-28,
                stateless): tools/call claim_next + tools/call complete_todo
  httpfloor     the HTTP floor: the same client and requests as http, served by
                bench/floor_server.py, a bare ASGI app on the same serving stack
                (gunicorn, uvicorn, uvloop, psycopg's async pool, as many
                processes) that runs the bare loop's two statements and nothing
                else: what any HTTP surface here pays before doing any work
  httpfloorstore  the same floor running the store's own two statements (the
                claim and the acknowledgement, as bound by the store): the
                server does nothing of Switchboard's, PostgreSQL all of it
  httpfloorstore10  the same as http10 (a claim of 10, a batch of 10
                completes) on that floor, with the store's statements

Then, in each repetition, each floor and the served paths it is the floor of
(http and mcp beside httpfloorstore; http10 and sqs10 beside httpfloorstore10)
run side by side: the same N processes take turns of ``--slice`` s on the wall
clock (bench/benchlib.alternate), the mode of each turn shuffled, so each
served path and its floor drain one queue under the same load on the machine,
at the same moments. A ratio to the floor is taken from these turns: measured
one path after another, PostgreSQL's CPU per todo moves 10–20% between
windows for every path at once, which the turns share between the two.

The served paths share one gunicorn (gunicorn.conf.py, as `make run` serves;
``--server-workers`` sets its processes; the floors have their own, as many).
Each worker counts only the todos it finishes inside the window (``--warmup``
s after all N start together, for ``--seconds``). The order of the paths is
shuffled per repetition; ``--reps`` runs the whole comparison again and the
median is reported.

It prints, per repetition, each path's todos/s with the load average before and
after; then the medians: todos/s, the ratio to the path's peer (a single path
to pgqueuer batch 1, a batch path to pgqueuer batch 10), and the server CPU per
todo (the gunicorn processes' CPU time from /proc over the window, divided by
the todos finished; for a single path that is a claim+complete pair, two
requests). Result: bench/results/latest/peers.json (`python bench/report.py`).
pgqueuer and procrastinate are the ``bench`` extra (`make bench` installs it).
"""

import asyncio
import contextlib
import json
import logging
import os
import random
import statistics
import sys
import time

import benchlib
import psycopg
import report

BATCH = 10
BARE_TABLE = "peers_bare_todos"
MCP_VERSION = "2026-07-28"


class Way:
    """One way to claim and finish todos: its label, its peer, and a rough
    ceiling of its rate (todos/s), used only to size its pre-filled queue."""

    def __init__(self, label, ceiling, peer=None, server=None):
        # server: which server a path's clients call and whose CPU it measures
        # ("switchboard" or "floor"); None for a path in the clients' processes.
        self.label, self.ceiling, self.peer, self.server = label, ceiling, peer, server


PATHS = {
    "bare": Way("bare claim+complete loop", 5_000),
    "pgqueuer1": Way("pgqueuer batch 1", 2_500),
    "pgqueuer10": Way("pgqueuer batch 10", 15_000),
    "procrastinate": Way("procrastinate", 2_500, peer="pgqueuer1"),
    "store": Way("store single", 3_000, peer="pgqueuer1"),
    "store10": Way("store batch 10", 12_000, peer="pgqueuer10"),
    "http": Way("HTTP single claim+complete", 2_000, "pgqueuer1", "switchboard"),
    "http10": Way("HTTP batch 10", 8_000, "pgqueuer10", "switchboard"),
    "sqs10": Way("SQS receive 10 + delete batch", 6_000, "pgqueuer10", "switchboard"),
    "mcp": Way("MCP claim_next + complete_todo", 1_500, "pgqueuer1", "switchboard"),
    "httpfloor": Way("HTTP floor: bare SQL", 3_000, "pgqueuer1", "floor"),
    "httpfloorstore": Way("HTTP floor: the store's SQL", 2_500, "pgqueuer1", "floor"),
    "httpfloorstore10": Way(
        "HTTP floor: the store's SQL, batch 10", 10_000, "pgqueuer10", "floor"
    ),
}
# Each floor and the served paths measured beside it in turns (side_by_side):
# the served path's todos/s over its floor's, both taken in the same seconds.
BESIDE_FLOOR = {
    "httpfloorstore": ("http", "mcp"),
    "httpfloorstore10": ("http10", "sqs10"),
}
# Untimed steps of each mode in each process before the turns begin.
WARM_UP_STEPS = 10
# What the served paths are to reach: (at least this ratio to the peer, at most
# this server CPU per todo in ms).
TARGETS = {"http": (1.0, 1.2), "http10": (0.6, 0.25), "sqs10": (0.6, 0.25)}
# Where each todo's CPU goes: its client's, the server's (served paths),
# PostgreSQL's; the columns bench/report.py renders.
CPU_KEYS = tuple(key for _, key in report.PEERS_CPU)
CPU_HEADERS = tuple(f"{header} ms/todo" for header, _ in report.PEERS_CPU)


def path_list(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PATHS]
    if unknown or not names:
        raise ValueError(f"unknown path(s) {unknown}; choose from {','.join(PATHS)}")
    return [name for name in PATHS if name in names]


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


def bare_fill(url, endpoint_id, count):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BARE_SCHEMA_SQL)
        conn.execute(f"TRUNCATE {BARE_TABLE}")
        conn.execute(BARE_FILL_SQL, [endpoint_id, benchlib.QUEUE, count])
        benchlib.settle(conn, url, BARE_TABLE)


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


# --- Switchboard: the store, and the served paths -------------------------------


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


def http_step(port, token, worker, prefix=""):
    """Claim and complete one todo through the JSON API (or a floor's copy of
    its two routes under ``prefix``)."""
    client = benchlib.Client(port, token)
    claim = {"worker": worker, "queue": benchlib.QUEUE}

    def step():
        status, data = client.request("POST", f"{prefix}/api/v1/todos/claim", claim)
        if status == 404:
            return 0
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {data}")
        todo = data["todo"]
        status, data = client.request(
            "POST",
            f"{prefix}/api/v1/todos/{todo['id']}/complete",
            {"worker": worker, "lease_token": todo["lease_token"]},
        )
        if status != 200:
            raise RuntimeError(f"complete answered {status}: {data}")
        return 1

    return step


def http_batch_step(port, token, worker, prefix=""):
    """Claim up to ten todos and complete them in one batch through the JSON
    API (or a floor's copy of its two routes under ``prefix``)."""
    client = benchlib.Client(port, token)
    claim = {"worker": worker, "queue": benchlib.QUEUE, "max_todos": BATCH}

    def step():
        status, data = client.request("POST", f"{prefix}/api/v1/todos/claim", claim)
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
            "POST",
            f"{prefix}/api/v1/todos/batch",
            {"worker": worker, "actions": actions},
        )
        if status != 200 or any(item["status"] != 200 for item in data["results"]):
            raise RuntimeError(f"batch answered {status}: {data}")
        return len(todos)

    return step


def sqs_client(port, key):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=key["sqs_access_key_id"],
        aws_secret_access_key=key["sqs_secret_access_key"],
        config=Config(retries={"max_attempts": 1}, max_pool_connections=2),
    )


def sqs_step(port, key, queue_url):
    client = sqs_client(port, key)

    def step():
        received = client.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=BATCH
        ).get("Messages", [])
        if not received:
            return 0
        entries = [
            {"Id": str(index), "ReceiptHandle": message["ReceiptHandle"]}
            for index, message in enumerate(received)
        ]
        deleted = client.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        if deleted.get("Failed"):
            raise RuntimeError(f"DeleteMessageBatch failed: {deleted['Failed']}")
        return len(received)

    return step


def mcp_call(tool, arguments, number):
    """A stateless tools/call: no session, the revision in ``_meta``."""
    return {
        "jsonrpc": "2.0",
        "id": number,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }


def mcp_step(port, token, worker):
    client = benchlib.Client(
        port,
        token,
        headers={
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MCP_VERSION,
            "Mcp-Method": "tools/call",
        },
    )
    numbers = iter(range(1, 10**9))

    def call(tool, arguments):
        status, data = client.request(
            "POST",
            "/mcp",
            mcp_call(tool, arguments, next(numbers)),
            headers={"Mcp-Name": tool},
        )
        if status != 200 or data is None or "result" not in data:
            raise RuntimeError(f"{tool} answered {status}: {data}")
        return data["result"]

    def step():
        claimed = call("claim_next", {"queue": benchlib.QUEUE, "worker": worker})
        todo = (claimed.get("structuredContent") or {}).get("todo")
        if claimed.get("isError") or not todo:
            return 0
        done = call(
            "complete_todo",
            {
                "todo_id": todo["id"],
                "worker": worker,
                "lease_token": todo["lease_token"],
            },
        )
        if done.get("isError"):
            raise RuntimeError(f"complete_todo failed: {done}")
        return 1

    return step


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


async def pgqueuer_fill(url, count):
    conn, queries = await pgqueuer_connect(url)
    async with conn:
        if not await queries.schema_is_installed():
            await queries.install()
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        for start in range(0, count, 10_000):
            size = min(10_000, count - start)
            await queries.enqueue(["bench"] * size, [None] * size, [0] * size)
    with psycopg.connect(url, autocommit=True) as conn:
        benchlib.settle(conn, url, "pgqueuer", "pgqueuer_log", "pgqueuer_statistics")


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


async def procrastinate_fill(url, count):
    app = procrastinate_app(url)

    @app.task(name="bench", queue="bench")
    async def bench():
        return None

    async with app.open_async():
        installed = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed"
        )
        if not installed["installed"]:
            await app.schema_manager.apply_schema_async()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
    async with app.open_async():
        for start in range(0, count, 1_000):
            size = min(1_000, count - start)
            await bench.batch_defer_async(*({} for _ in range(size)))
    with psycopg.connect(url, autocommit=True) as conn:
        benchlib.settle(conn, url, "procrastinate_jobs", "procrastinate_events")


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


class Setup:
    """What every worker process needs (picklable): databases, keys, the port."""

    def __init__(self, args, paths):
        base = args.database_url
        self.urls = {
            "switchboard": base,
            "pgqueuer": benchlib.sibling_url(base, "_pgqueuer"),
            "procrastinate": benchlib.sibling_url(base, "_procrastinate"),
        }
        benchlib.prepare_database(base)
        self.endpoint_id, self.token = benchlib.ensure_endpoint(base, name="peers")
        self.sqs_key = None
        if "sqs10" in paths:
            self.sqs_key = json.loads(
                benchlib.manage(
                    base, "sqs_credentials", self.endpoint_id, "--rotate", "--json"
                )
            )
        for peer in ("pgqueuer", "procrastinate"):
            if any(name.startswith(peer) for name in paths):
                benchlib.create_database(self.urls[peer])
        self.port = self.queue_url = self.floor_port = None

    def serving(self, server):
        """Note the served paths' server; create the SQS queue on it."""
        self.port = server.port
        if self.sqs_key is not None:
            self.queue_url = create_queue(server.port, self.sqs_key, benchlib.QUEUE)


@contextlib.contextmanager
def serve_floor(args, setup):
    """Serve bench/floor_server.py as Switchboard is served (gunicorn, uvicorn's
    worker, as many processes); yield its benchlib.Server."""
    port = args.port + 1 if args.port else benchlib.free_port()
    workers = args.server_workers or int(os.environ.get("GUNICORN_WORKERS", "2"))
    url = setup.urls["switchboard"]
    env = {
        **os.environ,
        "FLOOR_DATABASE_URL": url,
        "FLOOR_ENDPOINT_ID": str(setup.endpoint_id),
        "FLOOR_TOKEN": setup.token,
    }
    command = [sys.executable, "-m", "gunicorn", "floor_server:app"]
    command += ["--workers", str(workers)]
    command += ["--worker-class", "uvicorn_worker.UvicornWorker"]
    command += ["--bind", f"127.0.0.1:{port}", "--log-level", "warning"]
    command += ["--keep-alive", "75", "--no-control-socket"]
    bench = benchlib.ROOT / "bench"
    with benchlib.run_server([command], port, env, url, "floor", cwd=bench) as server:
        setup.floor_port = port
        yield server


def create_queue(port, key, name, deadline=30):
    """Create the SQS queue once the server answers; return its URL."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            return sqs_client(port, key).create_queue(QueueName=name)["QueueUrl"]
        except Exception:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)


def path_step(index, name, setup):
    """Process ``index``'s step of path ``name`` (todos finished per call);
    None for a peer, which runs its own loop."""
    worker_name = f"w{index}"
    url = setup.urls["switchboard"]
    steps = {
        "bare": lambda: bare_step(url, setup.endpoint_id, worker_name),
        "store": lambda: store_step(url, setup.endpoint_id, worker_name, 1),
        "store10": lambda: store_step(url, setup.endpoint_id, worker_name, BATCH),
        "http": lambda: http_step(setup.port, setup.token, worker_name),
        "http10": lambda: http_batch_step(setup.port, setup.token, worker_name),
        "sqs10": lambda: sqs_step(setup.port, setup.sqs_key, setup.queue_url),
        "mcp": lambda: mcp_step(setup.port, setup.token, worker_name),
        "httpfloor": lambda: http_step(setup.floor_port, setup.token, worker_name),
        "httpfloorstore": lambda: http_step(
            setup.floor_port, setup.token, worker_name, prefix="/store"
        ),
        "httpfloorstore10": lambda: http_batch_step(
            setup.floor_port, setup.token, worker_name, prefix="/store"
        ),
    }
    return steps[name]() if name in steps else None


def worker(index, name, setup, warmup):
    """Prepare one process of path ``name``; return its loop for run_processes."""
    step = path_step(index, name, setup)

    def ready(stop_at):
        window_start = time.perf_counter() + warmup
        if name == "pgqueuer1":
            return pgqueuer_loop(setup.urls["pgqueuer"], 1, window_start, stop_at)
        if name == "pgqueuer10":
            return pgqueuer_loop(setup.urls["pgqueuer"], BATCH, window_start, stop_at)
        if name == "procrastinate":
            return procrastinate_loop(
                setup.urls["procrastinate"], window_start, stop_at
            )
        return loop_until(step, window_start, stop_at)

    return ready


def fill(name, setup, count):
    if name in ("bare", "httpfloor"):
        bare_fill(setup.urls["switchboard"], setup.endpoint_id, count)
    elif name.startswith("pgqueuer"):
        run_async(pgqueuer_fill(setup.urls["pgqueuer"], count))
    elif name == "procrastinate":
        asyncio.run(procrastinate_fill(setup.urls["procrastinate"], count))
    else:
        benchlib.reset_todos(setup.urls["switchboard"])
        benchlib.fill_pending(setup.urls["switchboard"], setup.endpoint_id, count)


def measure(name, args, setup, servers, postgres):
    """Fill the path's queue, run N processes, and return its figures."""
    path = PATHS[name]
    count = int(path.ceiling * (args.seconds + args.warmup + 3) * args.fill)
    fill(name, setup, count)
    window = None
    if path.server is not None:
        window = benchlib.CpuWindow(servers[path.server], args.warmup, args.seconds)
    database = None
    if postgres.available:
        database = benchlib.CpuWindow(postgres, args.warmup, args.seconds)
    windows = [item for item in (window, database) if item is not None]

    def start():
        for item in windows:
            item.start()

    outcomes = benchlib.run_processes(
        worker,
        args.workers,
        args.seconds + args.warmup,
        (name, setup, args.warmup),
        on_start=start,
    )
    done = sum(item["done"] for item in outcomes)
    total = sum(item["total"] for item in outcomes)
    figures = {
        "rate": done / args.seconds,
        "done": done,
        "filled": count,
        "client_cpu_ms_per_todo": (
            sum(item["cpu"] for item in outcomes) / done * 1000 if done else None
        ),
    }
    for key, measured in (
        ("server_cpu_ms_per_todo", window),
        ("postgres_cpu_ms_per_todo", database),
    ):
        if measured is not None:
            used = measured.used()
            figures[key] = used / done * 1000 if done and used is not None else None
    if total >= count:
        figures["warning"] = "the queue ran dry: raise --fill"
    return figures


def beside_floor(paths):
    """Each floor in ``paths`` with the served paths in ``paths`` it is the floor of."""
    return {
        floor: [name for name in served if name in paths]
        for floor, served in BESIDE_FLOOR.items()
        if floor in paths and any(name in paths for name in served)
    }


def turns_worker(index, modes, setup, slice_seconds):
    """One process of a side-by-side run: each mode's step, warmed up, in turns."""
    steps = {}
    for name in modes:
        step = path_step(index, name, setup)
        for _ in range(WARM_UP_STEPS):
            step()
        steps[name] = _counted(step)
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, steps)


def _counted(step):
    """A peers step (todos finished) as benchlib.alternate's (None when dry)."""

    def counted():
        finished = step()
        return {"todos": finished} if finished else None

    return counted


def side_by_side(floor, served, args, setup):
    """Run ``floor`` and ``served`` in turns; return each one's todos/s over the
    seconds it held the turn, and each served path's ratio to the floor."""
    modes = [floor, *served]
    ceiling = sum(PATHS[name].ceiling for name in modes) / len(modes)
    seconds = args.seconds * len(modes)
    fill(floor, setup, int(ceiling * (seconds + 3) * args.fill))
    outcomes = benchlib.run_processes(
        turns_worker, args.workers, seconds, (modes, setup, args.slice)
    )
    merged = benchlib.merge_modes(outcomes)
    rates = {name: merged[name]["rate"] for name in modes}
    figures = {"rates": rates, "ratios": {}}
    for name in served:
        if rates[floor]:
            figures["ratios"][name] = rates[name] / rates[floor]
    return figures


def one_rep(number, args, setup, servers, postgres, paths):
    """Run every path once, in a shuffled order; return the rep's record."""
    order = list(paths)
    random.Random(f"peers-{number}-{args.seed}").shuffle(order)
    load_before = benchlib.load_average()
    benchlib.progress(
        f"rep {number + 1}/{args.reps}: load {load_before[0]:.2f}; "
        f"order {', '.join(order)}"
    )
    rows = {}
    for name in order:
        started = benchlib.load_average()[0]
        figures = measure(name, args, setup, servers, postgres)
        rows[name] = figures
        cpu = figures.get("server_cpu_ms_per_todo")
        note = f"  ({figures['warning']})" if "warning" in figures else ""
        benchlib.progress(
            f"  {name:13} {figures['rate']:9,.0f} todos/s"
            + (f"  server CPU {cpu:.2f} ms/todo" if cpu is not None else "")
            + (
                f"  PostgreSQL {pg:.2f}"
                if (pg := figures.get("postgres_cpu_ms_per_todo"))
                else ""
            )
            + f"  load {started:.2f}→{benchlib.load_average()[0]:.2f}{note}"
        )
    for name, figures in rows.items():
        peer = rows.get(PATHS[name].peer)
        if peer and peer["rate"]:
            figures["ratio"] = figures["rate"] / peer["rate"]
    beside = {}
    for floor, served in beside_floor(paths).items():
        beside[floor] = figures = side_by_side(floor, served, args, setup)
        ratios = figures["ratios"].items()
        benchlib.progress(
            f"  in turns beside {floor}: "
            + ", ".join(f"{name} {ratio:.2f}×" for name, ratio in ratios)
        )
    return {
        "rep": number + 1,
        "order": order,
        "load_before": load_before,
        "load_after": benchlib.load_average(),
        "paths": rows,
        "side_by_side": beside,
    }


def floor_ratios(reps):
    """Each served path's ratio to its floor, taken in turns: the median over
    the reps, and every rep's."""
    out = {}
    for floor in reps[0]["side_by_side"]:
        for name in reps[0]["side_by_side"][floor]["ratios"]:
            ratios = [rep["side_by_side"][floor]["ratios"].get(name) for rep in reps]
            ratios = [ratio for ratio in ratios if ratio is not None]
            out[name] = {
                "label": PATHS[name].label,
                "floor": floor,
                "ratio": statistics.median(ratios) if ratios else None,
                "reps": ratios,
            }
    return out


def medians(reps, paths, cores):
    """Each path's median over the reps: rate, ratio to its peer, the CPU per
    todo of its clients, the server and PostgreSQL; then the share of the
    machine those account for, and the server's budget at the target."""
    out = {}
    for name in paths:
        samples = [rep["paths"][name] for rep in reps]
        row = {"label": PATHS[name].label, "peer": PATHS[name].peer}
        for key in ("rate", "ratio", *CPU_KEYS):
            values = [item[key] for item in samples if item.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["accounted"] = accounted(row, cores)
        out[name] = row
    for name, row in out.items():
        row["server_budget_ms_per_todo"] = server_budget(name, out, cores)
    return out


def target_text(name, row):
    if name not in TARGETS:
        return ""
    ratio, cpu = TARGETS[name]
    met = (row["ratio"] or 0) >= ratio and (row["server_cpu_ms_per_todo"] or 99) <= cpu
    return f"≥ {ratio:.1f}×, ≤ {cpu:.2f} ms: {'met' if met else 'not met'}"


def server_budget(name, median, cores):
    """The server CPU per todo a path could spend at its target ratio: the
    machine's CPU per todo at that rate, less what its clients and PostgreSQL
    spent per todo. None when a figure is missing; at most zero when the
    target is out of reach on this machine whatever the server costs."""
    row = median[name]
    peer = median.get(row["peer"] or "")
    if name not in TARGETS or peer is None or not peer["rate"]:
        return None
    others = [row.get("client_cpu_ms_per_todo"), row.get("postgres_cpu_ms_per_todo")]
    if None in others:
        return None
    target_rate = TARGETS[name][0] * peer["rate"]
    return cores / target_rate * 1000 - sum(others)


def accounted(row, cores):
    """The share of the machine's CPU the measured processes account for."""
    costs = [row.get(key) for key in CPU_KEYS]
    if not row.get("rate") or costs[0] is None or costs[2] is None:
        return None
    return sum(cost or 0 for cost in costs) * row["rate"] / 1000 / cores


def print_report(args, reps, median, floors):
    for rep in reps:
        benchlib.print_table(
            f"rep {rep['rep']} (load {rep['load_before'][0]:.2f} → "
            f"{rep['load_after'][0]:.2f}): todos/s",
            ["path", "todos/s", "vs peer", *CPU_HEADERS],
            [
                [
                    PATHS[name].label,
                    row["rate"],
                    row.get("ratio"),
                    *(row.get(key) for key in CPU_KEYS),
                ]
                for name, row in sorted(
                    rep["paths"].items(), key=lambda item: list(PATHS).index(item[0])
                )
            ],
        )
    benchlib.print_table(
        f"median of {len(reps)} rep(s), {args.workers} workers, "
        f"{args.seconds:g} s per path",
        ["path", "todos/s", "vs peer", "peer", *CPU_HEADERS, "accounted", "target"],
        [
            [
                row["label"],
                row["rate"],
                None if row["ratio"] is None else f"{row['ratio']:.2f}×",
                PATHS[row["peer"]].label if row["peer"] else "",
                *(row[key] for key in CPU_KEYS),
                None if row["accounted"] is None else f"{row['accounted']:.0%}",
                target_text(name, row),
            ]
            for name, row in median.items()
        ],
    )
    if floors:
        benchlib.print_table(
            f"beside the floor, in turns of {args.slice:g} s: todos/s over the floor's",
            ["path", "floor", "median", "reps"],
            [
                [
                    row["label"],
                    PATHS[row["floor"]].label,
                    f"{row['ratio']:.2f}×",
                    ", ".join(f"{ratio:.2f}" for ratio in row["reps"]),
                ]
                for row in floors.values()
            ],
        )
    for row in median.values():
        budget = row["server_budget_ms_per_todo"]
        if budget is not None:
            print(
                f"{row['label']}: at the target rate, left for the server: "
                f"{report.budget_sentence(budget)}"
            )


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--workers", type=int, default=4, help="worker processes (default 4)"
    )
    parse.add_argument(
        "--seconds", type=float, default=8, help="measured seconds per path (8)"
    )
    parse.add_argument(
        "--warmup", type=float, default=2, help="seconds before each window (2)"
    )
    parse.add_argument("--reps", type=int, default=3, help="repetitions (3)")
    parse.add_argument(
        "--slice",
        type=float,
        default=0.5,
        help="seconds of one turn when a floor and its served paths alternate (0.5)",
    )
    parse.add_argument(
        "--paths",
        type=path_list,
        default=list(PATHS),
        help=f"a comma-separated subset of: {','.join(PATHS)}",
    )
    parse.add_argument(
        "--server-workers",
        type=int,
        default=None,
        help="gunicorn processes (default: gunicorn.conf.py's, GUNICORN_WORKERS or 2)",
    )
    parse.add_argument(
        "--fill", type=float, default=1.0, help="scale the pre-filled queues (1.0)"
    )
    parse.add_argument("--seed", default="0", help="the seed of the paths' order")
    parse.add_argument(
        "--port",
        type=int,
        help="the served paths' port, the floor's the next (default: free ones)",
    )
    args = parse.parse_args()
    benchlib.apply_quick(
        args, parse, seconds=1.5, warmup=1.0, reps=1, fill=0.3, slice=0.25
    )
    if args.reps < 1 or args.workers < 1:
        parse.error("--reps and --workers must be at least 1")
    paths = args.paths
    if any(name.startswith(("pgqueuer", "procrastinate")) for name in paths):
        try:
            import pgqueuer  # noqa: F401
            import procrastinate  # noqa: F401
        except ImportError:
            sys.exit(
                "pgqueuer and procrastinate are missing: pip install -e '.[bench]' "
                "(or make bench), or pick --paths without them"
            )

    result = benchlib.Result("peers", args)
    setup = Setup(args, paths)
    benchlib.progress(
        f"peers: {', '.join(paths)}; {args.workers} workers, {args.seconds:g} s "
        f"each (+{args.warmup:g} s warm-up), {args.reps} rep(s)"
    )
    postgres = benchlib.PostgresCpu(args.database_url)
    if not postgres.available:
        benchlib.progress("PostgreSQL runs elsewhere: its CPU per todo is not measured")
    needed = {PATHS[name].server for name in paths}
    serving = (
        benchlib.serve(args.database_url, workers=args.server_workers, port=args.port)
        if "switchboard" in needed
        else contextlib.nullcontext()
    )
    floor = serve_floor(args, setup) if "floor" in needed else contextlib.nullcontext()
    with serving as server, floor as floor_server, benchlib.autovacuum_held():
        if server is not None:
            setup.serving(server)
        servers = {"switchboard": server, "floor": floor_server}
        reps = [
            one_rep(n, args, setup, servers, postgres, paths) for n in range(args.reps)
        ]
    median = medians(reps, paths, os.cpu_count() or 1)
    floors = floor_ratios(reps)
    print_report(args, reps, median, floors)
    result.write(
        {
            "workers": args.workers,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "slice": args.slice,
            "reps": args.reps,
            "paths": paths,
            "server_workers": args.server_workers or "gunicorn.conf.py's",
            "versions": benchlib.versions(
                "pgqueuer", "procrastinate", "psycopg", "django", "gunicorn", "boto3"
            ),
        },
        benchlib.rounded({"median": median, "floors": floors, "reps": reps}),
    )


if __name__ == "__main__":
    main()
