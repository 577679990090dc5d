"""Return failed todos whose backoff window has elapsed to pending."""

import logging

from django.core.management.base import BaseCommand

from todos import store
from todos.management.database import unreachable
from todos.management.sweeper import batch_size_arg, drain

logger = logging.getLogger("switchboard.sweep")


class Command(BaseCommand):
    help = (
        "One pass of the retry scheduler: every failed todo whose next_retry_at has "
        "passed returns to pending (owner, lease and retry window cleared) and rings "
        "its endpoint's doorbell. Dead letters (no retry window) are left alone. "
        "Runs in batches until none is left and prints how many todos moved."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size",
            type=batch_size_arg,
            metavar="N",
            default=store.SWEEP_BATCH,
            help=f"Todos moved per statement (default {store.SWEEP_BATCH}).",
        )

    def handle(self, *args, **options):
        batch_size = options["batch_size"]
        requeued = 0
        try:
            for number, moved in enumerate(
                drain(store.requeue_due_retries, batch_size=batch_size), start=1
            ):
                requeued += len(moved)
                if moved:
                    self.stdout.write(f"batch {number}: {len(moved)} todos moved")
        except store.Unavailable as exc:
            raise unreachable("requeue_due_retries", exc) from exc
        logger.info(
            "requeue_due_retries done", extra={"fields": {"requeued": requeued}}
        )
        self.stdout.write(f"requeue_due_retries: {requeued} todos requeued")
