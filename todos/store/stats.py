"""The Board's statistics SQL: dead-letter groups, the per-minute rollup, charts
and the figures ``/metrics`` exports.

Part of the store (all todo SQL lives in the store): the same ``_run`` and the
same owner-scope predicate as ``todos.store.operator``. Every
function that reads todos takes ``endpoint_ids`` (None = every endpoint, the
staff view; a list = the Board's owner scope).

The charts never read the history (``todo_events``, millions of rows): the
sweep loop calls ``roll_up_minutes`` on each pass, which re-counts only the
minutes still open from the history (a BRIN index finds them) into
``todo_minutes``, one row per (endpoint, queue, minute), and samples each
queue's depth. Minutes older than two minutes are closed: folded once into
``todo_transition_totals`` (the base of the metrics' counters) and never
counted again. A day of charts is then at most 1 440 rows per queue.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, overload

from django.db import transaction

from .operator import _board_scope
from .questions import OPEN_QUESTION
from .reads import NO_ERROR_GROUP, STATE_FILTERS
from .sql import _run

# Transitions the rollup counts, in the order of todo_minutes' columns.
TRANSITIONS = ("created", "claimed", "completed", "failed", "dead_lettered", "retried")

# A minute is closed (final) this long after it ended: a transition's history
# row carries its transaction's start time, and commits within this margin.
CLOSE_AFTER = timedelta(minutes=2)
# One pass re-counts at most this much history (catching up after downtime
# takes several passes rather than one long statement).
MAX_WINDOW = timedelta(hours=1)
# How far back a first rollup (or one after a long outage) starts.
MAX_CATCH_UP = timedelta(days=1)
# Minute rows are kept this long (the charts show a day at most).
KEEP_MINUTES = timedelta(days=2)

GROUP_LIMIT = 200


# --- Dead letters grouped by error ----------------------------------------------


@dataclass(frozen=True)
class DeadLetterGroup:
    """Dead letters of one endpoint and queue whose errors share a fingerprint."""

    endpoint_id: str
    queue: str
    fingerprint: str
    count: int
    first_seen: datetime
    last_seen: datetime
    example_id: str
    example_error: str


# An index-only scan of todos_dead_letter_group_idx (dead letters alone), then
# one example per group from the same index (newest first). A dead letter
# without an error message has no fingerprint: those form their own group
# (NO_ERROR_GROUP), whose example the second lookup finds.
DEAD_LETTER_GROUPS_SQL = f"""
WITH groups AS (
    SELECT endpoint_id, queue, error_fingerprint, count(*) AS members,
           min(updated_at) AS first_seen, max(updated_at) AS last_seen
      FROM todos
     WHERE {STATE_FILTERS["dead_letter"]} AND dismissed_at IS NULL AND {{scope}}
     GROUP BY endpoint_id, queue, error_fingerprint
     ORDER BY count(*) DESC, max(updated_at) DESC
     LIMIT %(limit)s
)
SELECT g.endpoint_id, g.queue, g.error_fingerprint, g.members, g.first_seen,
       g.last_seen, COALESCE(named.id, unnamed.id),
       COALESCE(named.last_error, unnamed.last_error)
  FROM groups g
  LEFT JOIN LATERAL (
    SELECT t.id, t.last_error FROM todos t
     WHERE t.state = 'failed' AND t.next_retry_at IS NULL AND t.dismissed_at IS NULL
       AND t.endpoint_id = g.endpoint_id AND t.queue = g.queue
       AND t.error_fingerprint = g.error_fingerprint
     ORDER BY t.updated_at DESC
     LIMIT 1
  ) named ON TRUE
  LEFT JOIN LATERAL (
    SELECT t.id, t.last_error FROM todos t
     WHERE g.error_fingerprint IS NULL
       AND t.state = 'failed' AND t.next_retry_at IS NULL AND t.dismissed_at IS NULL
       AND t.endpoint_id = g.endpoint_id AND t.queue = g.queue
       AND t.error_fingerprint IS NULL
     ORDER BY t.updated_at DESC
     LIMIT 1
  ) unnamed ON TRUE
 ORDER BY g.members DESC, g.last_seen DESC
"""


def dead_letter_groups(
    *, endpoint_ids: Iterable[object] | None = None, limit: int = GROUP_LIMIT
) -> list[DeadLetterGroup]:
    """Return the dead letters grouped by (endpoint, queue, error fingerprint),
    largest group first."""
    scope, params = _board_scope(endpoint_ids)
    sql = DEAD_LETTER_GROUPS_SQL.format(scope=scope)
    rows = _run("dead_letter_groups", sql, {**params, "limit": int(limit)})
    return [
        DeadLetterGroup(
            str(endpoint_id),
            queue,
            fingerprint or NO_ERROR_GROUP,
            count,
            first_seen,
            last_seen,
            str(example_id),
            example_error or "",
        )
        for (
            endpoint_id,
            queue,
            fingerprint,
            count,
            first_seen,
            last_seen,
            example_id,
            example_error,
        ) in rows
    ]


FINGERPRINT_SQL = "SELECT switchboard_error_fingerprint(%(error)s)"


def error_fingerprint(error: str | None) -> str:
    """Return the fingerprint PostgreSQL stores for this error message."""
    if not error:
        return ""
    row = _run("error_fingerprint", FINGERPRINT_SQL, {"error": error}, "one")
    assert row is not None  # a SELECT without FROM returns one row
    fingerprint: str | None = row[0]
    return fingerprint or ""


# --- The per-minute rollup (run by the sweep loop) ------------------------------


@dataclass(frozen=True)
class Rollup:
    """What one rollup pass did."""

    ran: bool
    start: datetime | None = None
    end: datetime | None = None
    minutes: int = 0
    folded_through: datetime | None = None


# One sweeper at a time: a second one skips the pass instead of waiting.
ROLLUP_LOCK_SQL = """
SELECT folded_through, date_trunc('minute', now()), now()
  FROM todo_rollup_state WHERE id = 1 FOR UPDATE SKIP LOCKED
"""

ROLLUP_STATE_INIT_SQL = """
INSERT INTO todo_rollup_state (id, folded_through) VALUES (1, NULL)
ON CONFLICT (id) DO NOTHING
"""

# Re-count the open minutes from the history. A created event has no from
# state; a heartbeat (claimed -> claimed) is not a claim; a failure below the
# attempt cap schedules a retry (failed), at the cap it dead-letters.
COUNT_MINUTES_SQL = """
WITH counted AS (
    SELECT e.endpoint_id, t.queue, date_trunc('minute', e.at) AS minute,
           count(*) FILTER (WHERE e.from_state IS NULL) AS created,
           count(*) FILTER (WHERE e.to_state = 'claimed'
                              AND e.from_state IS DISTINCT FROM 'claimed'
                              AND e.error <> 'canceling') AS claimed,
           count(*) FILTER (WHERE e.to_state = 'done'
                              AND e.error <> 'canceled') AS completed,
           count(*) FILTER (WHERE e.to_state = 'done'
                              AND e.error = 'canceled') AS canceled,
           count(*) FILTER (WHERE e.to_state = 'failed'
                              AND e.attempt < t.max_attempts) AS failed,
           count(*) FILTER (WHERE e.to_state = 'failed'
                              AND e.attempt >= t.max_attempts) AS dead_lettered,
           count(*) FILTER (WHERE e.from_state = 'failed'
                              AND e.to_state = 'pending') AS retried
      FROM todo_events e
      JOIN todos t ON t.id = e.todo_id
     WHERE e.at >= %(start)s AND e.at < %(end)s
     GROUP BY 1, 2, 3
)
INSERT INTO todo_minutes (endpoint_id, queue, minute, created, claimed, completed,
                          failed, dead_lettered, retried, canceled)
SELECT endpoint_id, queue, minute, created, claimed, completed, failed,
       dead_lettered, retried, canceled
  FROM counted
ON CONFLICT (endpoint_id, queue, minute) DO UPDATE
   SET created = EXCLUDED.created, claimed = EXCLUDED.claimed,
       completed = EXCLUDED.completed, failed = EXCLUDED.failed,
       dead_lettered = EXCLUDED.dead_lettered, retried = EXCLUDED.retried,
       canceled = EXCLUDED.canceled
"""

FOLD_SQL = """
WITH closed AS (
    SELECT endpoint_id, queue, sum(created) AS created, sum(claimed) AS claimed,
           sum(completed) AS completed, sum(failed) AS failed,
           sum(dead_lettered) AS dead_lettered, sum(retried) AS retried,
           sum(canceled) AS canceled
      FROM todo_minutes
     WHERE minute >= %(start)s AND minute < %(closed)s
     GROUP BY endpoint_id, queue
)
INSERT INTO todo_transition_totals AS t (endpoint_id, queue, created, claimed,
                                         completed, failed, dead_lettered, retried,
                                         canceled)
SELECT * FROM closed
ON CONFLICT (endpoint_id, queue) DO UPDATE
   SET created = t.created + EXCLUDED.created, claimed = t.claimed + EXCLUDED.claimed,
       completed = t.completed + EXCLUDED.completed,
       failed = t.failed + EXCLUDED.failed,
       dead_lettered = t.dead_lettered + EXCLUDED.dead_lettered,
       retried = t.retried + EXCLUDED.retried,
       canceled = t.canceled + EXCLUDED.canceled
"""

SET_FOLDED_SQL = "UPDATE todo_rollup_state SET folded_through = %(closed)s WHERE id = 1"

# Each queue's depth (pending todos) now, from the live overview index; a
# queue that had pending todos in the last samples and has none now gets a 0.
SAMPLE_DEPTH_SQL = """
WITH live AS (
    SELECT endpoint_id, queue, count(*) AS pending
      FROM todos
     WHERE state = 'pending'
     GROUP BY endpoint_id, queue
), drained AS (
    SELECT DISTINCT m.endpoint_id, m.queue, 0 AS pending
      FROM todo_minutes m
     WHERE m.minute >= %(minute)s - interval '5 minutes' AND m.pending > 0
       AND NOT EXISTS (SELECT 1 FROM live l
                        WHERE l.endpoint_id = m.endpoint_id AND l.queue = m.queue)
)
INSERT INTO todo_minutes (endpoint_id, queue, minute, pending)
SELECT endpoint_id, queue, %(minute)s, pending FROM live
UNION ALL
SELECT endpoint_id, queue, %(minute)s, pending FROM drained
ON CONFLICT (endpoint_id, queue, minute) DO UPDATE SET pending = EXCLUDED.pending
"""

PRUNE_SQL = """
DELETE FROM todo_minutes WHERE minute < %(keep_from)s AND minute < %(closed)s
"""


def roll_up_minutes() -> Rollup:
    """Re-count the open minutes, fold the closed ones into the totals, sample
    each queue's depth, and drop minute rows past two days. One transaction;
    a pass another sweeper is running is skipped (``ran`` False)."""
    with transaction.atomic():
        _run("roll_up_minutes", ROLLUP_STATE_INIT_SQL, {}, fetch=None)
        row = _run("roll_up_minutes", ROLLUP_LOCK_SQL, {}, fetch="one")
        if row is None:
            return Rollup(False)
        folded_through, this_minute, now = row
        start = max(folded_through or this_minute, this_minute - MAX_CATCH_UP)
        end = min(start + MAX_WINDOW, now + timedelta(seconds=1))
        minutes = _run(
            "roll_up_minutes", COUNT_MINUTES_SQL, {"start": start, "end": end}, None
        )
        # Closed: ended CLOSE_AFTER ago, and counted entirely in this pass.
        closed = min(this_minute - CLOSE_AFTER, end.replace(second=0, microsecond=0))
        if closed > start:
            bound = {"start": start, "closed": closed}
            _run("roll_up_minutes", FOLD_SQL, bound, None)
            _run("roll_up_minutes", SET_FOLDED_SQL, {"closed": closed}, None)
            folded_through = closed
        elif folded_through is None:
            # The first pass: nothing closed yet; start counting from here.
            _run("roll_up_minutes", SET_FOLDED_SQL, {"closed": start}, None)
            folded_through = start
        _run("roll_up_minutes", SAMPLE_DEPTH_SQL, {"minute": this_minute}, None)
        keep = {"keep_from": this_minute - KEEP_MINUTES, "closed": folded_through}
        _run("roll_up_minutes", PRUNE_SQL, keep, None)
    return Rollup(True, start, end, minutes, folded_through)


RESTART_SQL = """
INSERT INTO todo_rollup_state (id, folded_through)
VALUES (1, date_trunc('minute', now()) - make_interval(secs => %(back)s))
ON CONFLICT (id) DO UPDATE SET folded_through = EXCLUDED.folded_through
"""


def restart_rollup(*, seconds_back: int) -> None:
    """Make the next rollup passes count the history again from this long ago
    (a backfill, the benchmark, tests); the minutes already counted stay."""
    _run("restart_rollup", RESTART_SQL, {"back": int(seconds_back)}, fetch=None)


# --- Charts ---------------------------------------------------------------------

RANGES = {
    # name: (span, bucket seconds)
    "hour": (timedelta(hours=1), 60),
    "day": (timedelta(days=1), 600),
}


@dataclass(frozen=True)
class Series:
    """One chart's buckets, oldest first: the transitions counted in each
    bucket, and the peak depth sampled in it (None: no sample)."""

    start: datetime
    bucket_seconds: int
    buckets: int
    counts: dict[str, list[int]]
    depth: list[int | None]

    def total(self, name: str) -> int:
        return sum(self.counts[name])

    def key(self) -> tuple[object, ...]:
        """The series as a hashable value: series with equal keys chart alike."""
        return (
            self.start,
            self.bucket_seconds,
            self.buckets,
            tuple((name, tuple(values)) for name, values in self.counts.items()),
            tuple(self.depth),
        )


# One statement: the range's start from PostgreSQL's clock, then per minute
# (the depth of a minute is the sum over its queues), then per bucket
# (transitions summed, depth its peak). With ``by="endpoint"`` the minutes are
# grouped both per endpoint and in total (GROUPING SETS), so the overview's
# charts are one query. The clock row is LEFT JOINed, so an empty range still
# answers its start.
CHART_SQL = """
WITH clock AS (
    SELECT to_timestamp(floor(EXTRACT(EPOCH FROM now()) / %(step)s) * %(step)s)
           - %(span)s + make_interval(secs => %(step)s) AS start
), per_minute AS (
    SELECT {endpoint} AS endpoint_id, minute, sum(created) AS created,
           sum(claimed) AS claimed, sum(completed) AS completed,
           sum(failed) AS failed, sum(dead_lettered) AS dead_lettered,
           sum(retried) AS retried, sum(pending) AS pending
      FROM todo_minutes, clock
     WHERE minute >= clock.start AND {scope} {narrow}
     GROUP BY {grouping}
), buckets AS (
    SELECT endpoint_id,
           floor(EXTRACT(EPOCH FROM minute - clock.start) / %(step)s)::int AS bucket,
           sum(created) AS created, sum(claimed) AS claimed,
           sum(completed) AS completed, sum(failed) AS failed,
           sum(dead_lettered) AS dead_lettered, sum(retried) AS retried,
           max(pending) AS pending
      FROM per_minute, clock
     GROUP BY endpoint_id, bucket
)
SELECT clock.start, b.endpoint_id, b.bucket, b.created, b.claimed, b.completed,
       b.failed, b.dead_lettered, b.retried, b.pending
  FROM clock LEFT JOIN buckets b ON TRUE
"""


@overload
def chart_series(
    *,
    range_name: str = "hour",
    endpoint_ids: Iterable[object] | None = None,
    endpoint_id: str | None = None,
    queue: str | None = None,
    by: None = None,
) -> Series: ...
@overload
def chart_series(
    *,
    range_name: str = "hour",
    endpoint_ids: Iterable[object] | None = None,
    endpoint_id: str | None = None,
    queue: str | None = None,
    by: Literal["endpoint"],
) -> "SeriesByKey": ...
def chart_series(
    *,
    range_name: str = "hour",
    endpoint_ids: Iterable[object] | None = None,
    endpoint_id: str | None = None,
    queue: str | None = None,
    by: Literal["endpoint"] | None = None,
) -> "Series | SeriesByKey":
    """Return the chart of a range ("hour": per minute, "day": per 10 minutes).

    ``endpoint_id`` and ``queue`` narrow it to one endpoint or queue; ``by``
    ("endpoint") returns {endpoint_id: Series} (empty for an endpoint without
    rows) with the total of them all under the key None, instead of one Series.
    """
    span, step = RANGES[range_name]
    buckets = int(span.total_seconds() // step)
    scope, scope_params = _board_scope(endpoint_ids)
    params: dict[str, object] = {**scope_params}
    narrow = ""
    if endpoint_id is not None:
        narrow += " AND endpoint_id = %(endpoint_id)s"
        params["endpoint_id"] = str(endpoint_id)
    if queue is not None:
        narrow += " AND queue = %(queue)s"
        params["queue"] = queue
    if by == "endpoint":
        endpoint, grouping = (
            "endpoint_id",
            "GROUPING SETS ((endpoint_id, minute), (minute))",
        )
    else:
        endpoint, grouping = "NULL::uuid", "minute"
    sql = CHART_SQL.format(
        endpoint=endpoint, grouping=grouping, scope=scope, narrow=narrow
    )
    rows = _run("chart_series", sql, {**params, "step": step, "span": span})
    start: datetime = rows[0][0]

    def empty() -> Series:
        return Series(
            start,
            step,
            buckets,
            {name: [0] * buckets for name in TRANSITIONS},
            [None] * buckets,
        )

    charts = SeriesByKey(empty)
    charts[None]  # the total, even when there is nothing to count
    for _, key, bucket, *values in rows:
        if bucket is None or not 0 <= bucket < buckets:
            continue
        series = charts[None if key is None else str(key)]
        for name, value in zip(TRANSITIONS, values[:6], strict=True):
            series.counts[name][bucket] = int(value or 0)
        series.depth[bucket] = None if values[6] is None else int(values[6])
    return charts if by == "endpoint" else charts[None]


class SeriesByKey(dict[str | None, Series]):
    """Series per endpoint; an endpoint with no rows gets an empty series."""

    def __init__(self, empty: Callable[[], Series]) -> None:
        super().__init__()
        self._empty = empty

    def __missing__(self, key: str | None) -> Series:
        self[key] = self._empty()
        return self[key]


# --- Metrics --------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFigures:
    """One (endpoint, queue)'s gauges and transition counters for /metrics."""

    endpoint_id: str
    queue: str
    pending: int = 0
    delayed: int = 0
    claimed: int = 0
    retry_scheduled: int = 0
    dead_letter: int = 0
    # Pending todos held for an answer (not counted as delayed).
    held: int = 0
    oldest_pending_age_seconds: float | None = None
    # The oldest open question's age (None when none is open).
    oldest_question_age_seconds: float | None = None
    transitions: dict[str, int] | None = None


# Pending todos (due and delayed, by the statement's clock like the claim)
# from the claim's lanes index, claims and
# parked retries from the live overview index, dead letters from the
# dead-letter group index: each an index-only scan that never reads the done
# backlog.
METRICS_PENDING_SQL = """
SELECT endpoint_id, queue,
       count(*) FILTER (WHERE available_at <= statement_timestamp()),
       count(*) FILTER (WHERE available_at > statement_timestamp()),
       EXTRACT(EPOCH FROM statement_timestamp() - min(available_at)
                                   FILTER (WHERE available_at <= statement_timestamp()))
  FROM todos
 WHERE state = 'pending'
 GROUP BY endpoint_id, queue
"""

# The WHERE is exactly todos_live_overview_idx's predicate, so the plan is an
# index-only scan of it (a narrower WHERE lets the planner pick a bitmap scan
# of the lease and retry indexes that reads the heap).
METRICS_LIVE_SQL = """
SELECT endpoint_id, queue,
       count(*) FILTER (WHERE state = 'claimed'),
       count(*) FILTER (WHERE state = 'failed')
  FROM todos
 WHERE state IN ('pending', 'claimed')
    OR (state = 'failed' AND next_retry_at IS NOT NULL)
 GROUP BY endpoint_id, queue
"""

# The open questions, through todos_open_question_idx (held todos only).
METRICS_QUESTIONS_SQL = f"""
SELECT endpoint_id, queue, count(*),
       EXTRACT(EPOCH FROM statement_timestamp() - min(asked_at))
  FROM todos
 WHERE {OPEN_QUESTION}
 GROUP BY endpoint_id, queue
"""

METRICS_DEAD_SQL = f"""
SELECT endpoint_id, queue, count(*) FROM todos
 WHERE {STATE_FILTERS["dead_letter"]}
 GROUP BY endpoint_id, queue
"""

# The counters: the folded totals plus the open minutes.
METRICS_COUNTERS_SQL = """
SELECT endpoint_id, queue, sum(created), sum(claimed), sum(completed), sum(failed),
       sum(dead_lettered), sum(retried), sum(canceled)
  FROM (
    SELECT endpoint_id, queue, created, claimed, completed, failed, dead_lettered,
           retried, canceled
      FROM todo_transition_totals
    UNION ALL
    SELECT m.endpoint_id, m.queue, m.created, m.claimed, m.completed, m.failed,
           m.dead_lettered, m.retried, m.canceled
      FROM todo_minutes m, todo_rollup_state s
     WHERE s.id = 1 AND m.minute >= COALESCE(s.folded_through, '-infinity')
  ) counted
 GROUP BY endpoint_id, queue
"""


def metrics_figures() -> list[QueueFigures]:
    """Return every (endpoint, queue)'s gauges and counters (the /metrics view)."""
    figures: dict[tuple[str, str], dict[str, Any]] = {}

    def line(endpoint_id: object, queue: str) -> dict[str, Any]:
        key = (str(endpoint_id), queue)
        return figures.setdefault(key, {"endpoint_id": key[0], "queue": queue})

    for endpoint_id, queue, pending, delayed, age in _run(
        "metrics", METRICS_PENDING_SQL, {}
    ):
        line(endpoint_id, queue).update(
            pending=pending,
            delayed=delayed,
            oldest_pending_age_seconds=None if age is None else float(age),
        )
    for endpoint_id, queue, claimed, retry in _run("metrics", METRICS_LIVE_SQL, {}):
        line(endpoint_id, queue).update(claimed=claimed, retry_scheduled=retry)
    for endpoint_id, queue, held, age in _run("metrics", METRICS_QUESTIONS_SQL, {}):
        figure = line(endpoint_id, queue)
        # Held todos wait for an answer, not for time: out of delayed.
        figure["delayed"] = figure.get("delayed", 0) - held
        figure.update(held=held, oldest_question_age_seconds=float(age))
    for endpoint_id, queue, count in _run("metrics", METRICS_DEAD_SQL, {}):
        line(endpoint_id, queue)["dead_letter"] = count
    for endpoint_id, queue, *counts in _run("metrics", METRICS_COUNTERS_SQL, {}):
        pairs = zip((*TRANSITIONS, "canceled"), counts, strict=True)
        line(endpoint_id, queue)["transitions"] = {
            name: int(value or 0) for name, value in pairs
        }
    return sorted(
        (QueueFigures(**values) for values in figures.values()),
        key=lambda f: (f.endpoint_id, f.queue),
    )
