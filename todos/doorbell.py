"""The doorbell: wake a waiting agent when a todo of its scope becomes claimable.

The store rings it with ``pg_notify`` inside each transition that makes a todo
claimable (create, release, retry, lease-expiry requeue, due-retry requeue),
so a wakeup is sent exactly when the transition commits. The payload carries
the todo's own ``endpoint_id``, ``queue`` and ``id``.

One ``Hub`` per server process holds the only LISTEN connection (its own, never
a request's: LISTEN state is per connection, and it must bypass a
transaction-mode pooler, see ``SWITCHBOARD_LISTEN_DATABASE_URL``). It fans each
ring out to that process's waiters, filtered by endpoint first — the tenant
boundary — and then by the waiter's queue grant:

- a *stream* waiter (``/api/v1/events``, an MCP GET stream) hears every ring
  of its scope;
- a *claim* waiter (a long-poll claim) is one of many competing for work: a
  ring wakes the longest-waiting one only, and a waiter that claimed, or left
  without trying, passes the ring on to the next, so no ready todo is slept
  through and a ring does not stampede a thousand claims.

A waiter holds no thread and no database connection while it waits: it is a
mailbox the hub thread fills. The hub also carries control notices on a second
channel (``CONTROL_CHANNEL``, rung by triggers of migration 0012): an endpoint
revoked, its token rotated or its grant changed; an MCP session ended or its
log level changed. On (re)connecting it tells every waiter to re-check, since
rings sent while it was away are lost; every few seconds it asks one claim
waiter per scope to re-check, for work that turns claimable without a ring (a
lease that lapsed before the reaper's pass).
"""

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
import time
import weakref
from collections import deque

import psycopg
from django.conf import settings
from django.db import connections

from todos.store import DOORBELL_CHANNEL, NotFound, Scope

logger = logging.getLogger("switchboard.doorbell")

CONTROL_CHANNEL = "switchboard_control"
# Notices a waiter may receive besides rings.
RECHECK = "recheck"  # look again: the hub (re)connected, or a periodic re-check
LOST = "lost"  # the LISTEN connection is gone; rings may be missed until RECHECK
ENDPOINT = "endpoint"  # the endpoint was revoked, re-keyed or re-granted
SESSION = "session"  # the MCP session ended or changed
SHUTDOWN = "shutdown"  # the server is stopping: end now


def recheck_seconds():
    """How often one claim waiter per scope re-tries without a ring (see above)."""
    return settings.SWITCHBOARD_LONG_POLL_RECHECK_SECONDS


# How long the hub waits before reconnecting, doubling up to the cap.
RECONNECT_FIRST_SECONDS = 0.2
RECONNECT_CAP_SECONDS = 2.0
# While the hub is not listening, claim waiters poll this often instead.
UNHEARD_POLL_SECONDS = 1.0
# How long the hub thread blocks on the socket before looking at its own state.
TICK_SECONDS = 0.5


def _connect():
    # Behind a transaction-mode pooler LISTEN is lost between transactions, so
    # the doorbell may have a connection string of its own (session mode, or
    # PostgreSQL itself).
    keepalives = {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    url = settings.SWITCHBOARD_LISTEN_DATABASE_URL
    if url:
        return psycopg.connect(url, autocommit=True, connect_timeout=3, **keepalives)
    params = connections["default"].get_connection_params()
    # Django's cursor class, adapters and pool are for its own connections.
    for key in ("cursor_factory", "context", "prepare_threshold", "pool"):
        params.pop(key, None)
    params.setdefault("application_name", "switchboard-doorbell")
    return psycopg.connect(autocommit=True, **{**keepalives, **params})


def parse(payload):
    """Decode a ring's JSON payload, or None when it is not one of ours."""
    try:
        ring = json.loads(payload)
    except (TypeError, ValueError):
        logger.warning("doorbell: ignoring a malformed payload")
        return None
    return ring if isinstance(ring, dict) else None


class Waiter:
    """One waiting request's mailbox: the rings and notices the hub left for it.

    ``wait`` (async) or ``wait_blocking`` (a thread) returns ``(rings,
    notices)`` as soon as there is something, or empty at the timeout. The
    waiter may move between event loops between two waits (under WSGI each
    step of a stream runs in a loop of its own).
    """

    def __init__(self, hub, scope, kind, session_id=None):
        self.hub = hub
        self.scope = scope
        self.kind = kind
        self.session_id = str(session_id) if session_id is not None else None
        self.rings = deque()
        self.notices = set()
        self.ended = False
        self._woken = None
        self._in_batch = False
        self._thread_event = threading.Event()

    def matches(self, ring):
        """Say whether a ring belongs to this waiter: endpoint first, then grant."""
        if ring.get("endpoint_id") != str(self.scope.endpoint_id):
            return False
        return self.scope.covers(ring.get("queue"))

    @property
    def busy(self):
        return bool(self.rings or self.notices)

    # Called by the hub with its lock held.
    def _deliver(self, ring=None, notice=None):
        if ring is not None:
            self.rings.append(ring)
        if notice is not None:
            self.notices.add(notice)
        self._thread_event.set()
        if self._woken is None:
            return
        if self.kind == "stream" and notice is None:
            # A ring: with the other streams of the loop, in a moment. (The
            # wait stays open to a notice, which wakes it at once.)
            if not self._in_batch:
                self._in_batch = True
                self.hub._wake_in_batch(self._woken)
            return
        _wake_soon(self._woken)
        self._woken = None

    def _take(self):
        rings, notices = list(self.rings), set(self.notices)
        self.rings.clear()
        self.notices.clear()
        self._thread_event.clear()
        return rings, notices

    async def wait(self, timeout):
        # One future woken by the hub or by a timer: a stream waits once per
        # ring, and asyncio.wait_for's coroutine, Event and Timeout cost more.
        loop = asyncio.get_running_loop()
        with self.hub.lock:
            if self.busy:
                return self._take()
            woken = self._woken = loop.create_future()
            self._in_batch = False
        timer = loop.call_later(max(timeout, 0), _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
        # (A cancelled wait leaves its done future behind: a later ring's
        # _wake then does nothing, and the ring stays in the mailbox.)
        with self.hub.lock:
            self._woken = None
            return self._take()

    def wait_blocking(self, timeout):
        self._thread_event.wait(max(timeout, 0))
        with self.hub.lock:
            return self._take()

    def close(self):
        """Leave the hub; rings not taken yet go to another claim waiter."""
        self.hub.unsubscribe(self)


def _wake(woken):
    if not woken.done():
        woken.set_result(None)


def _wake_soon(woken):
    with contextlib.suppress(RuntimeError):
        # (RuntimeError: that loop is closed; the wait it had is gone.)
        woken.get_loop().call_soon_threadsafe(_wake, woken)


def keepalive_wait(seconds):
    """How long a stream waits for a ring before its keep-alive: between
    three quarters of ``seconds`` and all of it, drawn anew for each wait.

    Streams opened together (a wave of clients reconnecting after a restart)
    or woken together (by a ring to their scope) would otherwise send their
    keep-alives together for good: 1 350 silent streams of one process wrote
    theirs in one burst every 15 s, and each probe's p99 ran into it.
    """
    return seconds * random.uniform(0.75, 1.0)


def stream_batch_seconds():
    return settings.SWITCHBOARD_STREAM_BATCH_MS / 1000


class Hub:
    """The process's one LISTEN connection and the waiters it serves."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_endpoint = {}
        self.connected = False
        self.shutting_down = False
        self.conn = None
        self.generation = 0
        self._thread = None
        self._started_in_pid = None
        self._stop = threading.Event()
        self.listening = threading.Event()
        # Stream waiters rung but not woken yet, per event loop (see
        # _wake_in_batch); weak, so a closed loop's batch goes with it.
        self._batches = weakref.WeakKeyDictionary()

    # --- Waiters ------------------------------------------------------------

    def subscribe(self, scope, kind="claim", session_id=None):
        """Register a waiter; it hears rings from now on (once the hub listens)."""
        self._ensure_running()
        waiter = Waiter(self, scope, kind, session_id)
        with self.lock:
            self.by_endpoint.setdefault(str(scope.endpoint_id), []).append(waiter)
            if self.shutting_down:
                waiter._deliver(notice=SHUTDOWN)
            elif self.generation and not self.connected:
                # It listened before and lost its connection: rings are being
                # missed now. (Before the first LISTEN, the RECHECK that
                # follows it covers the gap.)
                waiter._deliver(notice=LOST)
        return waiter

    def unsubscribe(self, waiter):
        with self.lock:
            if waiter.ended:
                return
            waiter.ended = True
            group = self.by_endpoint.get(str(waiter.scope.endpoint_id), [])
            if waiter in group:
                group.remove(waiter)
            if not group:
                self.by_endpoint.pop(str(waiter.scope.endpoint_id), None)
            leftover = list(waiter.rings)
            if waiter.kind == "claim":
                for ring in leftover:
                    self._dispatch_ring(ring)

    def pass_on(self, waiter, rings, recheck=False):
        """Hand a claim waiter's rings (or its re-check) to the next waiter."""
        with self.lock:
            for ring in rings:
                self._dispatch_ring(ring, exclude=waiter)
            if recheck:
                for other in self.by_endpoint.get(str(waiter.scope.endpoint_id), []):
                    if (
                        other is not waiter
                        and other.kind == "claim"
                        and other.scope == waiter.scope
                        and not other.busy
                    ):
                        other._deliver(notice=RECHECK)
                        break

    def waiter_count(self):
        with self.lock:
            return sum(len(group) for group in self.by_endpoint.values())

    def shutdown(self):
        """Tell every waiter to end now (the server is stopping)."""
        with self.lock:
            self.shutting_down = True
            for waiter in self._all():
                waiter._deliver(notice=SHUTDOWN)

    def _all(self):
        return [waiter for group in self.by_endpoint.values() for waiter in group]

    # --- Fan-out (lock held) -----------------------------------------------

    def _wake_in_batch(self, woken):
        """Wake a stream waiter with the others of its loop, a moment later.

        A ring reaches every open stream of its scope, and each woken stream
        costs its event loop a write. Woken together ``SWITCHBOARD_STREAM_
        BATCH_MS`` after the first ring, the streams take every ring of that
        moment in one write, and the request that rang (a create) is answered
        before its loop turns to the fan-out instead of after it.
        """
        delay = stream_batch_seconds()
        loop = woken.get_loop()
        if delay <= 0:
            _wake_soon(woken)
            return
        batch = self._batches.get(loop)
        if batch is None:
            try:
                loop.call_soon_threadsafe(
                    loop.call_later, delay, self._wake_batch, loop
                )
            except RuntimeError:
                return  # That loop is closed; the wait it had is gone.
            batch = self._batches[loop] = []
        batch.append(woken)

    def _wake_batch(self, loop):
        # In the loop's own thread.
        with self.lock:
            batch = self._batches.pop(loop, ())
        for woken in batch:
            _wake(woken)

    def _dispatch_ring(self, ring, exclude=None):
        group = self.by_endpoint.get(str(ring.get("endpoint_id")), ())
        chosen = None
        for waiter in group:
            if waiter is exclude or not waiter.matches(ring):
                continue
            if waiter.kind == "stream":
                waiter._deliver(ring=ring)
            elif chosen is None or (chosen.busy and not waiter.busy):
                # The longest-waiting idle claim waiter, else the first busy one.
                chosen = waiter
        if chosen is not None:
            chosen._deliver(ring=ring)

    def _dispatch_control(self, notice):
        endpoint_id = str(notice.get("endpoint_id"))
        kind = notice.get("kind")
        for waiter in self.by_endpoint.get(endpoint_id, ()):
            if kind == ENDPOINT:
                waiter._deliver(notice=ENDPOINT)
            elif kind == SESSION and waiter.session_id == str(notice.get("session_id")):
                waiter._deliver(notice=SESSION)

    def _recheck_claims(self, part=0, parts=1):
        """Ask the first idle claim waiter of each distinct scope to look again:
        of the scopes in ``part`` (of ``parts``), so that a recheck period's
        claim tries are spread over it instead of arriving at once."""
        seen = set()
        for waiter in self._all():
            if waiter.kind != "claim" or waiter.scope in seen:
                continue
            seen.add(waiter.scope)
            if hash(waiter.scope) % parts == part and not waiter.busy:
                waiter._deliver(notice=RECHECK)

    # --- The listening thread ------------------------------------------------

    def _ensure_running(self):
        with self.lock:
            pid = os.getpid()
            if self._thread is not None and self._started_in_pid == pid:
                return
            # First use in this process (or in a forked child of the one that
            # started it: threads do not survive a fork).
            self._started_in_pid = pid
            self.connected = False
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="switchboard-doorbell", daemon=True
            )
            self._thread.start()

    def stop(self):
        """Stop the listening thread (tests; a server process just exits)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        with self.lock:
            self._thread = None
            self.connected = False
            self.listening.clear()

    def _run(self):
        delay = RECONNECT_FIRST_SECONDS
        last_recheck, rechecks = time.monotonic(), 0
        while not self._stop.is_set():
            try:
                conn = _connect()
                conn.execute(f"LISTEN {DOORBELL_CHANNEL}; LISTEN {CONTROL_CHANNEL}")
            except psycopg.Error as exc:
                logger.warning(
                    "doorbell: cannot listen; retrying",
                    extra={"fields": {"error": type(exc).__name__}},
                )
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_CAP_SECONDS)
                continue
            delay = RECONNECT_FIRST_SECONDS
            with self.lock:
                self.conn = conn
                self.connected = True
                self.listening.set()
                self.generation += 1
                # Rings sent while nobody listened are lost: everyone looks again.
                for waiter in self._all():
                    waiter.notices.discard(LOST)
                    waiter._deliver(notice=RECHECK)
            try:
                while not self._stop.is_set():
                    for notify in conn.notifies(timeout=TICK_SECONDS):
                        message = parse(notify.payload)
                        if message is None:
                            continue
                        with self.lock:
                            if notify.channel == CONTROL_CHANNEL:
                                self._dispatch_control(message)
                            else:
                                self._dispatch_ring(message)
                    # One part of the scopes each tick: every scope once per
                    # recheck period, the tries spread over it.
                    if time.monotonic() - last_recheck >= TICK_SECONDS:
                        last_recheck = time.monotonic()
                        parts = max(1, round(recheck_seconds() / TICK_SECONDS))
                        with self.lock:
                            self._recheck_claims(rechecks % parts, parts)
                        rechecks += 1
            except psycopg.Error as exc:
                logger.warning(
                    "doorbell: LISTEN connection lost; reconnecting",
                    extra={"fields": {"error": type(exc).__name__}},
                )
            finally:
                with self.lock:
                    self.connected = False
                    self.listening.clear()
                    self.conn = None
                    if not self._stop.is_set():
                        for waiter in self._all():
                            waiter._deliver(notice=LOST)
                with contextlib.suppress(psycopg.Error):
                    conn.close()


hub = Hub()


class Doorbell:
    """A stream waiter of one scope, used as a context manager::

    with Doorbell(scope) as bell:
        rings = bell.wait(timeout=20)
    """

    def __init__(self, scope):
        self.scope = scope
        self.waiter = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()

    def open(self):
        self.waiter = hub.subscribe(self.scope, "stream")
        # A blocking caller cannot take the RECHECK that follows a first LISTEN.
        hub.listening.wait(5)

    @property
    def conn(self):
        """The hub's LISTEN connection (shared by the process's waiters)."""
        return hub.conn

    def close(self):
        if self.waiter is not None:
            self.waiter.close()
            self.waiter = None

    def wait(self, timeout, stop_after=1):
        """Wait up to ``timeout`` s for rings of this scope (a blocking wait)."""
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            rings, _ = self.waiter.wait_blocking(deadline - time.monotonic())
            if rings or time.monotonic() >= deadline:
                return rings[: max(stop_after, len(rings))]


# --- Long-poll claims -------------------------------------------------------------


class Revoked(Exception):
    """The waiter's endpoint was revoked or re-keyed while it waited."""


def _bell_scope(scope, queue):
    return Scope(scope.endpoint_id, (queue,)) if queue else scope


class FirstTry:
    """A long poll's first try, made by ``begin_claim`` in a database thread."""

    def __init__(self, scope, queue, wait, attempt):
        self.deadline = time.monotonic() + wait
        self.tries = _Attempts(None, attempt)
        # Registered before the try: a todo that turns ready after it rings
        # us, so one try both answers at once and starts the wait.
        self.waiter = (
            hub.subscribe(_bell_scope(scope, queue), "claim") if wait > 0 else None
        )
        try:
            self.result = self.tries.claimed_blocking()
        except BaseException:
            self.close()
            raise
        if self.result is not None:
            # Leaving passes on a ring that came during the try.
            self.close()

    def close(self):
        if self.waiter is not None:
            self.waiter.close()

    def take(self):
        """Hand the tries and the waiter over to the wait, which ends them.

        Let go of here: the tries hold the caller's ``attempt``, and the
        caller often holds this, a cycle that would outlive the request.
        """
        taken = self.tries, self.waiter, self.deadline
        self.tries = self.waiter = None
        return taken


def begin_claim(scope, queue, wait, attempt):
    """The first try of a long poll (sync: run it in the request's database
    call, after the authentication, to save a hop); finish it with
    ``aclaim_when_ready(..., first=...)``."""
    return FirstTry(scope, queue, wait, attempt)


async def aclaim_when_ready(
    scope, queue, wait, attempt, db, *, still_valid=None, first=None
):
    """Await ``attempt`` (run through ``db``) until it claims, for ``wait`` s.

    ``attempt`` is a plain function that claims one todo or a batch (it raises
    ``store.NotFound`` or returns an empty list while there is no claimable
    work); ``db(attempt)`` runs it in a thread that holds a pooled connection
    only for the call. Between tries the waiter holds nothing but its mailbox.
    The last NotFound (or empty batch) is the answer at the deadline, at once
    when ``wait`` is 0, and when the server shuts down. ``still_valid`` (run
    through ``db`` when the endpoint changed) returns the scope to go on with,
    or raises. ``first`` is the first try when ``begin_claim`` made it already.
    """
    if first is None:
        first = await db(begin_claim, scope, queue, wait, attempt)
    tries, waiter, deadline = first.take()
    tries.db = db
    if first.result is not None or waiter is None:
        return first.result if first.result is not None else tries.nothing()
    try:
        while True:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return tries.nothing()
                timeout = remaining if hub.connected else UNHEARD_POLL_SECONDS
                rings, notices = await waiter.wait(min(remaining, timeout))
                if SHUTDOWN in notices:
                    hub.pass_on(waiter, rings)
                    return tries.nothing()
                if ENDPOINT in notices and still_valid is not None:
                    new_scope = await db(still_valid)
                    if new_scope != scope:
                        hub.unsubscribe(waiter)
                        hub.pass_on(waiter, rings)
                        return await aclaim_when_ready(
                            new_scope,
                            queue,
                            max(deadline - time.monotonic(), 0),
                            attempt,
                            db,
                            still_valid=still_valid,
                        )
                if rings or notices - {LOST} or not hub.connected:
                    break
            result = await tries.claimed()
            if result is not None:
                # There may be more: the next waiter looks too.
                hub.pass_on(waiter, rings, recheck=RECHECK in notices)
                return result
    finally:
        hub.unsubscribe(waiter)


class _Attempts:
    """Runs the tries; remembers the last empty answer to give at the end."""

    def __init__(self, db, attempt):
        self.db = db
        self.attempt = attempt
        self.empty = None

    async def claimed(self):
        """Try once through ``db``; the claim, or None when nothing was claimable."""
        return await self.db(self.claimed_blocking)

    def claimed_blocking(self):
        try:
            result = self.attempt()
        except NotFound as exc:
            # Without its traceback: that holds this frame, and so ``self``,
            # a reference cycle only a full garbage collection would free.
            self.empty = exc.with_traceback(None)
            return None
        if isinstance(result, list) and not result:
            self.empty = result
            return None
        return result

    def nothing(self):
        """The answer when the wait ends empty: the last NotFound, or []."""
        empty, self.empty = self.empty, None
        if isinstance(empty, list):
            return empty
        if empty is None:
            raise NotFound(NO_WORK)
        # Raised, it holds this frame through its traceback; neither it nor
        # this frame may hold it back, or the request becomes a cycle.
        try:
            raise empty
        finally:
            del empty


NO_WORK = "no claimable todo"


def claim_when_ready(scope, queue, wait, attempt):
    """The blocking twin of ``aclaim_when_ready`` for sync callers (MCP tools).

    The calling thread waits on the hub's mailbox, not on a LISTEN connection
    of its own, and gives its database connection back while it waits.
    """
    deadline = time.monotonic() + wait
    tries = _Attempts(None, attempt)
    if wait <= 0:
        result = tries.claimed_blocking()
        return result if result is not None else tries.nothing()
    waiter = hub.subscribe(_bell_scope(scope, queue), "claim")
    try:
        while True:
            result = tries.claimed_blocking()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return tries.nothing()
            _release_connection()
            timeout = remaining if hub.connected else UNHEARD_POLL_SECONDS
            rings, notices = waiter.wait_blocking(min(remaining, timeout))
            if SHUTDOWN in notices:
                hub.pass_on(waiter, rings)
                return tries.nothing()
    finally:
        hub.unsubscribe(waiter)


def _release_connection():
    connection = connections["default"]
    if not connection.in_atomic_block:
        connection.close()
