"""Sync work for the async views, in a bounded thread pool.

An async view (served in the event loop) awaits its statements on the async
store (todos.db.pool). What it needs that is only sync (the ORM: an MCP
session, the SQS queue administration, a cancel's transaction) is one
``run_pooled`` call, said so where it is made, in at most
``SWITCHBOARD_DB_THREADS`` threads; the thread's connection goes back to the
pool when the call returns. The sync views are served whole in the same
threads (``run_in_thread``, board.serving.asgi).
"""

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections

from todos.telemetry import tracing

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
    """Run ``fn`` in the bounded pool as it is (it gives its connections back),
    in the request's trace while tracing is on (a create's span is a child of
    the request's)."""
    loop = asyncio.get_running_loop()
    call = tracing.carrying_context(functools.partial(fn, *args))
    return await loop.run_in_executor(executor(), call)
