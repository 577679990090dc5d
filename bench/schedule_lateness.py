"""Schedule lateness: how long after its slot is a scheduled todo created?

Question: with --schedules schedules coming due together every minute and the
sweep loop running as `make run` starts it (`manage.py sweep --loop`, its
default interval), how late is each slot's todo, from the slot's time to the
todo's created_at (p50, p95, p99, max), against the target of at most the
sweep interval plus 1 s at p99? And does every slot fire exactly once (no
slot missing, none doubled)?

    python bench/schedule_lateness.py
    python bench/schedule_lateness.py --quick
    python bench/schedule_lateness.py --schedules 1000 --minutes 5

The schedules are made through the store, spread over --endpoints endpoints
and --queues queues each; half are cron `* * * * *`, half `every_seconds` 60,
so all of them come due at the same minute boundary (the worst case: one
sweep fires them all). The sweep runs in real time; the slots measured are
those from the first whole minute after its loop started to --minutes minutes
later, both included (--minutes + 1 slots a schedule); then it stops
(SIGTERM). Each fired todo's created_at is read against its slot
(schedule_fires), and every todo's history row "schedule <name>, slot <time>"
is counted per slot: a slot in the window with no todo is missing, a
slot with more than one is doubled. Under --quick, a few schedules have their
first slot pulled a few seconds ahead (one slot each), so the smoke run does
not wait for the next minute.

Result: bench/results/latest/schedule_lateness.json (`python bench/report.py`).
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import benchlib
import psycopg

# A slot fired later than this after the sweep stops is not waited for.
STOP_MARGIN_SECONDS = 3
# Quick runs: the one slot comes due this long after the loop started.
QUICK_FIRST_SLOT_SECONDS = 3
EPSILON = timedelta(microseconds=1)


def options():
    parse = benchlib.parser(__doc__)
    add = parse.add_argument
    add("--schedules", type=int, default=1_000, help="schedules (1000)")
    add("--endpoints", type=int, default=4, help="endpoints they spread over (4)")
    add("--queues", type=int, default=5, help="queues per endpoint (5)")
    add("--minutes", type=int, default=3, help="minutes of slots (3: 4 a schedule)")
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, schedules=4, endpoints=2, queues=2, minutes=1)
    return args


def reset(url):
    """Empty the schedules, their fires, the todos and their history."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE schedule_fires, todos, todo_events")
        conn.execute("DELETE FROM schedules")
        conn.execute("CHECKPOINT")


def make_schedules(endpoint_ids, args):
    """Create the schedules through the store; return {id: (name, first slot)}."""
    from todos import store

    made = {}
    for number in range(args.schedules):
        endpoint_id = endpoint_ids[number % len(endpoint_ids)]
        every = number % 2 == 1
        schedule = store.create_schedule(
            store.Scope(endpoint_id),
            name=f"lateness-{number}",
            queue=f"lateness-{number % args.queues}",
            cron=None if every else "* * * * *",
            every_seconds=60 if every else None,
            todo={"title": f"lateness {number}"},
        )
        made[schedule.id] = schedule
    return made


def pull_first_slots(url, seconds):
    """Quick runs: move every schedule's next slot to ``seconds`` from now."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "UPDATE schedules SET next_slot_at = date_trunc('second', now()) "
            "+ make_interval(secs => %s) RETURNING next_slot_at",
            [seconds],
        ).fetchone()[0]


def database_now(url):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT now()").fetchone()[0]


@contextlib.contextmanager
def sweep_loop(url, log_path, timeout=120):
    """Run `manage.py sweep --loop` as scripts/serve.sh does (its default
    interval); yield once its loop has started, SIGTERM it after."""
    with open(log_path, "w") as log:
        sweeper = subprocess.Popen(
            [sys.executable, "manage.py", "sweep", "--loop"],
            cwd=benchlib.ROOT,
            env=benchlib.django_env(url, LOG_FORMAT="text", LOG_LEVEL="INFO"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + timeout
            while "sweep loop started" not in log_path.read_text():
                if sweeper.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the sweep loop did not start; see {log_path}")
                time.sleep(0.1)
            yield sweeper
        finally:
            sweeper.send_signal(signal.SIGTERM)
            sweeper.wait(timeout=30)


def sleep_until(url, moment, sweeper, log_path):
    """Sleep until the database clock reaches ``moment``, telling how long."""
    while True:
        remaining = (moment - database_now(url)).total_seconds()
        if remaining <= 0:
            return
        if sweeper.poll() is not None:
            raise RuntimeError(f"the sweep loop exited; see {log_path}")
        benchlib.progress(f"  sweeping, {remaining:.0f} s to go")
        time.sleep(min(30, remaining))


def window(schedule, start, cutoff):
    """The schedule's slots from ``start`` to ``cutoff``; a quick run's one
    slot is ``start`` itself (pulled ahead, off the minute)."""
    if start == cutoff:
        return [start]
    slots = []
    for slot in schedule.recurrence.slots_after(start - EPSILON):
        if slot > cutoff:
            break
        slots.append(slot)
    return slots


FIRES_SQL = """
SELECT f.schedule_id::text, f.slot, t.created_at
  FROM schedule_fires f
  JOIN todos t ON t.id = f.todo_id
 WHERE NOT f.manual
"""

HISTORY_SQL = """
SELECT actor, count(*) FROM todo_events
 WHERE from_state IS NULL AND actor LIKE 'schedule %%, slot %%'
 GROUP BY actor
"""


def measure(url, schedules, start, cutoff):
    """Lateness of every slot from ``start`` up to ``cutoff`` (the window);
    the window's missing and doubled slots."""
    from todos.store.rows import _iso

    with psycopg.connect(url, autocommit=True) as conn:
        fires = conn.execute(FIRES_SQL).fetchall()
        history = dict(conn.execute(HISTORY_SQL).fetchall())
    fired = {(schedule_id, slot): created for schedule_id, slot, created in fires}
    lateness, missing, doubled, expected = [], 0, 0, 0
    for schedule_id, schedule in schedules.items():
        for slot in window(schedule, start, cutoff):
            expected += 1
            created = fired.get((schedule_id, slot))
            todos = history.get(f"schedule {schedule.name}, slot {_iso(slot)}", 0)
            if created is None or todos == 0:
                missing += 1
                continue
            if todos > 1:
                doubled += 1
            lateness.append((created - slot).total_seconds())
    outside = sum(1 for (_, slot) in fired if not start <= slot <= cutoff)
    return {
        "slots_expected": expected,
        "slots_fired": len(lateness),
        "slots_missing": missing,
        "slots_doubled": doubled,
        "fired_outside_window": outside,
        "lateness_seconds": lateness_summary(lateness),
    }


def lateness_summary(values):
    return {
        "p50": benchlib.percentile(values, 0.50),
        "p95": benchlib.percentile(values, 0.95),
        "p99": benchlib.percentile(values, 0.99),
        "max": max(values) if values else None,
        "min": min(values) if values else None,
    }


def main():
    args = options()
    url = args.database_url
    result = benchlib.Result("schedule_lateness", args)
    benchlib.progress(f"preparing {url}")
    benchlib.prepare_database(url)
    endpoint_ids = [
        benchlib.ensure_endpoint(url, name=f"lateness-{number}")[0]
        for number in range(args.endpoints)
    ]
    benchlib.setup_django(url)
    from django.conf import settings
    from django.db import connection

    interval = settings.SWITCHBOARD_SWEEP_INTERVAL
    reset(url)
    benchlib.progress(
        f"creating {args.schedules} schedules over {args.endpoints} endpoints, "
        f"{args.queues} queues each"
    )
    schedules = make_schedules(endpoint_ids, args)
    connection.close()
    log_path = Path(tempfile.gettempdir()) / f"schedule_lateness_{os.getpid()}.log"
    benchlib.progress(f"starting manage.py sweep --loop (interval {interval} s)")
    cpu_before = benchlib.cpu_times()
    with sweep_loop(url, log_path) as sweeper:
        # The window starts once the loop is up: a slot that came due while
        # it was starting measures the bench's start, not the sweep.
        if args.quick:
            start = cutoff = pull_first_slots(url, QUICK_FIRST_SLOT_SECONDS)
        else:
            now = database_now(url)
            start = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
            cutoff = start + timedelta(minutes=args.minutes)
        benchlib.progress(
            f"measuring the slots {start:%H:%M:%S} to {cutoff:%H:%M:%S} UTC"
        )
        stop_at = cutoff + timedelta(seconds=interval + 1 + STOP_MARGIN_SECONDS)
        sleep_until(url, stop_at, sweeper, log_path)
    # On a shared machine, what else ran is the noise under the figures.
    machine_share = benchlib.machine_share(cpu_before, benchlib.cpu_times())
    figures = measure(url, schedules, start, cutoff)
    figures["machine_cpu"] = machine_share
    figures["sweep_interval_seconds"] = interval
    figures["target_p99_seconds"] = interval + 1
    p99 = figures["lateness_seconds"]["p99"]
    figures["within_target"] = (
        p99 is not None
        and p99 <= interval + 1
        and figures["slots_missing"] == 0
        and figures["slots_doubled"] == 0
    )
    figures["sweep_exit_code"] = sweeper.returncode
    reset(url)
    figures = benchlib.rounded(figures)
    late = figures["lateness_seconds"]
    benchlib.print_table(
        f"Schedule lateness, {args.schedules} schedules, sweep interval {interval} s",
        ["figure", "value", "target"],
        [
            ["slots fired", figures["slots_fired"], figures["slots_expected"]],
            ["slots missing", figures["slots_missing"], 0],
            ["slots doubled", figures["slots_doubled"], 0],
            ["lateness p50 (s)", late["p50"], ""],
            ["lateness p95 (s)", late["p95"], ""],
            ["lateness p99 (s)", late["p99"], f"≤ {interval + 1}"],
            ["lateness max (s)", late["max"], ""],
        ],
    )
    parameters = {
        name: getattr(args, name)
        for name in ("schedules", "endpoints", "queues", "minutes")
    }
    result.write(parameters, figures)


if __name__ == "__main__":
    main()
