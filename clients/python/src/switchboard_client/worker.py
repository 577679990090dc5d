"""The worker runtime: handlers per queue, run with leases kept alive.

``Worker`` long-polls each handled queue (a batch claim when it has several
free slots), runs each todo's handler with a ``Context``, extends the lease in
the background at a third of its length, and ends the attempt from what the
handler did: a return completes, an exception fails, ``ctx.ask`` parks the todo
on a question. On SIGTERM it stops claiming, gives in-flight handlers a grace
period to finish, and releases what is still running with its last checkpoint.

It runs on asyncio; a sync handler runs in a daemon thread (so a handler that
never returns cannot hold the process after its todo is given back), reused
for the next handler once it returns. With OpenTelemetry installed, a handler
runs in its todo's trace context, so its spans join the todo's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar

from switchboard_client import _core, _tracing
from switchboard_client.aio import AsyncClient
from switchboard_client.client import Client
from switchboard_client.errors import (
    APIError,
    BadRequest,
    Conflict,
    NotFound,
    PayloadTooLarge,
    SwitchboardError,
    Unavailable,
)
from switchboard_client.models import (
    JSON,
    ActionResult,
    Answer,
    ItemError,
    Progress,
    Question,
    Todo,
)

log = logging.getLogger("switchboard_client.worker")

Handler = Callable[["Context"], Any]
H = TypeVar("H", bound=Handler)

# A batch claim takes at most ten todos (the API's max_todos); a batch
# acknowledgement at most a hundred actions.
MAX_BATCH = 10
MAX_ACK_BATCH = 100


class EndAttempt(BaseException):
    """Raised inside a handler to end its attempt other than by returning.

    It derives from BaseException, as asyncio.CancelledError does, so that a
    handler's ``except Exception`` does not swallow it."""


class Ask(EndAttempt):
    """``ctx.ask``: park the todo on a question."""

    def __init__(self, question: str, options: dict[str, Any]) -> None:
        super().__init__(question)
        self.question = question
        self.options = options


class GiveBack(EndAttempt):
    """``ctx.give_back``: release the todo now with the last checkpoint."""

    def __init__(self, note: str | None) -> None:
        super().__init__(note)
        self.note = note


@dataclass
class _Route:
    queue: str
    handler: Handler
    lease_seconds: int | None


class Context:
    """What a handler sees of its todo and does with it.

    Read: ``todo``, ``payload``, ``checkpoint`` (the last one saved, by this
    attempt or an earlier one), ``answer`` and ``question`` (after an answered
    ask), ``attempt``, ``cancel_requested`` and ``stopping`` (the worker is
    shutting down: save a checkpoint and return, or be given back).
    Do: ``progress``, ``save_checkpoint``, ``ask``, ``give_back``.
    """

    def __init__(self, worker: Worker, todo: Todo, lease_seconds: int) -> None:
        self.todo = todo
        self.lease_seconds = lease_seconds
        self.log = TodoLog(log, _fields(todo))
        self._worker = worker
        self._checkpoint: JSON = todo.checkpoint
        self._progress: Progress | None = None
        self._dirty = False
        self._beats: _Beats | None = None
        self._cancel = threading.Event()
        self._lost = threading.Event()

    @property
    def payload(self) -> JSON:
        return self.todo.payload

    @property
    def checkpoint(self) -> JSON:
        """The last checkpoint: this attempt's, else the one it was delivered with."""
        return self._checkpoint

    @property
    def answer(self) -> Answer | None:
        """The answer to the question this todo asked (None before, or expired)."""
        return self.todo.answer

    @property
    def question(self) -> Question | None:
        return self.todo.question

    @property
    def attempt(self) -> int:
        return self.todo.attempt

    @property
    def cancel_requested(self) -> bool:
        """Whether someone asked to cancel the todo (seen with each heartbeat):
        stop, and return or ``give_back``."""
        return self._cancel.is_set()

    @property
    def lease_lost(self) -> bool:
        """Whether the lease was lost (another worker has the todo now)."""
        return self._lost.is_set()

    @property
    def stopping(self) -> bool:
        """Whether to stop: a cancel request, a lost lease or a shutdown."""
        return self._cancel.is_set() or self._lost.is_set() or self._worker.stopping

    def progress(
        self, message: str | None = None, fraction: float | None = None
    ) -> None:
        """Report progress; it goes with the next heartbeat."""
        self._progress = Progress(message, fraction)
        self._dirty = True

    def save_checkpoint(self, checkpoint: JSON, *, now: bool = False) -> None:
        """Keep ``checkpoint`` (any JSON, ≤ 64 KiB) for whoever takes the todo
        next; it goes with the next heartbeat, a release or an ask. With
        ``now``, a heartbeat carries it at once; a sync handler returns once
        it is saved."""
        self._checkpoint = checkpoint
        self._dirty = True
        if now:
            self._worker._beat_now(self)

    def ask(
        self,
        question: str,
        *,
        choices: Sequence[str] | None = None,
        schema: Mapping[str, Any] | None = None,
        deadline_seconds: int | None = None,
        return_to: Literal["me", "pool"] = "pool",
    ) -> NoReturn:
        """Ask a question and end this attempt: the todo is held with the last
        checkpoint until it is answered; then a claim delivers it again with
        ``ctx.answer`` and ``ctx.checkpoint``: to any worker of the queue
        (``return_to="pool"``, the default here, as a worker's name may not
        outlive its process), or to this worker's name (``"me"``)."""
        options = {
            "choices": choices,
            "answer_schema": schema,
            "deadline_seconds": deadline_seconds,
            "return_to": return_to,
        }
        raise Ask(question, options)

    def give_back(self, note: str | None = None) -> NoReturn:
        """End this attempt by releasing the todo with the last checkpoint (a
        cancel request then ends it canceled)."""
        raise GiveBack(note)


class TodoLog(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry the todo's fields beside each call's own
    ``extra`` (a plain LoggerAdapter replaces the call's with its own)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def _fields(todo: Todo) -> dict[str, Any]:
    return {"todo_id": todo.id, "queue": todo.queue, "attempt": todo.attempt}


def _describe(exc: BaseException) -> str:
    """A failure as the todo's ``last_error``: its type and message."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:10_000]


class Worker:
    """Runs handlers for queues: ``@worker.handler("reviews")``, then
    ``worker.run()``.

    ``concurrency``: todos run at once. ``lease_seconds``: each claim's lease
    (default the queue's); a heartbeat extends it every third of it.
    ``wait_seconds``: a claim's long poll (≤ 20). ``grace_seconds``: after
    SIGTERM, how long in-flight handlers may go on before their todos are
    released with their last checkpoint.
    """

    def __init__(
        self,
        client: Client | AsyncClient | None = None,
        *,
        concurrency: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: int = 20,
        grace_seconds: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.grace_seconds = grace_seconds
        self.routes: dict[str, _Route] = {}
        self.stopping = False
        self._api: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._give_back: asyncio.Future[None] | None = None
        self._threads: _Threads | None = None
        self._slots: asyncio.Semaphore | None = None
        self._acks: _Acknowledger | None = None
        self._running: set[asyncio.Task[None]] = set()

    def handler(
        self, queue: str, *, lease_seconds: int | None = None
    ) -> Callable[[H], H]:
        """Register the decorated function (sync or async, taking a Context)
        for ``queue``."""

        def register(fn: H) -> H:
            self.routes[queue] = _Route(queue, fn, lease_seconds)
            return fn

        return register

    def run(self) -> None:
        """Run until SIGTERM or SIGINT (or ``stop``), then shut down gracefully."""
        asyncio.run(self.serve())

    def stop(self) -> None:
        """Stop claiming and shut down (safe from any thread or a signal handler)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def serve(self) -> None:
        """The worker's life in the running loop: claim and run until stopped."""
        if not self.routes:
            raise ValueError("the worker has no handler: add one with @worker.handler")
        if self.client is None:
            raise ValueError("the worker has no client: Worker(Client(url, token))")
        self._loop = asyncio.get_running_loop()
        self._stop, self._give_back = asyncio.Event(), self._loop.create_future()
        self._threads = _Threads()
        self._slots = asyncio.Semaphore(self.concurrency)
        self.stopping = False
        owned = isinstance(self.client, Client)
        self._api = (
            self.client
            if isinstance(self.client, AsyncClient)
            else AsyncClient.like(self.client)
        )
        self._acks = _Acknowledger(self._api)
        signals = self._handle_signals()
        log.info(
            "worker started",
            extra={
                "worker": self._api.worker,
                "queues": sorted(self.routes),
                "concurrency": self.concurrency,
            },
        )
        pollers = [asyncio.create_task(self._poll(r)) for r in self.routes.values()]
        try:
            await self._stop.wait()
        finally:
            self.stopping = True
            for task in pollers:
                task.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)
            await self._drain()
            for signum in signals:
                self._loop.remove_signal_handler(signum)
            self._threads.close()
            if owned:
                await self._api.aclose()
            log.info("worker stopped", extra={"worker": self._api.worker})

    def _handle_signals(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None and self._stop is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(signum, self._stop.set)
        return [signal.SIGTERM, signal.SIGINT]

    async def _drain(self) -> None:
        """Let in-flight todos finish within the grace period, then give the
        rest back."""
        if not self._running:
            return
        log.info(
            "worker stopping",
            extra={
                "in_flight": len(self._running),
                "grace_seconds": self.grace_seconds,
            },
        )
        await asyncio.wait(set(self._running), timeout=self.grace_seconds)
        assert self._give_back is not None
        self._give_back.set_result(None)
        if self._running:
            await asyncio.wait(set(self._running))

    async def _poll(self, route: _Route) -> None:
        """Claim for one queue whenever a slot is free: a batch when several are."""
        assert self._slots is not None and self._api is not None
        share = max(1, min(MAX_BATCH, self.concurrency // len(self.routes)))
        # With fewer slots than queues a queue's long poll would hold a slot
        # another queue may need: poll briefly instead.
        wait = self.wait_seconds if self.concurrency >= len(self.routes) else 1
        lease = route.lease_seconds or self.lease_seconds
        while True:
            await self._slots.acquire()
            held = 1
            while held < share and not self._slots.locked():
                await self._slots.acquire()
                held += 1
            try:
                todos = await self._claim(route.queue, held, lease, wait)
            except asyncio.CancelledError:
                self._free(held)
                raise
            self._free(held - len(todos))
            for todo in todos:
                task = asyncio.create_task(self._execute(route, todo))
                self._running.add(task)
                task.add_done_callback(self._finished)

    async def _claim(
        self, queue: str, count: int, lease: int | None, wait: int
    ) -> list[Todo]:
        assert self._api is not None
        try:
            if count == 1:
                todo = await self._api.claim(
                    queue=queue, lease_seconds=lease, wait_seconds=wait
                )
                return [] if todo is None else [todo]
            return await self._api.claim_many(
                count, queue=queue, lease_seconds=lease, wait_seconds=wait
            )
        except SwitchboardError as exc:
            # An outage or a refusal (a revoked token): say so, wait, try again.
            log.warning("claim failed", extra={"queue": queue, "error": _describe(exc)})
            await asyncio.sleep(1.0)
            return []

    def _free(self, count: int) -> None:
        assert self._slots is not None
        for _ in range(count):
            self._slots.release()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._free(1)

    async def _execute(self, route: _Route, todo: Todo) -> None:
        """Run one todo's handler with its lease kept alive; end the attempt."""
        assert self._give_back is not None
        ctx = Context(self, todo, _lease_of(todo))
        ctx.log.info("todo started")
        started = time.monotonic()
        beats = ctx._beats = _Beats(self, ctx)
        run = self._call(route.handler, ctx)
        try:
            await asyncio.wait(
                {run, self._give_back}, return_when=asyncio.FIRST_COMPLETED
            )
            if not run.done():
                run.cancel()
                ctx.log.info("todo given back at shutdown")
                await beats.finish()
                await self._give_back_todo(ctx, "the worker shut down")
                return
            await beats.finish()
            await self._settle(ctx, run)
        finally:
            beats.stop()
            if ctx.log.isEnabledFor(logging.INFO):
                took = round(time.monotonic() - started, 3)
                ctx.log.info("todo ended", extra={"seconds": took})

    def _call(self, handler: Handler, ctx: Context) -> asyncio.Future[Any]:
        """The handler's outcome: an async one as a task, a sync one run by
        one of the worker's threads; either in the todo's trace context."""
        if inspect.iscoroutinefunction(handler):
            # The task copies the context current when it is made.
            with _tracing.within(ctx.todo.trace_context):
                return asyncio.ensure_future(handler(ctx))
        assert self._threads is not None
        return self._threads.run(handler, ctx)

    async def _settle(self, ctx: Context, run: asyncio.Future[Any]) -> None:
        """End the attempt as the handler did."""
        assert self._api is not None
        error = run.exception()
        if error is None:
            result = run.result()
            if _is_json(result):
                await self._end(ctx, "complete", result=result)
                return
            error = TypeError(f"the handler's result is not JSON: {result!r:.200}")
        if isinstance(error, Ask):
            ctx.log.info("todo asks", extra={"question": error.question[:200]})
            await self._asked(ctx, error)
        elif isinstance(error, GiveBack):
            await self._give_back_todo(ctx, error.note)
        else:
            ctx.log.warning("todo failed", extra={"error": _describe(error)})
            await self._end(ctx, "fail", error=_describe(error))

    async def _give_back_todo(self, ctx: Context, note: str | None) -> None:
        await self._end(ctx, "release", note=note, checkpoint=ctx.checkpoint)

    async def _end(self, ctx: Context, op: str, **fields: JSON) -> None:
        """Send the action that ends the attempt (through the acknowledger,
        with others that end meanwhile); a lost lease is logged, not raised."""
        assert self._acks is not None
        action = {"op": op, "id": ctx.todo.id, "lease_token": ctx.todo.lease_token}
        action.update({k: v for k, v in fields.items() if v is not None})
        try:
            done = await self._acks.send(action)
        except SwitchboardError as exc:
            ctx.log.error("todo not acknowledged", extra={"error": _describe(exc)})
            return
        if done.error is None:
            ctx.log.debug("todo acknowledged", extra={"op": op})
        elif done.status in (404, 409):
            detail = f"{done.error.error}: {done.error.detail}"
            ctx.log.warning("todo lost", extra={"error": detail})
        else:
            detail = f"{done.status} {done.error.error}: {done.error.detail}"
            ctx.log.error("todo not acknowledged", extra={"error": detail})

    async def _asked(self, ctx: Context, ask: Ask) -> None:
        """Send the ask (a call of its own: the batch takes no ask)."""
        assert self._api is not None
        options = {k: v for k, v in ask.options.items() if v is not None}
        try:
            await self._api.ask(
                ctx.todo,
                ask.question,
                checkpoint=ctx.checkpoint,
                lease_token=ctx.todo.lease_token,
                **options,
            )
        except (Conflict, NotFound) as exc:
            ctx.log.warning("todo lost", extra={"error": _describe(exc)})
        except SwitchboardError as exc:
            ctx.log.error("todo not acknowledged", extra={"error": _describe(exc)})

    async def _beat(self, ctx: Context) -> None:
        dirty, ctx._dirty = ctx._dirty, False
        try:
            todo = await self._heartbeat(ctx, dirty)
        except (Conflict, NotFound) as exc:
            ctx._lost.set()
            ctx.log.warning("lease lost", extra={"error": _describe(exc)})
            return
        except APIError as exc:
            if not dirty:
                ctx.log.warning("heartbeat refused", extra={"error": _describe(exc)})
                return
            # The progress or checkpoint it carried was refused (a checkpoint
            # over its limit): say so, and keep the lease without them.
            ctx.log.warning("checkpoint refused", extra={"error": _describe(exc)})
            await self._beat(ctx)
            return
        except SwitchboardError as exc:
            ctx._dirty = ctx._dirty or dirty
            ctx.log.warning("heartbeat failed", extra={"error": _describe(exc)})
            return
        if todo.cancel_requested and not ctx._cancel.is_set():
            ctx._cancel.set()
            ctx.log.info("cancel requested")

    async def _heartbeat(self, ctx: Context, dirty: bool) -> Todo:
        """Extend the lease; with the progress and checkpoint when ``dirty``."""
        assert self._api is not None
        return await self._api.heartbeat(
            ctx.todo,
            lease_token=ctx.todo.lease_token,
            lease_seconds=ctx.lease_seconds,
            progress=ctx._progress if dirty else None,
            checkpoint=ctx.checkpoint if dirty else None,
        )

    def _beat_now(self, ctx: Context) -> None:
        """A heartbeat now; from a handler's thread, wait until it is sent."""
        assert self._loop is not None
        if _in_loop(self._loop):
            assert ctx._beats is not None
            ctx._beats.now()
            return
        sent: Future[None] = asyncio.run_coroutine_threadsafe(
            self._beat(ctx), self._loop
        )
        sent.result()


class _Beats:
    """A todo's heartbeats: one every third of its lease, or at once when
    asked (``now``), each with the progress and checkpoint saved since the
    last. A timer waits between them, so a todo that ends before its first
    beat costs no task."""

    def __init__(self, worker: Worker, ctx: Context) -> None:
        self.worker = worker
        self.ctx = ctx
        self.loop = asyncio.get_running_loop()
        self.interval = max(ctx.lease_seconds / 3, 0.2)
        self.task: asyncio.Task[None] | None = None
        self.again = False
        self.stopped = False
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.interval, self.now
        )

    def now(self) -> None:
        """A heartbeat now, or right after the one in flight."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            self.again = True
        elif not self.stopped:
            self.task = self.loop.create_task(self._beat())

    async def _beat(self) -> None:
        try:
            await self.worker._beat(self.ctx)
        finally:
            self.task = None
        if self.again:
            self.again = False
            self.now()
        elif not self.stopped:
            self.timer = self.loop.call_later(self.interval, self.now)

    async def finish(self) -> None:
        """Stop before the attempt's end is sent: no timer fires any more,
        and a beat in flight is waited for, so no heartbeat reaches the
        server after the end (it would be refused, and read as a lost lease)."""
        self.stopped = True
        self.again = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            await asyncio.wait({self.task})

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


class _Threads:
    """The daemon threads that run sync handlers. A thread whose handler
    returned takes the next one (starting a thread a todo costs more than a
    short todo); one whose handler never returns is never reused, and being a
    daemon cannot hold the process once its todo is given back."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.closed = False

    def run(self, handler: Handler, ctx: Context) -> asyncio.Future[Any]:
        """Run ``handler(ctx)`` in a thread; its outcome, in the running loop."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if outcome.done():
                return
            if error is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(result)

        def job() -> None:
            threading.current_thread().name = f"handler-{ctx.todo.id}"
            result, error = None, None
            try:
                with _tracing.within(ctx.todo.trace_context):
                    result = handler(ctx)
            except BaseException as exc:  # carried to the loop, which ends the attempt
                error = exc
            # The loop is gone when the todo was given back and the worker exited.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, result, error)

        with self.lock:
            start = self.idle == 0
            if not start:
                self.idle -= 1
        self.jobs.put(job)
        if start:
            threading.Thread(target=self._serve, daemon=True).start()
        return outcome

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()
            with self.lock:
                if self.closed:
                    return
                self.idle += 1

    def close(self) -> None:
        """Let the idle threads end (a busy one ends after its handler)."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, 0
        for _ in range(idle):
            self.jobs.put(None)


class _Acknowledger:
    """Sends the actions that end attempts (complete, fail, release). One goes
    at once, alone (``POST /api/v1/todos/<id>/complete``…); those that end
    while it is in flight wait and go together in one ``POST
    /api/v1/todos/batch``, so a busy worker sends one request for many todos
    and an idle one no later, and no dearer to the server, than alone."""

    def __init__(self, api: AsyncClient) -> None:
        self.api = api
        self.waiting: list[tuple[dict[str, JSON], asyncio.Future[ActionResult]]] = []
        self.sending = False

    async def send(self, action: dict[str, JSON]) -> ActionResult:
        """Send ``action`` (with any that wait beside it); return its result."""
        done: asyncio.Future[ActionResult] = asyncio.get_running_loop().create_future()
        self.waiting.append((action, done))
        if not self.sending:
            # This caller sends until nothing waits; the others only await.
            self.sending = True
            try:
                while self.waiting:
                    batch = self.waiting[:MAX_ACK_BATCH]
                    del self.waiting[:MAX_ACK_BATCH]
                    await self._send(batch)
            finally:
                self.sending = False
        return await done

    async def _send(
        self, batch: list[tuple[dict[str, JSON], asyncio.Future[ActionResult]]]
    ) -> None:
        if len(batch) == 1:
            action, done = batch[0]
            try:
                done.set_result(await self._alone(action))
            except SwitchboardError as exc:
                done.set_exception(exc)
            return
        try:
            results = await self.api.batch([action for action, _ in batch])
        except (BadRequest, PayloadTooLarge) as exc:
            # One action the server refuses (a checkpoint over its limit)
            # refuses the whole batch: send each alone, so only it fails.
            if len(batch) > 1:
                for item in batch:
                    await self._send([item])
                return
            results = [
                ActionResult(str(batch[0][0]["id"]), exc.status, error=_item(exc))
            ]
        except SwitchboardError as exc:
            for _, done in batch:
                done.set_exception(exc)
            return
        for (_, done), result in zip(batch, results, strict=True):
            done.set_result(result)

    async def _alone(self, action: dict[str, JSON]) -> ActionResult:
        """Send one action as its own call; its result as a batch reads it,
        without the todo (an outage still raises, as it fails a whole batch)."""
        todo_id = str(action["id"])
        body = {k: v for k, v in action.items() if k not in ("op", "id")}
        call = _core.bare_acknowledgement(todo_id, str(action["op"]), body)
        try:
            await self.api.send(call)
        except Unavailable:
            raise
        except APIError as exc:
            return ActionResult(todo_id, exc.status, error=_item(exc))
        return ActionResult(todo_id, 200)


def _item(exc: APIError) -> ItemError:
    return ItemError(exc.status, exc.error, exc.detail)


def _is_json(value: Any) -> bool:
    """Whether a handler's result can be sent as JSON."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _lease_of(todo: Todo) -> int:
    """The lease the claim granted, in whole seconds (at least one)."""
    if todo.lease_expires_at is None or todo.claimed_at is None:
        return 300
    return max(1, round((todo.lease_expires_at - todo.claimed_at).total_seconds()))


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
