"""todo_events keyed by (todo_id, id): one index per history row instead of two.

Every transition appends a history row, and each index on todo_events is one
more WAL record per transition. Nothing reads a history row by its id alone:
the Board reads a todo's history in order (todo_id, id), and the purge's
cascade finds a todo's rows by todo_id. So the primary key becomes
(todo_id, id) and the separate todo_events_todo_idx goes. ``id`` stays an
identity column (unique by construction); Django still names it the model's
primary key, which only the ORM's own lookups by id would use (none do).
"""

from django.db import migrations

FORWARD = [
    "ALTER TABLE todo_events DROP CONSTRAINT todo_events_pkey",
    "ALTER TABLE todo_events ADD CONSTRAINT todo_events_pkey"
    " PRIMARY KEY (todo_id, id)",
    "DROP INDEX todo_events_todo_idx",
]

BACKWARD = [
    "CREATE INDEX todo_events_todo_idx ON todo_events (todo_id, id)",
    "ALTER TABLE todo_events DROP CONSTRAINT todo_events_pkey",
    "ALTER TABLE todo_events ADD CONSTRAINT todo_events_pkey PRIMARY KEY (id)",
]


class Migration(migrations.Migration):
    # Numbered 0008 until its number followed the order it runs in: a database
    # that applied it under that name has it applied.
    replaces = [("todos", "0008_history_key")]

    dependencies = [("todos", "0010_board_stats")]

    operations = [
        migrations.RunSQL(
            sql=FORWARD,
            reverse_sql=BACKWARD,
            state_operations=[
                migrations.RemoveIndex(
                    model_name="todoevent", name="todo_events_todo_idx"
                ),
            ],
        ),
    ]
