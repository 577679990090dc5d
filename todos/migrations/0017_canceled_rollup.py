"""Cancels in the per-minute rollup: ``canceled`` beside the other counts.

A cancel of a todo nobody works on is pending → claimed → done in one
statement (CONTRACT §14), and a canceled claim ends claimed → done: the rollup
counts those steps as cancels (their history rows say ``canceling`` and
``canceled``), not as claims and completions.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("todos", "0016_sqs_key_control_trigger")]

    operations = [
        migrations.AddField(
            model_name="todominute",
            name="canceled",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="transitiontotal",
            name="canceled",
            field=models.BigIntegerField(db_default=0),
        ),
    ]
