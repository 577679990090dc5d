"""The event-stream loop, one for ``/api/v1/events`` and the MCP GET stream.

A stream is a stream waiter on the doorbell hub (``todos.waiting.doorbell``): no thread,
no connection while it waits. ``watch`` yields what the stream says next —
a list of rings (the todos of its scope that became claimable; empty: a
keep-alive is due) — until the stream ends, and then one ``Ended``. Each
surface only formats what it yields.

A stream subscribes before reading its backlog, so nothing turns ready unheard
in between (a todo may be announced twice; the claim settles it). It ends
when its client goes (the server stops iterating it), when the server shuts
down, when the hub loses its connection (rings would be missed: the client
reconnects), and when ``refresh`` says its caller's access changed. The hub
asks for a ``refresh`` on every control notice and after every reconnect.
"""

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from todos import store
from todos.waiting.doorbell import (
    LOST,
    REVALIDATE,
    SESSION,
    SHUTDOWN,
    TRY,
    Ring,
    Waiter,
    hub,
    keepalive_wait,
)

BACKLOG_LIMIT = 100


@dataclass(frozen=True)
class Ended:
    """Why a stream ended: ``shutdown``, ``unavailable`` or ``access``."""

    reason: str


async def backlog(scope: store.Scope) -> list[Ring]:
    """The rings of the scope's todos that are claimable now, oldest first."""
    return [
        {"id": t.id, "endpoint_id": t.endpoint_id, "queue": t.queue}
        for t in await store.apending_doorbell_todos(scope, limit=BACKLOG_LIMIT)
    ]


async def open_stream[*Ts](
    authorize: Callable[[*Ts], Awaitable[tuple[store.Scope, object]]], *args: *Ts
) -> tuple[Waiter, list[Ring]]:
    """Open a stream: ``authorize(*args)`` authenticates the caller and
    returns ``(scope, session_id)``; then subscribe, read the backlog.
    Return ``(waiter, backlog)``."""
    await hub.hearing_rings_and_events()
    opened: list[Waiter] = []

    async def opening() -> tuple[Waiter, list[Ring]]:
        scope, session_id = await authorize(*args)
        opened.append(hub.subscribe(scope, "stream", session_id=session_id))
        return opened[0], await backlog(scope)

    call = asyncio.ensure_future(opening())
    try:
        return await asyncio.shield(call)
    except BaseException:
        # Cancelled (the client left) or failed: the waiter goes when the call ends.
        call.add_done_callback(functools.partial(_close_all, opened))
        raise


async def watch(
    waiter: Waiter,
    first: list[Ring],
    refresh: Callable[[set[str]], Awaitable[bool]],
    keepalive_seconds: float,
) -> AsyncIterator[list[Ring] | Ended]:
    """Yield each moment's rings until the stream ends, then its ``Ended``.

    ``refresh(notices)`` (awaited) says whether the caller still
    has the same access; ``waiter`` is closed when the stream ends, however.
    """
    try:
        rings = first
        while True:
            yield rings
            rings, notices = await waiter.wait(keepalive_wait(keepalive_seconds))
            if SHUTDOWN in notices:
                yield Ended("shutdown")
                return
            if LOST in notices:
                yield Ended("unavailable")
                return
            if notices & {REVALIDATE, SESSION} and not await refresh(notices):
                yield Ended("access")
                return
            if TRY in notices:
                # Rings may have been missed while the hub was away.
                rings = rings + await backlog(waiter.scope)
    finally:
        waiter.close()


def _close_all(waiters: list[Waiter], _call: object) -> None:
    for waiter in waiters:
        waiter.close()
