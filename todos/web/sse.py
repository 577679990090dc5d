"""The event-stream response of the async views (``/api/v1/events``, MCP's
streams): each chunk encoded once, the stream closed as the server stops."""

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from django.http import StreamingHttpResponse


class EventStreamResponse(StreamingHttpResponse):
    """A ``text/event-stream`` that hands the ASGI server its chunks directly.

    Django's async iteration wraps the stream twice per chunk (an adapter that
    re-reads the charset for each chunk, then ``__aiter__``); one ring reaches
    every open stream of its scope, so that was paid hundreds of times per
    ring. Here each chunk is encoded once, and the stream is closed (its
    waiter leaves the hub) as soon as the server stops iterating.
    """

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # The stream event_stream was given (the response keeps it as _iterator).
        stream: AsyncGenerator[str | bytes] = self._iterator  # type: ignore[attr-defined]  # set by StreamingHttpResponse, not in its stubs
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield chunk.encode() if isinstance(chunk, str) else chunk


def event_stream(
    agen: AsyncGenerator[str | bytes], close: Callable[[], object]
) -> EventStreamResponse:
    """An uncached, unbuffered event-stream response of ``agen``'s chunks;
    ``close`` runs when the response is done, even if it was never sent."""
    response = EventStreamResponse(agen, content_type="text/event-stream")
    response._resource_closers.append(close)  # type: ignore[attr-defined]  # HttpResponseBase sets it; not in its stubs
    # No caching, and no buffering by a proxy (nginx honours X-Accel-Buffering).
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
