"""Tracing (CONTRACT §19): what a todo keeps of its trace.

- ``trace_context``: the W3C context its create carried, or the create's own
  ``send`` span when tracing is on (``{"traceparent", "tracestate"}``); every
  claim hands it on, so the agent's spans join the trace.
- ``deliveries``: how many times a claim handed the todo out. Unlike
  ``attempt`` it never goes back (an asked question or a claim its client never
  received gives an attempt back): each delivery's ``process`` span is named by
  the todo and this number, so the next delivery can link to the last one with
  nothing more stored.
- ``trace_events``: the span events a delivery's ``process`` span shows that
  happen in other requests (progress, a cancel request, the answer that ended
  a hold), tagged with their delivery, kept only while tracing is on and
  bounded by the store.

All three are new nullable or defaulted columns: PostgreSQL adds them without
rewriting the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("todos", "0020_admission")]

    operations = [
        migrations.AddField(
            "todo", "trace_context", models.JSONField(null=True, blank=True)
        ),
        migrations.AddField("todo", "deliveries", models.IntegerField(db_default=0)),
        migrations.AddField(
            "todo", "trace_events", models.JSONField(null=True, blank=True)
        ),
    ]
