"""Schedules: recurring todos per endpoint, and the fires that made them.

``schedules`` holds each schedule's recurrence, its todo template and where it
stands (``next_slot_at``, the last slot fired, its /metrics counters);
``schedule_fires`` has one row per slot that made a todo, and its unique key
on (schedule, slot) is the backstop that keeps a slot from firing twice when
several sweeps, servers or a failover race (``todos.store.schedules``).
Deleting a schedule deletes its fires in the same statement (the cascade is
SQL: the store deletes with SQL, not through the ORM).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0018_text_search_trigrams"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.TextField()),
                ("queue", models.TextField()),
                ("cron", models.TextField(blank=True, null=True)),
                ("every_seconds", models.IntegerField(blank=True, null=True)),
                ("time_zone", models.TextField(db_default="UTC")),
                ("todo", models.JSONField(default=dict)),
                (
                    "overlap",
                    models.TextField(
                        choices=[("allow", "allow"), ("skip", "skip")],
                        db_default="allow",
                    ),
                ),
                (
                    "missed",
                    models.TextField(
                        choices=[("skip", "skip"), ("one", "one"), ("all", "all")],
                        db_default="skip",
                    ),
                ),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("next_slot_at", models.DateTimeField()),
                ("last_slot_at", models.DateTimeField(blank=True, null=True)),
                ("last_todo_id", models.UUIDField(blank=True, null=True)),
                ("fires", models.BigIntegerField(db_default=0)),
                ("skips", models.BigIntegerField(db_default=0)),
                ("lateness_seconds", models.FloatField(db_default=0)),
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
                "db_table": "schedules",
            },
        ),
        migrations.CreateModel(
            name="ScheduleFire",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("slot", models.DateTimeField()),
                ("todo_id", models.UUIDField(blank=True, null=True)),
                ("manual", models.BooleanField(db_default=False)),
                (
                    "fired_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now()
                    ),
                ),
                (
                    "schedule",
                    models.ForeignKey(
                        db_column="schedule_id",
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="fire_rows",
                        to="todos.schedule",
                    ),
                ),
            ],
            options={
                "db_table": "schedule_fires",
            },
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(
                condition=models.Q(("paused_at__isnull", True)),
                fields=["next_slot_at"],
                name="schedules_due_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.UniqueConstraint(
                fields=("endpoint", "name"), name="schedules_endpoint_name_key"
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("cron__isnull", False), ("every_seconds__isnull", True)),
                    models.Q(("cron__isnull", True), ("every_seconds__isnull", False)),
                    _connector="OR",
                ),
                name="schedules_cron_or_every_check",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("every_seconds__gte", 1)),
                name="schedules_every_seconds_check",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("overlap__in", ("allow", "skip"))),
                name="schedules_overlap_check",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("missed__in", ("skip", "one", "all"))),
                name="schedules_missed_check",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedulefire",
            constraint=models.UniqueConstraint(
                fields=("schedule", "slot"), name="schedule_fires_once"
            ),
        ),
        migrations.RunSQL(
            sql="""
            ALTER TABLE schedule_fires
                ADD CONSTRAINT schedule_fires_schedule_fk FOREIGN KEY (schedule_id)
                REFERENCES schedules (id) ON DELETE CASCADE
            """,
            reverse_sql="ALTER TABLE schedule_fires DROP CONSTRAINT schedule_fires_schedule_fk",
        ),
    ]
