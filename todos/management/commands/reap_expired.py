"""Requeue todos whose lease expired (dead-letter those at their attempt cap)."""

import logging

from django.core.management.base import BaseCommand

from todos import store
from todos.management.database import unreachable
from todos.management.sweeper import batch_size_arg, drain

logger = logging.getLogger("switchboard.sweep")


class Command(BaseCommand):
    help = (
        "One pass of the lease reaper: every claimed todo whose lease has expired "
        "returns to pending, or dead-letters (failed, no retry window) when it has "
        "used max_attempts. Runs in batches until none is left and prints how many "
        "todos moved. Safe to run from cron beside `sweep --loop` and the claim scan "
        "(rows are locked with SKIP LOCKED, each batch is one statement)."
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
        requeued = dead_lettered = canceled = 0
        try:
            for number, moved in enumerate(
                drain(store.reap_expired, batch_size=batch_size), start=1
            ):
                batch_requeued = sum(todo.state == "pending" for todo in moved)
                batch_canceled = sum(todo.state == "done" for todo in moved)
                requeued += batch_requeued
                canceled += batch_canceled
                dead_lettered += len(moved) - batch_requeued - batch_canceled
                if moved:
                    self.stdout.write(f"batch {number}: {len(moved)} todos moved")
        except store.Unavailable as exc:
            raise unreachable("reap_expired", exc) from exc
        logger.info(
            "reap_expired done",
            extra={
                "fields": {
                    "requeued": requeued,
                    "dead_lettered": dead_lettered,
                    "canceled": canceled,
                }
            },
        )
        moved = requeued + dead_lettered + canceled
        canceled_part = f", {canceled} canceled" if canceled else ""
        self.stdout.write(
            f"reap_expired: {moved} todos moved "
            f"({requeued} requeued, {dead_lettered} dead-lettered{canceled_part})"
        )
