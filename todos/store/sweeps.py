"""The background sweeps (system-wide: no endpoint predicate, by design)."""

from datetime import datetime

from todos.telemetry import tracing

from .rows import Moved
from .sql import DOORBELL, ENDED_RING, EVENT_INSERT, _run

SWEEP_BATCH = 500

# Expired leases: back to pending below the cap, dead-letter at it; under a
# cancel request, canceled (claimed → done), as CONTRACT §14 says. SKIP LOCKED
# lets several sweepers and the claim scan's own lapsed-lease branch coexist.
REAP_EXPIRED_SQL = f"""
WITH expired AS (
    SELECT id FROM todos
     WHERE state = 'claimed' AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = CASE WHEN t.cancel_request IS NOT NULL THEN 'done'
                        WHEN t.attempt < t.max_attempts THEN 'pending'
                        ELSE 'failed' END,
           owner = CASE WHEN t.attempt < t.max_attempts
                             AND t.cancel_request IS NULL
                        THEN NULL ELSE t.owner END,
           last_error = CASE WHEN t.cancel_request IS NOT NULL THEN t.last_error
                             WHEN t.attempt < t.max_attempts THEN t.last_error
                             ELSE 'lease expired at the attempt cap' END,
           result = CASE WHEN t.cancel_request IS NOT NULL
                         THEN jsonb_build_object('canceled', t.cancel_request)
                         ELSE t.result END,
           canceled_at = CASE WHEN t.cancel_request IS NOT NULL THEN now() END,
           lease_expires_at = NULL, next_retry_at = NULL, updated_at = now()
      FROM expired e
     WHERE t.id = e.id
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt, t.next_retry_at,
           t.canceled_at, 'claimed'::text AS from_state
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, from_state, state, attempt, %(actor)s,
           CASE WHEN canceled_at IS NOT NULL THEN 'canceled'
                ELSE %(event_error)s END,
           now()
      FROM moved
)
SELECT id, endpoint_id, queue, state, {DOORBELL}, {ENDED_RING} FROM moved
"""


def reap_expired(*, limit: int = SWEEP_BATCH) -> list[Moved]:
    """Requeue (or dead-letter at the cap) one batch of expired leases."""
    params = {
        "limit": int(limit),
        "actor": "system:reaper",
        "event_error": "lease expired",
    }
    rows = _run("reap_expired", REAP_EXPIRED_SQL, params)
    moved = [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]
    if moved and tracing.enabled():
        _trace_lapsed(moved)
    return moved


def _trace_lapsed(moved: list[Moved]) -> None:
    """End the process span of each delivery whose lease lapsed (one read of
    the reaped todos, only while tracing is on)."""
    from .lifecycle import _lookup_many

    for todo in _lookup_many(None, [m.id for m in moved]).values():
        settle = "dead_letter" if todo.is_dead_letter else None
        if todo.is_canceled:
            settle = "cancel"
        tracing.ended(todo, "lapsed", settle=settle, error="lease expired")


REQUEUE_DUE_SQL = f"""
WITH due AS (
    SELECT id FROM todos
     WHERE state = 'failed' AND next_retry_at <= now()
     ORDER BY next_retry_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = 'pending', owner = NULL, lease_expires_at = NULL,
           next_retry_at = NULL, updated_at = now()
      FROM due d
     WHERE t.id = d.id
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt,
           'failed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT id, endpoint_id, queue, state, {DOORBELL} FROM moved
"""


def requeue_due_retries(*, limit: int = SWEEP_BATCH) -> list[Moved]:
    """Return one batch of failed todos whose backoff elapsed to pending."""
    params = {"limit": int(limit), "actor": "system:retry-scheduler", "event_error": ""}
    rows = _run("requeue_due_retries", REQUEUE_DUE_SQL, params)
    return [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


# Open questions whose deadline passed: the hold ended with no answer. Their
# available_at is the deadline, so a claim may already take them; this marks
# the question expired, spends its links' nonce, and rings the doorbell.
EXPIRE_QUESTIONS_SQL = """
WITH due AS (
    SELECT id FROM todos
     WHERE state = 'pending' AND question_status = 'open'
       AND answer_deadline IS NOT NULL AND answer_deadline <= now()
     ORDER BY answer_deadline
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET question_status = 'expired', answer_nonce = NULL, updated_at = now()
      FROM due d
     WHERE t.id = d.id AND t.state = 'pending' AND t.question_status = 'open'
 RETURNING t.id, t.endpoint_id, t.queue, t.state
)
SELECT id, endpoint_id, queue, state,
       pg_notify('switchboard_todo_ready', json_build_object(
           'id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text)
  FROM moved
"""


def expire_questions(*, limit: int = SWEEP_BATCH) -> list[Moved]:
    """End the hold of one batch of open questions whose deadline passed."""
    rows = _run("expire_questions", EXPIRE_QUESTIONS_SQL, {"limit": int(limit)})
    return [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


# Terminal = done, or failed with no retry window (a true dead letter), aged
# from when it became terminal. Live rows are never touched. The history goes
# with each row (ON DELETE CASCADE).
PURGE_TERMINAL_SQL = """
WITH doomed AS (
    SELECT id FROM todos
     WHERE (state = 'done' OR (state = 'failed' AND next_retry_at IS NULL))
       AND updated_at < now() - make_interval(days => %(days)s::int)
     ORDER BY updated_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM todos t USING doomed d WHERE t.id = d.id
"""


def purge_terminal(older_than_days: int, *, limit: int = 5000) -> int:
    """Delete one batch of terminal todos older than the given days; return how many."""
    days = int(older_than_days)
    if days < 0:
        raise ValueError("older_than_days must not be negative")
    return _run(
        "purge_terminal",
        PURGE_TERMINAL_SQL,
        {"days": days, "limit": int(limit)},
        fetch="count",
    )


# Delayed todos that came due in (since, now]: ring each one's doorbell, so a
# waiting claim wakes when it becomes claimable. The claim scan takes due rows
# by itself (a ring is only a wakeup), so a ring missed while no sweeper ran
# costs a waiter its next recheck, never the todo. Served by todos_delayed_idx,
# which holds only pending rows created with a delay. The first row also
# carries now(), the next call's ``since``.
RING_DUE_DELAYED_SQL = """
SELECT t.id, t.endpoint_id, t.queue, t.state, clock.at, t.available_at,
       CASE WHEN t.id IS NOT NULL THEN pg_notify('switchboard_todo_ready',
           json_build_object('id', t.id, 'endpoint_id', t.endpoint_id,
                             'queue', t.queue)::text) END
  FROM (SELECT statement_timestamp() AS at) clock
  LEFT JOIN LATERAL (
      SELECT id, endpoint_id, queue, state, available_at FROM todos
       WHERE state = 'pending' AND available_at > created_at
         AND available_at > %(since)s AND available_at <= clock.at
       ORDER BY available_at
       LIMIT %(limit)s) t ON TRUE
"""


LOOK_BACK_SQL = "SELECT now() - interval '1 minute'"


def ring_due_delayed(
    since: datetime | None = None, *, limit: int = SWEEP_BATCH
) -> tuple[list[Moved], datetime]:
    """Ring the doorbell of each delayed todo that came due after ``since``.

    Return (rung, until): the todos rung and the database time to pass as the
    next call's ``since``. ``since=None`` looks back one minute. When ``limit``
    todos came due at once, ``until`` is the last one rung, so the next call
    continues after it.
    """
    if since is None:
        look_back = _run("ring_due_delayed", LOOK_BACK_SQL, {}, fetch="one")
        assert look_back is not None  # a SELECT without FROM returns one row
        since = look_back[0]
    rows = _run(
        "ring_due_delayed",
        RING_DUE_DELAYED_SQL,
        {"since": since, "limit": int(limit)},
    )
    rung = [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows if r[0] is not None]
    until: datetime = rows[-1][5] if len(rung) >= int(limit) else rows[0][4]
    return rung, until
