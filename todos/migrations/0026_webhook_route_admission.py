"""A webhook route's priority and group template (CONTRACT §17): the todos a
route makes carry that priority, and a group derived from each delivery."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0025_budgets"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookroute",
            name="priority",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="webhookroute",
            name="group_template",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
    ]
