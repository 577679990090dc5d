"""Waiting agents cost nothing (issue #12), against the real serving: gunicorn
with the project's config (uvicorn workers, board.serving.asgi) on the test database.

Long polls, event streams and MCP GET streams hold no database connection while
they wait (counted in pg_stat_activity), wake on create, reaper requeue and due
retry, never across endpoints, end when their endpoint is revoked, re-keyed or
re-granted, and end on SIGTERM well inside gunicorn's graceful timeout.
"""

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.support import ROOT, database_url, free_port
from todos import store
from todos.access import endpoints
from todos.models import Endpoint, McpSession
from todos.store import admission

APP_NAME = "sb-waiters-test-server"
POOL_MAX = 4
# The async pool of the agent surfaces' async views (todos/db/pool.py).
ASYNC_POOL_MAX = 2
# A process's connections: both pools and one LISTEN.
BUDGET = POOL_MAX + ASYNC_POOL_MAX + 1

pytestmark = pytest.mark.django_db(transaction=True)


class Server:
    def __init__(self, process, port):
        self.process = process
        self.port = port


def start_server(**env):
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url(application_name=APP_NAME),
            "DJANGO_SETTINGS_MODULE": "board.settings",
            "GUNICORN_WORKERS": "1",
            "LOG_LEVEL": "WARNING",
            "SWITCHBOARD_DB_POOL_MAX": str(POOL_MAX),
            "SWITCHBOARD_DB_POOL_MIN": "1",
            "SWITCHBOARD_DB_ASYNC_POOL_MAX": str(ASYNC_POOL_MAX),
            "SWITCHBOARD_SSE_KEEPALIVE_SECONDS": "1",
            # A ring, not the periodic re-check, must be what wakes the waiters.
            "SWITCHBOARD_LONG_POLL_RECHECK_SECONDS": "600",
            **env,
        },
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return Server(process, port)
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.1)


def stop_server(server):
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        started = start_server()
    yield started
    stop_server(started)


def server_connections():
    """The server process's PostgreSQL backends: (total, active or in a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'idle'"
            " AND query NOT LIKE 'LISTEN%%')"
            " FROM pg_stat_activity WHERE application_name = %s",
            [APP_NAME],
        )
        return cursor.fetchone()


def request(server, method, path, token, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(
            method,
            path,
            json.dumps(body) if body is not None else None,
            {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        return response.status, response.msg, response.read()
    finally:
        conn.close()


class LongPoll(threading.Thread):
    """A waiting claim on a thread of its own; .status/.body once answered."""

    def __init__(self, server, token, **body):
        super().__init__(daemon=True)
        self.server, self.token = server, token
        self.body = {"worker": "w", "wait_seconds": 10, **body}
        self.status = self.answer = self.answered_at = None
        # Answered before this, it was woken (or ended), not timed out.
        self.deadline = time.monotonic() + self.body["wait_seconds"]
        self.start()

    def run(self):
        self.status, _, raw = request(
            self.server, "POST", "/api/v1/todos/claim", self.token, self.body
        )
        self.answer = json.loads(raw)
        self.answered_at = time.monotonic()


class McpCall(threading.Thread):
    """A waiting MCP ``tools/call`` on a thread of its own; .answer once answered."""

    def __init__(self, server, token, session_id, name, arguments):
        super().__init__(daemon=True)
        self.server, self.token, self.session_id = server, token, session_id
        self.name, self.arguments = name, arguments
        self.status = self.answer = None
        self.start()

    def run(self):
        message = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": self.name, "arguments": self.arguments},
        }
        self.status, _, raw = request(
            self.server,
            "POST",
            "/mcp",
            self.token,
            message,
            headers={
                "Accept": "application/json, text/event-stream",
                "Mcp-Session-Id": self.session_id,
            },
        )
        self.answer = json.loads(raw)


class Stream:
    """An open event stream (SSE, an MCP GET or a POSTed subscriptions/listen),
    read line by line."""

    def __init__(self, server, path, headers, method="GET", body=None):
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines += [
                "Content-Type: application/json",
                f"Content-Length: {len(payload)}",
            ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            head += chunk
        head, _, self.data = head.partition(b"\r\n\r\n")
        self.status = int(head.split()[1])
        self.ended_at = None

    def read_until(self, text, seconds=5):
        """Read until ``text`` arrived or the stream ended; return what came."""
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while text.encode() not in self.data and time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                self.ended_at = time.monotonic()
                break
            self.data += chunk
        return self.data.decode(errors="replace")

    def ends_within(self, seconds):
        """Say whether the server ends the stream (chunked terminator or EOF)."""
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.data += chunk
            if not chunk or self.data.endswith(b"\r\n0\r\n\r\n"):
                self.ended_at = time.monotonic()
                return True
        return False

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.close()


def sse(server, endpoint):
    stream = Stream(
        server, "/api/v1/events", {"Authorization": f"Bearer {endpoint.token}"}
    )
    assert stream.status == 200
    assert ": connected" in stream.read_until(": connected")
    return stream


def mcp_session(server, endpoint):
    status, headers, _ = request(
        server,
        "POST",
        "/mcp",
        endpoint.token,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "clientInfo": {"name": "t"}},
        },
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert status == 200
    return headers["Mcp-Session-Id"]


def mcp_stream(server, endpoint, session_id=None):
    session_id = session_id or mcp_session(server, endpoint)
    stream = Stream(
        server,
        "/mcp",
        {
            "Authorization": f"Bearer {endpoint.token}",
            "Accept": "text/event-stream",
            "Mcp-Session-Id": session_id,
        },
    )
    assert stream.status == 200
    assert ": connected" in stream.read_until(": connected")
    return stream


def mcp_listen(server, endpoint, queue="q"):
    """A 2026-07-28 subscriptions/listen stream of one queue, acknowledged."""
    version = "2026-07-28"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscriptions/listen",
        "params": {
            "notifications": {
                "resourceSubscriptions": [f"switchboard://queues/{queue}"]
            },
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    headers = {
        "Authorization": f"Bearer {endpoint.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
        "Mcp-Method": "subscriptions/listen",
    }
    stream = Stream(server, "/mcp", headers, method="POST", body=body)
    assert stream.status == 200
    assert "acknowledged" in stream.read_until("acknowledged")
    return stream


def wait_until(predicate, seconds=5, message="condition never held"):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def warm_up(server, endpoints):
    """Start what starts on first use: the async pool (long polls, served in
    the loop) and the bounded database threads (sync requests, served in
    them, more at once than there are threads)."""
    warm = [LongPoll(server, e.token, wait_seconds=1) for e in endpoints for _ in "ab"]
    sync = [
        threading.Thread(target=request, args=(server, "GET", "/healthz", None))
        for _ in range(2 * POOL_MAX)
    ]
    for thread in sync:
        thread.start()
    for thread in [*warm, *sync]:
        thread.join(timeout=15)


def settle(seconds=0.5):
    """Let the server register the waiters just opened."""
    time.sleep(seconds)


# --- No connection, no thread while waiting -------------------------------------


def test_waiters_hold_no_database_connection_while_waiting(server, make_endpoint):
    """50 long polls, 20 event streams, 10 MCP GET streams and 10 MCP
    subscriptions/listen streams on one process with pools of 4 and 2: PostgreSQL
    sees at most the pools and one LISTEN, none of them busy."""
    endpoints = [make_endpoint(f"agent-{i}") for i in range(5)]
    polls = [
        LongPoll(server, endpoints[i % 5].token, wait_seconds=15) for i in range(50)
    ]
    streams = [sse(server, endpoints[i % 5]) for i in range(20)]
    streams += [mcp_stream(server, endpoints[i % 5]) for i in range(10)]
    streams += [mcp_listen(server, endpoints[i % 5]) for i in range(10)]
    settle(1.5)
    try:
        total, busy = server_connections()
        assert total <= BUDGET, total
        assert busy == 0
        assert all(poll.status is None for poll in polls)
        # And the waiters still wake: one todo per endpoint, five claims.
        for endpoint in endpoints:
            store.create_todo(store.Scope.for_endpoint(endpoint), queue="q")
        wait_until(lambda: sum(poll.status == 200 for poll in polls) == 5)
        settle(0.3)
        assert sum(poll.status == 200 for poll in polls) == 5
    finally:
        for stream in streams:
            stream.close()


def worker_threads(server):
    """The number of threads of the server's (one) worker process."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    (worker,) = children.read_text().split()
    return len(list(Path(f"/proc/{worker}/task").iterdir()))


def test_waiters_park_no_thread(server, make_endpoint):
    """A hundred waiting long polls and streams, and forty waiting MCP
    claim_next calls: the worker's thread count stays put (its database
    threads are bounded by SWITCHBOARD_DB_THREADS). Defect: each waiting MCP
    claim_next held a thread of its own."""
    endpoints = [make_endpoint(f"threads-{i}") for i in range(4)]
    # Warm up: the bounded database threads start on first use.
    warm_up(server, endpoints)
    before = worker_threads(server)
    polls = [
        LongPoll(server, endpoints[i % 4].token, wait_seconds=5) for i in range(80)
    ]
    streams = [sse(server, endpoints[i % 4]) for i in range(10)]
    streams += [mcp_stream(server, endpoints[i % 4]) for i in range(10)]
    streams += [mcp_listen(server, endpoints[i % 4]) for i in range(10)]
    sessions = [mcp_session(server, e) for e in endpoints]
    claims = [
        McpCall(
            server,
            endpoints[i % 4].token,
            sessions[i % 4],
            "claim_next",
            {"queue": "idle", "wait_seconds": 5},
        )
        for i in range(40)
    ]
    settle(1.5)
    try:
        assert all(poll.status is None for poll in polls)
        assert all(claim.status is None for claim in claims)
        assert worker_threads(server) <= before + 2
    finally:
        for stream in streams:
            stream.close()


def test_waiting_mcp_result_waits_hold_no_thread_and_no_connection(
    server, make_endpoint
):
    """Forty MCP wait_for_todo calls waiting on pending todos: the worker's
    thread count stays put, PostgreSQL sees at most the pools and one LISTEN,
    none busy; and a completed todo wakes its wait at once."""
    endpoints = [make_endpoint(f"results-{i}") for i in range(4)]
    scopes = [store.Scope.for_endpoint(e) for e in endpoints]
    sessions = [mcp_session(server, e) for e in endpoints]
    # Warm up the bounded database threads before the todos exist.
    warm_up(server, endpoints)
    todos = [store.create_todo(scopes[i % 4], queue="q")[0] for i in range(40)]
    before = worker_threads(server)
    waits = [
        McpCall(
            server,
            endpoints[i % 4].token,
            sessions[i % 4],
            "wait_for_todo",
            {"todo_id": todo.id, "wait_seconds": 15},
        )
        for i, todo in enumerate(todos)
    ]
    settle(1.5)
    assert all(wait.status is None for wait in waits)
    assert worker_threads(server) <= before + 2
    total, busy = server_connections()
    assert total <= BUDGET, total
    assert busy == 0
    store.claim_todo(scopes[0], todos[0].id, "w")
    store.complete_todo(scopes[0], todos[0].id, "w")
    wait_until(lambda: waits[0].status == 200, seconds=3)
    result = waits[0].answer["result"]["structuredContent"]["todo"]
    assert result["outcome"] == "done"
    assert sum(wait.status is not None for wait in waits) == 1


class ResultWait(threading.Thread):
    """A JSON API ``GET /api/v1/todos/<id>?wait_seconds=N`` on its own thread."""

    def __init__(self, server, token, todo_id, wait_seconds):
        super().__init__(daemon=True)
        self.server, self.token = server, token
        self.path = f"/api/v1/todos/{todo_id}?wait_seconds={wait_seconds}"
        self.status = self.answer = None
        self.start()

    def run(self):
        self.status, _, raw = request(self.server, "GET", self.path, self.token)
        self.answer = json.loads(raw)


def test_waiting_api_result_waits_hold_no_thread_and_no_connection(
    server, make_endpoint
):
    """Forty JSON API result waits (``GET /api/v1/todos/<id>?wait_seconds``) on
    pending todos: the worker's thread count stays put and PostgreSQL sees at
    most the pools and one LISTEN, none busy; a completed todo answers its wait
    at once. Defect: the path was served in the bounded thread pool, so each
    wait held a thread and forty of them starved every other request."""
    endpoints = [make_endpoint(f"api-results-{i}") for i in range(4)]
    scopes = [store.Scope.for_endpoint(e) for e in endpoints]
    warm_up(server, endpoints)
    todos = [store.create_todo(scopes[i % 4], queue="q")[0] for i in range(40)]
    before = worker_threads(server)
    waits = [
        ResultWait(server, endpoints[i % 4].token, todo.id, 15)
        for i, todo in enumerate(todos)
    ]
    settle(1.5)
    assert all(wait.status is None for wait in waits)
    assert worker_threads(server) <= before + 2
    total, busy = server_connections()
    assert total <= BUDGET, total
    assert busy == 0
    status, _, _ = request(server, "GET", "/healthz", endpoints[0].token, timeout=5)
    assert status == 200
    store.claim_todo(scopes[0], todos[0].id, "w")
    store.complete_todo(scopes[0], todos[0].id, "w")
    wait_until(lambda: waits[0].status == 200, seconds=3)
    assert waits[0].answer["todo"]["outcome"] == "done"
    assert sum(wait.status is not None for wait in waits) == 1


# --- Wakeups ---------------------------------------------------------------------


def test_a_waiting_claim_wakes_on_create(server, endpoint, scope):
    poll = LongPoll(server, endpoint.token)
    settle()
    todo, _ = store.create_todo(scope, queue="q")
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    assert poll.answered_at < poll.deadline


def test_one_ring_wakes_one_of_many_waiting_claims(server, endpoint, scope):
    polls = [LongPoll(server, endpoint.token, wait_seconds=3) for _ in range(10)]
    settle()
    todo, _ = store.create_todo(scope, queue="q")
    for poll in polls:
        poll.join(timeout=15)
    claimed = [poll for poll in polls if poll.status == 200]
    assert [poll.answer["todo"]["id"] for poll in claimed] == [todo.id]
    assert all(poll.status == 404 for poll in polls if poll not in claimed)


def test_a_waiting_claim_wakes_on_the_reapers_requeue(server, endpoint, scope):
    """SPEC: Crashed worker's todo is re-claimable (the reaper rings)."""
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "crashed", lease_seconds=60)
    poll = LongPoll(server, endpoint.token)
    settle()
    assert poll.status is None
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 minute'"
            " WHERE id = %s",
            [todo.id],
        )
    assert [t.id for t in store.reap_expired()] == [todo.id]
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    assert poll.answered_at < poll.deadline


def test_a_waiting_claim_wakes_on_a_due_retry(server, endpoint, scope):
    """SPEC: Failed todo is retried with backoff (the retry sweep rings)."""
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w0")
    store.fail_todo(scope, todo.id, "w0", error="flaky")
    poll = LongPoll(server, endpoint.token)
    settle()
    assert poll.status is None
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET next_retry_at = now() - interval '1 second'"
            " WHERE id = %s",
            [todo.id],
        )
    assert [t.id for t in store.requeue_due_retries()] == [todo.id]
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    assert poll.answered_at < poll.deadline


def test_a_waiting_claim_takes_a_lease_that_lapses_during_its_wait(
    server, endpoint, scope
):
    """SPEC: Crashed worker's todo is re-claimable: a lease that lapses while a
    claim waits wakes it at that instant, as a new todo would, with no sweep
    and no periodic re-check (off here)."""
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "crashed", lease_seconds=1)
    poll = LongPoll(server, endpoint.token)
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    assert poll.answer["todo"]["attempt"] == 2
    assert poll.answered_at < poll.deadline - 7  # about 1 s of its 10


def test_a_waiting_claim_takes_a_delayed_todo_when_it_comes_due(
    server, endpoint, scope
):
    todo, _ = store.create_todo(scope, queue="q", delay_seconds=1)
    poll = LongPoll(server, endpoint.token)
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    assert poll.answered_at < poll.deadline - 7


def test_a_waiting_mcp_claim_next_takes_a_lease_that_lapses_during_its_wait(
    server, endpoint, scope
):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "crashed", lease_seconds=1)
    started = time.monotonic()
    call = McpCall(
        server,
        endpoint.token,
        mcp_session(server, endpoint),
        "claim_next",
        {"queue": "q", "wait_seconds": 10},
    )
    call.join(timeout=15)
    assert time.monotonic() - started < 3
    assert call.answer["result"]["structuredContent"]["todo"]["id"] == todo.id


def test_a_waiting_mcp_claim_next_wakes_when_a_groups_limit_is_raised(
    server, endpoint, scope
):
    """CONTRACT §17 Waking: a raised limit rings, so a waiting claim_next takes
    the group's todo at once, not at its timer (the periodic re-check is off)."""
    admission.set_group(scope, "q", "g", concurrency=0)
    todo, _ = store.create_todo(scope, queue="q", group="g")
    call = McpCall(
        server,
        endpoint.token,
        mcp_session(server, endpoint),
        "claim_next",
        {"queue": "q", "wait_seconds": 10},
    )
    settle()
    assert call.answer is None
    raised = time.monotonic()
    admission.set_group(scope, "q", "g", concurrency=1)
    call.join(timeout=15)
    assert time.monotonic() - raised < 2
    assert call.answer["result"]["structuredContent"]["todo"]["id"] == todo.id


def test_b_waiter_is_never_woken_by_a_todo_of_a(
    server, endpoint, other_endpoint, make_endpoint
):
    """SPEC: Doorbell never crosses endpoints (nor the queue grant)."""
    narrow = make_endpoint("narrow", queues=("a",))
    theirs = LongPoll(server, other_endpoint.token, wait_seconds=2)
    narrow_poll = LongPoll(server, narrow.token, wait_seconds=2)
    stream = sse(server, other_endpoint)
    settle()
    try:
        store.create_todo(store.Scope.for_endpoint(endpoint), queue="a")
        store.create_todo_any_endpoint(str(narrow.id), queue="b")
        theirs.join(timeout=15)
        narrow_poll.join(timeout=15)
        assert theirs.status == 404 and narrow_poll.status == 404
        assert "todo.ready" not in stream.read_until("todo.ready", seconds=0.5)
    finally:
        stream.close()


def test_sse_and_mcp_streams_hear_a_ring_at_once(server, endpoint, scope):
    events, mcp = sse(server, endpoint), mcp_stream(server, endpoint)
    listen = mcp_listen(server, endpoint)
    settle()
    try:
        todo, _ = store.create_todo(scope, queue="q")
        assert todo.id in events.read_until(todo.id, seconds=1)
        assert todo.id in mcp.read_until(todo.id, seconds=1)
        updated = "notifications/resources/updated"
        assert updated in listen.read_until(updated, seconds=1)
    finally:
        events.close()
        mcp.close()
        listen.close()


# --- Streams end when the endpoint's access changes (#11) -----------------------


# Through the endpoint lifecycle (todos/access/endpoints.py), as the CLI and the
# Board do.
def revoke(endpoint):
    endpoints.revoke(Endpoint.objects.get(pk=endpoint.pk))


def rotate(endpoint):
    endpoints.rotate_token(Endpoint.objects.get(pk=endpoint.pk))


def narrow(endpoint):
    endpoints.set_grant(Endpoint.objects.get(pk=endpoint.pk), ["only-this"])


CHANGES = {"revoke": revoke, "rotate": rotate, "narrow": narrow}


@pytest.mark.parametrize("change", CHANGES)
def test_events_stream_ends_when_access_changes(server, endpoint, scope, change):
    stream = sse(server, endpoint)
    settle()
    try:
        CHANGES[change](endpoint)
        assert stream.ends_within(2)
        assert "token or grant changed" in stream.data.decode()
        # Nothing was delivered after the change: the todo is not announced.
        todo, _ = store.create_todo_any_endpoint(str(endpoint.id), queue="q")
        assert todo.id not in stream.data.decode()
    finally:
        stream.close()


@pytest.mark.parametrize("change", CHANGES)
def test_mcp_stream_ends_when_access_changes(server, endpoint, change):
    session_id = mcp_session(server, endpoint)
    stream = mcp_stream(server, endpoint, session_id)
    settle()
    try:
        CHANGES[change](endpoint)
        assert stream.ends_within(2)
    finally:
        stream.close()


def test_revoke_ends_the_endpoints_mcp_sessions(server, endpoint, other_endpoint):
    mine, theirs = mcp_session(server, endpoint), mcp_session(server, other_endpoint)
    revoke(endpoint)
    assert not McpSession.objects.filter(pk=mine).exists()
    assert McpSession.objects.filter(pk=theirs).exists()


def test_a_deleted_mcp_session_ends_its_stream_at_once(server, endpoint):
    session_id = mcp_session(server, endpoint)
    stream = mcp_stream(server, endpoint, session_id)
    settle()
    try:
        status, _, _ = request(
            server,
            "DELETE",
            "/mcp",
            endpoint.token,
            headers={"Mcp-Session-Id": session_id},
        )
        assert status == 204
        assert stream.ends_within(1.5)
    finally:
        stream.close()


def test_a_waiting_claim_of_a_revoked_endpoint_ends_with_401(server, endpoint):
    poll = LongPoll(server, endpoint.token)
    settle()
    revoke(endpoint)
    poll.join(timeout=15)
    assert poll.status == 401
    assert poll.answered_at < poll.deadline


def test_a_waiting_claim_follows_a_narrowed_grant(server, endpoint):
    poll = LongPoll(server, endpoint.token, wait_seconds=3)
    settle()
    narrow(endpoint)
    settle()
    # A todo in a queue the grant no longer covers is not handed out.
    store.create_todo_any_endpoint(str(endpoint.id), queue="q")
    poll.join(timeout=15)
    assert poll.status == 404


# --- The hub's LISTEN connection ----------------------------------------------


def test_waiters_recheck_when_the_listen_connection_comes_back(server, endpoint, scope):
    """The hub reconnects after its backend is killed (as a PostgreSQL restart
    does); a todo created while nobody listened is found by the re-check."""
    poll = LongPoll(server, endpoint.token, wait_seconds=15)
    settle()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            [APP_NAME],
        )
        assert cursor.rowcount == 1
    todo, _ = store.create_todo(scope, queue="q")
    poll.join(timeout=15)
    assert poll.status == 200 and poll.answer["todo"]["id"] == todo.id
    # And rings are heard again afterwards.
    wait_until(lambda: server_connections()[0] >= 1)
    second = LongPoll(server, endpoint.token, wait_seconds=15)
    settle(1.5)
    later, _ = store.create_todo(scope, queue="q")
    second.join(timeout=15)
    assert second.status == 200 and second.answer["todo"]["id"] == later.id
    assert second.answered_at < second.deadline


def test_a_payload_the_hub_cannot_read_does_not_stop_it(server, endpoint, scope):
    """Defect: a notice whose payload the hub could not decode (nested past
    json's recursion limit) raised a RecursionError, not a psycopg.Error, and
    the hub's thread died for good: every stream opened after ended at once."""
    first = sse(server, endpoint)
    first.read_until(": keep-alive", seconds=3)  # the hub listens by now
    first.close()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, repeat('[', 7000))", [store.DOORBELL_CHANNEL]
        )
    settle()
    stream = sse(server, endpoint)
    try:
        todo, _ = store.create_todo(scope, queue="q")
        assert todo.id in stream.read_until(todo.id, seconds=3)
    finally:
        stream.close()


# --- Shutdown -----------------------------------------------------------------


def test_sigterm_ends_every_waiter_at_once(db, endpoint):
    """No waiter is left hanging on SIGTERM: the long polls answer, the streams
    end, and the server exits well inside gunicorn's graceful_timeout (25 s)."""
    server = start_server()
    try:
        polls = [LongPoll(server, endpoint.token, wait_seconds=20) for _ in range(5)]
        streams = [sse(server, endpoint), mcp_stream(server, endpoint)]
        settle()
        server.process.send_signal(signal.SIGTERM)
        for poll in polls:
            poll.join(timeout=10)
            assert poll.status == 404
            assert poll.answered_at < poll.deadline
        for stream in streams:
            assert stream.ends_within(3)
        # Well inside gunicorn's graceful_timeout (25 s), which the waiters
        # would otherwise run into.
        server.process.wait(timeout=10)
    finally:
        stop_server(server)


def test_the_pool_gives_its_connections_back_between_requests(server, endpoint):
    for _ in range(20):
        status, _, _ = request(server, "GET", "/api/v1/todos", endpoint.token)
        assert status == 200
    total, busy = server_connections()
    assert total <= BUDGET and busy == 0
