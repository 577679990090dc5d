"""SQS credentials: create_endpoint --sqs, sqs_credentials, encryption at rest."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from todos.access import auth, crypto
from todos.models import SqsCredential

pytestmark = pytest.mark.django_db


def run(command, *args):
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def stored_text(table):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {table} t")
        return " ".join(row[0] for row in cursor.fetchall())


def test_create_endpoint_with_sqs_prints_credentials_once_as_json():
    output = json.loads(
        run(
            "create_endpoint",
            "w",
            "--owner",
            "alice",
            "--queues",
            "*",
            "--sqs",
            "--json",
        )
    )
    assert output["sqs_access_key_id"].startswith("SBIA")
    assert len(output["sqs_access_key_id"]) == 20
    assert len(output["sqs_secret_access_key"]) == 40
    assert len(output["sqs_account_id"]) == 12 and output["sqs_account_id"].isdigit()
    endpoint, ciphertext, account = auth.endpoint_for_access_key(
        output["sqs_access_key_id"]
    )
    assert str(endpoint.id) == output["endpoint_id"]
    assert account == output["sqs_account_id"]
    assert crypto.decrypt(ciphertext) == output["sqs_secret_access_key"]


def test_create_endpoint_without_sqs_issues_no_credentials():
    output = json.loads(
        run("create_endpoint", "w", "--owner", "alice", "--queues", "*", "--json")
    )
    assert "sqs_access_key_id" not in output
    assert not SqsCredential.objects.exists()


def test_sqs_secret_is_stored_encrypted_never_in_clear():
    output = json.loads(
        run(
            "create_endpoint",
            "w",
            "--owner",
            "alice",
            "--queues",
            "*",
            "--sqs",
            "--json",
        )
    )
    stored = stored_text("sqs_credentials")
    assert output["sqs_access_key_id"] in stored
    assert output["sqs_secret_access_key"] not in stored


def test_sqs_credentials_shows_the_key_without_its_secret(endpoint):
    first = json.loads(run("sqs_credentials", str(endpoint.id), "--json"))
    assert first["issued"] is True and first["sqs_secret_access_key"]
    again = json.loads(run("sqs_credentials", str(endpoint.id), "--json"))
    assert again["issued"] is False and "sqs_secret_access_key" not in again
    assert again["sqs_access_key_id"] == first["sqs_access_key_id"]
    assert again["sqs_account_id"] == first["sqs_account_id"]


def test_sqs_credentials_rotate_stops_the_old_key_and_keeps_the_account(endpoint):
    first = json.loads(run("sqs_credentials", str(endpoint.id), "--json"))
    rotated = json.loads(run("sqs_credentials", str(endpoint.id), "--rotate", "--json"))
    assert rotated["issued"] is True
    assert rotated["sqs_access_key_id"] != first["sqs_access_key_id"]
    assert rotated["sqs_secret_access_key"] != first["sqs_secret_access_key"]
    assert rotated["sqs_account_id"] == first["sqs_account_id"]
    assert auth.endpoint_for_access_key(first["sqs_access_key_id"]) is None
    assert auth.endpoint_for_access_key(rotated["sqs_access_key_id"]) is not None


def test_sqs_credentials_text_form_says_the_secret_is_shown_once(endpoint):
    output = run("sqs_credentials", str(endpoint.id))
    assert "sqs secret access key:" in output and "shown only now" in output


@pytest.mark.parametrize(
    "given", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"]
)
def test_sqs_credentials_refuses_an_unknown_endpoint(given):
    with pytest.raises(CommandError, match="no endpoint"):
        run("sqs_credentials", given)


def test_a_revoked_endpoints_key_is_not_found(endpoint):
    from django.utils import timezone

    issued = json.loads(run("sqs_credentials", str(endpoint.id), "--json"))
    endpoint.revoked_at = timezone.now()
    endpoint.save()
    assert auth.endpoint_for_access_key(issued["sqs_access_key_id"]) is None
    with pytest.raises(CommandError, match="revoked"):
        run("sqs_credentials", str(endpoint.id))


def test_encryption_key_setting_takes_comma_separated_fernet_keys():
    new, old = crypto.derived_key("new"), crypto.derived_key("old")
    with override_settings(SWITCHBOARD_ENCRYPTION_KEY=old):
        ciphertext = crypto.encrypt("s3cret")
    # A new key prepended: new ciphertexts use it, old ones still open.
    with override_settings(SWITCHBOARD_ENCRYPTION_KEY=f"{new},{old}"):
        assert crypto.decrypt(ciphertext) == "s3cret"
        fresh = crypto.encrypt("s3cret")
    with override_settings(SWITCHBOARD_ENCRYPTION_KEY=new):
        assert crypto.decrypt(fresh) == "s3cret"
        with pytest.raises(crypto.DecryptionFailed):
            crypto.decrypt(ciphertext)


def test_encryption_key_setting_rejects_a_key_that_is_not_fernet():
    from django.core.exceptions import ImproperlyConfigured

    with (
        override_settings(SWITCHBOARD_ENCRYPTION_KEY="too-short"),
        pytest.raises(ImproperlyConfigured),
    ):
        crypto.encrypt("x")


def test_webhook_signing_secret_is_stored_encrypted(endpoint):
    from todos.models import WebhookSource

    run(
        "create_webhook",
        "gh",
        "--secret",
        "webhook-secret-value",
        "--route",
        f"{endpoint.id}:q",
    )
    assert "webhook-secret-value" not in stored_text("webhook_sources")
    assert WebhookSource.objects.get(slug="gh").secret == "webhook-secret-value"
