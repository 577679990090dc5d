"""What several test modules share: the repo's paths, free ports, the test
database as a URL for child processes, a gunicorn launcher, and small helpers
for management commands. Fixtures live in the conftest.py files; plain
functions live here (``from tests.support import free_port``).
"""

import contextlib
import datetime
import http.server
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import psycopg
from django.core.management import call_command
from django.db import connection
from django.http import HttpResponse
from django.test.client import AsyncRequestFactory

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    """A TCP port nothing listens on (yet): for servers, or for a closed database."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(port=None, application_name=None):
    """The test database as a DATABASE_URL (on another port: an outage)."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    url = (
        f"postgres://{credentials}@{db['HOST'] or '127.0.0.1'}"
        f":{port or db['PORT'] or 5432}/{quote(db['NAME'], safe='')}"
    )
    if application_name:
        url += f"?application_name={application_name}"
    return url


def child_env(database=None, **extra):
    """The environment of a child process on the test database (or `database`)."""
    return {**os.environ, "DATABASE_URL": database or database_url(), **extra}


def start_gunicorn(
    database,
    port=None,
    workers=1,
    log=None,
    log_level="warning",
    access_log=False,
    **env,
):
    """Start gunicorn (the project's config) on ``port`` (default a free one);
    return (process, port).

    One worker (uvicorn's event loop) unless told, keep-alives every second, a
    one-second database connect timeout (an outage is answered quickly). With
    ``log`` (an open file), everything the server writes goes there, and
    with ``access_log`` a line for each request too.
    """
    port = port or free_port()
    access = ["--access-logfile", "-"] if access_log else []
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--log-level",
            log_level,
            *access,
        ],
        cwd=ROOT,
        env=child_env(
            database,
            SWITCHBOARD_SSE_KEEPALIVE_SECONDS="1",
            SWITCHBOARD_DB_CONNECT_TIMEOUT="1",
            **env,
        ),
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else None,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("gunicorn did not start") from None
            time.sleep(0.1)


def stop(process, signum=signal.SIGTERM):
    """Stop a child process; kill it if it has not exited within ten seconds."""
    process.send_signal(signum)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve_gunicorn(django_db_blocker, database=None):
    """Yield the URL of a gunicorn on the test database (for module fixtures)."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database or database_url())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def command_output(*args, **options):
    """Run a management command in process; return what it printed."""
    out = StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def load_resilience_script(module_name):
    """Import scripts/resilience.py (a script, not a package) as module_name.

    Skip the calling test when there are no PostgreSQL server binaries for the
    throwaway cluster the script starts.
    """
    import pytest

    found = subprocess.run(
        [str(ROOT / "scripts" / "devdb.sh"), "bindir"], capture_output=True
    )
    if found.returncode != 0:
        pytest.skip("no PostgreSQL server binaries to start a throwaway cluster")
    script = ROOT / "scripts" / "resilience.py"
    spec = importlib.util.spec_from_file_location(module_name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InProcessServer:
    """uvicorn serving board.serving.asgi in a thread of the test process, as a gunicorn
    worker serves it (one event loop with the doorbell hub and the async pool in
    it), so a test sees the server's hub and may change the settings it reads.
    ``answer`` hands the application a request in that loop without the socket
    (``ServedClient``). A process has one (its hub is the module's): ``current``."""

    current = None

    def __init__(self):
        import asyncio

        import uvicorn

        from board.serving.asgi import application
        from todos.db import pool
        from todos.waiting import longpoll
        from todos.waiting.doorbell import hub

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                application,
                host="127.0.0.1",
                port=self.port,
                lifespan="off",
                log_level="warning",
                http="httptools",
                timeout_graceful_shutdown=2,
            )
        )

        async def serve():
            self.loop = asyncio.get_running_loop()
            hub.start()
            try:
                await self.server.serve()
            finally:
                await longpoll.finish_outliving(timeout=5)
                await hub.stop()
                await pool.close()

        self.thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not (self.server.started and hub.connected):
            assert time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.02)
        InProcessServer.current = self

    def run(self, coroutine, timeout=60):
        """Run ``coroutine`` in the server's loop; return its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def in_loop(self, fn, *args):
        """Call ``fn`` in the server's loop (the hub is touched only there)."""

        async def call():
            return fn(*args)

        return self.run(call())

    def answer(self, scope, body):
        """board.serving.asgi's answer to one request, handed over as uvicorn
        hands it: the body, then a disconnect once the response is sent."""
        return self.run(_exchange(scope, body))

    def settle(self, timeout=10.0):
        """Wait until the server serves no request and no claim outlives its
        client (a stopped worker's long poll: its try, then the hand-back of
        what it claimed): before a test's rows are emptied, which such a claim
        would deadlock with or write after. Return what still ran at the
        timeout, as text (empty when settled)."""
        from todos.waiting import longpoll

        async def busy():
            return len(self.server.server_state.tasks), longpoll.outliving()

        deadline = time.monotonic() + timeout
        while True:
            requests, outliving = self.run(busy(), timeout)
            if not (requests or outliving) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if not (requests or outliving):
            return ""
        return f"{requests} request(s), {outliving} claim(s) of gone clients"

    def stop(self):
        from todos.waiting.doorbell import hub

        # As a worker stops: the waiters end at once, then the server.
        hub.loop.call_soon_threadsafe(hub.shutdown)
        self.server.should_exit = True
        self.thread.join(timeout=10)
        InProcessServer.current = None


async def _exchange(scope, body):
    import asyncio

    from board.serving.asgi import application

    sent = asyncio.Event()
    request = [{"type": "http.request", "body": body, "more_body": False}]
    start, chunks = {}, []

    async def receive():
        if request:
            return request.pop()
        await sent.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            start.update(message)
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            sent.set()

    await application(scope, receive, send)
    response = ServedResponse(b"".join(chunks), status=start["status"])
    del response["Content-Type"]
    for name, value in start["headers"]:
        if name.lower() == b"set-cookie":
            response.cookies.load(value.decode("latin-1"))
        else:
            response[name.decode("latin-1")] = value.decode("latin-1")
    return response


class ServedResponse(HttpResponse):
    """A served answer, read as Django's test client's responses are."""

    def json(self):
        return json.loads(self.content)


class ServedClient(AsyncRequestFactory):
    """Django's test client's calls (``get``, ``post``, ... with ``headers``),
    answered by the served application (``InProcessServer.answer``), not by
    Django's test handler: the agent surfaces' async views run in the server's
    loop on the async pool, the sync views in its threads. The rows they read
    must be committed (the ``committed`` fixture). Headers may be given as
    Django's test client takes them, ``HTTP_AUTHORIZATION=...`` too."""

    def __init__(self, server=None, **defaults):
        super().__init__(**defaults)
        self.server = server or InProcessServer.current
        assert self.server, "no in-process server: use the asgi_server fixture"

    def generic(self, method, path, data="", content_type=None, *args, **extra):
        headers = {**(extra.pop("headers", None) or {})}
        for key in [key for key in extra if key.startswith("HTTP_")]:
            headers[key.removeprefix("HTTP_").replace("_", "-")] = extra.pop(key)
        content_type = content_type or "application/octet-stream"
        return super().generic(
            method, path, data, content_type, *args, headers=headers, **extra
        )

    def request(self, **request):
        payload = request.pop("_body_file", None)
        query = request.get("query_string", "")
        scope = {
            **self._base_scope(**request),
            "root_path": "",
            "raw_path": request["path"].encode(),
            "query_string": query.encode() if isinstance(query, str) else query,
        }
        hosts = [header for header in scope["headers"] if header[0] == b"host"]
        if len(hosts) > 1:  # a Host given replaces the factory's
            scope["headers"].remove(hosts[0])
        response = self.server.answer(scope, payload.read() if payload else b"")
        self.cookies.update(response.cookies)
        return response


def empty_tables():
    """Delete the rows a test committed, from every table but the migrations'
    records and Django's content types and permissions. DELETE, not Django's
    flush: its TRUNCATE makes and fsyncs a new file for each table, a second
    a test."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename NOT IN"
            " ('django_migrations', 'django_content_type', 'auth_permission')"
        )
        tables = [table for (table,) in cursor.fetchall()]
        # One transaction: the foreign keys are checked at its commit.
        cursor.execute(
            "BEGIN; SET LOCAL synchronous_commit = off; "
            + "".join(f'DELETE FROM "{table}"; ' for table in tables)
            + "COMMIT"
        )


@contextlib.contextmanager
def claims_held_back(application_name=None):
    """Hold every claim statement where it starts until the block ends: a
    SHARE lock on the history table, which a claim appends to, held by a
    transaction of its own. Yields a check that one claim waits (of the
    server's connections named ``application_name``, else of any)."""
    with psycopg.connect(database_url(), autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE todo_events IN SHARE MODE")

        def one_waits():
            # Not on the holder: a transaction reads the statistics once.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    " AND (%s::text IS NULL OR application_name = %s::text)",
                    [application_name, application_name],
                )
                return cursor.fetchone()[0] == 1

        yield one_waits
        holder.execute("COMMIT")


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hits += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"type": "string"}')

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def counting_server():
    """A server the server under test must never call: it answers any GET with
    a JSON schema and counts them. Yields it, with ``.url`` and ``.hits``."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _CountingHandler)
    server.hits = 0
    server.url = f"http://127.0.0.1:{server.server_port}/schema.json"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class DatabaseClock:
    """PostgreSQL's ``now()`` at a time the test sets, for the connections that
    ask for it: a schema whose ``now()`` reads a one-row table, put before
    ``pg_catalog`` on the search path. The store's statements name ``now()``
    unqualified, so they read this clock; column defaults and
    ``clock_timestamp()`` still read the real one.

    ``install`` makes it (in the test's transaction, or committed for a
    transactional test); ``use`` turns it on for Django's connection;
    ``serve`` for the served path's too; ``database_url`` is a child
    process's, on the clock; ``remove`` drops it.
    """

    served = False

    SCHEMA = "switchboard_test_clock"

    def install(self, at):
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {self.SCHEMA}")
            cursor.execute(f"CREATE TABLE {self.SCHEMA}.clock (at timestamptz)")
            cursor.execute(f"INSERT INTO {self.SCHEMA}.clock VALUES (%s)", [at])
            cursor.execute(
                f"CREATE FUNCTION {self.SCHEMA}.now() RETURNS timestamptz"
                f" LANGUAGE sql STABLE AS 'SELECT at FROM {self.SCHEMA}.clock'"
            )
        return self

    @property
    def search_path(self):
        return f"{self.SCHEMA}, pg_catalog, public"

    def database_url(self, application_name):
        """The test database as a child's DATABASE_URL, on this clock."""
        options = quote(f"-c search_path={self.SCHEMA},pg_catalog,public")
        return f"{database_url(application_name=application_name)}&options={options}"

    def use(self):
        with connection.cursor() as cursor:
            cursor.execute(f"SET search_path = {self.search_path}")
        return self

    def serve(self):
        """Put the in-process server's connections on the clock: the test
        database's new connections start on it, and the pools' are replaced."""
        self._database_search_path(f"SET search_path = {self.search_path}")
        self.served = True
        return self

    def _database_search_path(self, setting):
        from todos.db import pool

        with connection.cursor() as cursor:
            cursor.execute("SELECT current_database()")
            (name,) = cursor.fetchone()
            cursor.execute(f'ALTER DATABASE "{name}" {setting}')
        InProcessServer.current.run(pool.close())
        connection.close_pool()

    def set(self, at):
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {self.SCHEMA}.clock SET at = %s", [at])

    def advance(self, **delta):
        """Move the clock on by timedelta's keywords (seconds=…, hours=…)."""
        self.set(self.now() + datetime.timedelta(**delta))

    def now(self):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT at FROM {self.SCHEMA}.clock")
            return cursor.fetchone()[0]

    def remove(self):
        if self.served:
            self._database_search_path("RESET search_path")
        with connection.cursor() as cursor:
            cursor.execute("RESET search_path")
            cursor.execute(f"DROP SCHEMA IF EXISTS {self.SCHEMA} CASCADE")


# --- Schedules: the exactly-once checker ------------------------------------------


def slot_violations(expected):
    """Replay the history: every expected (schedule name, slot) has exactly one
    todo, and no todo names a slot not expected. Return the violations."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT actor FROM todo_events"
            " WHERE from_state IS NULL AND actor LIKE 'schedule %%'"
        )
        return slot_violations_in(expected, [actor for (actor,) in cursor.fetchall()])


def slot_violations_in(expected, actors):
    """``slot_violations`` over the creating events' actors, read elsewhere
    (from a cluster the test's connection is not on)."""
    made = Counter(actors)
    violations = []
    for name, slot in sorted(expected):
        actor = f"schedule {name}, slot {slot.isoformat().replace('+00:00', 'Z')}"
        count = made.pop(actor, 0)
        if count != 1:
            violations.append((actor, count))
    violations.extend(made.items())
    return violations


def expected_slots(schedules, start, end):
    """Every slot of each schedule in (start, end]."""
    out = set()
    for schedule in schedules:
        for slot in schedule.recurrence.slots_after(start):
            if slot > end:
                break
            out.add((schedule.name, slot))
    return out


def wait_until_nothing_due(timeout=30):
    """Wait until the sweeps have fired every slot due on the clock."""
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM schedules WHERE next_slot_at <= now()")
            if cursor.fetchone()[0] == 0:
                return
        assert time.monotonic() < deadline, "the sweeps left slots due"
        time.sleep(0.02)


def exhausted_budget(scope, queue):
    """A reject_new daily budget of $1 on ``queue``, spent to its limit:
    the next create there is refused with budget_exhausted. Returns it."""
    from todos import store

    budget = store.create_budget(
        scope,
        scope="queue",
        queue=queue,
        window="day",
        limit_usd=1,
        action="reject_new",
    )
    store.report_usage(scope, queue=queue, usage={"cost_usd": 1})
    return budget


def due_redeliveries(scope, todos, count, rng, time_travel, worker="w1"):
    """Claim up to ``count`` of ``todos`` (chosen by ``rng``) and leave each a due
    redelivery: its lease lapsed, or failed with its retry due."""
    from todos import store

    for todo in rng.sample(todos, count):
        try:
            claimed = store.claim_todo(scope, todo.id, todo.assignee or worker)
        except (store.Conflict, store.NotFound):
            continue
        if rng.random() < 0.5:
            time_travel(claimed.id, lease_expires_at=-900)
        else:
            store.fail_todo(scope, claimed.id, claimed.owner, error="x")
            time_travel(claimed.id, next_retry_at=-900)


def deadlocked(call, holds, params):
    """Run ``call`` into a real deadlock; return {"returned": ...} or {"raised": ...}.

    ``call`` runs in a thread whose connection first takes an advisory lock.
    A second connection holds what ``call`` needs (``holds``, a locking
    statement, with ``params``); once ``call`` waits for it, the holder asks
    for the advisory lock: a lock cycle. ``call`` waited first, so its
    deadlock check finds the cycle (after deadlock_timeout) and PostgreSQL
    stops its statement; the holder then takes the lock and rolls back.
    """
    from django.db import connections

    params_of = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params_of.pop(key, None)
    bait = "SELECT pg_advisory_lock(%s)"
    key = 715_517  # any number no other lock of the suite uses
    outcome = {}

    def run():
        try:
            with connection.cursor() as cursor:
                cursor.execute(bait, [key])
            outcome["returned"] = call()
        except Exception as exc:  # noqa: BLE001 - the caller asserts on it
            outcome["raised"] = exc
        finally:
            # A pooled connection must not keep the session's lock.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock_all()")
            connection.close()

    thread = threading.Thread(target=run)
    with (
        psycopg.connect(**params_of) as holder,
        psycopg.connect(autocommit=True, **params_of) as watch,
    ):
        holder.execute(holds, params)
        thread.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE %s = ANY(pg_blocking_pids(pid))"
        )
        deadline = time.monotonic() + 10
        while watch.execute(waiting, [holder.info.backend_pid]).fetchone()[0] == 0:
            assert time.monotonic() < deadline, "the call never waited"
            time.sleep(0.01)
        # The call waited first: its deadlock check finds the cycle.
        holder.execute(bait, [key])
        holder.rollback()
        thread.join(timeout=10)
    assert not thread.is_alive(), "the call never ended"
    return outcome


# A statement that holds a todo's row, as a holder for ``deadlocked``.
LOCK_TODO = "SELECT 1 FROM todos WHERE id = %s FOR UPDATE"


def deadlocked_heartbeat(scope, worker="w1"):
    """Return a claimed todo of ``scope`` and what its heartbeat raised when
    PostgreSQL stopped it to break a lock cycle: a real store.Deadlocked."""
    from todos import store

    todo, _ = store.create_todo(scope, queue="q", title="t")
    store.claim_todo(scope, todo.id, worker)
    outcome = deadlocked(
        lambda: store.heartbeat(scope, todo.id, worker), LOCK_TODO, [todo.id]
    )
    return todo, outcome["raised"]
