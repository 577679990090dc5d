"""The doorbell stream, GET /api/v1/events, over the ASGI serving."""

import contextlib
import http.client
import json
import queue
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.support import InProcessServer
from todos import store
from todos.waiting.doorbell import hub


class EventStreamClient:
    """Read a Server-Sent Events stream line by line on a background thread."""

    def __init__(self, asgi_server, token):
        url = urlsplit(asgi_server.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        self.conn.request(
            "GET",
            "/api/v1/events",
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "text/event-stream",
            },
        )
        # Kept: a "Connection: close" response detaches the socket from conn.
        self.sock = self.conn.sock
        self.response = self.conn.getresponse()
        self.lines = queue.Queue()
        self.retry = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            while line := self.response.readline():
                self.lines.put(line.decode().rstrip("\n"))
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            # (AttributeError: http.client reading a chunk of a closed response.)
            pass
        self.lines.put(None)

    def next_message(self, timeout):
        """Return the next comment (":...") or event ({"event", "data"}), or None."""
        deadline = time.monotonic() + timeout
        fields = {}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(":"):
                return line
            if line == "":
                if "data" in fields:
                    return {
                        "event": fields.get("event"),
                        "data": json.loads(fields["data"]),
                    }
                continue
            name, _, value = line.partition(":")
            fields[name] = value.strip()
            if name == "retry":
                self.retry = value.strip()

    def events_within(self, seconds):
        """Return the todo.ready events that arrive within the given seconds."""
        deadline = time.monotonic() + seconds
        events = []
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.next_message(remaining)
            if isinstance(message, dict):
                events.append(message)
        return events

    def close(self):
        # Shutting the socket down wakes the reader thread; the server notices
        # on its next write.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        self.reader.join(timeout=5)


@pytest.fixture
def open_stream(db, asgi_server, settings):
    """Open event streams, closed after the test: set up after ``db`` (the
    committed rows), so the streams end before the server must settle and the
    tables are emptied."""
    # Short keep-alives make departed clients noticed fast.
    settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS = 0.3
    streams = []

    def opener(endpoint):
        # The hub listening first: a stream opened before it re-reads its backlog
        # when the hub connects, and may then announce a todo twice (allowed:
        # the claim settles it), which these tests would count as a defect.
        assert hub.connected, "the doorbell hub is not listening"
        stream = EventStreamClient(asgi_server, endpoint.token)
        streams.append(stream)
        return stream

    yield opener
    for stream in streams:
        stream.close()
    # A server notices a departed client at its next keep-alive: let every
    # stream of this test end before the next one counts listeners.
    wait_for_listeners(0)


def listeners():
    """Count the waiters on this process's doorbell hub (the live server's),
    in its loop."""
    return InProcessServer.current.in_loop(
        lambda: sum(len(group) for group in hub.by_endpoint.values())
    )


def wait_for_listeners(count, seconds=4):
    deadline = time.monotonic() + seconds
    while listeners() != count:
        assert time.monotonic() < deadline, f"{listeners()} listeners, not {count}"
        time.sleep(0.05)


def test_the_stream_opens_with_a_comment_then_the_claimable_backlog(
    open_stream, endpoint
):
    scope = store.Scope.for_endpoint(endpoint)
    first, _ = store.create_todo(scope, queue="q")
    second, _ = store.create_todo(scope, queue="r")
    done, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, done.id, "w")
    stream = open_stream(endpoint)
    assert stream.response.status == 200
    assert stream.response.getheader("Content-Type") == "text/event-stream"
    assert stream.response.getheader("Cache-Control") == "no-cache"
    assert stream.response.getheader("Content-Encoding") is None
    assert stream.next_message(timeout=1) == ": connected"
    backlog = [stream.next_message(timeout=1), stream.next_message(timeout=1)]
    assert backlog == [
        {
            "event": "todo.ready",
            "data": {"id": first.id, "endpoint_id": str(endpoint.id), "queue": "q"},
        },
        {
            "event": "todo.ready",
            "data": {"id": second.id, "endpoint_id": str(endpoint.id), "queue": "r"},
        },
    ]


def test_doorbell_never_crosses_endpoints(open_stream, endpoint, other_endpoint):
    """SPEC: Doorbell never crosses endpoints."""
    stream_a, stream_b = open_stream(endpoint), open_stream(other_endpoint)
    assert stream_a.next_message(timeout=1) == ": connected"
    assert stream_b.next_message(timeout=1) == ": connected"
    todo, _ = store.create_todo(store.Scope.for_endpoint(endpoint), queue="q")
    ready = stream_a.next_message(timeout=1)
    assert ready == {
        "event": "todo.ready",
        "data": {"id": todo.id, "endpoint_id": str(endpoint.id), "queue": "q"},
    }
    assert stream_b.events_within(1.5) == []


def test_a_ring_arrives_at_once_with_the_default_keep_alive(
    open_stream, endpoint, settings
):
    """A ring is sent when it rings, not at the next keep-alive."""
    # Long enough that waiting for the keep-alive would show, short enough
    # that the server notices the departed client before the fixture's check.
    settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS = 1.5
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    created_at = time.monotonic()
    todo, _ = store.create_todo(store.Scope.for_endpoint(endpoint), queue="q")
    ready = stream.next_message(timeout=3)
    # Before the wait's own end: the earliest its keep-alive could be due.
    assert time.monotonic() - created_at < 0.75 * 1.5
    assert ready["data"]["id"] == todo.id


def test_the_stream_filters_by_the_queue_grant(open_stream, make_endpoint):
    narrow = make_endpoint("narrow", queues=("a",))
    stream = open_stream(narrow)
    assert stream.next_message(timeout=1) == ": connected"
    store.create_todo_any_endpoint(narrow.id, queue="b")
    wanted, _ = store.create_todo_any_endpoint(narrow.id, queue="a")
    events = stream.events_within(1.0)
    assert [event["data"]["id"] for event in events] == [wanted.id]


def test_the_stream_rings_for_a_release_and_a_retry(open_stream, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q", max_attempts=1)
    store.claim_todo(scope, todo.id, "w")
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    store.release_todo(scope, todo.id, "w")  # at the cap: a dead letter, no ring
    store.retry_todo(scope, todo.id)
    events = stream.events_within(1.0)
    assert [(event["event"], event["data"]["id"]) for event in events] == [
        ("todo.failed", todo.id),
        ("todo.ready", todo.id),
    ]


def test_an_idle_stream_sends_keep_alive_comments(open_stream, endpoint):
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    assert stream.next_message(timeout=2.5) == ": keep-alive"


def test_each_keep_alive_wait_is_drawn_anew(open_stream, endpoint, monkeypatch):
    """Streams opened together kept their keep-alives in step, a burst of
    writes every period; each wait now draws its own (keepalive_wait)."""
    from django.conf import settings

    from todos.waiting import streams

    asked = []

    def drawn(seconds):
        asked.append(seconds)
        return 0.2 + 0.1 * len(asked)

    monkeypatch.setattr(streams, "keepalive_wait", drawn)
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    assert stream.next_message(timeout=2) == ": keep-alive"
    assert stream.next_message(timeout=2) == ": keep-alive"

    assert asked[:2] == [settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS] * 2


def test_the_stream_leaves_the_hub_when_the_client_leaves(open_stream, endpoint):
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    assert listeners() == 1
    stream.close()
    wait_for_listeners(0)


def test_the_stream_asks_clients_to_reconnect_after_three_seconds(
    open_stream, endpoint
):
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    assert stream.next_message(timeout=0.5) in (None, ": keep-alive")
    assert stream.retry == "3000"


def test_the_stream_ends_cleanly_when_its_database_connection_dies(
    open_stream, endpoint
):
    from django.db import connection

    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database()"
            " AND query LIKE 'LISTEN switchboard_todo_ready%%'"
        )
    messages = [stream.next_message(timeout=2) for _ in range(3)]
    assert ": the database is unavailable; reconnect shortly" in messages
    assert messages[-1] is None  # and then the stream ended


def test_the_stream_tells_a_budgets_limit_and_its_resume(open_stream, endpoint):
    """budget.soft_limit and budget.exhausted when the report that reaches
    them commits; budget.resumed and the scope's waiting todos, ready again,
    when the owner resumes."""
    scope = store.Scope.for_endpoint(endpoint)
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=1
    )
    waiting, _ = store.create_todo(scope, queue="q")
    stream = open_stream(endpoint)
    assert stream.next_message(timeout=1) == ": connected"
    stream.events_within(0.5)  # the claimable backlog
    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    store.decide_budget(scope, budget.id, "resume")
    events = stream.events_within(1.0)
    assert [(event["event"], event["data"]["id"]) for event in events] == [
        ("budget.soft_limit", budget.id),
        ("budget.exhausted", budget.id),
        ("budget.resumed", budget.id),
        ("todo.ready", waiting.id),
    ]
