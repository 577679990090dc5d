"""Database work from async views: in a bounded thread pool, a pooled connection
held only for the call.

The waiting surfaces (long-poll claim, ``/api/v1/events``, MCP GET streams)
are async views: while they wait they hold no thread and no connection. Each
piece of database work they do (authenticate, try a claim, read a backlog) runs
through ``db_runner(request)``:

- served by ASGI, in ``EXECUTOR`` (at most ``SWITCHBOARD_DB_THREADS`` threads),
  and the thread's connection goes back to the pool when the call returns;
- served by WSGI (the test live server, ``runserver``) the async view already
  runs inside a request thread: the work runs in that thread, on its own
  connection, as a sync view's would (so a test's transaction sees it too).
"""

import asyncio
import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
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


def _closing(fn, *args):
    try:
        return fn(*args)
    finally:
        # With the pool on, close() hands the connection back to it.
        connections.close_all()


async def run_pooled(fn, *args):
    """Run ``fn`` in the bounded pool; its connection goes back after the call."""
    return await run_in_thread(_closing, fn, *args)


async def run_in_thread(fn, *args):
    """Run ``fn`` in the bounded pool as it is (it gives its connections back)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(fn, *args))


async def run_owned(db, fn, *args):
    """``await db(fn, *args)``, for a result that holds something (a waiter
    on the doorbell hub): when the caller is cancelled meanwhile, the result
    is closed as soon as the call ends instead of being lost.
    """
    call = asyncio.ensure_future(db(fn, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        call.add_done_callback(_close_result)
        raise


def _close_result(call):
    if not call.cancelled() and call.exception() is None:
        close = getattr(call.result(), "close", None)
        if close is not None:
            close()


def db_runner(request):
    """Return how this request runs a blocking database call from async code."""
    if isinstance(request, ASGIRequest):
        return run_pooled
    return lambda fn, *args: sync_to_async(fn, thread_sensitive=True)(*args)


class BlockingStream:
    """An async generator as a WSGI response body: each step runs in an event
    loop of the stream's own (under ASGI the server iterates it directly).
    """

    def __init__(self, agen):
        self.agen = agen
        self.loop = asyncio.new_event_loop()

    def __iter__(self):
        while True:
            try:
                yield self.loop.run_until_complete(self.agen.__anext__())
            except StopAsyncIteration:
                return

    def close(self):
        if not self.loop.is_closed():
            try:
                self.loop.run_until_complete(self.agen.aclose())
            finally:
                self.loop.close()


def streaming_body(request, agen):
    """Return what a StreamingHttpResponse should iterate for this server."""
    if isinstance(request, ASGIRequest):
        return agen
    return BlockingStream(agen)


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


def event_stream(request, agen):
    """An uncached, unbuffered event-stream response of ``agen``'s chunks."""
    response = EventStreamResponse(
        streaming_body(request, agen), content_type="text/event-stream"
    )
    # No caching, and no buffering by a proxy (nginx honours X-Accel-Buffering).
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
