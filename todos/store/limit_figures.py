"""What admission holds back, per queue, for ``/metrics`` (CONTRACT §17).

The gauges: the groups whose due pending todos their limit (the group's
override, else the queue's ``group_concurrency``) or their pause holds back at
this instant, and how many todos wait in them (``held_by_limit``).

The counters: every candidate a claim's admission passed over, by reason
(``limit``: its group was at its limit; ``paused``: its group is paused;
``rate_limit`` / ``group_rate_limit``: the queue's or the group's rate window
had no room for its cost), as ``switchboard_admit`` reports them with the
claim's answer; and ``rate_wait``, the long polls that waited because a rate
window passed over what they could have claimed (counted once per poll). A
group the claim already saw at its limit (or paused) is skipped before
admission and not counted: the gauges show those. Each process counts in
memory, for free, and adds its counts to the ``admission_counts`` table every
``FLUSH_SECONDS`` (a thread of its own, on its own connection) and when
``/metrics`` is read, so every server's and command's claims add up there.
"""

import atexit
import contextvars
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection

from .rows import StoreError
from .sql import _run

logger = logging.getLogger("switchboard.store")

# Each group with due pending todos (todos_group_pending_idx), kept when
# switchboard_group_full (the claim's own test) says it has no room.
HELD_BY_LIMIT_SQL = """
SELECT p.endpoint_id::text, p.queue, count(*), sum(p.waiting)
  FROM (SELECT t.endpoint_id, t.queue, t.group_key, count(*) AS waiting
          FROM todos t
         WHERE t.state = 'pending' AND t.group_key IS NOT NULL
           AND t.available_at <= statement_timestamp()
         GROUP BY t.endpoint_id, t.queue, t.group_key) p
  JOIN queues q ON q.endpoint_id = p.endpoint_id AND q.name = p.queue
 WHERE switchboard_group_full(p.endpoint_id, p.queue, p.group_key,
                              q.group_concurrency)
 GROUP BY p.endpoint_id, p.queue
 ORDER BY 1, 2
"""


@dataclass(frozen=True)
class HeldByLimit:
    """One queue's groups at their limit (or paused) with todos waiting."""

    endpoint_id: str
    queue: str
    groups: int
    todos: int


def held_by_limit() -> list[HeldByLimit]:
    """Per queue, the groups whose due todos a limit or a pause holds back
    now, and those todos (system-wide: /metrics is staff's)."""
    return [
        HeldByLimit(endpoint_id, queue, int(groups), int(todos))
        for endpoint_id, queue, groups, todos in _run(
            "held_by_limit", HELD_BY_LIMIT_SQL, {}
        )
    ]


# --- Counters -------------------------------------------------------------------

PASSED_REASONS = ("limit", "paused", "rate_limit", "group_rate_limit")
RATE_REASONS = frozenset({"rate_limit", "group_rate_limit"})
RATE_WAIT = "rate_wait"
FLUSH_SECONDS = 10.0

# (endpoint_id, queue, counter) -> count not yet added to admission_counts.
_pending: Counter[tuple[str, str, str]] = Counter()
_lock = threading.Lock()
_flusher: dict[str, Any] = {"pid": None}
# The (endpoint_id, queue) pairs whose rate window passed over a candidate in
# the last claim of this context (a long poll's task asks after its try).
_last_rated: contextvars.ContextVar[frozenset[tuple[str, str]]] = (
    contextvars.ContextVar("switchboard_last_rated", default=frozenset())
)


def note_passed(passed: str | list[dict[str, Any]] | None) -> None:
    """Count what a claim's admission passed over: ``passed`` is the claim
    row's ``passed`` column (a jsonb array, as text on Django's connection,
    or None when nothing was passed over)."""
    items = json.loads(passed) if isinstance(passed, str) else passed or []
    rated: set[tuple[str, str]] = set()
    if items:
        with _lock:
            for item in items:
                key = (str(item["endpoint"]), str(item["queue"]))
                _pending[(*key, str(item["passed"]))] += 1
                if item["passed"] in RATE_REASONS:
                    rated.add(key)
        _start_flusher()
    _last_rated.set(frozenset(rated))


def rate_limited() -> frozenset[tuple[str, str]]:
    """The (endpoint_id, queue) pairs whose rate window held back a candidate
    of this context's last claim (none before any claim)."""
    return _last_rated.get()


def forget_rate_limited() -> None:
    """Start a claim's try with nothing rate-limited noted."""
    _last_rated.set(frozenset())


def note_rate_wait(pairs: frozenset[tuple[str, str]]) -> None:
    """Count one long poll that waits because these queues' rate windows held
    back what it could have claimed."""
    if not pairs:
        return
    with _lock:
        for endpoint_id, queue in pairs:
            _pending[(endpoint_id, queue, RATE_WAIT)] += 1
    _start_flusher()


FLUSH_SQL = """
INSERT INTO admission_counts (endpoint_id, queue, counter, count)
SELECT u.endpoint_id, u.queue, u.counter, u.count
  FROM unnest(%(endpoints)s::uuid[], %(queues)s::text[], %(counters)s::text[],
              %(counts)s::bigint[]) AS u (endpoint_id, queue, counter, count)
 ORDER BY 1, 2, 3
    ON CONFLICT (endpoint_id, queue, counter)
    DO UPDATE SET count = admission_counts.count + EXCLUDED.count
"""


def flush() -> None:
    """Add this process's counts to ``admission_counts`` (on this thread's
    connection); on failure they stay here for the next flush."""
    with _lock:
        taken = dict(_pending)
        _pending.clear()
    if not taken:
        return
    keys = sorted(taken)
    try:
        _run(
            "admission_counts",
            FLUSH_SQL,
            {
                "endpoints": [key[0] for key in keys],
                "queues": [key[1] for key in keys],
                "counters": [key[2] for key in keys],
                "counts": [taken[key] for key in keys],
            },
            fetch=None,
        )
    except (StoreError, DatabaseError):
        with _lock:
            _pending.update(taken)
        raise


def _start_flusher() -> None:
    """Start this process's flush thread once (again in a forked child)."""
    if _flusher["pid"] == os.getpid():
        return
    with _lock:
        if _flusher["pid"] == os.getpid():
            return
        _flusher["pid"] = os.getpid()
    thread = threading.Thread(
        target=_flush_forever, name="switchboard-admission-counts", daemon=True
    )
    thread.start()


def _flush_forever() -> None:
    """Flush every FLUSH_SECONDS, on a connection opened for it and closed
    after, so the thread holds no connection between flushes."""
    while True:
        time.sleep(FLUSH_SECONDS)
        _flush_quietly()


def _flush_quietly() -> None:
    try:
        flush()
    except Exception as exc:  # noqa: BLE001 - kept for the next flush
        logger.warning(
            "admission counts not flushed: %s",
            type(exc).__name__,
            extra={"fields": {"error": type(exc).__name__}},
        )
    finally:
        connection.close()


@atexit.register
def _flush_at_exit() -> None:
    """What the process counted since its last flush, on its way out."""
    if _pending:
        _flush_quietly()


@dataclass(frozen=True)
class AdmissionCount:
    """One queue's count of one admission counter."""

    endpoint_id: str
    queue: str
    counter: str
    count: int


def admission_counts() -> list[AdmissionCount]:
    """Every queue's admission counters (system-wide: /metrics is staff's),
    after adding this process's own."""
    flush()
    return [
        AdmissionCount(endpoint_id, queue, counter, int(count))
        for endpoint_id, queue, counter, count in _run(
            "admission_counts",
            "SELECT endpoint_id::text, queue, counter, count FROM admission_counts"
            " ORDER BY 1, 2, 3",
            {},
        )
    ]
