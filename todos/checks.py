"""System checks for the keys of the secrets kept encrypted at rest.

- ``switchboard.E001``: ``SWITCHBOARD_ENCRYPTION_KEY`` is malformed (every
  command refuses to run, as the server could neither read nor write a secret).
- ``switchboard.W001``: stored secrets that no configured key decrypts (their
  SQS keys are refused and their webhooks answer 503 until the old key is back
  or the credentials are rotated).
- ``switchboard.W002``: stored secrets readable only with an old key (a
  fallback): run ``manage.py reencrypt_secrets`` before dropping it.

The stored secrets are read from the database, so, like Django's own database
checks, that survey runs when a command names its databases (``migrate``,
``check --database default``), in ``check --deploy`` and as each serving
process starts (``report_at_start``); a database that is down or not migrated
yet is not an error of the keys and is skipped.
"""

import logging

from django.core.checks import Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection

from todos.access import crypto

KEY_ROTATION = "docs/operations.md, 'Rotating keys'"
# gunicorn's exit code for a worker that cannot boot: the master stops too.
WORKER_BOOT_ERROR = 3

logger = logging.getLogger("switchboard.checks")


@register(Tags.security)
def check_encryption_key(app_configs=None, **kwargs):
    """Refuse a malformed SWITCHBOARD_ENCRYPTION_KEY."""
    problem = crypto.configuration_error()
    if problem is None:
        return []
    return [
        Error(
            problem,
            hint="Generate one with `python -c 'from cryptography.fernet import "
            "Fernet; print(Fernet.generate_key().decode())'`; see " + KEY_ROTATION,
            id="switchboard.E001",
        )
    ]


@register(Tags.database, Tags.security)
def check_stored_secrets(app_configs=None, databases=None, **kwargs):
    """Report stored secrets the keys do not open (when a database is named)."""
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    return stored_secrets_issues()


@register(Tags.security, deploy=True)
def check_stored_secrets_deploy(app_configs=None, databases=None, **kwargs):
    """The same survey in ``check --deploy`` (unless a database was named)."""
    if databases:
        return []
    return stored_secrets_issues()


def stored_secrets_issues():
    """Return the warnings about the stored secrets, or [] when all is well."""
    if crypto.configuration_error():
        return []  # E001 says it already.
    from todos.access import stored_secrets

    try:
        tallies = [stored_secrets.survey(store) for store in stored_secrets.STORES]
    except DatabaseError:
        # No database, or one before the migrations: nothing stored to check.
        return []
    issues = []
    unreadable = [tally for tally in tallies if tally.unreadable]
    if unreadable:
        issues.append(
            Warning(
                "Stored secrets do not decrypt with any configured key: "
                + "; ".join(_unreadable(tally) for tally in unreadable)
                + ".",
                hint="Put the SECRET_KEY they were encrypted under back in "
                "SECRET_KEY_FALLBACKS (or the old Fernet key in "
                "SWITCHBOARD_ENCRYPTION_KEY), or rotate those credentials; see "
                + KEY_ROTATION,
                id="switchboard.W001",
            )
        )
    old = [tally for tally in tallies if tally.old_key]
    if old:
        issues.append(
            Warning(
                "Stored secrets are still under an old key: "
                + ", ".join(f"{tally.old_key} {tally.label}" for tally in old)
                + ".",
                hint="Run `python manage.py reencrypt_secrets` before removing "
                "that key from SECRET_KEY_FALLBACKS or SWITCHBOARD_ENCRYPTION_KEY.",
                id="switchboard.W002",
            )
        )
    return issues


def _unreadable(tally):
    shown = ", ".join(str(pk) for pk in tally.unreadable[:5])
    more = len(tally.unreadable) - 5
    if more > 0:
        shown += f" and {more} more"
    return f"{len(tally.unreadable)} {tally.label} ({shown})"


def report_at_start() -> None:
    """Log the keys' checks as a serving process starts; exit on a malformed key.

    gunicorn runs no ``manage.py`` command, so a server started on its own
    would otherwise answer with unreadable secrets before anyone ran a check.
    """
    for issue in check_encryption_key():
        logger.error("%s: %s %s", issue.id, issue.msg, issue.hint)
        raise SystemExit(WORKER_BOOT_ERROR)
    try:
        for issue in stored_secrets_issues():
            logger.warning("%s: %s %s", issue.id, issue.msg, issue.hint)
    finally:
        # Back to the pool: the process's event loop makes its own calls.
        connection.close()
