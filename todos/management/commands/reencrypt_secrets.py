"""Rewrite every secret stored encrypted under the key that now encrypts."""

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from todos.access import stored_secrets


class Command(BaseCommand):
    help = (
        "Rewrite every secret kept encrypted at rest (SQS secret keys, webhook "
        "signing secrets) under the key that encrypts now: the first of "
        "SWITCHBOARD_ENCRYPTION_KEY, or the one derived from SECRET_KEY. Run it "
        "after a key rotation (the old key still in SECRET_KEY_FALLBACKS or "
        "SWITCHBOARD_ENCRYPTION_KEY), then remove the old key. Secrets already "
        "under the current key are left alone, so a second run moves nothing; "
        "safe while the server runs. Exits 1 when a secret opens with no "
        "configured key (it is left as it is)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would move; change nothing.",
        )

    def handle(self, *args, dry_run=False, verbosity=1, **options):
        self.verbosity = verbosity
        unreadable = 0
        for store in stored_secrets.STORES:
            try:
                if dry_run:
                    tally = stored_secrets.survey(store)
                else:
                    tally = stored_secrets.reencrypt(
                        store, progress=self._progress(store.label)
                    )
            except DatabaseError as exc:
                raise CommandError(f"reencrypt_secrets: {exc}") from exc
            self.stdout.write(self._summary(tally, dry_run))
            for pk in tally.unreadable:
                self.stderr.write(f"  does not decrypt: {tally.label} {pk}")
            unreadable += len(tally.unreadable)
        if unreadable:
            raise CommandError(
                f"{unreadable} stored secrets decrypt with no configured key: put "
                "the key they were encrypted under back (SECRET_KEY_FALLBACKS or "
                "SWITCHBOARD_ENCRYPTION_KEY) and run this again, or rotate those "
                "credentials"
            )

    def _progress(self, label):
        def report(seen, tally):
            if self.verbosity >= 1:
                self.stdout.write(f"  {label}: {seen} read, {tally.moved} moved")

        return report

    @staticmethod
    def _summary(tally, dry_run):
        if dry_run:
            return (
                f"{tally.label}: {tally.total} stored, {tally.old_key} to move, "
                f"{tally.current} already current, {len(tally.unreadable)} unreadable"
            )
        return (
            f"{tally.label}: {tally.total} stored, {tally.moved} moved to the "
            f"current key, {tally.current} already current, "
            f"{len(tally.unreadable)} unreadable"
        )
