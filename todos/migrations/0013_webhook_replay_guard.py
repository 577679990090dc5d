"""Timestamped webhook schemes (Stripe, Standard Webhooks) and their replay guard.

The scheme CHECK grows to the two new schemes; ``webhook_signatures_seen``
remembers each timestamped delivery's signature for the tolerance window, one
row per (source, signature), so every process refuses a replay of it.
"""

import django.db.models.deletion
from django.db import migrations, models

SCHEMES = ["github", "hmac-sha256", "stripe", "standard-webhooks"]


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0012_waiter_control_triggers"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="webhooksource",
            name="webhook_sources_scheme_check",
        ),
        migrations.AlterField(
            model_name="webhooksource",
            name="scheme",
            field=models.CharField(
                choices=[
                    ("github", "GitHub (X-Hub-Signature-256)"),
                    ("hmac-sha256", "Generic HMAC-SHA256 header"),
                    ("stripe", "Stripe (Stripe-Signature t=…,v1=…, timestamped)"),
                    (
                        "standard-webhooks",
                        "Standard Webhooks (webhook-signature, timestamped)",
                    ),
                ],
                default="github",
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="webhooksource",
            constraint=models.CheckConstraint(
                condition=models.Q(scheme__in=SCHEMES),
                name="webhook_sources_scheme_check",
            ),
        ),
        migrations.CreateModel(
            name="WebhookSignatureSeen",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("signature", models.CharField(max_length=64)),
                ("signed_at", models.DateTimeField()),
                (
                    "source",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="signatures_seen",
                        to="todos.webhooksource",
                    ),
                ),
            ],
            options={
                "db_table": "webhook_signatures_seen",
                "indexes": [
                    models.Index(
                        fields=["source", "signed_at"],
                        name="webhook_signatures_seen_age",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "signature"),
                        name="webhook_signatures_seen_once",
                    )
                ],
            },
        ),
    ]
