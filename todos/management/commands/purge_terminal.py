"""Delete terminal todos (and their history) that became terminal long enough ago,
and the record of schedule slots fired that long ago."""

import argparse
import logging

from django.core.management.base import BaseCommand

from todos import store
from todos.management.database import unreachable
from todos.management.sweeper import batch_size_arg

logger = logging.getLogger("switchboard.sweep")

PURGE_BATCH = 5000
# A century: beyond it the cutoff leaves PostgreSQL's timestamp range.
MAX_DAYS = 36500


def days(raw):
    """Parse --older-than: whole days, zero or more."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole days, not {raw!r}") from None
    if not 0 <= value <= MAX_DAYS:
        raise argparse.ArgumentTypeError(
            f"must be between 0 and {MAX_DAYS} days, not {value}"
        )
    return value


class Command(BaseCommand):
    help = (
        "Retention: delete terminal todos - done, or dead-lettered (failed with no "
        "retry window) - whose last transition (updated_at) is more than DAYS days "
        "old, with their todo_events history. Live todos (pending, claimed, failed "
        "with a retry window open) are never deleted. Also deletes the record of "
        "schedule slots fired more than DAYS days ago. Runs in batches and prints "
        "how many were purged."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            type=days,
            metavar="DAYS",
            help="Purge terminal todos that became terminal more than DAYS days ago.",
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size_arg,
            metavar="N",
            default=PURGE_BATCH,
            help=f"Todos deleted per statement (default {PURGE_BATCH}).",
        )

    def handle(self, *args, **options):
        older_than = options["older_than"]
        batch_size = options["batch_size"]
        try:
            purged = self.drain(store.purge_terminal, older_than, batch_size)
            fires = self.drain(store.purge_fires, older_than, batch_size)
        except store.Unavailable as exc:
            raise unreachable("purge_terminal", exc) from exc
        logger.info(
            "purge_terminal done",
            extra={
                "fields": {
                    "purged": purged,
                    "fires": fires,
                    "older_than_days": older_than,
                }
            },
        )
        self.stdout.write(
            f"purge_terminal: {purged} terminal todos older than {older_than} days "
            "purged"
        )
        self.stdout.write(
            f"purge_terminal: {fires} schedule fires older than {older_than} days "
            "purged"
        )

    def drain(self, purge, older_than, batch_size):
        """Run one purge batch after batch until one comes back short."""
        purged = 0
        while True:
            count = purge(older_than, limit=batch_size)
            purged += count
            if count:
                self.stdout.write(f"purged {purged} so far")
            if count < batch_size:
                return purged
