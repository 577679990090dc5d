"""Schedules in the store (CONTRACT §20): one todo per slot, the DST rule, the
overlap and missed-slot policies, pause and resume, and exactly-once firing
under concurrent sweep processes.

Time is PostgreSQL's: ``DatabaseClock`` sets the ``now()`` the store reads,
so a test walks days of slots without sleeping.
"""

import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.support import (
    ROOT,
    DatabaseClock,
    child_env,
    expected_slots,
    slot_violations,
    wait_until_nothing_due,
)
from todos import store
from todos.store import schedules as store_schedules


def utc(*parts):
    return datetime(*parts, tzinfo=UTC)


@pytest.fixture
def clock(db):
    """PostgreSQL's clock, set by the test (in the test's transaction)."""
    return DatabaseClock().install(utc(2026, 3, 27)).use()


def fire(times=1):
    """Run the sweep's firing ``times`` passes; return the todos made."""
    made = []
    for _ in range(times):
        made.extend(store.fire_due_schedules().todos)
    return made


def walk(clock, until, step):
    """Move the clock to ``until`` by ``step``, firing at each step; return
    the todos made, in order."""
    made = []
    while clock.now() < until:
        clock.advance(seconds=step.total_seconds())
        made.extend(fire())
    return made


def slot_of(todo):
    """The slot a todo's creation history names ("schedule <name>, slot <time>")."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT actor FROM todo_events WHERE todo_id = %s AND from_state IS NULL",
            [todo.id],
        )
        (actor,) = cursor.fetchone()
    return actor


def refreshed(scope, schedule):
    return store.get_schedule(scope, schedule.id)


# --- One slot, one todo --------------------------------------------------------


def test_a_due_slot_makes_one_todo_whose_history_names_the_schedule_and_slot(
    clock, scope
):
    schedule = store.create_schedule(
        scope,
        name="inbox",
        queue="triage",
        every_seconds=3600,
        todo={"title": "Triage the inbox", "payload": {"box": "support"}},
    )
    assert schedule.next_slot_at == utc(2026, 3, 27, 1)

    clock.set(utc(2026, 3, 27, 1, 0, 2))
    [todo] = fire()
    again = fire()

    assert again == []
    assert (todo.queue, todo.title, todo.payload) == (
        "triage",
        "Triage the inbox",
        {"box": "support"},
    )
    assert slot_of(todo) == "schedule inbox, slot 2026-03-27T01:00:00Z"
    after = refreshed(scope, schedule)
    assert after.next_slot_at == utc(2026, 3, 27, 2)
    assert after.last_slot_at == utc(2026, 3, 27, 1)
    assert after.last_todo_id == todo.id
    assert (after.fires, after.skips) == (1, 0)


def test_a_slots_todo_takes_the_templates_admission_fields_and_max_cost(clock, scope):
    store.create_schedule(
        scope,
        name="s",
        queue="q",
        every_seconds=60,
        todo={
            "priority": 1,
            "group": "acme/app",
            "cost": 2.5,
            "max_attempts": 2,
            "max_cost": 0.5,
        },
    )
    clock.advance(seconds=61)

    [todo] = fire()

    made = store.get_todo(scope, todo.id).to_dict()
    assert (made["priority"], made["group"], made["cost"], made["max_attempts"]) == (
        1,
        "acme/app",
        2.5,
        2,
    )
    assert made["max_cost"] == 0.5


def test_a_slot_not_yet_due_makes_nothing(clock, scope):
    store.create_schedule(scope, name="later", queue="q", cron="0 9 * * *")

    clock.advance(hours=8, minutes=59)

    assert fire() == []


def test_a_todo_without_a_title_takes_the_schedules_name(clock, scope):
    store.create_schedule(scope, name="nightly review", queue="q", cron="@daily")

    clock.advance(days=1)

    [todo] = fire()
    assert todo.title == "nightly review"


def test_the_unique_slot_key_refuses_a_slot_fired_already(clock, scope):
    """The backstop: even a schedule moved back onto a slot it fired makes no
    second todo for it."""
    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    clock.advance(seconds=61)
    [first] = fire()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE schedules SET next_slot_at = %s WHERE id = %s",
            [schedule.next_slot_at, schedule.id],
        )

    assert fire() == []
    assert refreshed(scope, schedule).skips == 1


# --- DST -----------------------------------------------------------------------


def test_daily_0230_in_berlin_fires_once_a_day_across_both_2026_dst_changes(
    clock, scope
):
    """02:30 does not exist on 2026-03-29 (it fires at 03:00 CEST) and happens
    twice on 2026-10-25 (it fires once, at the first)."""
    schedule = store.create_schedule(
        scope,
        name="nightly",
        queue="q",
        cron="30 2 * * *",
        time_zone="Europe/Berlin",
    )

    spring = walk(clock, utc(2026, 3, 31), timedelta(minutes=5))

    assert [slot_of(todo) for todo in spring] == [
        "schedule nightly, slot 2026-03-27T01:30:00Z",  # 02:30 CET
        "schedule nightly, slot 2026-03-28T01:30:00Z",  # 02:30 CET
        "schedule nightly, slot 2026-03-29T01:00:00Z",  # 03:00 CEST: the gap
        "schedule nightly, slot 2026-03-30T00:30:00Z",  # 02:30 CEST
    ]

    # The months between are missed slots (missed: skip): none of them fires.
    clock.set(utc(2026, 10, 23))
    assert fire() == []
    assert refreshed(scope, schedule).next_slot_at == utc(2026, 10, 23, 0, 30)

    autumn = walk(clock, utc(2026, 10, 27), timedelta(minutes=5))

    assert [slot_of(todo) for todo in autumn] == [
        "schedule nightly, slot 2026-10-23T00:30:00Z",  # 02:30 CEST
        "schedule nightly, slot 2026-10-24T00:30:00Z",  # 02:30 CEST
        "schedule nightly, slot 2026-10-25T00:30:00Z",  # the first 02:30 only
        "schedule nightly, slot 2026-10-26T01:30:00Z",  # 02:30 CET
    ]


def test_an_hourly_cron_follows_the_clock_through_the_autumn_repeat(clock, scope):
    """A cron whose hour is * runs every real hour: 02:00 happens twice."""
    clock.set(utc(2026, 10, 24, 22))
    store.create_schedule(
        scope, name="hourly", queue="q", cron="@hourly", time_zone="Europe/Berlin"
    )

    made = walk(clock, utc(2026, 10, 25, 3), timedelta(minutes=15))

    assert [slot_of(todo)[-20:] for todo in made] == [
        "2026-10-24T23:00:00Z",  # 01:00 CEST
        "2026-10-25T00:00:00Z",  # 02:00 CEST
        "2026-10-25T01:00:00Z",  # 02:00 CET
        "2026-10-25T02:00:00Z",  # 03:00 CET
        "2026-10-25T03:00:00Z",  # 04:00 CET
    ]


# --- Overlap ---------------------------------------------------------------------


def test_overlap_skip_skips_slots_while_the_last_todo_is_live(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=60, overlap="skip"
    )
    clock.advance(seconds=61)
    [todo] = fire()

    clock.advance(seconds=60)
    assert fire() == []  # pending
    store.claim_todo(scope, todo.id, "w")
    clock.advance(seconds=60)
    assert fire() == []  # claimed
    store.complete_todo(scope, todo.id, "w")
    clock.advance(seconds=60)
    [later] = fire()

    assert slot_of(later).endswith("2026-03-27T00:04:00Z")
    assert (refreshed(scope, schedule).fires, refreshed(scope, schedule).skips) == (
        2,
        2,
    )


def test_overlap_allow_fires_while_the_last_todo_is_live(clock, scope):
    store.create_schedule(scope, name="s", queue="q", every_seconds=60)

    clock.advance(seconds=61)
    fire()
    clock.advance(seconds=60)

    assert len(fire()) == 1


# --- Missed slots ----------------------------------------------------------------


def downtime(clock, scope, missed, hours):
    """An hourly schedule, then the sweep down for ``hours`` (ten minutes
    past the last slot); return the schedule and what the first pass made."""
    schedule = store.create_schedule(
        scope, name="h", queue="q", every_seconds=3600, missed=missed
    )
    clock.advance(hours=hours, minutes=10)
    return schedule, fire()


def test_missed_skip_fires_none_of_the_missed_slots(clock, scope):
    schedule, made = downtime(clock, scope, "skip", 10)

    after = refreshed(scope, schedule)
    assert made == []
    assert after.skips == 10
    assert after.next_slot_at == utc(2026, 3, 27, 11)


def test_missed_skip_still_fires_a_slot_a_little_late(clock, scope):
    """Only a slot over five minutes late counts as missed."""
    store.create_schedule(scope, name="h", queue="q", every_seconds=3600)

    clock.advance(hours=1, minutes=4)

    assert len(fire()) == 1


def test_missed_one_fires_one_todo_for_the_latest_missed_slot(clock, scope):
    schedule, made = downtime(clock, scope, "one", 10)

    [todo] = made
    assert slot_of(todo).endswith("slot 2026-03-27T10:00:00Z")
    assert refreshed(scope, schedule).skips == 9


def test_missed_all_fires_every_missed_slot_in_order(clock, scope):
    schedule, made = downtime(clock, scope, "all", 10)

    assert [slot_of(todo)[-20:] for todo in made] == [
        f"2026-03-27T{hour:02d}:00:00Z" for hour in range(1, 11)
    ]
    assert refreshed(scope, schedule).next_slot_at == utc(2026, 3, 27, 11)


def test_missed_all_fires_at_most_the_latest_hundred_slots(clock, scope):
    schedule, made = downtime(clock, scope, "all", 150)

    assert len(made) == store.MAX_MISSED_SLOTS == 100
    assert slot_of(made[0]).endswith("slot 2026-03-29T03:00:00Z")  # slot 51
    assert slot_of(made[-1]).endswith("slot 2026-04-02T06:00:00Z")  # slot 150
    assert refreshed(scope, schedule).skips == 50


# --- Pause and resume ------------------------------------------------------------


def test_a_paused_schedule_fires_nothing(clock, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    store.pause_schedule(scope, schedule.id)

    clock.advance(hours=2)

    assert fire() == []
    assert store.get_schedule(scope, schedule.id).to_dict()["next_slot_at"] is None


def test_resuming_with_missed_skip_starts_at_the_next_slot_without_a_burst(
    clock, scope
):
    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    store.pause_schedule(scope, schedule.id)
    clock.advance(hours=2, seconds=1)

    resumed = store.resume_schedule(scope, schedule.id)

    assert resumed.next_slot_at == utc(2026, 3, 27, 2, 1)
    assert fire() == []
    clock.advance(seconds=60)
    assert len(fire()) == 1


def test_resuming_with_missed_one_fires_one_todo_for_the_pause(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=60, missed="one"
    )
    store.pause_schedule(scope, schedule.id)
    clock.advance(hours=2, seconds=1)

    store.resume_schedule(scope, schedule.id)

    [todo] = fire()
    assert slot_of(todo).endswith("slot 2026-03-27T02:00:00Z")


def test_resuming_with_missed_all_fires_the_slots_of_the_pause(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=600, missed="all"
    )
    store.pause_schedule(scope, schedule.id)
    clock.advance(hours=1, seconds=1)

    store.resume_schedule(scope, schedule.id)

    assert len(fire()) == 6


# --- Fire now, next slots, changes -----------------------------------------------


def test_fire_now_makes_one_todo_per_call_and_leaves_the_slots_alone(clock, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", cron="@daily")
    store.pause_schedule(scope, schedule.id)

    first, created = store.fire_schedule(scope, schedule.id)
    second, _ = store.fire_schedule(scope, schedule.id)

    assert created and first.id != second.id
    assert slot_of(first).startswith("schedule s, slot ")
    after = refreshed(scope, schedule)
    assert after.last_todo_id == second.id and after.fires == 0


def test_fire_now_with_a_key_is_idempotent(clock, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", cron="@daily")

    first, created = store.fire_schedule(scope, schedule.id, idempotency_key="k1")
    again, created_again = store.fire_schedule(scope, schedule.id, idempotency_key="k1")

    assert (created, created_again) == (True, False)
    assert again.id == first.id
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM schedule_fires WHERE schedule_id = %s",
            [schedule.id],
        )
        assert cursor.fetchone()[0] == 1


def test_next_slots_lists_the_coming_slots_in_utc(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", cron="30 2 * * *", time_zone="Europe/Berlin"
    )

    slots = store.next_slots(scope, schedule.id, 3)

    assert slots == [
        utc(2026, 3, 27, 1, 30),
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),
    ]


def test_changing_the_recurrence_restarts_from_the_next_slot_after_now(clock, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", cron="@daily")
    clock.advance(hours=3, minutes=10)

    changed = store.update_schedule(scope, schedule.id, every_seconds=3600)

    assert (changed.cron, changed.every_seconds) == (None, 3600)
    assert changed.next_slot_at == utc(2026, 3, 27, 4)


def test_a_name_is_unique_per_endpoint(clock, scope, other_scope):
    store.create_schedule(scope, name="s", queue="q", cron="@daily")
    store.create_schedule(other_scope, name="s", queue="q", cron="@daily")
    other = store.create_schedule(scope, name="t", queue="q", cron="@daily")

    with pytest.raises(store.Conflict):
        store.create_schedule(scope, name="s", queue="q", cron="@hourly")
    with pytest.raises(store.Conflict):
        store.update_schedule(scope, other.id, name="s")


def test_another_endpoints_schedule_is_not_found(clock, scope, other_scope):
    schedule = store.create_schedule(scope, name="s", queue="q", cron="@daily")

    for call in (
        store.get_schedule,
        store.pause_schedule,
        store.resume_schedule,
        store.delete_schedule,
        store.fire_schedule,
    ):
        with pytest.raises(store.NotFound):
            call(other_scope, schedule.id)
        with pytest.raises(store.NotFound):
            call(scope, "not-a-uuid")


def test_deleting_a_schedule_deletes_its_fires_and_keeps_its_todos(clock, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    clock.advance(seconds=61)
    [todo] = fire()

    store.delete_schedule(scope, schedule.id)

    assert store.get_todo(scope, todo.id).id == todo.id
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM schedule_fires")
        assert cursor.fetchone()[0] == 0


def test_retention_purges_old_fires_and_keeps_recent_ones(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=86400, missed="all"
    )
    clock.advance(days=10, hours=1)
    assert len(fire()) == 10

    purged = store.purge_fires(7)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(slot) FROM schedule_fires WHERE schedule_id = %s",
            [schedule.id],
        )
        assert cursor.fetchone()[0] == utc(2026, 3, 31)
    assert purged == 3
    assert fire() == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "0 0 * * * *"}, "cron"),
        ({"cron": "@fortnightly"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "@daily", "every_seconds": 60}, "cron"),
        ({}, "cron"),
        ({"every_seconds": 59}, "every_seconds"),
        ({"cron": "@daily", "time_zone": "Mars/Olympus"}, "time_zone"),
        ({"cron": "@daily", "todo": []}, "todo"),
        ({"cron": "@daily", "todo": {"title": 3}}, "todo.title"),
        ({"cron": "@daily", "todo": {"max_attempts": 0}}, "todo.max_attempts"),
        ({"cron": "@daily", "todo": {"colour": "red"}}, "todo.colour"),
        ({"cron": "@daily", "todo": {"priority": 9}}, "todo.priority"),
        ({"cron": "@daily", "todo": {"group": ""}}, "todo.group"),
        ({"cron": "@daily", "todo": {"cost": 0}}, "todo.cost"),
        ({"cron": "@daily", "todo": {"max_cost": -2.5}}, "todo.max_cost"),
        ({"cron": "@daily", "overlap": "never"}, "overlap"),
        ({"cron": "@daily", "missed": "some"}, "missed"),
    ],
)
def test_an_invalid_schedule_names_its_field(clock, scope, fields, field):
    with pytest.raises(store.InvalidSchedule) as raised:
        store.create_schedule(scope, name="s", queue="q", **fields)

    assert raised.value.field == field


def test_a_queue_outside_the_grant_is_refused(clock, make_endpoint):
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("a",)))

    with pytest.raises(store.QueueNotGranted):
        store.create_schedule(narrow, name="s", queue="b", cron="@daily")


def test_a_revoked_endpoints_schedules_do_not_fire(clock, endpoint, scope):
    store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE endpoints SET revoked_at = now() WHERE id = %s", [endpoint.id]
        )

    clock.advance(minutes=5)

    assert fire() == []


def test_a_slot_whose_todo_cannot_be_made_is_skipped_and_holds_up_no_other(
    clock, scope
):
    broken = store.create_schedule(scope, name="a", queue="q", every_seconds=60)
    store.create_schedule(scope, name="b", queue="q", every_seconds=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE schedules SET todo = '{\"max_attempts\": 0}' WHERE id = %s",
            [broken.id],
        )
    clock.advance(seconds=61)

    [made] = fire()

    assert slot_of(made).startswith("schedule b,")
    after = refreshed(scope, broken)
    assert (after.fires, after.skips) == (0, 1)
    assert after.next_slot_at == utc(2026, 3, 27, 0, 2)


def test_a_queue_the_grant_no_longer_covers_skips_its_slots(clock, endpoint, scope):
    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=60)
    store.create_schedule(scope, name="t", queue="kept", every_seconds=60)
    endpoint.queues = ["kept", "other"]
    endpoint.save()
    clock.advance(seconds=61)

    [made] = fire()

    assert made.queue == "kept"
    with connection.cursor() as cursor:
        cursor.execute("SELECT skips FROM schedules WHERE id = %s", [schedule.id])
        assert cursor.fetchone()[0] == 1


# --- Exactly once, concurrently ------------------------------------------------


def test_the_checker_catches_a_slot_fired_twice_and_a_slot_missed(clock, scope):
    """The exactly-once checker against planted violations."""
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=60, missed="all"
    )
    start = clock.now()
    clock.advance(seconds=121)
    fire()
    expected = expected_slots([schedule], start, clock.now())
    assert slot_violations(expected) == []
    twice = store.create_todo(
        scope, queue="q", actor="schedule s, slot 2026-03-27T00:01:00Z"
    )[0]
    assert slot_violations(expected) == [("schedule s, slot 2026-03-27T00:01:00Z", 2)]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos WHERE id = %s", [twice.id])

    missing = expected | {("s", utc(2026, 3, 27, 0, 3))}

    assert slot_violations(missing) == [("schedule s, slot 2026-03-27T00:03:00Z", 0)]


SWEEPS = 3
# How far the clock jumps at each step, in seconds: within a slot, across one,
# across several (up to five minutes of one-minute slots).
STEPS = (1, 5, 17, 37, 59, 60, 61, 90, 180, 240, 300)
SIMULATED_SECONDS = 3600
SCHEDULES = 12


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_sweep_processes_fire_every_slot_exactly_once(make_endpoint):
    """Three ``manage.py sweep --loop`` processes race over a simulated hour:
    every slot of every schedule has exactly one todo, none missing, none
    twice (the clock jumps in random steps, some across several slots; the
    seed is in the failure)."""
    clock = DatabaseClock().install(utc(2026, 3, 27))
    loops = []
    try:
        clock.use()
        scope = store.Scope.for_endpoint(make_endpoint("sched"))
        schedules = [
            store.create_schedule(
                scope,
                name=f"s{index}",
                queue="q",
                missed="all",
                **(
                    {"every_seconds": 60 * (1 + index % 3)}
                    if index % 2
                    else {"cron": f"*/{1 + index % 5} * * * *"}
                ),
            )
            for index in range(SCHEDULES)
        ]
        start = clock.now()
        env = child_env(clock.database_url("schedule-sweep"))
        for _ in range(SWEEPS):
            loops.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "sweep",
                        "--loop",
                        "--interval",
                        "0.05",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        seed = random.randrange(2**32)
        steps = random.Random(seed)
        while clock.now() < start + timedelta(seconds=SIMULATED_SECONDS):
            clock.advance(seconds=steps.choice(STEPS))
            wait_until_nothing_due()
        assert all(loop.poll() is None for loop in loops)
        expected = expected_slots(schedules, start, clock.now())

        assert len(expected) > 300
        assert slot_violations(expected) == [], f"random seed {seed}"
    finally:
        for loop in loops:
            loop.terminate()
            loop.wait(timeout=10)
        clock.remove()


def test_plan_keeps_the_latest_hundred_of_a_long_downtime(clock, scope):
    schedule = store.create_schedule(
        scope, name="s", queue="q", every_seconds=60, missed="all"
    )

    steps = store_schedules.plan(schedule, schedule.next_slot_at + timedelta(days=7))

    assert len(steps.fire) == 100
    assert steps.missed == 7 * 24 * 60 + 1 - 100


@pytest.mark.django_db(transaction=True)
def test_the_sweep_loop_fires_a_slot_at_its_time_not_at_its_next_pass(scope):
    """Between passes (30 s apart here) the loop sleeps until the next slot and
    fires it then: a slot's lateness is the firing's, not the pass interval."""
    from todos.management.sweeper import Sweeper

    schedule = store.create_schedule(scope, name="s", queue="q", every_seconds=3600)
    sweeper = Sweeper(interval=30)
    thread = threading.Thread(target=sweeper.run)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while sweeper.passes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE schedules SET next_slot_at = clock_timestamp()"
                " + interval '1.5 seconds' WHERE id = %s RETURNING next_slot_at",
                [schedule.id],
            )
            (slot,) = cursor.fetchone()
        deadline = time.monotonic() + 10
        while not store.get_schedule(scope, schedule.id).fires:
            assert time.monotonic() < deadline, "the slot did not fire"
            time.sleep(0.05)
    finally:
        sweeper.stop()
        thread.join(timeout=5)

    [todo] = store.list_todos(scope, queue="q").todos
    lateness = (todo.created_at - slot).total_seconds()
    assert 0 <= lateness < 1.0
    assert sweeper.passes == 1
