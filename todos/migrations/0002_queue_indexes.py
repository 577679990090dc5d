"""The indexes and table settings the store's queries are written against.

Written as SQL so each predicate is exactly the one the store names: PostgreSQL
only uses a partial index when the query's WHERE implies the index predicate,
and ON CONFLICT only infers the dedupe index from the same predicate.
"""

from django.db import migrations

FORWARD = [
    # Purging a todo takes its history with it.
    """
    ALTER TABLE todo_events
        ADD CONSTRAINT todo_events_todo_fk FOREIGN KEY (todo_id)
        REFERENCES todos (id) ON DELETE CASCADE
    """,
    "ALTER TABLE todos ALTER COLUMN payload SET DEFAULT '{}'::jsonb",
    # The claim scan: only pending rows, in creation order per endpoint. The
    # terminal backlog is not in this index at all, so it costs the scan nothing.
    """
    CREATE INDEX todos_pending_claim_idx ON todos (endpoint_id, created_at)
        WHERE state = 'pending'
    """,
    # Idempotent enqueue: one LIVE row per (endpoint, key). Live = not done and
    # not a true dead letter; a parked retry keeps its slot (SPEC-0003).
    """
    CREATE UNIQUE INDEX todos_dedupe_idx ON todos (endpoint_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL
          AND state <> 'done'
          AND (state <> 'failed' OR next_retry_at IS NOT NULL)
    """,
    # The reaper, and the claim scan's lapsed-lease branch.
    """
    CREATE INDEX todos_claimed_lease_idx ON todos (lease_expires_at)
        WHERE state = 'claimed'
    """,
    # The retry scheduler, and the claim scan's due-retry branch.
    """
    CREATE INDEX todos_retry_window_idx ON todos (next_retry_at)
        WHERE state = 'failed' AND next_retry_at IS NOT NULL
    """,
    # Listing an endpoint's todos with keyset pagination.
    "CREATE INDEX todos_endpoint_list_idx ON todos (endpoint_id, created_at, id)",
    # The Board's overview: live rows by endpoint, queue and state, index-only.
    # Terminal rows are not in it; the Board caps or estimates those counts.
    """
    CREATE INDEX todos_live_overview_idx ON todos (endpoint_id, queue, state, created_at)
        WHERE state IN ('pending', 'claimed')
           OR (state = 'failed' AND next_retry_at IS NOT NULL)
    """,
    # Retention: terminal rows by the time they became terminal.
    """
    CREATE INDEX todos_terminal_age_idx ON todos (updated_at)
        WHERE state = 'done' OR (state = 'failed' AND next_retry_at IS NULL)
    """,
    # Every transition writes a new row version (state is in index predicates,
    # so no HOT updates); vacuum early and without throttling so dead entries do
    # not pile up at the head of the pending index (PERF-NOTES §2).
    """
    ALTER TABLE todos SET (
        autovacuum_vacuum_scale_factor = 0,
        autovacuum_vacuum_threshold = 2000,
        autovacuum_vacuum_cost_delay = 0,
        autovacuum_analyze_scale_factor = 0.02
    )
    """,
]

BACKWARD = [
    "ALTER TABLE todos RESET (autovacuum_vacuum_scale_factor,"
    " autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay,"
    " autovacuum_analyze_scale_factor)",
    "DROP INDEX todos_terminal_age_idx",
    "DROP INDEX todos_live_overview_idx",
    "DROP INDEX todos_endpoint_list_idx",
    "DROP INDEX todos_retry_window_idx",
    "DROP INDEX todos_claimed_lease_idx",
    "DROP INDEX todos_dedupe_idx",
    "DROP INDEX todos_pending_claim_idx",
    "ALTER TABLE todos ALTER COLUMN payload DROP DEFAULT",
    "ALTER TABLE todo_events DROP CONSTRAINT todo_events_todo_fk",
]


class Migration(migrations.Migration):
    dependencies = [("todos", "0001_init")]

    operations = [
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
