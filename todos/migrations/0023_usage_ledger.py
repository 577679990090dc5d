"""Usage (CONTRACT §18): what agents report they spent, one ledger row per attempt.

- ``usage_ledger``: one row per (todo, delivery), the attempt's running total
  as last reported (a later report of the same attempt replaces it), and one
  row per report made outside a todo (``todo_id`` NULL, against a queue;
  ``idempotency_key`` makes such a report safe to repeat). ``delivery`` is the
  todo's ``deliveries`` at the report: unlike ``attempt`` it never goes back
  (an asked question gives an attempt back), so two deliveries never share a
  row. No foreign keys: a purged todo's spend stays spent, and Django's test
  flush can truncate ``endpoints``.
- ``todos.attempt_usage``: the current delivery's figure as last reported
  (tagged with its delivery and attempt); ``todos.usage``: the sum over the
  todo's attempts. Both are kept by the acknowledgement's own UPDATE from the
  row itself (``switchboard_attempt_usage``, ``switchboard_usage_total``), so
  two reports on one todo serialize on its row lock and each sees the other.
- ``todo_events.usage``: an acknowledgement that carried usage records the
  attempt's figure after it in the history.

Nullable columns: PostgreSQL adds them without rewriting the tables.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

FUNCTIONS = r"""
-- The delivery's usage after a report: the report's fields replace the
-- delivery's last ones (a field left out keeps its value); a figure of an
-- earlier delivery is not this one's. No report: the figure as it was.
CREATE FUNCTION switchboard_attempt_usage(p_last jsonb, p_delivery int,
                                          p_attempt int, p_report jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_report IS NULL THEN p_last
           ELSE CASE WHEN (p_last->>'delivery')::int = p_delivery THEN p_last
                     ELSE '{}'::jsonb END
                || p_report
                || jsonb_build_object('delivery', p_delivery, 'attempt', p_attempt)
           END
$$;

-- A todo's usage summed over its attempts after a report: the sum, less the
-- delivery's last figure, plus its new one (numeric: exact to the cent).
CREATE FUNCTION switchboard_usage_total(p_total jsonb, p_last jsonb,
                                        p_delivery int, p_attempt int,
                                        p_report jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_report IS NULL THEN p_total ELSE (
        SELECT jsonb_object_agg(k,
                   coalesce((p_total->>k)::numeric, 0)
                   - coalesce((was->>k)::numeric, 0)
                   + coalesce((now->>k)::numeric, 0))
          FROM unnest(ARRAY['input_tokens', 'output_tokens', 'cost_usd']) k,
               LATERAL (SELECT CASE WHEN (p_last->>'delivery')::int = p_delivery
                                    THEN p_last END AS was,
                               switchboard_attempt_usage(p_last, p_delivery,
                                                         p_attempt, p_report) AS now) x)
    END
$$;
"""

DROP_FUNCTIONS = """
DROP FUNCTION switchboard_usage_total(jsonb, jsonb, int, int, jsonb);
DROP FUNCTION switchboard_attempt_usage(jsonb, int, int, jsonb);
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0022_sqs_fifo")]

    operations = [
        migrations.AddField("todo", "usage", models.JSONField(null=True, blank=True)),
        migrations.AddField(
            "todo", "attempt_usage", models.JSONField(null=True, blank=True)
        ),
        migrations.AddField(
            "todoevent", "usage", models.JSONField(null=True, blank=True)
        ),
        migrations.CreateModel(
            name="UsageReport",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("endpoint_id", models.UUIDField()),
                ("queue", models.TextField()),
                (
                    "group",
                    models.TextField(blank=True, db_column="group_key", null=True),
                ),
                ("todo_id", models.UUIDField(blank=True, null=True)),
                ("delivery", models.IntegerField(blank=True, null=True)),
                ("attempt", models.IntegerField(blank=True, null=True)),
                ("input_tokens", models.BigIntegerField(db_default=0)),
                ("output_tokens", models.BigIntegerField(db_default=0)),
                (
                    "cost_usd",
                    models.DecimalField(db_default=0, decimal_places=6, max_digits=20),
                ),
                ("model", models.TextField(blank=True, db_default="")),
                ("idempotency_key", models.TextField(blank=True, null=True)),
                (
                    "reported_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now()
                    ),
                ),
            ],
            options={
                "db_table": "usage_ledger",
                "indexes": [
                    models.Index(
                        fields=["endpoint_id", "queue", "reported_at"],
                        name="usage_ledger_scope_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("todo_id", "delivery"), name="usage_ledger_attempt_key"
                    ),
                    models.UniqueConstraint(
                        fields=("endpoint_id", "idempotency_key"),
                        name="usage_ledger_report_key",
                    ),
                ],
            },
        ),
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
