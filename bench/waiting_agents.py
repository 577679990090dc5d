"""Waiting agents: do thousands of waiting agents slow down everyone else?

Question: with thousands of agents waiting for work at once (long polls, event
streams, MCP streams and waiting MCP claims), do creates, the Board and the
health check stay fast, does a create still wake its waiter at once, and how
many PostgreSQL connections and threads does the server hold?

    python bench/waiting_agents.py
    python bench/waiting_agents.py --long-polls 2000 --sse 1000 --mcp 500 \
        --mcp-claims 500 --mcp-listen 500 --seconds 20

It starts what `make run` starts (gunicorn with gunicorn.conf.py,
GUNICORN_WORKERS=2, and `manage.py sweep --loop`) on the benchmark database,
then measures for ``--seconds``, once with no waiters and once with the
waiters open:

- create: ``POST /api/v1/todos`` latency (and timeouts, at 10 s);
- overview: the Board's ``GET /board/`` (a logged-in operator);
- healthz: ``GET /healthz``;
- wake: a create, to the moment a long poll waiting on that queue returns it;
- long polls past their deadline: each waiter's long poll that found nothing,
  from its ``wait_seconds`` (``--poll-wait``) after it was sent to its answer
  (p50, p99, max over the run: every one should be answered within 1 s);
- PostgreSQL connections of the server's processes (the most seen);
- the machine's CPUs over the measurement (``/proc/stat``): busy, idle and
  stolen by the hypervisor, the noise under every figure on a shared machine;
- the server workers' threads.

The waiters come from a separate process (asyncio, raw sockets): long polls
(``wait_seconds`` 20, or ``--poll-wait``, re-polled at once), ``/api/v1/events``
streams and MCP GET streams (each after its ``initialize``), MCP ``claim_next`` calls
(``wait_seconds`` 20, called again at once) and MCP 2026-07-28
``subscriptions/listen`` streams, over 50 endpoints (a tenth of the streams on
the probes' endpoint, so each create rings them). Each probe runs in a process
of its own, as independent clients do.

It prints each figure with no waiters and with them, side by side. Result:
bench/results/latest/waiting_agents.json (`python bench/report.py`).
"""

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib
import psycopg

ROOT = benchlib.ROOT
APP_NAME = "sb-bench-waiters"
LOAD_ENDPOINTS = 50
TIMEOUT = 10.0


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def server_url(url):
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}application_name={APP_NAME}"


# --- Seeding (in a child process, with Django) ---------------------------------


def seed(url):
    """Create the endpoints and an operator session; print them as JSON."""
    benchlib.setup_django(url)
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from todos.models import Endpoint

    stamp = int(time.time())
    owner, _ = get_user_model().objects.get_or_create(username="bench-waiters")
    # Each run starts from its own endpoints only: the operator sees every
    # endpoint, and those of earlier runs would grow its overview run by run.
    # (The run empties the todos anyway; emptied first, the delete is quick.)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos, todo_events")
    Endpoint.objects.filter(owner=owner).delete()
    made = []
    for number in range(LOAD_ENDPOINTS + 2):
        # The model's own token minting: the old serving's code has no
        # todos.access.endpoints yet.
        endpoint = Endpoint(
            name=f"bench-waiters-{stamp}-{number}", owner=owner, queues=["*"]
        )
        token = endpoint.set_new_token()
        endpoint.save()
        made.append({"id": str(endpoint.id), "token": token})
    user, _ = get_user_model().objects.get_or_create(username="bench-operator")
    user.is_staff = True
    user.set_password("bench-operator-password")
    user.save()
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    print(
        json.dumps(
            {
                "probe": made[0],
                "throughput": made[1],
                "load": made[2:],
                "session": session.session_key,
            }
        )
    )


def seeded(url):
    done = subprocess.run(
        [sys.executable, __file__, "--seed", url],
        cwd=ROOT,
        env=benchlib.django_env(url),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- Probes (plain blocking HTTP, a process per kind) ---------------------------


class Probe:
    """A client of one kind of call: a new connection per call (as a webhook
    sender), or with ``keep_alive`` one connection kept (as an HTTP session)."""

    def __init__(self, port, headers, keep_alive=False):
        self.port, self.headers, self.keep_alive = port, headers, keep_alive
        self.conn = None

    def call(self, method, path, body=None, timeout=TIMEOUT):
        """Return (status, body bytes, seconds); status 0 on a timeout or error.

        Without ``keep_alive`` the connection is the call's own, so threads
        may share the probe (the wake probe's claim and create)."""
        for _ in range(2):
            conn, self.conn = self.conn, None
            reused = conn is not None
            if not reused:
                conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=timeout
                )
            started = time.monotonic()
            try:
                conn.request(
                    method,
                    path,
                    None if body is None else json.dumps(body),
                    {"Content-Type": "application/json", **self.headers},
                )
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                if reused and time.monotonic() - started < 1:
                    continue  # The server closed the idle connection: a new one.
                return 0, b"", time.monotonic() - started
            if self.keep_alive:
                self.conn = conn
            else:
                conn.close()
            return response.status, raw, time.monotonic() - started


def loop_probe(seconds, step, every=0):
    """Call ``step()`` for ``seconds``: 20 ms after each answer, or (``every``)
    one call starting every that many seconds. Return its latencies and fails."""
    latencies, failures = [], 0
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        ok, elapsed = step()
        latencies.append(elapsed)
        failures += not ok
        started += every
        time.sleep(max(0.02, started - time.monotonic()))
    return latencies, failures


def wake_probe(api, seconds):
    """Wait on a queue of its own, create there, time create -> claimed."""
    latencies, failures = [], 0
    deadline = time.monotonic() + seconds
    number = 0
    while time.monotonic() < deadline:
        number += 1
        queue = f"wake-{number}"
        answer = {}

        def claim(queue=queue, answer=answer):
            answer["status"], answer["raw"], _ = api.call(
                "POST",
                "/api/v1/todos/claim",
                {"worker": "wake-probe", "queue": queue, "wait_seconds": 10},
                timeout=15,
            )
            answer["at"] = time.monotonic()

        waiter = threading.Thread(target=claim)
        waiter.start()
        time.sleep(0.3)
        status, raw, _ = api.call("POST", "/api/v1/todos", {"queue": queue})
        created_at = time.monotonic()
        waiter.join(timeout=20)
        if status == 201 and answer.get("status") == 200:
            latencies.append(answer["at"] - created_at)
        else:
            failures += 1
            latencies.append(TIMEOUT)
    return latencies, failures


def count_connections(url):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [APP_NAME],
        ).fetchone()[0]


PROBES = ("create", "overview", "healthz", "wake")


def run_probe(kind, port, seeds, seconds, overview_every=0, keep_alive=False):
    """One probe's latencies and failures (in a process of its own)."""
    token = {"Authorization": f"Bearer {seeds['probe']['token']}"}
    if kind == "wake":
        # Two threads, a call each: a connection per call.
        return wake_probe(Probe(port, token), seconds)
    api = Probe(port, token, keep_alive)
    if kind == "create":
        probe, method, path, body, ok = (
            api,
            "POST",
            "/api/v1/todos",
            {"queue": "create-probe", "title": "probe"},
            201,
        )
    elif kind == "overview":
        board = Probe(port, {"Cookie": f"sessionid={seeds['session']}"}, keep_alive)
        probe, method, path, body, ok = board, "GET", "/board/", None, 200
    else:
        health = Probe(port, {}, keep_alive)
        probe, method, path, body, ok = health, "GET", "/healthz", None, 200

    def step():
        status, _, elapsed = probe.call(method, path, body)
        return status == ok, elapsed

    return loop_probe(seconds, step, overview_every if kind == "overview" else 0)


def measure(serving, seeds, seconds, probes=PROBES, overview_every=0, keep_alive=False):
    """Run the probes all at once for ``seconds``; return their figures.

    Each probe is a process of its own, as independent clients are: as
    threads of one interpreter, one probe's parsing (the overview's 70 kB)
    held the others' clocks behind its GIL.
    """
    connections = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            connections.append(count_connections(serving.url))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(probes)) as pool:
        calls = {
            kind: pool.apply_async(
                run_probe,
                (kind, serving.port, seeds, seconds, overview_every, keep_alive),
            )
            for kind in PROBES
            if kind in probes
        }
        results = {kind: call.get() for kind, call in calls.items()}
    stop.set()
    watcher.join()
    figures = {}
    for kind, (latencies, failures) in results.items():
        figures[kind] = {
            "n": len(latencies),
            "failed": failures,
            "p50_ms": round(benchlib.percentile(latencies, 0.50) * 1000, 1),
            "p99_ms": round(benchlib.percentile(latencies, 0.99) * 1000, 1),
        }
    figures["pg_connections_max"] = max(connections) if connections else None
    return figures


# --- The waiters (a process of their own) -----------------------------------------


async def read_head(reader):
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed")
    status = int(line.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def read_body(reader, headers):
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    raise ConnectionError("no length")


def request_bytes(method, path, token, body=None, extra=""):
    payload = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{extra}\r\n"
    )
    return head.encode() + payload


# A 2026-07-28 subscriptions/listen of the probes' queue: no session, the
# protocol version and capabilities in _meta and mirrored in the headers.
LISTEN = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "subscriptions/listen",
    "params": {
        "notifications": {"resourceSubscriptions": ["switchboard://queues/idle"]},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    },
}
LISTEN_HEADERS = (
    "Accept: application/json, text/event-stream\r\n"
    "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\n"
)


class Load:
    def __init__(self, port, spec):
        self.port, self.spec = port, spec
        self.stats = {"polls_waiting": 0, "polls_answered": 0, "sse_open": 0}
        self.stats.update(mcp_open=0, mcp_claims_waiting=0, mcp_listen=0, errors=0)
        # Seconds past its deadline at which each long poll that ran out was
        # answered (its queue never gets a todo).
        self.late = []

    def lateness(self):
        """The long polls past their deadline: count, p50, p99 and max (ms)."""
        if not self.late:
            return {}
        return {
            "polls_late_n": len(self.late),
            "polls_late_p50_ms": round(benchlib.percentile(self.late, 0.5) * 1000, 1),
            "polls_late_p99_ms": round(benchlib.percentile(self.late, 0.99) * 1000, 1),
            "polls_late_max_ms": round(max(self.late) * 1000, 1),
        }

    async def long_poll(self, token, delay):
        wait = self.spec["poll_wait"]
        body = {"worker": "idle", "queue": "idle", "wait_seconds": wait}
        await asyncio.sleep(delay)
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                while True:
                    writer.write(
                        request_bytes("POST", "/api/v1/todos/claim", token, body)
                    )
                    deadline = time.monotonic() + wait
                    self.stats["polls_waiting"] += 1
                    try:
                        status, headers = await read_head(reader)
                        await read_body(reader, headers)
                    finally:
                        self.stats["polls_waiting"] -= 1
                    self.stats["polls_answered"] += 1
                    if status == 404:  # it waited its seconds out
                        self.late.append(time.monotonic() - deadline)
                    if status not in (200, 404):
                        self.stats["errors"] += 1
                        await asyncio.sleep(1)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                self.stats["errors"] += 1
                await asyncio.sleep(1)

    async def mcp_claim(self, token, delay):
        """An MCP agent waiting in ``claim_next`` (20 s), called again at once."""
        await asyncio.sleep(delay)
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "claim_next",
                "arguments": {"queue": "idle", "wait_seconds": 20},
            },
        }
        while True:
            try:
                session = await self.mcp_session(token)
                extra = (
                    "Accept: application/json, text/event-stream\r\n"
                    f"Mcp-Session-Id: {session}\r\n"
                )
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                while True:
                    writer.write(request_bytes("POST", "/mcp", token, call, extra))
                    self.stats["mcp_claims_waiting"] += 1
                    try:
                        status, headers = await read_head(reader)
                        await read_body(reader, headers)
                    finally:
                        self.stats["mcp_claims_waiting"] -= 1
                    if status != 200:
                        raise ConnectionError(status)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                self.stats["errors"] += 1
                await asyncio.sleep(1)

    async def stream(self, token, kind, delay):
        await asyncio.sleep(delay)
        while True:
            try:
                headers, method, body = "", "GET", None
                if kind == "mcp_listen":
                    method, body, headers = "POST", LISTEN, LISTEN_HEADERS
                    path = "/mcp"
                elif kind == "mcp_open":
                    session = await self.mcp_session(token)
                    headers = (
                        f"Accept: text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                    )
                    path = "/mcp"
                else:
                    path = "/api/v1/events"
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(request_bytes(method, path, token, body, headers))
                status, _ = await read_head(reader)
                if status != 200:
                    raise ConnectionError(status)
                self.stats[kind] += 1
                try:
                    while await reader.read(65536):
                        pass
                finally:
                    self.stats[kind] -= 1
                writer.close()
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                self.stats["errors"] += 1
            await asyncio.sleep(1)

    async def mcp_session(self, token):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "clientInfo": {"name": "b"}},
        }
        writer.write(
            request_bytes(
                "POST",
                "/mcp",
                token,
                message,
                "Accept: application/json, text/event-stream\r\n",
            )
        )
        status, headers = await read_head(reader)
        await read_body(reader, headers)
        writer.close()
        if status != 200:
            raise ConnectionError(status)
        return headers["mcp-session-id"]

    async def run(self):
        spec = self.spec
        tasks, load, probe = [], spec["load"], spec["probe"]
        plan = [("poll", load[i % len(load)]["token"]) for i in range(spec["polls"])]
        for i in range(spec["sse"]):
            owner = probe if i % 10 == 0 else load[i % len(load)]
            plan.append(("sse_open", owner["token"]))
        for i in range(spec["mcp"]):
            owner = probe if i % 10 == 0 else load[i % len(load)]
            plan.append(("mcp_open", owner["token"]))
        for i in range(spec["mcp_claims"]):
            plan.append(("mcp_claim", load[i % len(load)]["token"]))
        for i in range(spec["mcp_listen"]):
            owner = probe if i % 10 == 0 else load[i % len(load)]
            plan.append(("mcp_listen", owner["token"]))
        # Agents do not all start in the same second: each waiter starts at a
        # random moment of the spread (the long polls and the streams alike).
        spread = random.Random(12)
        for kind, token in plan:
            delay = spread.uniform(0, spec["spread"])
            if kind == "poll":
                tasks.append(asyncio.create_task(self.long_poll(token, delay)))
            elif kind == "mcp_claim":
                tasks.append(asyncio.create_task(self.mcp_claim(token, delay)))
            else:
                tasks.append(asyncio.create_task(self.stream(token, kind, delay)))
        while True:
            print(json.dumps({**self.stats, **self.lateness()}), flush=True)
            await asyncio.sleep(1)


def load_main(port, spec_path):
    raise_fd_limit()
    spec = json.loads(Path(spec_path).read_text())
    asyncio.run(Load(port, spec).run())


class LoadProcess:
    """The waiters' process; ``stats`` is its latest report."""

    def __init__(self, port, seeds, args):
        spec = {
            **seeds,
            "polls": args.long_polls,
            "sse": args.sse,
            "mcp": args.mcp,
            "mcp_claims": args.mcp_claims,
            "mcp_listen": args.mcp_listen,
            "spread": args.spread,
            "poll_wait": args.poll_wait,
        }
        handle, self.spec_path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(handle, "w") as spec_file:
            json.dump(spec, spec_file)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--load", str(port), self.spec_path],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.stats = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.stats = json.loads(line)

    def wait_open(self, args):
        """Wait until every waiter is open (or ``--ramp`` s); return the stats."""
        deadline = time.monotonic() + args.ramp
        while time.monotonic() < deadline:
            stats = self.stats
            if (
                stats.get("polls_waiting", 0) >= args.long_polls * 0.99
                and stats.get("sse_open", 0) >= args.sse
                and stats.get("mcp_open", 0) >= args.mcp
                and stats.get("mcp_claims_waiting", 0) >= args.mcp_claims * 0.99
                and stats.get("mcp_listen", 0) >= args.mcp_listen
            ):
                break
            time.sleep(0.5)
        time.sleep(2)
        return dict(self.stats)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.spec_path)


# --- The run ---------------------------------------------------------------------


def measure_serving(url, args):
    """Serve, seed, probe with no waiters, open the waiters, probe again."""
    seeds = seeded(url)
    result = {}
    serving = benchlib.serve(
        server_url(url), workers=2, sweep=True, port=args.port, LOG_LEVEL="WARNING"
    )
    with serving as server:
        server.url = url

        def probe(window):
            """Run the probes as the arguments say, with the machine's share."""
            times = benchlib.cpu_times()
            result[window] = measure(
                server,
                seeds,
                args.seconds,
                args.probes,
                args.overview_every,
                args.keep_alive,
            )
            result[window]["machine"] = benchlib.machine_share(
                times, benchlib.cpu_times()
            )

        benchlib.reset_todos(url)
        probe("idle")
        benchlib.progress(f"  no waiters: {result['idle']}")
        result["worker_threads_idle"] = server.threads()
        load = LoadProcess(server.port, seeds, args)
        try:
            opened = load.wait_open(args)
            result["waiters_open"] = opened
            result["worker_threads_loaded"] = server.threads()
            benchlib.progress(f"  waiters: {opened}")
            probe("loaded")
            result["waiters_after"] = dict(load.stats)
            benchlib.progress(f"  with waiters: {result['loaded']}")
        finally:
            load.stop()
    return result


WAITER_KINDS = ("polls_waiting", "sse_open", "mcp_open", "mcp_claims_waiting")
WAITER_KINDS += ("mcp_listen",)
POLLS_LATE = ("polls_late_n", "polls_late_p50_ms", "polls_late_p99_ms")
POLLS_LATE += ("polls_late_max_ms",)


def side_by_side(result, probes):
    """The figures, each with no waiters and with them: the table's rows."""
    rows = []
    for kind, unit in (
        ("create", "p99_ms"),
        ("create", "failed"),
        ("overview", "p99_ms"),
        ("healthz", "p99_ms"),
        ("wake", "p99_ms"),
        ("wake", "failed"),
    ):
        if kind in probes and kind in result["idle"]:
            idle, loaded = result["idle"][kind][unit], result["loaded"][kind][unit]
            rows.append([f"{kind} {unit}", idle, loaded])
    rows.append(
        [
            "PostgreSQL connections (max)",
            result["idle"]["pg_connections_max"],
            result["loaded"]["pg_connections_max"],
        ]
    )
    for key in ("busy_pct", "steal_pct"):
        rows.append(
            [f"machine CPU {key.removesuffix('_pct')} %"]
            + [result[w].get("machine", {}).get(key) for w in ("idle", "loaded")]
        )
    rows.append(
        [
            "server worker threads",
            result.get("worker_threads_idle"),
            result.get("worker_threads_loaded"),
        ]
    )
    for key in WAITER_KINDS:
        rows.append([f"waiters open: {key}", "", result["waiters_open"].get(key)])
    for key in POLLS_LATE:
        rows.append(
            [f"long polls past deadline: {key}", "", result["waiters_after"].get(key)]
        )
    return rows


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument("--long-polls", type=int, default=2000, help="(2000)")
    parse.add_argument("--sse", type=int, default=1000, help="event streams (1000)")
    parse.add_argument("--mcp", type=int, default=500, help="MCP GET streams (500)")
    parse.add_argument(
        "--mcp-claims", type=int, default=500, help="waiting MCP claim_next (500)"
    )
    parse.add_argument(
        "--mcp-listen",
        type=int,
        default=500,
        help="MCP 2026-07-28 subscriptions/listen streams (500)",
    )
    parse.add_argument(
        "--seconds", type=float, default=20, help="seconds per measurement (20)"
    )
    parse.add_argument(
        "--port", type=int, default=0, help="the server's port (0: any free)"
    )
    parse.add_argument(
        "--poll-wait",
        type=int,
        default=20,
        help="the waiters' long polls' wait_seconds (20)",
    )
    parse.add_argument("--ramp", type=float, default=60, help="seconds to open them")
    parse.add_argument(
        "--spread",
        type=float,
        default=20,
        help="seconds over which the waiters start, polls and streams (0: at once)",
    )
    parse.add_argument(
        "--probes",
        type=lambda text: tuple(text.split(",")),
        default=PROBES,
        help="which probes run at once (default: all of create,overview,healthz,wake)",
    )
    parse.add_argument(
        "--overview-every",
        type=float,
        default=0,
        metavar="SECONDS",
        help="start a Board overview every SECONDS (0, the default: back to back, "
        "20 ms after each answer). An open Board reloads its overview every 10 s: "
        "0.2 stands for 50 open Boards",
    )
    parse.add_argument(
        "--keep-alive",
        action="store_true",
        help="the create, overview and /healthz probes keep one connection each, "
        "as an HTTP session does (default: a new connection per call; the wake "
        "probe always opens one per call)",
    )
    parse.add_argument("--seed", nargs=1, help=argparse.SUPPRESS)
    parse.add_argument("--load", nargs=2, help=argparse.SUPPRESS)
    args = parse.parse_args()
    if args.seed:
        return seed(*args.seed)
    if args.load:
        return load_main(int(args.load[0]), args.load[1])
    benchlib.apply_quick(
        args,
        parse,
        long_polls=40,
        sse=20,
        mcp=10,
        mcp_claims=10,
        mcp_listen=10,
        seconds=2.0,
        ramp=15.0,
        spread=1.0,
        poll_wait=2,
    )

    result = benchlib.Result("waiting_agents", args)
    limit = raise_fd_limit()
    url = args.database_url
    benchlib.prepare_database(url)
    benchlib.progress(
        f"waiting agents: {args.long_polls} long polls, {args.sse} SSE, {args.mcp} "
        f"MCP GET, {args.mcp_claims} MCP claim_next, {args.mcp_listen} MCP listen"
    )
    figures = measure_serving(url, args)
    benchlib.print_table(
        f"{args.long_polls} long polls + {args.sse} SSE + {args.mcp} MCP GET streams"
        f" + {args.mcp_claims} MCP claim_next + {args.mcp_listen} MCP listen streams,"
        f" {args.seconds:g} s per measurement",
        ["figure", "no waiters", "waiters"],
        side_by_side(figures, args.probes),
    )
    result.write(
        {
            "long_polls": args.long_polls,
            "sse": args.sse,
            "mcp": args.mcp,
            "mcp_claims": args.mcp_claims,
            "mcp_listen": args.mcp_listen,
            "poll_wait": args.poll_wait,
            "seconds": args.seconds,
            "probes": list(args.probes),
            "server_workers": 2,
            "fd_limit": limit,
        },
        benchlib.rounded(figures),
    )


if __name__ == "__main__":
    main()
