"""Run the sweeps (and fire due schedules): once, or as a long-running loop that
stops on SIGTERM/SIGINT."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from todos import store
from todos.management.database import unreachable
from todos.management.sweeper import (
    Sweeper,
    batch_size_arg,
    log_pass,
    positive_seconds,
    sweep_once,
)


class Command(BaseCommand):
    help = (
        "Run the lease reaper (expired leases back to pending, or dead-lettered at "
        "the attempt cap) and then the retry scheduler (failed todos whose backoff "
        "elapsed back to pending), and fire the schedules whose slots came due "
        "(one todo per slot). Without --loop: one pass, printing the counts. "
        "With --loop: a pass every --interval seconds until SIGTERM or SIGINT, which "
        "stop it within a second with exit status 0; database outages are logged "
        "and the loop reconnects and keeps going."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep sweeping until SIGTERM/SIGINT instead of one pass.",
        )
        parser.add_argument(
            "--interval",
            type=positive_seconds,
            metavar="SECONDS",
            default=None,
            help="Seconds between passes with --loop (default "
            "SWITCHBOARD_SWEEP_INTERVAL, 5).",
        )
        parser.add_argument(
            "--batch-size",
            type=batch_size_arg,
            metavar="N",
            default=store.SWEEP_BATCH,
            help=f"Todos moved per statement (default {store.SWEEP_BATCH}).",
        )

    def handle(self, *args, **options):
        if options["interval"] is not None and not options["loop"]:
            raise CommandError("--interval only applies with --loop")
        if options["loop"]:
            interval = options["interval"] or settings.SWITCHBOARD_SWEEP_INTERVAL
            sweeper = Sweeper(interval=interval, batch_size=options["batch_size"])
            sweeper.install_signal_handlers()
            self.stdout.write(f"sweep: looping every {interval:g} s; SIGTERM stops it")
            passes = sweeper.run()
            self.stdout.write(
                f"sweep: stopped after {passes} passes ({sweeper.failures} failed)"
            )
            return
        try:
            result = sweep_once(batch_size=options["batch_size"])
        except store.Unavailable as exc:
            raise unreachable("sweep", exc) from exc
        log_pass("sweep done", result)
        self.stdout.write(
            f"sweep: {result.moved} todos moved ({result.requeued} requeued after "
            f"lease expiry, {result.dead_lettered} dead-lettered at the attempt cap, "
            f"{result.retried} retries requeued) in {result.seconds * 1000:.0f} ms; "
            f"{result.fired} schedule slots fired, {result.fire_skips} skipped"
        )
