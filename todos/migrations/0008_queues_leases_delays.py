"""Store v2: queue settings, lease tokens, delayed todos, and a claim index per lane.

- ``queues``: one row per (endpoint, queue name) with its settings; backfilled
  from the queue names existing todos use.
- ``todos.lease_token`` (fencing) and ``todos.available_at`` (== created_at for
  existing rows).
- The claim index leads with the lane a claim reads, (endpoint_id, queue,
  assignee or ''), then available_at: a claim walks only its own lanes' due
  pending rows, never another queue's or endpoint's backlog, never a delayed row
  before it is due (SPEC-0003 "Claim never scans terminal rows"; issue #13).
- ``todos_delayed_idx``: the delayed todos only, for the sweep that rings the
  doorbell when one becomes due.
- Dropped: ``todo_events``' index on todo_id alone (``todo_events_todo_idx``
  on (todo_id, id) serves the same reads and the cascade).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0007_drop_redundant_endpoint_index"),
    ]

    operations = [
        migrations.RunSQL(
            sql="DROP INDEX todos_pending_claim_idx",
            reverse_sql="""
            CREATE INDEX todos_pending_claim_idx ON todos (endpoint_id, created_at)
                WHERE state = 'pending'
            """,
        ),
        migrations.AddField(
            model_name="todo",
            name="available_at",
            field=models.DateTimeField(
                db_default=django.db.models.functions.datetime.Now()
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="lease_token",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="todoevent",
            name="todo",
            field=models.ForeignKey(
                db_column="todo_id",
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="todos.todo",
            ),
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.TextField()),
                ("lease_seconds", models.IntegerField(blank=True, null=True)),
                ("max_attempts", models.IntegerField(blank=True, null=True)),
                ("delay_seconds", models.IntegerField(blank=True, null=True)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now()
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now()
                    ),
                ),
                (
                    "endpoint",
                    models.ForeignKey(
                        db_column="endpoint_id",
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="todos.endpoint",
                    ),
                ),
            ],
            options={
                "db_table": "queues",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("endpoint", "name"), name="queues_endpoint_name_key"
                    )
                ],
            },
        ),
        migrations.RunSQL(
            sql=[
                "UPDATE todos SET available_at = created_at"
                " WHERE available_at IS DISTINCT FROM created_at",
                """
                INSERT INTO queues (endpoint_id, name, created_at, updated_at)
                SELECT endpoint_id, queue, min(created_at), now() FROM todos
                 GROUP BY endpoint_id, queue
                """,
                """
                CREATE INDEX todos_pending_claim_idx ON todos
                    (endpoint_id, queue, (coalesce(assignee, '')), available_at)
                    WHERE state = 'pending'
                """,
                """
                CREATE INDEX todos_delayed_idx ON todos (available_at)
                    WHERE state = 'pending' AND available_at > created_at
                """,
            ],
            reverse_sql=[
                "DROP INDEX todos_delayed_idx",
                "DROP INDEX todos_pending_claim_idx",
            ],
        ),
    ]
