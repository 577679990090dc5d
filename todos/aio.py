"""Database work from the waiting (async) views: in a bounded thread pool, a
pooled connection held only for the call; and their event-stream response.

A long poll, an event stream and an MCP or SQS call wait in the event loop,
holding no thread and no connection; each piece of database work they do
(authenticate, try a claim, read a backlog) is one ``run_pooled`` call, in at
most ``SWITCHBOARD_DB_THREADS`` threads, and the thread's connection goes back
to the pool when the call returns.
"""

import asyncio
import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections
from django.http import StreamingHttpResponse

_executor = None


def executor():
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(
            max_workers=settings.SWITCHBOARD_DB_THREADS,
            thread_name_prefix="switchboard-db",
        )
    return _executor


def closing(fn, *args):
    """Call ``fn``, then hand this thread's connections back."""
    try:
        return fn(*args)
    finally:
        # With the pool on, close() hands the connection back to it.
        connections.close_all()


async def run_pooled(fn, *args):
    """Run ``fn`` in the bounded pool; its connection goes back after the call."""
    return await run_in_thread(closing, fn, *args)


async def run_in_thread(fn, *args):
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

    async def __aiter__(self):
        async with contextlib.aclosing(self._iterator) as chunks:
            async for chunk in chunks:
                yield chunk.encode() if isinstance(chunk, str) else chunk


def event_stream(agen, close):
    """An uncached, unbuffered event-stream response of ``agen``'s chunks;
    ``close`` runs when the response is done, even if it was never sent."""
    response = EventStreamResponse(agen, content_type="text/event-stream")
    response._resource_closers.append(close)
    # No caching, and no buffering by a proxy (nginx honours X-Accel-Buffering).
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
