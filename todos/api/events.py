"""The doorbell as Server-Sent Events: ``GET /api/v1/events``.

A stream belongs to one endpoint token. It sends a comment at once (a client
sees nothing of a stream until its first chunk), then the endpoint's todos
that are claimable now, then a ``todo.ready`` event per ring of its own scope
and the events of its todos (``todo.done``, ``todo.failed`` for a dead letter,
``todo.asked``, ``todo.cancel_requested``, ``todo.canceled``),
with a keep-alive comment whenever nothing rang for a while. A ring is a hint,
not a lease: the agent still claims, and may lose the race to another worker.
The waiting is ``todos.waiting.streams``'s: this view formats what it yields.
"""

import functools
import json
from collections.abc import AsyncGenerator

from django.conf import settings
from django.http import HttpRequest

from todos import store
from todos.api.plumbing import ApiRequest, aauthenticate, api_view, aprepare
from todos.waiting import streams
from todos.waiting.doorbell import Ring, Waiter
from todos.web import sse
from todos.web.sse import EventStreamResponse

RECONNECT_MILLISECONDS = 3000
ENDED = {
    "shutdown": ": the server is shutting down; reconnect\n\n",
    "unavailable": ": the database is unavailable; reconnect shortly\n\n",
    "access": ": this endpoint's token or grant changed; reconnect\n\n",
}


@functools.lru_cache(maxsize=4096)
def _ready_event(
    todo_id: str, endpoint_id: str, queue: str, event: str = "todo.ready"
) -> str:
    # One ring reaches every open stream of its scope: its text is made once.
    # A doorbell ring is todo.ready; the event channel names its own event
    # (store.TODO_EVENTS: todo.done, todo.failed, todo.asked, …).
    data = json.dumps({"id": todo_id, "endpoint_id": endpoint_id, "queue": queue})
    return f"event: {event}\ndata: {data}\n\n"


def _event(ring: Ring) -> str:
    return _ready_event(
        str(ring["id"]),
        str(ring["endpoint_id"]),
        ring["queue"],
        ring.get("event", "todo.ready"),
    )


async def same_access(request: HttpRequest, scope: store.Scope) -> bool:
    """Say whether the request's token still opens the same scope."""
    try:
        endpoint = await aauthenticate(request)
    except Exception:
        return False
    return store.Scope.for_endpoint(endpoint) == scope


async def _authorize(request: ApiRequest) -> tuple[store.Scope, None]:
    await aprepare(request)
    return request.scope, None


async def _body(
    request: HttpRequest, waiter: Waiter, first: list[Ring]
) -> AsyncGenerator[str]:
    # "retry" tells an EventSource how long to wait before reconnecting.
    yield f": connected\nretry: {RECONNECT_MILLISECONDS}\n\n"
    scope = waiter.scope
    async for said in streams.watch(
        waiter,
        first,
        lambda notices: same_access(request, scope),
        settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS,
    ):
        if isinstance(said, streams.Ended):
            yield ENDED[said.reason]
        elif said:
            yield "".join(_event(ring) for ring in said)
        elif said is not first:
            yield ": keep-alive\n\n"


@api_view("GET")
async def events(request: ApiRequest) -> EventStreamResponse:
    """Stream this endpoint's doorbell as ``todo.ready`` events."""
    waiter, first = await streams.open_stream(_authorize, request)
    # Each event must leave at once: the stream is never compressed (Django's
    # GZipMiddleware would hold small chunks back; it is not installed) and
    # whitenoise passes non-static paths through untouched.
    return sse.event_stream(_body(request, waiter, first), waiter.close)
