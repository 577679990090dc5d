"""The Board's indexes: its newest-first list and its dead letters.

Without them the Board's default list (every todo, newest first) sorted the
whole table on each load and each 5-second poll: ~370 ms at 1 000 000 rows
(docs/benchmarks.md, "Board"). The dead-letter index is partial, so it holds
only true dead letters and costs the hot path (claim, complete) nothing.
"""

from django.db import migrations

FORWARD = [
    # The list's keyset order across every endpoint: ORDER BY created_at, id.
    "CREATE INDEX todos_created_idx ON todos (created_at, id)",
    # Dead letters newest first, and the overview's capped dead-letter counts
    # as an index-only scan (endpoint_id and queue ride along).
    """
    CREATE INDEX todos_dead_letter_idx ON todos (created_at, id)
        INCLUDE (endpoint_id, queue)
        WHERE state = 'failed' AND next_retry_at IS NULL
    """,
]

BACKWARD = [
    "DROP INDEX todos_dead_letter_idx",
    "DROP INDEX todos_created_idx",
]


class Migration(migrations.Migration):
    dependencies = [("todos", "0004_mcp_sessions")]

    operations = [
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
