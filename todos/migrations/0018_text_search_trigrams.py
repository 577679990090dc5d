"""The Board list's text search: trigram indexes on the title and the key.

The list's text filter is a substring match (``title ILIKE '%…%' OR
idempotency_key ILIKE '%…%'``), which no b-tree serves: over a million todos
it read the table newest first until it had a page, 0.7 s at the median and
1.5 s at p95 for a rare term (docs/benchmarks.md, "Board"). A GIN index of
each column's trigrams (``pg_trgm``, in PostgreSQL's contrib, which Debian's
``postgresql`` package ships) answers the same ILIKE from the index, and the
planner still walks the newest-first index when a term matches most rows.

``pg_trgm`` is a trusted extension (PostgreSQL 13+): the database's owner may
create it without being a superuser. ``IF NOT EXISTS`` leaves one created by
an administrator alone, and the reverse keeps the extension (other schemas may
use it).
"""

from django.db import migrations

FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX todos_title_trgm_idx ON todos USING gin (title gin_trgm_ops)",
    """
    CREATE INDEX todos_key_trgm_idx ON todos USING gin (idempotency_key gin_trgm_ops)
        WHERE idempotency_key IS NOT NULL
    """,
]

BACKWARD = [
    "DROP INDEX todos_key_trgm_idx",
    "DROP INDEX todos_title_trgm_idx",
]


class Migration(migrations.Migration):
    dependencies = [("todos", "0017_canceled_rollup")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
