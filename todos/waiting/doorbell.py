"""The doorbell hub: two LISTEN connections per server process, in its event loop.

The store rings the doorbell with ``pg_notify`` inside each transition that
makes a todo claimable, so a ring is sent exactly when the transition commits;
its payload is the todo's ``endpoint_id``, ``queue`` and ``id``. Triggers
(migrations 0012, 0016) send control notices on a second channel: an endpoint
revoked, its token rotated, its grant changed or its SQS key rotated (which
also drops its cached credentials, todos.access.auth, as every (re)connect and
disconnect drops them all); an MCP session ended or its log level changed.

The hub listens on connections of its own (never a request's: LISTEN state is
per connection and must bypass a transaction-mode pooler, see
``SWITCHBOARD_LISTEN_DATABASE_URL``), as tasks of the worker's event loop: one
hears the rings (and the todos' events), the other the control notices alone,
so that a revocation is heard within milliseconds however many rings are
queued before it (a burst of 100,000 takes the rings connection seconds to
read). The hub fans each ring out to that process's waiters, filtered by
endpoint first — the tenant boundary — then by the waiter's queue grant:

- a *stream* waiter (``todos.waiting.streams``) hears every ring of its scope;
- a *claim* waiter (``todos.waiting.longpoll``) competes for work: a ring wakes the
  longest-waiting one only, and one that claimed, or left without trying,
  passes the ring on, so no ready todo is slept through and a ring does not
  stampede a thousand claims.

A waiter is a mailbox: it holds no thread and no connection. Rings sent while
the hub was not listening are lost, and so are control notices: on every
(re)connect each waiter is told to re-validate its caller and look again.
Work also turns claimable without a ring: a lease lapses, a retry window or a
delay ends. A claim waiter whose try found nothing learns when the next such
instant of its scope is (``store.next_due``) and the hub sets one timer per
scope for it (``due``), which asks one waiter to look again then. Every few
seconds one claim waiter per scope is also asked to look again, for what no
timer foresaw (a lease shortened after the look). Any failure of the hub is
logged and the hub reconnects.

Each channel of the rings connection is heard only while the process has
a waiter for it: the rings while it has a claim waiter or a stream, a
todo's events (``todo.done``, ...) while it has a stream or a result wait.
Every create and every end of a grouped todo in the cluster rings, every
completion sends an event, and a process that would only drop them should
not wake for them (40 µs each, in every process). A channel is listened to
before a stream subscribes (``hearing_rings_and_events``), or once a claim
waiter or a result wait has (which then looks again, ``TRY``: what turned
ready before the LISTEN rang unheard), and given up ``LINGER_SECONDS`` after
the last waiter for it left.
"""

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict, TypeGuard

import psycopg
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from todos.access import auth
from todos.db.params import listen_params
from todos.store import DOORBELL_CHANNEL, TODO_EVENT_CHANNEL, Scope

logger = logging.getLogger("switchboard.doorbell")

CONTROL_CHANNEL = "switchboard_control"
# What a waiter may be told besides rings.
TRY = "try"  # look again (the periodic re-check, or after a reconnect)
REVALIDATE = "revalidate"  # the endpoint changed, or notices may have been missed
LOST = "lost"  # the LISTEN connection is gone: rings are missed until it is back
SESSION = "session"  # the MCP session ended or changed
SHUTDOWN = "shutdown"  # the server is stopping: end now

# The hub's two connections: the rings (the doorbell, and the todos' events
# when wanted) and the control notices, each heard on its own so that a
# backlog of rings never holds a revocation back.
RINGS, CONTROL = "rings", "control"
ROLES = frozenset({RINGS, CONTROL})
# The waiters that hear rings, and those that hear a todo's events.
RING_KINDS = frozenset({"claim", "stream"})
EVENT_KINDS = frozenset({"stream", "todo"})
# How long a channel stays heard after its last waiter left.
LINGER_SECONDS = 30.0
# How long a waiter about to subscribe waits for the event channel's LISTEN.
EVENTS_LISTEN_WAIT_SECONDS = 2.0
RING_FIELDS = ("endpoint_id", "queue", "id")
CONTROL_FIELDS = ("endpoint_id", "kind")
RECONNECT_FIRST_SECONDS = 0.2
RECONNECT_CAP_SECONDS = 2.0
# While the hub is not listening, claim waiters re-validate and try this often.
UNHEARD_POLL_SECONDS = 1.0
TICK_SECONDS = 0.5
# A due re-check runs this long after the instant (a lease has lapsed only
# once ``lease_expires_at < now()``, and the clocks tick apart).
DUE_MARGIN_SECONDS = 0.005


class Ring(TypedDict):
    """A ring (a todo turned claimable) or a todo's event, as a waiter hears it.

    ``parse`` checked that its fields are strings; the event channel's
    notices name their event too (``todo.done``, ...; a ring is ``todo.ready``).
    """

    endpoint_id: str
    queue: str
    id: str
    event: NotRequired[str]


class Control(TypedDict):
    """A control notice: an endpoint changed (``kind`` "endpoint"), or an MCP
    session did (``kind`` "session", with its ``session_id``)."""

    endpoint_id: str
    kind: str
    session_id: NotRequired[object]


class _Keepalives(TypedDict):
    keepalives: int
    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int


KEEPALIVES: _Keepalives = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


async def _connect(role: str = RINGS) -> psycopg.AsyncConnection[TupleRow]:
    """A LISTEN connection for ``role``: the control one's application name
    is the doorbell's with ``-control`` after it."""
    url = settings.SWITCHBOARD_LISTEN_DATABASE_URL
    if url:
        params: dict[str, Any] = {"connect_timeout": 3, **conninfo_to_dict(url)}
    else:
        params = listen_params()
    params.setdefault("application_name", "switchboard-doorbell")
    if role == CONTROL:
        params["application_name"] += "-control"
    return await psycopg.AsyncConnection.connect(
        autocommit=True, **{**KEEPALIVES, **params}
    )


def parse(
    payload: str, fields: tuple[str, ...] = ("endpoint_id",)
) -> dict[str, object] | None:
    """Decode a notice's JSON payload, or None when it is not one of ours."""
    try:
        message = json.loads(payload)
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(message, dict):
        return None
    if not all(isinstance(message.get(field), str) for field in fields):
        return None
    return message


def is_ring(message: dict[str, object]) -> TypeGuard[Ring]:
    """Say whether a parsed notice is a ring or a todo's event (its
    ``RING_FIELDS`` are text)."""
    return all(isinstance(message.get(field), str) for field in RING_FIELDS)


def is_control(message: dict[str, object]) -> TypeGuard[Control]:
    """Say whether a parsed notice is a control notice (its ``CONTROL_FIELDS``
    are text)."""
    return all(isinstance(message.get(field), str) for field in CONTROL_FIELDS)


def keepalive_wait(seconds: float) -> float:
    """A stream's silence before its keep-alive, drawn anew between 3/4 of
    ``seconds`` and all of it: streams opened or woken together would else
    send their keep-alives together for good, in one burst."""
    return seconds * random.uniform(0.75, 1.0)


class Waiter:
    """One waiting request's mailbox: the rings and notices the hub left."""

    def __init__(
        self,
        hub: "Hub",
        scope: Scope,
        kind: str,
        session_id: object = None,
        todo_id: object = None,
    ) -> None:
        self.hub, self.scope, self.kind = hub, scope, kind
        self.session_id = str(session_id) if session_id is not None else None
        # A "todo" waiter (todos.waiting.results) hears the events of this one todo.
        self.todo_id = str(todo_id) if todo_id is not None else None
        self.rings: deque[Ring] = deque()
        self.notices: set[str] = set()
        self.ended = False
        # Subscribed while the process did not hear what it waits for.
        self.unheard = False
        self._woken: asyncio.Future[None] | None = None
        self._in_batch = False

    def matches(self, ring: Ring) -> bool:
        if ring.get("endpoint_id") != str(self.scope.endpoint_id):
            return False
        return self.scope.covers(ring.get("queue"))

    @property
    def busy(self) -> bool:
        return bool(self.rings or self.notices)

    def _deliver(self, ring: Ring | None = None, notice: str | None = None) -> None:
        if ring is not None:
            self.rings.append(ring)
        if notice is not None:
            self.notices.add(notice)
        if self._woken is None:
            return
        if self.kind == "stream" and notice is None:
            # A ring: with the other streams, in a moment; the wait stays
            # open to a notice, which wakes it at once.
            if not self._in_batch:
                self._in_batch = True
                self.hub._wake_in_batch(self._woken)
            return
        _wake(self._woken)
        self._woken = None

    def _take(self) -> tuple[list[Ring], set[str]]:
        rings, notices = list(self.rings), set(self.notices)
        self.rings.clear()
        self.notices.clear()
        return rings, notices

    async def wait(self, timeout: float) -> tuple[list[Ring], set[str]]:
        """Return ``(rings, notices)`` once there are some, or empty at the timeout."""
        loop = asyncio.get_running_loop()
        if self.busy:
            return self._take()
        woken = self._woken = loop.create_future()
        self._in_batch = False
        timer = loop.call_later(max(timeout, 0), _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._woken = None
        return self._take()

    def close(self) -> None:
        """Leave the hub; rings not taken yet go to another claim waiter."""
        self.hub.unsubscribe(self)


class Channel:
    """One channel of the rings connection: whether it is heard now, how many
    waiters hear it, and when the last one left (or one was about to come)."""

    def __init__(self, name: str, kinds: frozenset[str]) -> None:
        self.name, self.kinds = name, kinds
        self.heard = False
        self.waiters = 0
        self.wanted_at = 0.0

    def wanted(self, awaited: bool) -> bool:
        """Whether it should be heard: a waiter hears it, a stream is about to
        (``awaited``), or one did within ``LINGER_SECONDS``."""
        recent = time.monotonic() - self.wanted_at < LINGER_SECONDS
        return self.waiters > 0 or awaited or recent


def _wake(woken: "asyncio.Future[None]") -> None:
    if not woken.done():
        woken.set_result(None)


class Hub:
    """The process's LISTEN connection and the waiters it serves.

    It is touched only from its event loop: a waiter comes and goes there
    (the async views await all their work in it), and the notices are heard
    there. Another thread tells it something through the loop
    (``loop.call_soon_threadsafe``), as a worker's signal handler does.
    """

    def __init__(self) -> None:
        self.by_endpoint: dict[str, list[Waiter]] = {}
        # Both connections listen (``_listening`` holds the roles that do).
        self.connected = False
        self._listening: set[str] = set()
        self.shutting_down = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ticker: asyncio.TimerHandle | None = None
        self._ticks = 0
        self._batch: list[asyncio.Future[None]] = []
        # The rings connection's channels, and the calls waiting for both
        # LISTENs (hearing_rings_and_events).
        self.rings = Channel(DOORBELL_CHANNEL, RING_KINDS)
        self.events = Channel(TODO_EVENT_CHANNEL, EVENT_KINDS)
        self.channels = (self.rings, self.events)
        self._rethink: asyncio.Event | None = None
        self._awaiting_both: list[asyncio.Future[None]] = []
        # Per claim scope, the re-check set for when its next todo falls due
        # with no ring (``due``): the loop time and its timer.
        self._due: dict[Scope, tuple[float, asyncio.TimerHandle]] = {}

    # --- Waiters ----------------------------------------------------------------

    def start(self) -> None:
        """Listen in the running event loop (the worker's), once."""
        loop = asyncio.get_running_loop()
        running = any(not task.done() for task in self._tasks)
        if running and self.loop is not None and not self.loop.is_closed():
            return
        self.loop, self.connected = loop, False
        self._listening.clear()
        auth.cache.listening(self, False)
        self._rethink = asyncio.Event()
        self._tasks = [
            loop.create_task(self._run(RINGS), name="switchboard-doorbell"),
            loop.create_task(self._run(CONTROL), name="switchboard-control"),
        ]
        self._ticker = loop.call_later(TICK_SECONDS, self._tick)

    def subscribe(
        self,
        scope: Scope,
        kind: str = "claim",
        session_id: object = None,
        todo_id: object = None,
    ) -> Waiter:
        """Register a waiter; it hears rings from now on.

        ``kind`` is "claim", "stream", or "todo" (with ``todo_id``: a wait for
        that todo's events, todos.waiting.results).
        """
        waiter = Waiter(self, scope, kind, session_id, todo_id)
        self.by_endpoint.setdefault(str(scope.endpoint_id), []).append(waiter)
        if self.shutting_down:
            waiter._deliver(notice=SHUTDOWN)
        for channel in self.channels:
            channel.waiters += kind in channel.kinds
        if not self._hears(kind):
            # A claim waiter or a result wait (a stream awaits
            # hearing_rings_and_events first) looks again once its channels
            # are heard (_listen).
            waiter.unheard = True
            self._ask_rethink()
        return waiter

    def _hears(self, kind: str) -> bool:
        """Whether this process hears every channel a ``kind`` waiter needs."""
        return all(channel.heard for channel in self.channels if kind in channel.kinds)

    async def hearing_rings_and_events(self) -> None:
        """Make sure this process hears the rings and todos' events before a
        stream subscribes: LISTEN now if it does not yet. (A claim waiter or
        a result wait, which may not wait at all, just subscribes: it looks
        again once its channels are heard.)

        Returns at once when the hub is not connected (the waiter polls, and
        the connect listens for it); else when the LISTEN is done, or after
        ``EVENTS_LISTEN_WAIT_SECONDS`` at most.
        """
        self.start()
        now = time.monotonic()
        for channel in self.channels:
            channel.wanted_at = now
        if all(channel.heard for channel in self.channels) or not self.connected:
            return
        heard = asyncio.get_running_loop().create_future()
        self._awaiting_both.append(heard)
        self._ask_rethink()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(heard), EVENTS_LISTEN_WAIT_SECONDS)

    def _wanted(self) -> tuple[bool, ...]:
        """Whether each channel should be heard, in ``channels``' order."""
        awaited = bool(self._awaiting_both)
        return tuple(channel.wanted(awaited) for channel in self.channels)

    def _ask_rethink(self) -> None:
        """Have the listening task look at what to listen to."""
        if self._rethink is not None:
            self._rethink.set()

    def rescope(self, waiter: Waiter, scope: Scope) -> None:
        """Let ``waiter`` hear its caller's new grant (same endpoint)."""
        waiter.scope = scope

    def unsubscribe(self, waiter: Waiter) -> None:
        if waiter.ended:
            return
        waiter.ended = True
        for channel in self.channels:
            if waiter.kind in channel.kinds:
                channel.waiters -= 1
                if not channel.waiters:
                    channel.wanted_at = time.monotonic()
        group = self.by_endpoint.get(str(waiter.scope.endpoint_id), [])
        if waiter in group:
            group.remove(waiter)
        if not group:
            self.by_endpoint.pop(str(waiter.scope.endpoint_id), None)
        if waiter.kind == "claim":
            for ring in waiter.rings:
                self._dispatch_ring(ring, claims_only=True)

    def pass_on(self, waiter: Waiter, rings: list[Ring], recheck: bool = False) -> None:
        """Hand a claim waiter's rings (or its re-check) to the next waiter."""
        for ring in rings:
            self._dispatch_ring(ring, exclude=waiter, claims_only=True)
        if not recheck:
            return
        for other in self.by_endpoint.get(str(waiter.scope.endpoint_id), []):
            same = other.kind == "claim" and other.scope == waiter.scope
            if other is not waiter and same and not other.busy:
                other._deliver(notice=TRY)
                return

    def due(self, scope: Scope, delay: float) -> None:
        """Have one claim waiter of ``scope`` look again in ``delay`` seconds,
        when a todo there turns claimable with no ring (a lease lapses, a
        retry window or a delay ends: ``store.anext_due``). One timer per
        scope, at the earliest instant asked for; called in the hub's loop
        (a long poll's try, todos.waiting.longpoll)."""
        if self.loop is None:
            return
        at = self.loop.time() + max(delay, 0) + DUE_MARGIN_SECONDS
        current = self._due.get(scope)
        if current is not None:
            if current[0] <= at:
                return
            current[1].cancel()
        timer = self.loop.call_at(at, self._fire_due, scope)
        self._due[scope] = (at, timer)

    def _fire_due(self, scope: Scope) -> None:
        self._due.pop(scope, None)
        for waiter in self.by_endpoint.get(str(scope.endpoint_id), ()):
            if waiter.kind == "claim" and waiter.scope == scope:
                if not waiter.busy:
                    waiter._deliver(notice=TRY)
                return

    def shutdown(self) -> None:
        """Tell every waiter to end now (the server is stopping)."""
        self.shutting_down = True
        self._tell_all(SHUTDOWN)

    def _tell_all(self, *notices: str) -> None:
        for group in self.by_endpoint.values():
            for waiter in group:
                for notice in notices:
                    waiter._deliver(notice=notice)

    # --- Fan-out -------------------------------------------------------------------

    def _wake_in_batch(self, woken: "asyncio.Future[None]") -> None:
        """Wake a stream with the others rung in the same moment.

        Each woken stream costs the loop a write: woken together
        ``SWITCHBOARD_STREAM_BATCH_MS`` after the first ring, the streams
        take that moment's rings in one write, and the create that rang is
        answered before the loop turns to the fan-out.
        """
        delay = settings.SWITCHBOARD_STREAM_BATCH_MS / 1000
        loop = self.loop
        if delay <= 0 or loop is None:
            _wake(woken)
            return
        if not self._batch:
            loop.call_later(delay, self._wake_batch)
        self._batch.append(woken)

    def _wake_batch(self) -> None:
        batch, self._batch = self._batch, []
        for woken in batch:
            _wake(woken)

    def _dispatch_ring(
        self, ring: Ring, exclude: Waiter | None = None, claims_only: bool = False
    ) -> None:
        chosen = None
        for waiter in self.by_endpoint.get(ring["endpoint_id"], ()):
            if waiter is exclude or not waiter.matches(ring):
                continue
            if waiter.kind == "stream":
                if not claims_only:
                    waiter._deliver(ring=ring)
            elif chosen is None or (chosen.busy and not waiter.busy):
                # The longest-waiting idle claim waiter, else the first busy one.
                chosen = waiter
        if chosen is not None:
            chosen._deliver(ring=ring)

    def _dispatch_event(self, event: Ring) -> None:
        # A todo's event (it ended, asked, or got a cancel request): to the
        # streams of its scope and the waiters of that todo; a claim has
        # nothing to take from it.
        for waiter in self.by_endpoint.get(event["endpoint_id"], ()):
            if not waiter.matches(event):
                continue
            if waiter.kind == "stream" or (
                waiter.kind == "todo" and waiter.todo_id == str(event["id"])
            ):
                waiter._deliver(ring=event)

    def _dispatch_control(self, notice: Control) -> None:
        kind = notice.get("kind")
        if kind == "endpoint":
            # Before the waiters re-validate, so that they read the row anew.
            auth.cache.forget(notice["endpoint_id"])
        for waiter in self.by_endpoint.get(notice["endpoint_id"], ()):
            if kind == "endpoint":
                waiter._deliver(notice=REVALIDATE)
            elif kind == SESSION and waiter.session_id == str(notice.get("session_id")):
                waiter._deliver(notice=SESSION)

    def _recheck_claims(self, part: int = 0, parts: int = 1) -> None:
        """Ask the first idle claim waiter of each scope in ``part`` (of
        ``parts``) to look again: a period's tries spread over it."""
        seen: set[Scope] = set()
        for group in self.by_endpoint.values():
            for waiter in group:
                if waiter.kind != "claim" or waiter.scope in seen:
                    continue
                seen.add(waiter.scope)
                if hash(waiter.scope) % parts == part and not waiter.busy:
                    waiter._deliver(notice=TRY)

    # --- Listening, in the event loop --------------------------------------------

    def _tick(self) -> None:
        if self.loop is None:  # start() set it before the first tick
            return
        self._ticker = self.loop.call_later(TICK_SECONDS, self._tick)
        if not self.connected:
            return
        period = settings.SWITCHBOARD_LONG_POLL_RECHECK_SECONDS
        parts = max(1, round(period / TICK_SECONDS))
        wanted = self._wanted()
        if any(
            channel.heard and not wants
            for channel, wants in zip(self.channels, wanted, strict=True)
        ):
            self._ask_rethink()
        self._recheck_claims(self._ticks % parts, parts)
        self._ticks += 1

    async def _run(self, role: str) -> None:
        """Keep the ``role`` connection listening: connect, LISTEN, hear its
        notices until it fails, reconnect."""
        delay = RECONNECT_FIRST_SECONDS
        while True:
            conn = None
            try:
                conn = await _connect(role)
                if role == RINGS:
                    wanted = self._wanted()
                    await conn.execute(_listen(self.channels, wanted))
                else:
                    await conn.execute(f"LISTEN {CONTROL_CHANNEL}")
                delay = RECONNECT_FIRST_SECONDS
                if role == RINGS:
                    # Every waiter looks again once both connections listen
                    # (_listened), the unheard ones too.
                    for channel, heard in zip(self.channels, wanted, strict=True):
                        channel.heard = heard
                    for group in self.by_endpoint.values():
                        for waiter in group:
                            waiter.unheard = waiter.unheard and not self._hears(
                                waiter.kind
                            )
                    if all(wanted):
                        self._both_heard()
                self._listened(role, True)
                if role == RINGS:
                    await self._hear(conn)
                else:
                    await self._notices(conn)
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                logger.warning(
                    "doorbell: not listening; reconnecting",
                    extra={"fields": {"error": type(exc).__name__, "role": role}},
                )
            except Exception:
                logger.exception("doorbell: the hub failed; restarting it")
            finally:
                if role == RINGS:
                    for channel in self.channels:
                        channel.heard = False
                    self._both_heard()
                self._listened(role, False)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_CAP_SECONDS)

    def _listened(self, role: str, listens: bool) -> None:
        """Note that the ``role`` connection listens now, or stopped.
        Whatever it was sent while it did not is lost, rings and
        control notices alike: each change forgets the cached credentials,
        and once both listen again every waiter re-validates and looks."""
        was = self.connected
        if listens:
            self._listening.add(role)
        else:
            self._listening.discard(role)
        self.connected = self._listening == ROLES
        auth.cache.listening(self, self.connected)
        if was and not self.connected:
            self._tell_all(LOST)
        elif self.connected and listens:
            for group in self.by_endpoint.values():
                for waiter in group:
                    waiter.notices.discard(LOST)
            self._tell_all(REVALIDATE, TRY)

    async def _hear(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Hand on each notice; between notices, LISTEN to the rings and the
        event channel or UNLISTEN them when asked to (_ask_rethink). Returns
        only by raising."""
        assert self._rethink is not None  # start() made it
        while True:
            hearing = asyncio.ensure_future(self._notices(conn))
            asked = asyncio.ensure_future(self._rethink.wait())
            try:
                await asyncio.wait(
                    (hearing, asked), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for task in (hearing, asked):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            if hearing.done() and not hearing.cancelled():
                hearing.result()  # the connection failed: raise it
            # Before what is wanted is read: a later ask makes another turn.
            self._rethink.clear()
            await self._listen(conn)

    async def _notices(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        async for notify in conn.notifies():
            self._heard(notify)
        raise psycopg.OperationalError("the notices stopped")

    async def _listen(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        wanted = self._wanted()
        if wanted != tuple(channel.heard for channel in self.channels):
            # A channel given up stops counting as heard before its UNLISTEN:
            # a waiter that subscribes meanwhile is unheard, and looks again.
            for channel, heard in zip(self.channels, wanted, strict=True):
                channel.heard = channel.heard and heard
            await conn.execute(_listen(self.channels, wanted))
        for channel, heard in zip(self.channels, wanted, strict=True):
            channel.heard = heard
        # A waiter that subscribed before its channels were heard may have
        # missed a ring or its todo's end: it looks again.
        for group in self.by_endpoint.values():
            for waiter in group:
                if waiter.unheard and self._hears(waiter.kind):
                    waiter.unheard = False
                    waiter._deliver(notice=TRY)
        if all(wanted):
            self._both_heard()

    def _both_heard(self) -> None:
        # hearing_rings_and_events' callers go on (heard, or the hub is gone).
        heard, self._awaiting_both = self._awaiting_both, []
        for future in heard:
            if not future.done():
                future.set_result(None)

    def _heard(self, notify: psycopg.Notify) -> None:
        message = parse(notify.payload)
        if message is None:
            pass
        elif notify.channel == CONTROL_CHANNEL:
            if is_control(message):
                self._dispatch(self._dispatch_control, message)
                return
        elif is_ring(message):
            if notify.channel == TODO_EVENT_CHANNEL:
                self._dispatch(self._dispatch_event, message)
            else:
                self._dispatch(self._dispatch_ring, message)
            return
        logger.warning("doorbell: ignoring a malformed payload")

    def _dispatch[M](self, dispatch: Callable[[M], None], message: M) -> None:
        try:
            dispatch(message)
        except Exception:
            logger.exception("doorbell: a notice could not be delivered")

    async def stop(self) -> None:
        """Stop listening (tests; a server process just exits)."""
        if self._ticker is not None:
            self._ticker.cancel()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks, self._ticker = [], None
        for _, timer in self._due.values():
            timer.cancel()
        self._due.clear()
        self.connected = False
        for channel in self.channels:
            channel.heard = False
        self._listening.clear()
        auth.cache.listening(self, False)
        self._both_heard()


def _listen(channels: tuple[Channel, ...], wanted: tuple[bool, ...]) -> str:
    """The rings connection's statement: each of its channels heard or not."""
    return "; ".join(
        f"{'LISTEN' if heard else 'UNLISTEN'} {channel.name}"
        for channel, heard in zip(channels, wanted, strict=True)
    )


hub = Hub()
