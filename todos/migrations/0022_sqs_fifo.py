"""SQS FIFO queues (CONTRACT §11, §17): what a ``.fifo`` queue keeps of the
attributes SQS gives FIFO queues.

``queues.sqs_fifo``: NULL for every queue but an SQS FIFO queue, whose
``ContentBasedDeduplication``, ``DeduplicationScope`` and
``FifoThroughputLimit`` it holds as SQS spells them. Its order and one message
in flight per group are admission's (``group_concurrency`` 1), not this
column's. A nullable column: PostgreSQL adds it without rewriting the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("todos", "0021_trace_context")]

    operations = [
        migrations.AddField(
            "queue", "sqs_fifo", models.JSONField(null=True, blank=True)
        ),
    ]
