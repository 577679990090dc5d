"""SQS credentials per endpoint; webhook signing secrets encrypted at rest.

The existing clear-text webhook secrets are encrypted in place (and decrypted
again on the way back), with the key of todos.access.crypto at the time of migrating.
"""

import django.db.models.deletion
from django.db import migrations, models


def encrypt_webhook_secrets(apps, schema_editor):
    from todos.access import crypto

    WebhookSource = apps.get_model("todos", "WebhookSource")
    for source in WebhookSource.objects.all():
        source.secret_encrypted = crypto.encrypt(source.secret)
        source.save(update_fields=["secret_encrypted"])


def decrypt_webhook_secrets(apps, schema_editor):
    from todos.access import crypto

    WebhookSource = apps.get_model("todos", "WebhookSource")
    for source in WebhookSource.objects.all():
        source.secret = crypto.decrypt(source.secret_encrypted)
        source.save(update_fields=["secret"])


class Migration(migrations.Migration):
    # Numbered 0011 until its number followed the order it runs in: a database
    # that applied it under that name has it applied.
    replaces = [("todos", "0011_sqs_credentials_encrypted_secrets")]

    dependencies = [
        ("todos", "0008_queues_leases_delays"),
    ]

    operations = [
        migrations.CreateModel(
            name="SqsCredential",
            fields=[
                (
                    "endpoint",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="sqs",
                        serialize=False,
                        to="todos.endpoint",
                    ),
                ),
                ("access_key_id", models.CharField(max_length=32, unique=True)),
                ("secret_encrypted", models.TextField()),
                ("account_id", models.CharField(max_length=12, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("rotated_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"db_table": "sqs_credentials"},
        ),
        migrations.AddField(
            model_name="webhooksource",
            name="secret_encrypted",
            field=models.TextField(default=""),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="webhooksource",
            name="secret",
            field=models.CharField(max_length=200, default=""),
        ),
        migrations.RunPython(encrypt_webhook_secrets, decrypt_webhook_secrets),
        migrations.RemoveField(model_name="webhooksource", name="secret"),
    ]
