"""What every benchmark shares: its own database, worker processes, tables, JSON.

Each benchmark runs Switchboard's code and its baseline (a plain psycopg loop
running the same SQL on the same database) in the same run, so the ratio holds
on any machine. The benchmarks use their own database (``switchboard_bench`` on
the project-local cluster unless ``--database-url`` says otherwise), create it
when missing, migrate it with ``manage.py migrate`` and empty its todos before
each measurement. They never touch another database.
"""

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_URL = "postgres://postgres@127.0.0.1:{port}/switchboard_bench"
QUEUE = "bench"


def default_url():
    """Return the benchmark database: BENCH_DATABASE_URL, or switchboard_bench on
    the server DATABASE_URL names, or on the project-local cluster."""
    if os.environ.get("BENCH_DATABASE_URL"):
        return os.environ["BENCH_DATABASE_URL"]
    if os.environ.get("DATABASE_URL"):
        parts = urlsplit(os.environ["DATABASE_URL"])
        return urlunsplit(parts._replace(path="/switchboard_bench"))
    return DEFAULT_URL.format(port=os.environ.get("SB_PG_PORT", "54329"))


def parser(description):
    """Return an argument parser with the options every benchmark takes."""
    parse = argparse.ArgumentParser(description=description)
    parse.add_argument(
        "--database-url",
        default=default_url(),
        help="the benchmark's own database; created and migrated when missing",
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


# --- The database ---------------------------------------------------------------


def create_database(url):
    """Create the database named by url when it is missing."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
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
        env=django_env(url),
        check=True,
    )


def django_env(url, **extra):
    """Return an environment that points Switchboard at the benchmark database."""
    env = dict(os.environ)
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="board.settings", **extra)
    return env


def setup_django(url):
    """Configure Django in this process against the benchmark database."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "board.settings"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def ensure_endpoint(url, name="bench"):
    """Create an endpoint granted every queue; return (endpoint_id, token)."""
    created = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "create_endpoint",
            name,
            "--owner",
            "bench",
            "--queues",
            "*",
            "--json",
        ],
        cwd=ROOT,
        env=django_env(url),
        check=True,
        capture_output=True,
        text=True,
    )
    endpoint = json.loads(created.stdout)
    return endpoint["endpoint_id"], endpoint["token"]


def reset_todos(url):
    """Empty the todos and their history, then checkpoint so runs start alike."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos, todo_events")
        conn.execute("CHECKPOINT")


def fill_pending(url, endpoint_id, count, queue=QUEUE):
    """Insert ``count`` pending todos in creation order, then analyze."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                               max_attempts, last_error, created_at, updated_at)
            SELECT gen_random_uuid(), %s, %s, 'bench ' || n, '{}'::jsonb, 'pending', 0,
                   5, '', clock_timestamp(), now()
              FROM generate_series(1, %s) AS n
            """,
            [endpoint_id, queue, count],
        )
        conn.execute("VACUUM ANALYZE todos")
        conn.execute("CHECKPOINT")


def count_states(url):
    """Return {state: count} of the todos table."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT state, count(*) FROM todos GROUP BY state"
        ).fetchall()
    return dict(rows)


# --- Worker processes -----------------------------------------------------------


def run_processes(target, count, seconds, args=(), on_start=None):
    """Run ``target(index, start, stop_at, *args)`` in ``count`` processes.

    Every process connects first, then waits at a barrier; all start together
    and stop at the same deadline (``on_start()``, when given, is called in
    this process as they start). Returns the list of what each target returned.
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
    collected = [results.get(timeout=seconds + 120) for _ in procs]
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
        results.put(outcome)
    except BaseException as exc:  # reported to the parent, which raises it
        results.put({"error": f"{type(exc).__name__}: {exc}"})


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


def busy_seconds(before, after):
    """The CPU seconds the whole machine was busy between two ``cpu_times()``
    (every process: servers, clients, PostgreSQL), or None."""
    if before is None or after is None:
        return None
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return (sum(spent) - spent[3] - spent[4] - spent[7]) / os.sysconf("SC_CLK_TCK")


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
        "client_cpu_ms_per_todo": cpu / done * 1000 if done else float("nan"),
        "dry": sum(item.get("dry", 0) for item in outcomes),
        "latency_ms": {name: summary(values) for name, values in latencies.items()},
    }


# --- Numbers and reports --------------------------------------------------------


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
        "mean": statistics.fmean(seconds_list) * 1000 if seconds_list else float("nan"),
        "count": len(seconds_list),
    }


def machine(url):
    """Describe the machine and the server, so a result file says where it ran."""
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        commit = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": server,
        "fsync": fsync,
        "synchronous_commit": commit,
    }


def print_table(title, headers, rows):
    """Print rows under headers, columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
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


def _cell(value):
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_results(name, data):
    """Write a benchmark's results as JSON under bench/results/ and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    if "machine" in data:
        data["machine"]["loadavg_at_end"] = list(os.getloadavg())
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    return path


def turn_of(names, slice_index):
    """Return the mode whose turn a slice is: a shuffle every process agrees on.

    Each pair of slices holds each mode once, in an order drawn from the slice
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
    names = list(outcomes[0]["modes"])
    merged = {}
    for name in names:
        figures = merge(
            [{**item["modes"][name], "elapsed": item["elapsed"]} for item in outcomes]
        )
        held = statistics.fmean(item["modes"][name]["seconds"] for item in outcomes)
        figures["seconds"] = held
        figures["rate"] = figures["done"] / held if held else 0.0
        merged[name] = figures
    return merged


# --- The HTTP API under gunicorn ------------------------------------------------


@contextlib.contextmanager
def before_tree(ref):
    """A `git worktree` of ``ref`` (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="sb-bench-before-"))
    path.rmdir()
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)],
            cwd=ROOT,
            capture_output=True,
        )


def free_port():
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def gunicorn(url, port=None, root=None, **env):
    """Serve Switchboard with gunicorn (gunicorn.conf.py) against ``url``.

    ``root`` is the tree whose code it serves (this checkout by default; a
    ``before_tree`` for the previous design).

    Yields a Server (its port, and the CPU its processes used) once /healthz
    answers 200; stops the server on exit.
    """
    port = port or free_port()
    RESULTS.mkdir(parents=True, exist_ok=True)
    # The request log stays on, as in production, but goes to a file.
    log = (RESULTS / f"gunicorn-{port}.log").open("ab")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        cwd=root or ROOT,
        env=django_env(url, GUNICORN_LOG_LEVEL="warning", **env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(port, server)
        yield Server(port, server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


class Server:
    """A running gunicorn: where it listens, and how much CPU it has used."""

    def __init__(self, port, pid):
        self.port = port
        self.pid = pid

    def cpu_seconds(self):
        """Return the user+system CPU seconds of the master and its workers."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(stat.parent.name), int(fields[1])
            if self.pid in (pid, ppid):
                total += int(fields[11]) + int(fields[12])
        return total / tick


def wait_healthy(port, server=None, timeout=30):
    """Wait until /healthz on ``port`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {server.returncode}")
        try:
            status, _ = Client(port, timeout=2).request("GET", "/healthz")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gunicorn on port {port} did not become healthy")


class Client:
    """A keep-alive JSON client of the agent API (one connection, reused)."""

    def __init__(self, port, token=None, timeout=30):
        self.port = port
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method, path, body=None):
        """Send one request; return (status, decoded JSON body or None)."""
        payload = None if body is None else json.dumps(body)
        try:
            self.conn.request(method, path, body=payload, headers=self.headers)
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
