"""Sync work for the async views, in a bounded thread pool; and their
event-stream response.

An async view (served in the event loop) awaits its statements on the async
store (todos.db.pool). What it needs that is only sync (the ORM: an MCP
session, the SQS queue administration, a cancel's transaction) is one
``run_pooled`` call, said so where it is made, in at most
``SWITCHBOARD_DB_THREADS`` threads; the thread's connection goes back to the
pool when the call returns. The sync views are served whole in the same
threads (``run_in_thread``, board.serving.asgi).
"""

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections
from django.http import StreamingHttpResponse

_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(
            max_workers=settings.SWITCHBOARD_DB_THREADS,
            thread_name_prefix="switchboard-db",
        )
    return _executor


def closing[*Ts, R](fn: Callable[[*Ts], R], *args: *Ts) -> R:
    """Call ``fn``, then hand this thread's connections back."""
    try:
        return fn(*args)
    finally:
        # With the pool on, close() hands the connection back to it.
        connections.close_all()


async def run_pooled[*Ts, R](fn: Callable[[*Ts], R], *args: *Ts) -> R:
    """Run ``fn`` in the bounded pool; its connection goes back after the call."""
    return await run_in_thread(closing, fn, *args)


async def run_in_thread[*Ts, R](fn: Callable[[*Ts], R], *args: *Ts) -> R:
    """Run ``fn`` in the bounded pool as it is (it gives its connections back)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(fn, *args))


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
