"""The doorbell as Server-Sent Events: ``GET /api/v1/events``.

A stream belongs to one endpoint token. It sends a comment at once (a client
sees nothing of a stream until its first chunk), then the endpoint's todos
that are claimable now, then a ``todo.ready`` event per ring of its own scope,
with a keep-alive comment whenever nothing rang for a while. A ring is a hint,
not a lease: the agent still claims, and may lose the race to another worker.

An async view: an open stream is a mailbox on the process's doorbell hub
(``todos.doorbell``), holding no thread and no database connection. It ends
when the client goes, when the server shuts down, when the database goes away
(the client reconnects after ``retry``), and within a second of its endpoint
being revoked, its token rotated or its grant changed.
"""

import functools
import json
import logging

from django.conf import settings

from todos import aio, store
from todos.api.core import api_view, authenticate
from todos.doorbell import ENDPOINT, LOST, RECHECK, SHUTDOWN, hub, keepalive_wait

logger = logging.getLogger("switchboard.events")

BACKLOG_LIMIT = 100
RECONNECT_MILLISECONDS = 3000
ENDED_SHUTDOWN = ": the server is shutting down; reconnect\n\n"
ENDED_UNAVAILABLE = ": the database is unavailable; reconnect shortly\n\n"
ENDED_ACCESS = ": this endpoint's token or grant changed; reconnect\n\n"


def _event(ring):
    return _ready_event(str(ring["id"]), str(ring["endpoint_id"]), ring["queue"])


@functools.lru_cache(maxsize=4096)
def _ready_event(todo_id, endpoint_id, queue):
    # One ring reaches every open stream of its scope: its text is made once.
    data = json.dumps({"id": todo_id, "endpoint_id": endpoint_id, "queue": queue})
    return f"event: todo.ready\ndata: {data}\n\n"


def _rings(todos):
    return [{"id": t.id, "endpoint_id": t.endpoint_id, "queue": t.queue} for t in todos]


def backlog(scope):
    return store.pending_doorbell_todos(scope, limit=BACKLOG_LIMIT)


def same_access(request, scope):
    """Say whether the request's token still opens the same scope."""
    try:
        endpoint = authenticate(request)
    except Exception:
        return False
    return store.Scope.for_endpoint(endpoint) == scope


async def stream_events(request, waiter, first, keepalive_seconds):
    """The stream's body; ``waiter`` is closed when it ends, however it ends."""
    scope = waiter.scope
    try:
        # "retry" tells an EventSource how long to wait before reconnecting.
        yield f": connected\nretry: {RECONNECT_MILLISECONDS}\n\n"
        rings = first
        while True:
            if rings:
                yield "".join(_event(ring) for ring in rings)
            rings, notices = await waiter.wait(keepalive_wait(keepalive_seconds))
            if SHUTDOWN in notices:
                yield ENDED_SHUTDOWN
                return
            if LOST in notices:
                logger.warning(
                    "event stream ended: doorbell connection lost",
                    extra={"fields": {"endpoint_id": scope.endpoint_id}},
                )
                yield ENDED_UNAVAILABLE
                return
            if ENDPOINT in notices and not await aio.run_pooled(
                same_access, request, scope
            ):
                yield ENDED_ACCESS
                return
            if RECHECK in notices:
                # Rings may have been missed before the hub listened: announce
                # what is claimable now (some twice; the claim settles it).
                rings = rings + _rings(await aio.run_pooled(backlog, scope))
            if not rings and not notices:
                yield ": keep-alive\n\n"
    finally:
        waiter.close()


@api_view("GET")
async def events(request):
    """Stream this endpoint's doorbell as ``todo.ready`` events."""
    # Listen before reading the backlog, so nothing turns ready unheard in
    # between (a todo may then be announced twice; the claim settles it).
    waiter = hub.subscribe(request.scope, "stream")
    try:
        first = _rings(await request.db(functools.partial(backlog, request.scope)))
    except BaseException:
        waiter.close()
        raise
    body = stream_events(
        request, waiter, first, settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS
    )
    # Each event must leave at once: the stream is never compressed (Django's
    # GZipMiddleware would hold small chunks back; it is not installed) and
    # whitenoise passes non-static paths through untouched.
    return aio.event_stream(request, body)
