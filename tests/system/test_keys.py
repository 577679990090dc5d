"""The keys of the secrets kept encrypted at rest: rotation and the system checks.

Django's own recipe: a SECRET_KEY moved to SECRET_KEY_FALLBACKS keeps what it
protected readable; SWITCHBOARD_ENCRYPTION_KEY, once set, encrypts while the
keys derived from SECRET_KEY and its fallbacks still decrypt.
"""

import subprocess
import sys
import time

import pytest
from cryptography.fernet import Fernet
from django.core import checks
from django.db import connection

from tests.support import ROOT, child_env, database_url, free_port
from todos.access import crypto
from todos.models import SqsCredential, WebhookSource
from todos.sqs import credentials

NEW_SECRET_KEY = "the-new-secret-key-after-rotation-0123456789abcdefghijklmnop"


@pytest.fixture
def stored(db, endpoint, settings):
    """A webhook secret and an SQS secret, encrypted under SECRET_KEY's key."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = ""
    settings.SECRET_KEY_FALLBACKS = []
    WebhookSource.objects.create(slug="acme-app", secret="hook-secret")
    issued = credentials.issue(endpoint)
    return {"hook": "hook-secret", "sqs": issued.secret_access_key}


def read_back():
    return {
        "hook": WebhookSource.objects.get().secret,
        "sqs": SqsCredential.objects.get().secret_access_key,
    }


def switchboard_issues(**options):
    found = checks.run_checks(**options)
    return [issue for issue in found if issue.id.startswith("switchboard.")]


def issue_ids(**options):
    return sorted(issue.id for issue in switchboard_issues(**options))


def test_a_secret_key_moved_to_the_fallbacks_keeps_every_stored_secret_readable(
    stored, settings
):
    """Defect: rotating SECRET_KEY the Django way made stored secrets unreadable."""
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = NEW_SECRET_KEY

    assert read_back() == stored


def test_the_secret_key_derived_key_still_decrypts_once_an_encryption_key_is_set(
    stored, settings
):
    """Defect: setting SWITCHBOARD_ENCRYPTION_KEY made existing secrets unreadable."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = Fernet.generate_key().decode()

    assert read_back() == stored
    # New secrets are written under the configured key.
    fresh = crypto.encrypt("new")
    assert Fernet(settings.SWITCHBOARD_ENCRYPTION_KEY).decrypt(fresh.encode()) == b"new"


def test_an_old_secret_key_without_a_fallback_no_longer_decrypts(stored, settings):
    settings.SECRET_KEY = NEW_SECRET_KEY

    with pytest.raises(crypto.DecryptionFailed):
        read_back()


def test_secret_key_fallbacks_are_read_from_the_environment():
    """Defect: SECRET_KEY_FALLBACKS could not be set without editing the settings."""
    finished = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings;"
            " print(settings.SECRET_KEY_FALLBACKS)",
        ],
        cwd=ROOT,
        env=child_env(
            DJANGO_SETTINGS_MODULE="board.settings",
            SECRET_KEY="k" * 50,
            SECRET_KEY_FALLBACKS=" older-key-one , older-key-two ",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.stdout.strip() == "['older-key-one', 'older-key-two']"


# --- The system checks ------------------------------------------------------------


def test_the_checks_report_stored_secrets_that_no_key_decrypts(stored, settings):
    """Defect: a lost key showed only as failing requests, never at start."""
    settings.SECRET_KEY = NEW_SECRET_KEY

    # `migrate` and `check --database default` name the database; `check
    # --deploy` runs the same survey.
    assert issue_ids(databases=["default"]) == ["switchboard.W001"]
    assert issue_ids(include_deployment_checks=True) == ["switchboard.W001"]
    [issue] = switchboard_issues(databases=["default"])
    assert "1 SQS secret keys" in issue.msg and "1 webhook signing secrets" in issue.msg
    assert "SECRET_KEY_FALLBACKS" in issue.hint


def test_the_checks_say_when_secrets_wait_for_reencrypt_secrets(stored, settings):
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = NEW_SECRET_KEY

    [issue] = switchboard_issues(databases=["default"])
    assert issue.id == "switchboard.W002"
    assert "reencrypt_secrets" in issue.hint


def test_the_checks_are_quiet_when_every_secret_is_under_the_current_key(stored):
    assert issue_ids(databases=["default"], include_deployment_checks=True) == []


def test_the_checks_refuse_a_malformed_encryption_key(db, settings):
    """Defect: a malformed SWITCHBOARD_ENCRYPTION_KEY surfaced as a 500 at first use."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = "not-a-fernet-key"

    found = [i for i in checks.run_checks() if i.id == "switchboard.E001"]

    assert [issue.level for issue in found] == [checks.ERROR]
    assert "SWITCHBOARD_ENCRYPTION_KEY must be Fernet keys" in found[0].msg


def manage_check(*args, database):
    """Run `manage.py check ARGS` against `database` in a child process."""
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=child_env(database, DJANGO_SETTINGS_MODULE="tests.settings"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manage_check_deploy_names_a_malformed_key_and_exits_1():
    finished = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=child_env(
            DJANGO_SETTINGS_MODULE="tests.settings",
            SWITCHBOARD_ENCRYPTION_KEY="not-a-fernet-key",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 1
    assert "switchboard.E001" in finished.stderr


@pytest.mark.django_db(transaction=True)
def test_the_stored_secrets_check_copes_with_no_database_and_an_unmigrated_one():
    """Defect guard: a check that reads the database must not break `migrate` on a
    fresh database, nor `check --deploy` where the database is down."""
    down = manage_check("--deploy", database=database_url(port=free_port()))
    assert "Traceback" not in down.stderr
    assert "switchboard." not in down.stderr

    fresh = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{fresh}"')
        cursor.execute(f'CREATE DATABASE "{fresh}"')
    try:
        url = database_url().rsplit("/", 1)[0] + "/" + fresh
        unmigrated = manage_check("--database", "default", "--deploy", database=url)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
    assert "Traceback" not in unmigrated.stderr
    assert "switchboard." not in unmigrated.stderr


def serve_until(pattern, tmp_path, **env):
    """Start gunicorn with `env`; return its log once `pattern` shows (or it exits)."""
    log = tmp_path / "gunicorn.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "--workers"]
            + ["1", "--bind", f"127.0.0.1:{free_port()}"],
            cwd=ROOT,
            env=child_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 30
        while pattern not in log.read_text() and process.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        return process, log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_a_server_started_on_its_own_reports_secrets_no_key_opens(
    endpoint, settings, tmp_path
):
    """gunicorn runs no manage.py command: its worker reports at start that the
    stored secrets do not decrypt (a SECRET_KEY changed without a fallback)."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = ""
    WebhookSource.objects.create(slug="acme-app", secret="hook-secret")

    _, log = serve_until(
        "switchboard.W001", tmp_path, SECRET_KEY=NEW_SECRET_KEY, SECRET_KEY_FALLBACKS=""
    )

    assert "switchboard.W001" in log and "webhook" in log


def test_a_server_with_a_malformed_encryption_key_refuses_to_start(tmp_path):
    """The worker logs E001 and exits as a boot error, which stops gunicorn."""
    process, log = serve_until(
        "Worker failed to boot", tmp_path, SWITCHBOARD_ENCRYPTION_KEY="not-a-fernet-key"
    )

    assert "switchboard.E001" in log
    assert process.returncode not in (None, 0)
