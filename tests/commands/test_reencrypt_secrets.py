"""python manage.py reencrypt_secrets: every stored secret moved to the current key."""

from functools import partial
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from tests.support import command_output
from todos.access import crypto
from todos.models import SqsCredential, WebhookSource
from todos.sqs import credentials

reencrypt_secrets = partial(command_output, "reencrypt_secrets")
NEW_SECRET_KEY = "the-new-secret-key-after-rotation-0123456789abcdefghijklmnop"


@pytest.fixture
def rotated(db, make_endpoint, settings):
    """Three SQS secrets and two webhook secrets under the old SECRET_KEY, which
    has just moved to SECRET_KEY_FALLBACKS."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = ""
    settings.SECRET_KEY_FALLBACKS = []
    secrets = {}
    for number in range(3):
        endpoint = make_endpoint(f"agent-{number}")
        secrets[endpoint.id] = credentials.issue(endpoint).secret_access_key
    for slug in ("one", "two"):
        WebhookSource.objects.create(slug=slug, secret=f"{slug}-secret")
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = NEW_SECRET_KEY
    return secrets


def test_reencrypt_secrets_moves_every_stored_secret_to_the_current_key(
    rotated, settings
):
    """Defect: no way to move stored secrets off an old key, so it could never go."""
    out = reencrypt_secrets()

    assert "SQS secret keys: 3 stored, 3 moved to the current key" in out
    assert "webhook signing secrets: 2 stored, 2 moved to the current key" in out
    assert "SQS secret keys: 3 read, 3 moved" in out  # the progress line
    # The old key can now leave the settings.
    settings.SECRET_KEY_FALLBACKS = []
    assert {
        credential.endpoint_id: credential.secret_access_key
        for credential in SqsCredential.objects.all()
    } == rotated
    assert sorted(s.secret for s in WebhookSource.objects.all()) == [
        "one-secret",
        "two-secret",
    ]


def test_reencrypt_secrets_a_second_time_moves_nothing(rotated):
    reencrypt_secrets()
    before = list(WebhookSource.objects.values_list("secret_encrypted", flat=True))

    out = reencrypt_secrets()

    assert (
        "SQS secret keys: 3 stored, 0 moved to the current key, 3 already current"
        in out
    )
    assert (
        list(WebhookSource.objects.values_list("secret_encrypted", flat=True)) == before
    )


def test_reencrypt_secrets_moves_to_a_newly_set_encryption_key(rotated, settings):
    settings.SWITCHBOARD_ENCRYPTION_KEY = Fernet.generate_key().decode()

    reencrypt_secrets()

    settings.SECRET_KEY_FALLBACKS = []
    settings.SECRET_KEY = "yet-another-secret-key-0123456789abcdefghijklmnopqrstuv"
    assert WebhookSource.objects.get(slug="one").secret == "one-secret"


def test_reencrypt_secrets_dry_run_counts_and_changes_nothing(rotated):
    before = list(SqsCredential.objects.values_list("secret_encrypted", flat=True))

    out = reencrypt_secrets("--dry-run")

    assert "SQS secret keys: 3 stored, 3 to move, 0 already current" in out
    assert (
        list(SqsCredential.objects.values_list("secret_encrypted", flat=True)) == before
    )


def test_reencrypt_secrets_names_what_no_key_opens_and_exits_1(rotated, settings):
    unreadable = WebhookSource.objects.get(slug="two")
    unreadable.secret_encrypted = Fernet(Fernet.generate_key()).encrypt(b"x").decode()
    unreadable.save()
    err = StringIO()

    with pytest.raises(
        CommandError, match="1 stored secrets decrypt with no configured key"
    ):
        call_command("reencrypt_secrets", stdout=StringIO(), stderr=err)

    assert (
        f"does not decrypt: webhook signing secrets {unreadable.id}" in err.getvalue()
    )
    # Everything else moved all the same.
    settings.SECRET_KEY_FALLBACKS = []
    assert WebhookSource.objects.get(slug="one").secret == "one-secret"
    with pytest.raises(crypto.DecryptionFailed):
        WebhookSource.objects.get(slug="two").secret  # noqa: B018


def test_reencrypt_secrets_help_says_when_to_run_it(capsys):
    with pytest.raises(SystemExit):
        call_command("reencrypt_secrets", "--help")

    text = " ".join(capsys.readouterr().out.split())
    assert "SECRET_KEY_FALLBACKS" in text and "a second run moves nothing" in text
    assert "--dry-run" in text
