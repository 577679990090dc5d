"""The background sweeps (system-wide: no endpoint predicate, by design)."""

from .rows import Moved
from .sql import DOORBELL, EVENT_INSERT, _run

SWEEP_BATCH = 500

# Expired leases: back to pending below the cap, dead-letter at it. SKIP LOCKED
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
       SET state = CASE WHEN t.attempt < t.max_attempts THEN 'pending'
                        ELSE 'failed' END,
           owner = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE t.owner END,
           last_error = CASE WHEN t.attempt < t.max_attempts THEN t.last_error
                             ELSE 'lease expired at the attempt cap' END,
           lease_expires_at = NULL, next_retry_at = NULL, updated_at = now()
      FROM expired e
     WHERE t.id = e.id
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt,
           'claimed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT id, endpoint_id, queue, state, {DOORBELL} FROM moved
"""


def reap_expired(*, limit=SWEEP_BATCH):
    """Requeue (or dead-letter at the cap) one batch of expired leases."""
    params = {
        "limit": int(limit),
        "actor": "system:reaper",
        "event_error": "lease expired",
    }
    rows = _run("reap_expired", REAP_EXPIRED_SQL, params)
    return [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


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


def requeue_due_retries(*, limit=SWEEP_BATCH):
    """Return one batch of failed todos whose backoff elapsed to pending."""
    params = {"limit": int(limit), "actor": "system:retry-scheduler", "event_error": ""}
    rows = _run("requeue_due_retries", REQUEUE_DUE_SQL, params)
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


def purge_terminal(older_than_days, *, limit=5000):
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
