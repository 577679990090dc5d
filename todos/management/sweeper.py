"""The background sweeps: drain them in batches, once or in a long-running loop.

The store's sweeps (``reap_expired``, ``requeue_due_retries``) each move one
batch in one statement, so a todo is either moved with its history row and its
wakeup or not at all; stopping between batches never leaves one half-moved.
The commands build on the two pieces here:

- ``drain`` runs one sweep batch after batch until a batch comes back short.
- ``sweep_once`` fires the schedules whose slots came due first (one todo
  per slot, ``store.fire_due_schedules``), and also rolls the history up into
  the Board's per-minute statistics (``store.stats.roll_up_minutes``) and
  the usage ledger into the spend totals (``store.spend.roll_up_usage``):
  the charts and /metrics read those, so they are as fresh as the last pass.
- ``Sweeper`` runs both sweeps every ``interval`` seconds until ``stop()`` (or
  SIGTERM/SIGINT once ``install_signal_handlers()`` was called); between
  passes it fires each schedule slot at its time. It sleeps in
  short slices so a stop takes effect within a fraction of a second, and it
  survives a database restart: a failed pass is logged, Django's connection is
  closed, and the next pass connects afresh.
"""

import argparse
import logging
import os
import signal
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections, connection

from todos import store
from todos.mcp import sessions as mcp_sessions
from todos.store import spend
from todos.store import stats as store_stats

logger = logging.getLogger("switchboard.sweep")

# How long one sleep slice lasts: the longest a stop request waits.
SLEEP_SLICE_SECONDS = 0.1
# Between passes the loop looks this often for a schedule slot coming due
# (and sleeps until the next one when it is sooner).
SCHEDULE_LOOK_SECONDS = 1.0

# A batch is one statement; past this size it holds its row locks too long.
MAX_BATCH_SIZE = 100_000


def batch_size_arg(raw):
    """Parse a command-line batch size: 1 to MAX_BATCH_SIZE."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number, not {raw!r}"
        ) from None
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(
            f"must be between 1 and {MAX_BATCH_SIZE}, not {value}"
        )
    return value


def positive_seconds(raw):
    """Parse a command-line duration in seconds that must be above zero."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {raw!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(
            f"must be above 0 and at most 86400, not {raw}"
        )
    return value


def drain(sweep, *, batch_size=store.SWEEP_BATCH, should_stop=None):
    """Yield each batch a sweep moves, until a batch is short (or a stop is asked)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    while True:
        moved = sweep(limit=batch_size)
        yield moved
        if len(moved) < batch_size or (should_stop is not None and should_stop()):
            return


@dataclass
class PassResult:
    """What one pass of both sweeps moved."""

    requeued: int = 0
    dead_lettered: int = 0
    retried: int = 0
    # Lapsed leases under a cancel request, ended canceled.
    canceled: int = 0
    # Open questions whose deadline passed: their hold ended with no answer.
    questions_expired: int = 0
    # MCP sessions idle past SWITCHBOARD_MCP_SESSION_IDLE_SECONDS, deleted.
    sessions_expired: int = 0
    # Delayed todos that came due: their doorbells rung (not moved).
    woken: int = 0
    # Schedule slots that made their todo, and slots skipped (missed, overlap).
    fired: int = 0
    fire_skips: int = 0
    # The database time the next pass's delayed-todo window starts from.
    delayed_until: object = None
    rolled_up: bool = False
    seconds: float = 0.0
    endpoints: set = field(default_factory=set)

    @property
    def moved(self):
        return self.requeued + self.dead_lettered + self.retried + self.canceled


def _log_moved(sweep_name, moved):
    for todo in moved:
        logger.debug(
            "todo moved",
            extra={
                "fields": {
                    "sweep": sweep_name,
                    "todo_id": todo.id,
                    "endpoint_id": todo.endpoint_id,
                    "queue": todo.queue,
                    "state": todo.state,
                }
            },
        )


def log_pass(message, result):
    """Log one pass's counts as a structured line."""
    logger.info(
        message,
        extra={
            "fields": {
                "requeued": result.requeued,
                "dead_lettered": result.dead_lettered,
                "retried": result.retried,
                "canceled": result.canceled,
                "questions_expired": result.questions_expired,
                "sessions_expired": result.sessions_expired,
                "woken": result.woken,
                "fired": result.fired,
                "fire_skips": result.fire_skips,
                "endpoints": len(result.endpoints),
                "ms": round(result.seconds * 1000, 1),
            }
        },
    )


def sweep_once(*, batch_size=store.SWEEP_BATCH, should_stop=None, delayed_since=None):
    """Fire due schedules, reap expired leases, requeue due retries, expire
    questions past their deadline, ring delayed todos that came due, roll up
    the Board's minutes.

    ``delayed_since`` is the previous pass's ``delayed_until`` (None: look back
    a minute); a delayed todo's ring is a wakeup only, the claim scan takes
    a due todo by itself.
    """
    started = time.monotonic()
    result = PassResult()
    # First, so a slot's todo is made as soon after its time as the pass allows.
    while True:
        fired = store.fire_due_schedules(limit=store.FIRE_BATCH)
        result.fired += fired.fired
        result.fire_skips += fired.skipped
        result.endpoints.update(todo.endpoint_id for todo in fired.todos or ())
        if fired.schedules < store.FIRE_BATCH or (
            should_stop is not None and should_stop()
        ):
            break
    for moved in drain(
        store.reap_expired, batch_size=batch_size, should_stop=should_stop
    ):
        _log_moved("reap_expired", moved)
        for todo in moved:
            result.endpoints.add(todo.endpoint_id)
            if todo.state == "pending":
                result.requeued += 1
            elif todo.state == "done":
                result.canceled += 1
            else:
                result.dead_lettered += 1
    for moved in drain(
        store.requeue_due_retries, batch_size=batch_size, should_stop=should_stop
    ):
        _log_moved("requeue_due_retries", moved)
        result.retried += len(moved)
        result.endpoints.update(todo.endpoint_id for todo in moved)
    for moved in drain(
        store.expire_questions, batch_size=batch_size, should_stop=should_stop
    ):
        _log_moved("expire_questions", moved)
        result.questions_expired += len(moved)
        result.endpoints.update(todo.endpoint_id for todo in moved)
    result.sessions_expired = mcp_sessions.forget_expired()
    since = delayed_since
    while True:
        rung, since = store.ring_due_delayed(since, limit=batch_size)
        result.woken += len(rung)
        if len(rung) < batch_size or (should_stop is not None and should_stop()):
            break
    result.delayed_until = since
    # After the sweeps, so the minutes include what they just moved.
    result.rolled_up = store_stats.roll_up_minutes().ran
    spend.roll_up_usage()
    result.seconds = time.monotonic() - started
    return result


class Sweeper:
    """Run both sweeps every ``interval`` seconds until stopped.

    Lifecycle: construct, optionally ``install_signal_handlers()``, then
    ``run()`` blocks until ``stop()`` is called (from a signal handler or
    another thread). ``run()`` returns after the pass in flight finishes its
    current batch, never in the middle of a statement.
    """

    def __init__(self, *, interval, batch_size=store.SWEEP_BATCH):
        if interval <= 0:
            raise ValueError("interval must be positive")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.interval = interval
        self.batch_size = batch_size
        self.passes = 0
        self.failures = 0
        self.stop_signal = None
        self.delayed_since = None
        self._stopping = False

    @property
    def stopping(self):
        return self._stopping

    def stop(self):
        """Ask the loop to finish; it returns within a sleep slice."""
        self._stopping = True

    def install_signal_handlers(self):
        """Stop cleanly on SIGTERM (systemd, docker stop) and SIGINT (Ctrl-C)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        # Only set flags here: logging from a handler could re-enter a write
        # the signal interrupted. run() logs the signal when it returns.
        self.stop_signal = signal.Signals(signum).name
        self.stop()

    def run(self):
        """Sweep every interval until stopped; return the number of passes."""
        logger.info(
            "sweep loop started",
            extra={
                "fields": {
                    "interval": self.interval,
                    "batch_size": self.batch_size,
                    "pid": os.getpid(),
                }
            },
        )
        while not self._stopping:
            # A long-lived process sees no request signals, so honour
            # CONN_MAX_AGE and the health check (which notices a connection
            # the server dropped) here, before each pass.
            close_old_connections()
            self.run_pass()
            self._wait(self.interval)
        connection.close()
        logger.info(
            "sweep loop stopped",
            extra={
                "fields": {
                    "passes": self.passes,
                    "failures": self.failures,
                    "signal": self.stop_signal,
                }
            },
        )
        return self.passes

    def run_pass(self):
        """Run one pass of both sweeps; return its result, or None when it failed."""
        try:
            result = sweep_once(
                batch_size=self.batch_size,
                should_stop=lambda: self._stopping,
                delayed_since=self.delayed_since,
            )
        except (store.Unavailable, DatabaseError) as exc:
            self.failures += 1
            cause = exc.__cause__ if isinstance(exc, store.Unavailable) else exc
            logger.warning(
                "sweep pass failed; will reconnect",
                extra={
                    "fields": {
                        "operation": getattr(exc, "operation", "sweep"),
                        "error": type(cause or exc).__name__,
                        "failures": self.failures,
                    }
                },
            )
            # The connection may be dead (server restart, terminated backend):
            # drop it so the next pass opens a fresh one.
            connection.close()
            return None
        self.passes += 1
        self.delayed_since = result.delayed_until
        if result.moved or result.fired or result.fire_skips:
            log_pass("sweep pass", result)
        return result

    def _wait(self, seconds):
        """Sleep until the next pass, firing each schedule slot that comes due
        meanwhile at its time: a slot waits for no pass (its lateness is the
        firing's own), and the sweeps run no more often for it."""
        deadline = time.monotonic() + seconds
        while not self._stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            due_in = self._fire_schedules()
            if due_in is None:
                due_in = SCHEDULE_LOOK_SECONDS
            # Due already: another sweeper holds it (SKIP LOCKED); look again soon.
            self._sleep(min(remaining, max(due_in, SLEEP_SLICE_SECONDS / 2)))

    def _fire_schedules(self):
        """Fire the due schedule slots; return the seconds until the next slot
        (at most SCHEDULE_LOOK_SECONDS: a schedule made meanwhile is seen), or
        None when the database failed (the next pass logs and reconnects)."""
        try:
            fired = skipped = 0
            while not self._stopping:
                result = store.fire_due_schedules(limit=store.FIRE_BATCH)
                fired, skipped = fired + result.fired, skipped + result.skipped
                if result.schedules < store.FIRE_BATCH:
                    break
            due_in = store.seconds_to_next_slot()
        except (store.Unavailable, DatabaseError):
            connection.close()
            return None
        if fired or skipped:
            logger.info(
                "schedule slots fired",
                extra={"fields": {"fired": fired, "skipped": skipped}},
            )
        return (
            SCHEDULE_LOOK_SECONDS
            if due_in is None
            else min(due_in, SCHEDULE_LOOK_SECONDS)
        )

    def _sleep(self, seconds):
        deadline = time.monotonic() + seconds
        while not self._stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(SLEEP_SLICE_SECONDS, remaining))
