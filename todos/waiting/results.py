"""Waiting for a result: until a todo ends or asks (CONTRACT §14, "Waiting").

A creator's wait for one todo is a *todo* waiter on the doorbell hub
(``todos.waiting.doorbell``): it hears that todo's events (``todo.done``,
``todo.failed``, ``todo.asked``, ``todo.cancel_requested``, ``todo.canceled``)
and holds no thread and no database connection while it waits, as a long poll does
(``todos.waiting.longpoll``). Each wakeup re-reads the todo, awaited in the event
loop on the async store (todos.db.pool); the wait ends when the todo is
*settled* — terminal (done, canceled, dead letter) or held for an answer — or
at the deadline, with the todo as it is then.

A surface describes its wait as a ``ResultWait`` (how to authenticate, how to
re-validate) and awaits ``wait(...)``. A control notice (revoked, re-keyed,
re-granted) and a reconnect of the hub re-validate the caller first: a
revoked token ends the wait with the surface's refusal.
"""

import asyncio
import functools
import uuid

from django.http import HttpRequest

from todos import store
from todos.waiting.doorbell import (
    REVALIDATE,
    SHUTDOWN,
    UNHEARD_POLL_SECONDS,
    Waiter,
    hub,
)

SETTLED = ("done", "canceled", "dead_letter", "held")


def settled(todo: store.Todo) -> bool:
    """Say whether a wait for this todo is over: it ended, or it is asking."""
    return todo.outcome in SETTLED


class ResultWait:
    """What a surface says about one wait for a todo's result."""

    wait: float = 0  # seconds it may wait (set by ``start``)

    def __init__(self, request: HttpRequest | None, todo_id: str) -> None:
        self.request, self.todo_id = request, todo_id

    async def start(self) -> store.Scope:
        """Authenticate and read the request; return the caller's scope."""
        raise NotImplementedError

    async def revalidate(self) -> store.Scope:
        """The caller's scope now; raise when it may no longer read the todo."""
        raise NotImplementedError


def _canonical(todo_id: str) -> str | None:
    # Rings name a todo by its canonical id; a malformed one is not found (the
    # read right after says so).
    try:
        return str(uuid.UUID(str(todo_id)))
    except ValueError:
        return None


async def wait(result_wait: ResultWait) -> store.Todo:
    """Return the todo once it is settled, or after ``result_wait.wait`` s."""
    # Not hearing_rings_and_events: a read that does not wait needs no LISTEN,
    # and a waiter that subscribes unheard is told to read its todo again.
    hub.start()
    loop = asyncio.get_running_loop()
    opened: list[Waiter] = []

    async def first() -> tuple[store.Scope, store.Todo]:
        scope = await result_wait.start()
        if result_wait.wait > 0:
            opened.append(
                hub.subscribe(scope, "todo", todo_id=_canonical(result_wait.todo_id))
            )
        return scope, await store.aget_todo(scope, result_wait.todo_id)

    call = asyncio.ensure_future(first())
    try:
        scope, todo = await asyncio.shield(call)
    except BaseException:
        # Cancelled (the client left) or failed: the waiter goes with the call.
        call.add_done_callback(functools.partial(_close_all, opened))
        raise
    if not opened:
        return todo
    waiter = opened[0]
    deadline = loop.time() + result_wait.wait

    async def again(check: bool) -> store.Todo:
        nonlocal scope
        if check:
            scope = await result_wait.revalidate()
        return await store.aget_todo(scope, result_wait.todo_id)

    try:
        while not settled(todo):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if not hub.connected:
                remaining = min(remaining, UNHEARD_POLL_SECONDS)
            rings, notices = await waiter.wait(remaining)
            if SHUTDOWN in notices:
                break
            check = REVALIDATE in notices or not hub.connected
            if rings or notices or check:
                todo = await again(check)
    finally:
        waiter.close()
    return todo


def _close_all(waiters: list[Waiter], _call: object) -> None:
    for waiter in waiters:
        waiter.close()
