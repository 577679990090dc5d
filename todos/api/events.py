"""The doorbell as Server-Sent Events: ``GET /api/v1/events``.

A stream belongs to one endpoint token. It sends a comment at once (a client
sees nothing of a stream until its first chunk), then the endpoint's todos
that are claimable now, then a ``todo.ready`` event per ring of its own scope,
with a keep-alive comment whenever nothing rang for a while. A ring is a hint,
not a lease: the agent still claims, and may lose the race to another worker.
"""

import json
import logging

import psycopg
from django.conf import settings
from django.http import StreamingHttpResponse

from todos import store
from todos.api.core import api_view
from todos.doorbell import Doorbell

logger = logging.getLogger("switchboard.events")

BACKLOG_LIMIT = 100
RECONNECT_MILLISECONDS = 3000


def _event(ring):
    data = json.dumps(
        {"id": ring["id"], "endpoint_id": ring["endpoint_id"], "queue": ring["queue"]}
    )
    return f"event: todo.ready\ndata: {data}\n\n"


class EventStream:
    """The stream's body. Django calls ``close`` when the response ends, also
    when the client has gone, which is what closes the LISTEN connection.
    """

    def __init__(self, bell, backlog, keepalive_seconds):
        self.bell = bell
        self.backlog = backlog
        self.keepalive_seconds = keepalive_seconds

    def __iter__(self):
        # "retry" tells an EventSource how long to wait before reconnecting.
        yield f": connected\nretry: {RECONNECT_MILLISECONDS}\n\n"
        for todo in self.backlog:
            yield _event(
                {"id": todo.id, "endpoint_id": todo.endpoint_id, "queue": todo.queue}
            )
        while True:
            try:
                rings = self.bell.wait(self.keepalive_seconds, stop_after=BACKLOG_LIMIT)
            except psycopg.Error as exc:
                # The headers are long gone, so no 503: end the stream cleanly
                # and let the client reconnect once the database is back.
                logger.warning(
                    "event stream ended: doorbell connection lost",
                    extra={
                        "fields": {
                            "endpoint_id": self.bell.scope.endpoint_id,
                            "error": type(exc).__name__,
                        }
                    },
                )
                yield ": the database is unavailable; reconnect shortly\n\n"
                return
            if not rings:
                # Writing is how a WSGI server learns that the client left.
                yield ": keep-alive\n\n"
            for ring in rings:
                yield _event(ring)

    def close(self):
        self.bell.close()


@api_view("GET")
def events(request):
    """Stream this endpoint's doorbell as ``todo.ready`` events."""
    bell = Doorbell(request.scope)
    try:
        # Listen before reading the backlog, so nothing turns ready unheard in
        # between (a todo may then be announced twice; the claim settles it).
        bell.open()
        backlog = store.pending_doorbell_todos(request.scope, limit=BACKLOG_LIMIT)
    except Exception:
        bell.close()
        raise
    stream = EventStream(bell, backlog, settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS)
    # Each event must leave at once: the stream is never compressed (Django's
    # GZipMiddleware would hold small chunks back; it is not installed) and
    # whitenoise passes non-static paths through untouched.
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    # No caching, and no buffering by a proxy (nginx honours X-Accel-Buffering).
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
