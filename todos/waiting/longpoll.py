"""The long poll: the one way a claim waits for work, on every surface.

The JSON API's ``POST /api/v1/todos/claim``, SQS ReceiveMessage and MCP's
``claim_next`` each describe their claim as a ``LongPoll`` and await
``claim(poll)``:

1. ``start`` authenticates the caller and reads its request, a claim
   waiter subscribes to the doorbell hub, then the first try: a todo that
   turns ready after the subscription rings it, so one try both answers at
   once and starts the wait.
2. Between tries the poll is a mailbox on the hub: no thread, no connection.
   A ring, the hub's re-check at the instant a todo of the scope falls due
   with no ring (a lease lapses, a retry window or a delay ends: a try that
   found nothing asks when, ``store.anext_due``), or its periodic re-check
   makes one more try. A control notice (revoked, re-keyed, re-granted, SQS
   key rotated), a reconnect of the hub, and every try made while the hub
   is not listening first re-validate the caller (``revalidate``): a caller
   that may no longer claim gets its surface's refusal, a new grant applies
   from then on.

Every step is awaited in the event loop, on the async store (todos.db.pool):
the first try and every try after a wake alike, with no thread.
3. The client going away cancels the request's task: the wait ends where it
   is, a try is never started for a gone client, and what a try already
   running claims for it is handed back as it was found (``hand_back``:
   pending, its attempt not spent), as is what was claimed for a caller
   refused by the re-validation after the claim. Such a step outlives its
   request: a server stopping awaits it (``finish_outliving``) before it
   closes its pool.

The answer is the claim, or ``nothing`` at the deadline and on shutdown.
"""

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from todos import store
from todos.store import limit_figures
from todos.waiting.doorbell import (
    REVALIDATE,
    SHUTDOWN,
    TRY,
    UNHEARD_POLL_SECONDS,
    Waiter,
    hub,
)

logger = logging.getLogger("switchboard.longpoll")

NO_WORK = "no claimable todo"

# What a claim answers: one todo, or a batch (a ``max_todos`` claim, SQS).
type Claimed = store.Todo | list[store.Todo]


class LongPoll:
    """What a surface says about one waiting claim."""

    queue: str | None = None  # the one queue it claims from, else the scope's
    wait: float = 0  # seconds it may wait (set by ``start``)

    async def start(self) -> store.Scope | None:
        """Authenticate, read the request: the caller's scope (None: no claim)."""
        raise NotImplementedError

    async def revalidate(self) -> store.Scope:
        """The caller's scope now; raise when it may no longer claim."""
        raise NotImplementedError

    async def attempt(self, scope: store.Scope) -> Claimed:
        """Claim: the todo(s), or raise ``store.NotFound`` / return ``[]``."""
        raise NotImplementedError

    async def hand_back(self, scope: store.Scope, todo: store.Todo) -> None:
        """Give back a todo claimed for a caller that never received it (it
        left, or was refused once the claim had run): as the claim found it,
        pending with its attempt restored (CONTRACT §16)."""
        await store.aunclaim(scope, todo)


async def claim(poll: LongPoll) -> Claimed | None:
    """Claim for ``poll``, waiting up to ``poll.wait`` seconds (see above); None
    when ``start`` said there is no claim to make."""
    hub.start()
    loop = asyncio.get_running_loop()
    state = _State(poll)
    try:
        result = await _guarded(state, state.first())
        if state.scope is None:
            return None
        deadline = loop.time() + poll.wait
        while result is None and state.waiter is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if not hub.connected:
                remaining = min(remaining, UNHEARD_POLL_SECONDS)
            rings, notices = await state.waiter.wait(remaining)
            if SHUTDOWN in notices:
                hub.pass_on(state.waiter, rings)
                break
            check = REVALIDATE in notices or not hub.connected
            if not (rings or check or TRY in notices):
                continue
            result = await _guarded(state, state.again(check))
            if result is not None:
                # There may be more: the next waiter looks too.
                hub.pass_on(state.waiter, rings, recheck=TRY in notices)
    finally:
        state.close()
    return result if result is not None else state.nothing()


class _State:
    """One poll's scope, waiter and last empty answer."""

    def __init__(self, poll: LongPoll) -> None:
        self.poll = poll
        self.scope: store.Scope | None = None
        self.waiter: Waiter | None = None
        self.empty: store.NotFound | list[store.Todo] | None = None
        self.gone = False
        self.until = 0.0  # when the wait ends (time.monotonic)
        self.rate_waited = False  # counted as a rate-limited wait

    async def first(self) -> Claimed | None:
        self.scope = await self.poll.start()
        if self.scope is None:
            return None
        if self.poll.wait > 0 and not self.gone:
            self.until = time.monotonic() + self.poll.wait
            self.waiter = hub.subscribe(self._bell_scope(self.scope), "claim")
        return await self._try()

    async def again(self, check: bool) -> Claimed | None:
        if not check:
            return await self._try()
        await self._revalidate()
        result, scope = await self._try(), self.scope
        if result is None:
            return None
        # The claim's snapshot may hold a change committed just after the
        # re-validation: checked once more, what was claimed for a caller
        # that may no longer have it goes back.
        try:
            await self._revalidate()
        except BaseException:
            await self.give_back(result)
            raise
        if self.scope != scope:
            await self.give_back(result)
            return None
        return result

    async def _revalidate(self) -> None:
        scope = await self.poll.revalidate()
        if scope != self.scope:
            self.scope = scope
            # Only a waiting poll re-validates: it has its waiter.
            if self.waiter is not None:
                hub.rescope(self.waiter, self._bell_scope(scope))

    def _started(self) -> store.Scope:
        """The caller's scope; ``first`` set it before any try."""
        if self.scope is None:
            raise RuntimeError("the long poll tried before it started")
        return self.scope

    async def give_back(self, result: Claimed) -> None:
        """Hand back what was claimed for a caller that left or was refused."""
        scope = self._started()
        for todo in result if isinstance(result, list) else [result]:
            with contextlib.suppress(store.NotFound, store.Conflict):
                await self.poll.hand_back(scope, todo)

    def _bell_scope(self, scope: store.Scope) -> store.Scope:
        queue = self.poll.queue
        return store.Scope(scope.endpoint_id, (queue,)) if queue else scope

    async def _try(self) -> Claimed | None:
        limit_figures.forget_rate_limited()
        try:
            result = await self.poll.attempt(self._started())
        except store.NotFound as exc:
            # Without its traceback, which would hold this frame (and so the
            # request) in a reference cycle.
            self.empty = exc.with_traceback(None)
            await self._look_ahead()
            return None
        if isinstance(result, list) and not result:
            self.empty = result
            await self._look_ahead()
            return None
        return result

    def _count_rate_wait(self) -> None:
        """A waiting poll whose try came back empty because a rate window
        held back what it could have claimed: one rate-limited wait (/metrics),
        once per poll."""
        if self.waiter is None or self.rate_waited:
            return
        rated = limit_figures.rate_limited()
        if rated:
            self.rate_waited = True
            limit_figures.note_rate_wait(rated)

    async def _look_ahead(self) -> None:
        """After a try that found nothing, while waiting: have the hub wake
        the scope when its next todo turns claimable with no ring (a lease
        lapses, a retry window or a delay ends), if that is before the wait
        ends."""
        if self.waiter is None:
            return
        self._count_rate_wait()
        scope = self.waiter.scope
        delay = await store.anext_due(scope, within=self.until - time.monotonic())
        if delay is not None:
            hub.due(scope, delay)

    def nothing(self) -> list[store.Todo]:
        empty, self.empty = self.empty, None
        if isinstance(empty, list):
            return empty
        try:
            raise empty if empty is not None else store.NotFound(NO_WORK)
        finally:
            del empty

    def close(self) -> None:
        self.gone = True
        if self.waiter is not None:
            self.waiter.close()


async def _guarded(
    state: _State, step: Coroutine[Any, Any, Claimed | None]
) -> Claimed | None:
    """Await one step of the poll (``first``, ``again``) as its own task. When
    the client leaves meanwhile, the step finishes; then the waiter it may
    have made is closed, and what it may have claimed is given back."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _outliving.add(task)
        task.add_done_callback(functools.partial(_left, state))
        raise


# The steps of clients that left, and then their hand-backs, until they finish.
_outliving: set["asyncio.Future[Any]"] = set()


def _left(state: _State, task: "asyncio.Future[Claimed | None]") -> None:
    _outliving.discard(task)
    state.close()
    if task.cancelled() or task.exception() is not None:
        return
    result = task.result()
    if result:
        handing = asyncio.ensure_future(state.give_back(result))
        _outliving.add(handing)
        handing.add_done_callback(_handed_back)


def _handed_back(task: "asyncio.Future[None]") -> None:
    _outliving.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.warning(
            "long poll: a claim its client never received was not handed back",
            extra={"fields": {"error": type(task.exception()).__name__}},
        )


def outliving() -> int:
    """How many steps and hand-backs of clients that left are still running."""
    return len(_outliving)


async def finish_outliving(timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the steps of clients that left, and
    for their hand-backs, to finish: a server stopping awaits them before it
    closes its pool, or a todo claimed for a gone client would stay claimed
    until its lease lapsed."""
    deadline = asyncio.get_running_loop().time() + timeout
    while _outliving:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return
        await asyncio.wait(set(_outliving), timeout=remaining)
