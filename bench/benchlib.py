"""What every benchmark shares: its database, its server, its clients, its result file.

Each benchmark runs Switchboard's code beside its baseline (a plain psycopg loop
running the same SQL, a peer queue, PostgreSQL's own wakeup) in the same run,
so the ratio holds on any machine. The benchmarks use their own database
(``switchboard_bench`` on the project-local cluster unless ``--database-url``
or BENCH_DATABASE_URL says otherwise), create it when missing, migrate it with
``manage.py migrate`` and empty its todos before each measurement. They never
touch another database.

Every benchmark writes ``bench/results/latest/<name>.json``: the command line,
the UTC date, the machine, the load average before and after, the parameters
and the results. ``python bench/report.py`` prints them as Markdown.
"""

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LATEST = RESULTS / "latest"
DEFAULT_URL = "postgres://postgres@127.0.0.1:{port}/switchboard_bench"
QUEUE = "bench"
# The settings refuse to start without a key; a benchmark run by hand may have none.
BENCH_SECRET_KEY = "switchboard-bench-only-key-not-a-secret-0123456789abcdef"


def default_url():
    """Return the benchmark database: BENCH_DATABASE_URL, or switchboard_bench on
    the server DATABASE_URL names, or on the project-local cluster."""
    if os.environ.get("BENCH_DATABASE_URL"):
        return os.environ["BENCH_DATABASE_URL"]
    if os.environ.get("DATABASE_URL"):
        return sibling_url(os.environ["DATABASE_URL"], name="switchboard_bench")
    return DEFAULT_URL.format(port=os.environ.get("SB_PG_PORT", "54329"))


def sibling_url(url, suffix="", name=None):
    """Return the URL of another database on ``url``'s server: ``name``, or
    ``url``'s own name plus ``suffix``."""
    parts = urlsplit(url)
    path = f"/{name}" if name else parts.path + suffix
    return urlunsplit(parts._replace(path=path))


def parser(doc):
    """Return an argument parser whose help is the script's docstring, with the
    options every benchmark takes (``--database-url``, ``--quick``)."""
    parse = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse.add_argument(
        "--database-url",
        default=default_url(),
        help="the benchmark's own database; created and migrated when missing "
        "(default: %(default)s)",
    )
    parse.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of seconds (tiny sizes); the result file says quick",
    )
    parse.add_argument(
        "--results-dir",
        type=Path,
        default=LATEST,
        help="where the result file goes (default: bench/results/latest)",
    )
    return parse


def int_list(text):
    """Parse '1,2,4,8' into [1, 2, 4, 8]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("give positive integers, e.g. 1,2,4,8")
    return values


def apply_quick(args, parse, **sizes):
    """Under ``--quick``, set each option of ``sizes`` the command line left at
    its default to the quick size."""
    if not args.quick:
        return
    for name, value in sizes.items():
        if getattr(args, name) == parse.get_default(name):
            setattr(args, name, value)


def versions(*names):
    """The installed version of each named package (None when it is absent)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def progress(message):
    """Print one progress line at once (make bench shows them as they come)."""
    print(message, flush=True)


# --- The database ---------------------------------------------------------------


def create_database(url):
    """Create the database named by url when it is missing."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(sibling_url(url, name="postgres"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def prepare_database(url):
    """Create the benchmark database when missing and apply the migrations."""
    create_database(url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=django_env(url, SWITCHBOARD_STATEMENT_TIMEOUT_MS="0"),
        check=True,
    )


def secret_key():
    """The environment's SECRET_KEY, else `make`'s local one, else the bench's:
    a run by hand and a run by `make bench` then read each other's secrets."""
    local = ROOT / ".switchboard-secret-key"
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    if local.exists() and local.read_text().strip():
        return local.read_text().strip()
    return BENCH_SECRET_KEY


def django_env(url, **extra):
    """Return an environment that points Switchboard at the benchmark database."""
    env = dict(os.environ)
    env["SECRET_KEY"] = secret_key()
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="board.settings", **extra)
    return env


def setup_django(url):
    """Configure Django in this process against the benchmark database."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "board.settings"
    os.environ["SECRET_KEY"] = secret_key()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def manage(url, *command):
    """Run ``manage.py command`` on the benchmark database; return its stdout."""
    done = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=django_env(url),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def ensure_endpoint(url, name="bench"):
    """Create an endpoint granted every queue; return (endpoint_id, token)."""
    endpoint = json.loads(
        manage(
            url,
            *("create_endpoint", name, "--owner", "bench", "--queues", "*", "--json"),
        )
    )
    return endpoint["endpoint_id"], endpoint["token"]


# Tables whose autovacuum a benchmark holds off while it measures: (url, table).
_HELD_AUTOVACUUM: set[tuple[str, str]] | None = None


@contextlib.contextmanager
def autovacuum_held():
    """Hold autovacuum off on the tables the block's fills settle (see
    ``settle``), and give each back its own setting afterwards.

    A fill leaves its table vacuumed and analyzed, so a measured window of a
    few seconds needs no vacuum; an autovacuum worker that starts inside one
    adds its CPU to whichever path holds the turn, and PostgreSQL's CPU per
    todo for the same statements then swings twofold between windows."""
    global _HELD_AUTOVACUUM
    _HELD_AUTOVACUUM = set()
    try:
        yield
    finally:
        held, _HELD_AUTOVACUUM = _HELD_AUTOVACUUM, None
        for url, table in sorted(held):
            reset = sql.SQL("ALTER TABLE IF EXISTS {} RESET (autovacuum_enabled)")
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(url, autocommit=True) as conn,
            ):
                conn.execute(reset.format(sql.Identifier(table)))


def settle(conn, url, *tables):
    """VACUUM ANALYZE the freshly filled ``tables`` and checkpoint; inside
    ``autovacuum_held`` also hold their autovacuum off until it ends."""
    for table in tables:
        name = sql.Identifier(table)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(name))
        if _HELD_AUTOVACUUM is not None:
            conn.execute(
                sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(name)
            )
            _HELD_AUTOVACUUM.add((url, table))
    conn.execute("CHECKPOINT")


def reset_todos(url):
    """Empty the todos and their history, then checkpoint so runs start alike."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos, todo_events")
        conn.execute("CHECKPOINT")


FILL_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at)
SELECT gen_random_uuid(), %s, %s, 'bench ' || n, '{}'::jsonb, 'pending', 0,
       5, '', clock_timestamp(), now()
  FROM generate_series(1, %s) AS n
"""


def fill_pending(url, endpoint_id, count, queue=QUEUE):
    """Insert ``count`` pending todos in creation order, then analyze."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL_SQL, [endpoint_id, queue, count])
        settle(conn, url, "todos", "todo_events")


# --- The store's own SQL on a bare connection (the baseline) --------------------


def plain_step(url, endpoint_id, worker, lease_seconds=300):
    """Return a step that claims and completes one todo with the store's own two
    statements (``CLAIM_PLAIN_SQL``, the claim of a queue without admission
    controls, and the acknowledgement, bound by ``store.bind_claim`` and
    ``store.bind_acks``) on a bare psycopg connection."""
    setup_django(url)
    from todos import store
    from todos.store import lifecycle

    conn = psycopg.connect(url, autocommit=True)
    scope = store.Scope(endpoint_id)
    claim_params = store.bind_claim(scope, worker, lease_seconds=lease_seconds)

    def claim():
        return conn.execute(lifecycle.CLAIM_PLAIN_SQL, claim_params).fetchone()

    def complete(row):
        # id and lease_token (TODO_COLUMNS: lease_token is the 19th column)
        ack = store.Ack("complete", str(row[0]), worker=worker, lease_token=row[18])
        if conn.execute(*store.bind_acks(scope, [ack])).fetchone():
            return
        raise RuntimeError(f"complete matched no row: {row[0]}")

    return lambda: timed(claim, complete)


def timed(claim, complete, count=None):
    """Claim and complete; return the latencies (and todos done), None if no work."""
    start = time.perf_counter()
    claimed_todos = claim()
    claimed = time.perf_counter()
    if not claimed_todos:
        return None
    complete(claimed_todos)
    out = {"claim": claimed - start, "complete": time.perf_counter() - claimed}
    if count is not None:
        out["todos"] = count(claimed_todos)
    return out


def timed_http_step(port, token, worker, queue):
    """A step that claims and completes one todo of ``queue`` over the JSON
    API, timed as ``timed`` times it (None when there is no work)."""
    client = Client(port, token)

    def claim():
        status, body = client.request(
            "POST", "/api/v1/todos/claim", {"worker": worker, "queue": queue}
        )
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {body}")
        return body["todo"]

    def complete(todo):
        status, body = client.request(
            "POST",
            f"/api/v1/todos/{todo['id']}/complete",
            {"worker": worker, "lease_token": todo["lease_token"]},
        )
        if status != 200:
            raise RuntimeError(f"complete answered {status}: {body}")

    return lambda: timed(claim, complete)


# --- Worker processes -----------------------------------------------------------


def run_processes(target, count, seconds, args=(), on_start=None):
    """Run ``target(index, *args)`` in ``count`` processes; each returns a
    ``ready(stop_at)`` loop.

    Every process prepares first, then waits at a barrier; all start together
    and stop at the same deadline (``on_start()``, when given, is called in
    this process as they start). Returns what each loop returned, in the
    order of ``index`` (not the order they finished in).
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(count + 1)
    results = context.Queue()
    procs = [
        context.Process(
            target=_worker_main,
            args=(target, index, barrier, seconds, results, args),
            daemon=True,
        )
        for index in range(count)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    if on_start is not None:
        on_start()
    answers = dict(results.get(timeout=seconds + 120) for _ in procs)
    collected = [answers[index] for index in range(count)]
    for proc in procs:
        proc.join(timeout=30)
    failures = [item["error"] for item in collected if "error" in item]
    if failures:
        raise RuntimeError(f"{len(failures)} worker(s) failed: {failures[0]}")
    return collected


def _worker_main(target, index, barrier, seconds, results, args):
    try:
        ready = target(index, *args)
        barrier.wait(timeout=120)
        start = time.perf_counter()
        outcome = ready(start + seconds)
        outcome["elapsed"] = time.perf_counter() - start
        results.put((index, outcome))
    except BaseException as exc:  # reported to the parent, which raises it
        results.put((index, {"error": f"{type(exc).__name__}: {exc}"}))


def merge(outcomes):
    """Sum the counts and pool the latencies of several workers' outcomes."""
    done = sum(item["done"] for item in outcomes)
    elapsed = max(item["elapsed"] for item in outcomes)
    latencies = {}
    for item in outcomes:
        for name, values in item.get("latencies", {}).items():
            latencies.setdefault(name, []).extend(values)
    cpu = sum(item.get("cpu", 0.0) for item in outcomes)
    return {
        "done": done,
        "elapsed": elapsed,
        "rate": done / elapsed if elapsed else 0.0,
        "client_cpu_ms_per_todo": cpu / done * 1000 if done else None,
        "dry": sum(item.get("dry", 0) for item in outcomes),
        "latency_ms": {name: summary(values) for name, values in latencies.items()},
    }


def turn_of(names, slice_index):
    """Return the mode whose turn a slice is: a shuffle every process agrees on.

    Each round of slices holds each mode once, in an order drawn from the round
    number, so no periodic activity elsewhere on the machine can keep falling
    on the same mode.
    """
    order = list(names)
    random.Random(slice_index // len(names)).shuffle(order)
    return order[slice_index % len(names)]


def alternate(stop_at, slice_seconds, modes):
    """Run the steps of several modes in turns of ``slice_seconds`` until the deadline.

    ``modes`` maps a mode's name to its step: a callable that does one unit of
    work and returns {latency name: seconds} (plus "todos": how many, for a
    batch), or None when there was no work.
    The turn is chosen from the wall clock, so every worker process switches at
    the same moment: all modes see the same load on the machine, at the same
    number of workers, on the same database. Returns each mode's counts,
    latencies, CPU seconds and wall seconds.
    """
    names = list(modes)
    stats = {
        name: {"done": 0, "dry": 0, "cpu": 0.0, "seconds": 0.0, "latencies": {}}
        for name in names
    }
    while (started := time.perf_counter()) < stop_at:
        name = turn_of(names, int(time.time() / slice_seconds))
        mode = stats[name]
        cpu = time.process_time()
        timings = modes[name]()
        if timings is None:
            mode["dry"] += 1
            time.sleep(0.001)
        else:
            # A batch step says how many todos it did; a single step did one.
            mode["done"] += timings.pop("todos", 1)
            for key, seconds in timings.items():
                mode["latencies"].setdefault(key, []).append(seconds)
        mode["cpu"] += time.process_time() - cpu
        mode["seconds"] += time.perf_counter() - started
    return {"modes": stats}


def merge_modes(outcomes):
    """Merge the workers' outcomes of ``alternate``, mode by mode.

    A mode's rate is its work over the wall time it held the turn (the mean
    over the workers, which switch together).
    """
    merged = {}
    for name in outcomes[0]["modes"]:
        figures = merge(
            [{**item["modes"][name], "elapsed": item["elapsed"]} for item in outcomes]
        )
        held = statistics.fmean(item["modes"][name]["seconds"] for item in outcomes)
        figures["seconds"] = held
        figures["rate"] = figures["done"] / held if held else 0.0
        merged[name] = figures
    return merged


# --- Numbers --------------------------------------------------------------------


def percentile(values, fraction):
    """Return the nearest-rank percentile of a list of numbers."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(seconds_list):
    """Return p50, p99, mean and count in milliseconds."""
    return {
        "p50": percentile(seconds_list, 0.50) * 1000,
        "p99": percentile(seconds_list, 0.99) * 1000,
        "mean": statistics.fmean(seconds_list) * 1000 if seconds_list else None,
        "count": len(seconds_list),
    }


# --- The machine ----------------------------------------------------------------


def load_average():
    """The 1, 5 and 15-minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def cpu_times():
    """The machine's CPU times so far (``/proc/stat``'s first line), or None."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:9]
    except OSError:
        return None
    return [int(field) for field in fields]


def machine_share(before, after):
    """What the machine's CPUs did between two ``cpu_times()``: the busy,
    idle and stolen shares in percent. Steal is time the hypervisor gave to
    another guest while this one had work: on a shared machine it is the
    noise under every latency figure of the window."""
    if before is None or after is None:
        return {}
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent) or 1
    idle = spent[3] + spent[4]
    return {
        "busy_pct": round((total - idle - spent[7]) * 100 / total, 1),
        "idle_pct": round(idle * 100 / total, 1),
        "steal_pct": round(spent[7] * 100 / total, 1),
    }


def memory_gib():
    """The machine's memory (``/proc/meminfo``'s MemTotal) in GiB, or None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine(url):
    """Describe the machine and the server, so a result file says where it ran."""
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        commit = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "kernel": platform.release(),
        "postgresql": server.split()[0],
        "fsync": fsync,
        "synchronous_commit": commit,
        "python": platform.python_version(),
    }


# --- Output ---------------------------------------------------------------------


def print_table(title, headers, rows):
    """Print rows under headers, columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for number, row in enumerate(cells):
        print(
            "  ".join(
                value.rjust(width) for value, width in zip(row, widths, strict=True)
            )
        )
        if number == 0:
            print("  ".join("-" * width for width in widths))
    sys.stdout.flush()


def cell(value):
    """A figure as a table shows it: two decimals below 100, none above."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _measuring(argv):
    """The arguments that say what a run measured: without --results-dir
    (where its record went, which does not change what it measured)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--results-dir":
            skip = True
        elif not arg.startswith("--results-dir="):
            kept.append(arg)
    return kept


class Result:
    """A run's record: started before the measuring, written once it is done."""

    def __init__(self, name, args):
        self.name = name
        self.quick = bool(getattr(args, "quick", False))
        self.command = shlex.join(
            ["python", f"bench/{Path(sys.argv[0]).name}", *_measuring(sys.argv[1:])]
        )
        self.date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.load_before = load_average()
        self.url = args.database_url
        self.folder = args.results_dir

    def write(self, parameters, results, machine_url=None):
        """Write ``bench/results/latest/<name>.json``; return its path."""
        data = {
            "name": self.name,
            "command": self.command,
            "date": self.date,
            "quick": self.quick,
            "machine": machine(machine_url or self.url),
            "load_average": {"before": self.load_before, "after": load_average()},
            "parameters": parameters,
            "results": results,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.name}.json"
        text = json.dumps(data, indent=2, default=_json_default, allow_nan=False)
        path.write_text(text + "\n")
        print(f"\nresults: {path}", flush=True)
        return path


def _json_default(value):
    return str(value)


def rounded(value, digits=3):
    """Round every float in a nested structure (result files stay readable); a
    NaN becomes None (JSON has none)."""
    if isinstance(value, float):
        return None if value != value else round(value, digits)
    if isinstance(value, dict):
        return {key: rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item, digits) for item in value]
    return value


# --- The server -----------------------------------------------------------------


def free_port():
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _proc_stat(pid):
    """``/proc/<pid>/stat``'s fields after the command, or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid):
    """The pids of ``pid``'s live children, or none when it is gone."""
    try:
        return [
            int(child)
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except OSError:
        return []


def _cpu_ticks(pids):
    """The user+system clock ticks of the processes still running among ``pids``."""
    total = 0
    for pid in pids:
        fields = _proc_stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total


def _proc_comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


class Server:
    """A running gunicorn (and, if asked, the sweep loop): where it listens,
    its processes, and how much CPU they have used."""

    def __init__(self, port, pid, url, log_path):
        self.port, self.pid, self.url, self.log_path = port, pid, url, log_path

    def worker_pids(self):
        """The gunicorn workers: the master's children."""
        return _children(self.pid)

    def cpu_seconds(self):
        """Return the user+system CPU seconds of the master and its workers."""
        ticks = _cpu_ticks((self.pid, *self.worker_pids()))
        return ticks / os.sysconf("SC_CLK_TCK")

    def threads(self):
        """The workers' threads, together."""
        return sum(
            len(list(Path(f"/proc/{pid}/task").iterdir()))
            for pid in self.worker_pids()
            if Path(f"/proc/{pid}/task").exists()
        )


@contextlib.contextmanager
def serve(url, workers=None, sweep=False, port=None, app=None, **env):
    """Serve Switchboard as `make run` does (gunicorn with gunicorn.conf.py, and
    with ``sweep`` the sweep loop beside it) against ``url``, on ``port`` (a
    free one when None); ``app`` names another ASGI application to serve in
    gunicorn.conf.py's place (a profiling wrapper of it).

    ``workers`` sets GUNICORN_WORKERS (gunicorn.conf.py's default otherwise).
    The request log stays on, as in production, but goes to a file under
    bench/results/. Yields a Server once /healthz answers 200; stops it on exit.
    """
    port = port or free_port()
    if workers:
        env["GUNICORN_WORKERS"] = str(workers)
    commands = [
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
        + ["--bind", f"127.0.0.1:{port}"]
        + ([app] if app else [])
    ]
    if sweep:
        commands.append([sys.executable, "manage.py", "sweep", "--loop"])
    server_env = django_env(url, GUNICORN_LOG_LEVEL="warning", **env)
    with run_server(commands, port, server_env, url, "gunicorn") as server:
        yield server


@contextlib.contextmanager
def run_server(commands, port, env, url, log_name, cwd=ROOT):
    """Start ``commands`` in ``cwd``, the first a server that answers /healthz on
    ``port``, their output in bench/results/<log_name>-<port>.log. Yield a
    Server once it is healthy; stop them all on exit."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_path = RESULTS / f"{log_name}-{port}.log"
    with log_path.open("ab") as log:
        procs = [
            subprocess.Popen(
                command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            for command in commands
        ]
        try:
            wait_healthy(port, procs[0])
            yield Server(port, procs[0].pid, url, log_path)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def wait_healthy(port, process=None, timeout=60):
    """Wait until /healthz on ``port`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {process.returncode}")
        try:
            status, _ = Client(port, timeout=2).request("GET", "/healthz")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gunicorn on port {port} did not become healthy")


class PostgresCpu:
    """The CPU seconds of the PostgreSQL cluster at ``url``, when it runs on
    this machine: its postmaster's, its live children's (the backends and
    background processes) and its exited children's (reaped into the
    postmaster's cutime and cstime). ``available`` is False for a remote
    server, or one whose processes this user cannot read."""

    def __init__(self, url):
        with psycopg.connect(url, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            stat = _proc_stat(backend)
            local = stat is not None and _proc_comm(backend) == "postgres"
        parent = int(stat[1]) if stat else None
        self.pid = parent if local and _proc_comm(parent) == "postgres" else None
        self.available = self.pid is not None

    def cpu_seconds(self):
        """user+system CPU seconds so far, or None when not ``available``."""
        if self.pid is None:
            return None
        own = _proc_stat(self.pid)
        if own is None:
            return None
        reaped = int(own[13]) + int(own[14])  # cutime, cstime
        ticks = _cpu_ticks((self.pid, *_children(self.pid))) + reaped
        return ticks / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """The CPU seconds of ``server`` (a Server, or anything with a
    ``cpu_seconds()``: PostgresCpu) over a measurement window that opens
    ``warmup`` seconds after ``start()`` and lasts ``seconds`` (sampled by a
    thread)."""

    def __init__(self, server, warmup, seconds):
        self.server, self.warmup, self.seconds = server, warmup, seconds
        self.samples = []
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self):
        self.thread.start()

    def _sample(self):
        time.sleep(self.warmup)
        self.samples.append(self.server.cpu_seconds())
        time.sleep(self.seconds)
        self.samples.append(self.server.cpu_seconds())

    def used(self):
        """The CPU seconds of the window (after the processes have stopped),
        or None when the source could not say."""
        self.thread.join()
        if None in self.samples:
            return None
        return self.samples[1] - self.samples[0]


# Which gunicorn process serves a keep-alive connection is the kernel's choice
# at accept, kept for the connection's life: two clients' connections land on
# one process about half the time (measured: 2 clients, 2 processes), which
# halves what that server serves them. A client that keeps one connection for
# a whole window measures that draw, not the server; reopened every few
# hundred requests, a window averages many draws (a connect costs ~0.1 ms).
REOPEN_EVERY = 250


class Client:
    """A keep-alive JSON client of the agent API: one connection, reused,
    reopened every ``reopen_every`` requests (see REOPEN_EVERY)."""

    def __init__(
        self, port, token=None, timeout=30, headers=None, reopen_every=REOPEN_EVERY
    ):
        self.port = port
        self.timeout = timeout
        self.reopen_every = reopen_every
        self.sent = 0
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method, path, body=None, headers=None):
        """Send one request; return (status, decoded JSON body or None)."""
        payload = None if body is None else json.dumps(body)
        sent = {**self.headers, **(headers or {})}
        self.sent += 1
        if self.reopen_every and self.sent % self.reopen_every == 0:
            self.conn.close()  # the next request connects afresh
        try:
            self.conn.request(method, path, body=payload, headers=sent)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            # A dropped keep-alive connection: the next request reconnects.
            self.conn.close()
            raise
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        return response.status, data
