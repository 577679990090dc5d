"""The Board's statistics in the store: error fingerprints and dead-letter
groups, the per-minute rollup the charts and /metrics read, and its counters."""

import uuid

import pytest
from django.db import connection

from todos import store
from todos.store import stats

# Four causes; each occurrence differs in its ids, numbers, hosts and values.
CAUSES = [
    lambda n: (
        f"TimeoutError: POST https://api.acme.test/orders/{1000 + n}"
        f" took {n * 7 + 30}.{n % 10}s"
    ),
    lambda n: f"KeyError: 'customer_{n:04d}' missing in payload {uuid.uuid4()}",
    lambda n: (
        f'HTTP 50{n % 4} from upstream {n % 250}.0.0.{n % 7}: "busy, retry in {n}s"'
    ),
    lambda n: (
        "IntegrityError: duplicate key value violates unique constraint"
        f" at 0x{n * 9973:08x} (row {n})"
    ),
]


def dead_letter(scope, error, queue="q", key=None):
    todo, _ = store.create_todo(
        scope, queue=queue, title="t", max_attempts=1, idempotency_key=key
    )
    store.claim_todo(scope, todo.id, "w")
    return store.fail_todo(scope, todo.id, "w", error=error)


def fingerprint_of(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT error_fingerprint FROM todos WHERE id = %s", [todo_id])
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    "first, second",
    [
        ("order 1234 failed after 3 tries", "order 98 failed after 12 tries"),
        (
            "no row for id 3f2b1c9e-1111-2222-3333-444455556666",
            "no row for id 0b9e0c1d-aaaa-bbbb-cccc-ddddeeeeffff",
        ),
        ("segfault at 0xdeadbeef", "segfault at 0x7ffe12"),
        ("unknown user 'alice'", 'unknown user "bob-the-builder"'),
        ("job ord_8f3kq9 timed out after 30.5s", "job ord_a1b2c3 timed out after 2ms"),
        ("commit 9f2c1e7ab failed", "commit 1b7d0a2 failed"),
    ],
)
def test_an_error_fingerprint_sets_aside_numbers_ids_hex_and_quoted_values(
    db, first, second
):
    assert stats.error_fingerprint(first) == stats.error_fingerprint(second)
    assert stats.error_fingerprint(first) != stats.error_fingerprint("other " + first)


def test_the_fingerprint_is_stored_by_the_failing_statement_itself(scope, time_travel):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters.
    SPEC: Repeated expiry dead-letters at the cap."""
    failed = dead_letter(scope, "boom 42")
    released, _ = store.create_todo(scope, queue="q", max_attempts=1)
    store.claim_todo(scope, released.id, "w")
    store.release_todo(scope, released.id, "w")
    reaped, _ = store.create_todo(scope, queue="q", max_attempts=1)
    store.claim_todo(scope, reaped.id, "w")
    time_travel(reaped.id, lease_expires_at=-3600)
    store.reap_expired()
    live, _ = store.create_todo(scope, queue="q")

    assert fingerprint_of(failed.id) == "boom <n>"
    assert fingerprint_of(released.id) == "released at the attempt cap"
    assert fingerprint_of(reaped.id) == "lease expired at the attempt cap"
    assert fingerprint_of(live.id) is None


def test_300_dead_letters_from_4_causes_collapse_to_4_groups(scope, other_scope):
    for n in range(300):
        dead_letter(scope, CAUSES[n % 4](n))
    dead_letter(other_scope, CAUSES[0](7))

    groups = stats.dead_letter_groups(endpoint_ids=[scope.endpoint_id])

    assert len(groups) == 4
    assert sorted(g.count for g in groups) == [75, 75, 75, 75]
    assert {g.endpoint_id for g in groups} == {scope.endpoint_id}
    for group in groups:
        assert group.first_seen <= group.last_seen
        assert stats.error_fingerprint(group.example_error) == group.fingerprint
    assert len(stats.dead_letter_groups()) == 5, "staff see the other endpoint's too"


def test_groups_are_per_endpoint_and_queue(scope):
    dead_letter(scope, "boom 1", queue="a")
    dead_letter(scope, "boom 2", queue="b")
    dead_letter(scope, "boom 3", queue="b")

    groups = stats.dead_letter_groups()

    assert [(g.queue, g.count) for g in groups] == [("b", 2), ("a", 1)]


def test_retrying_a_group_requeues_exactly_its_members(scope, other_scope):
    members = {dead_letter(scope, CAUSES[1](n)).id for n in range(40)}
    others = {dead_letter(scope, CAUSES[2](n)).id for n in range(10)}
    elsewhere = dead_letter(other_scope, CAUSES[1](3)).id
    (group,) = [
        g
        for g in stats.dead_letter_groups(endpoint_ids=[scope.endpoint_id])
        if g.count == 40
    ]

    outcome = store.retry_matching_any_endpoint(
        endpoint_id=group.endpoint_id,
        queue=group.queue,
        state="dead_letter",
        fingerprint=group.fingerprint,
        endpoint_ids=[scope.endpoint_id],
        batch=7,
    )

    assert outcome.retried == 40 and not outcome.more
    states = {
        todo.id: todo.state for todo in store.list_todos_any_endpoint(limit=200).todos
    }
    assert {states[i] for i in members} == {"pending"}
    assert {states[i] for i in others} == {"failed"}
    assert states[elsewhere] == "failed"


# --- The rollup -----------------------------------------------------------------


def move_history(todo_id, seconds):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todo_events SET at = at + make_interval(secs => %s)"
            " WHERE todo_id = %s",
            [seconds, todo_id],
        )


def reset_rollup(minutes_ago):
    stats.restart_rollup(seconds_back=60 * minutes_ago)


def test_the_rollup_counts_each_transition_per_minute_and_samples_depth(scope):
    """SPEC: Background sweep spans tenants without a scope."""
    reset_rollup(30)
    done, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, done.id, "w")
    store.heartbeat(scope, done.id, "w")
    store.complete_todo(scope, done.id, "w")
    retry, _ = store.create_todo(scope, queue="q", max_attempts=3)
    store.claim_todo(scope, retry.id, "w")
    store.fail_todo(scope, retry.id, "w", error="x")
    store.retry_todo(scope, retry.id)
    dead_letter(scope, "boom")
    store.create_todo(scope, queue="q")
    move_history(done.id, -600)

    assert stats.roll_up_minutes().ran

    series = stats.chart_series(range_name="hour", endpoint_ids=[scope.endpoint_id])
    assert {name: series.total(name) for name in stats.TRANSITIONS} == {
        "created": 4,
        "claimed": 3,
        "completed": 1,
        "failed": 1,
        "dead_lettered": 1,
        "retried": 1,
    }
    assert sum(1 for c in series.counts["completed"] if c) == 1
    assert series.counts["completed"].index(1) == series.buckets - 11
    assert series.depth[-1] == 2, "two pending now: the retried todo and the last"
    assert stats.chart_series(range_name="hour", endpoint_ids=[]).total("created") == 0


def test_closed_minutes_fold_into_the_counters_once(scope):
    reset_rollup(30)
    old, _ = store.create_todo(scope, queue="q")
    move_history(old.id, -900)
    store.create_todo(scope, queue="q")

    stats.roll_up_minutes()
    first = {f.queue: f.transitions["created"] for f in stats.metrics_figures()}
    stats.roll_up_minutes()
    store.create_todo(scope, queue="q")
    stats.roll_up_minutes()
    again = {f.queue: f.transitions["created"] for f in stats.metrics_figures()}

    assert first == {"q": 2}
    assert again == {"q": 3}
    with connection.cursor() as cursor:
        cursor.execute("SELECT created FROM todo_transition_totals")
        assert cursor.fetchall() == [(1,)], "only the closed minute is folded"


def test_a_rollup_pass_counts_at_most_an_hour_of_history(scope):
    reset_rollup(24 * 60)
    store.create_todo(scope, queue="q")

    result = stats.roll_up_minutes()

    assert (result.end - result.start) == stats.MAX_WINDOW
    assert stats.metrics_figures()[0].transitions["created"] == 0
    for _ in range(25):
        stats.roll_up_minutes()
    assert stats.metrics_figures()[0].transitions["created"] == 1


def test_the_day_chart_has_ten_minute_buckets(scope):
    reset_rollup(30)
    todo, _ = store.create_todo(scope, queue="q")
    move_history(todo.id, -3 * 3600)
    reset_rollup(4 * 60)
    for _ in range(5):
        stats.roll_up_minutes()

    series = stats.chart_series(range_name="day")

    assert series.buckets == 144 and series.bucket_seconds == 600
    assert series.total("created") == 1
    assert stats.chart_series(range_name="hour").total("created") == 0


def test_dead_letters_without_an_error_form_their_own_group(scope):
    silent = {dead_letter(scope, "").id for _ in range(3)}
    loud = dead_letter(scope, "boom 7").id

    groups = {g.fingerprint: g for g in stats.dead_letter_groups()}
    outcome = store.retry_matching_any_endpoint(
        state="dead_letter", fingerprint=store.NO_ERROR_GROUP
    )

    assert groups[store.NO_ERROR_GROUP].count == 3
    assert groups[store.NO_ERROR_GROUP].example_id in silent
    assert outcome.retried == 3
    assert store.get_todo_any_endpoint(loud).state == "failed"


def test_the_first_rollup_after_the_state_row_was_lost_starts_counting_now(scope):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todo_rollup_state")
    store.create_todo(scope, queue="q")

    assert stats.roll_up_minutes().ran
    stats.restart_rollup(seconds_back=600)
    stats.roll_up_minutes()

    assert stats.metrics_figures()[0].transitions["created"] == 1


def test_charts_per_endpoint_come_with_their_total_in_one_query(scope, other_scope):
    reset_rollup(30)
    for _ in range(3):
        store.create_todo(scope, queue="q")
    store.create_todo(other_scope, queue="q")
    stats.roll_up_minutes()

    charts = stats.chart_series(range_name="hour", by="endpoint")

    assert charts[scope.endpoint_id].total("created") == 3
    assert charts[other_scope.endpoint_id].total("created") == 1
    assert charts[None].total("created") == 4
    assert charts[None].depth[-1] == 4
    assert charts["00000000-0000-0000-0000-000000000000"].total("created") == 0
    scoped = stats.chart_series(
        range_name="hour", by="endpoint", endpoint_ids=[other_scope.endpoint_id]
    )
    assert scoped[None].total("created") == 1


def test_the_fingerprint_function_is_not_inlined_into_every_write_of_todos(db):
    """The generated error_fingerprint column's expression is prepared at the
    start of every INSERT and UPDATE of todos; an inlinable SQL function there
    was parsed and analysed again on each claim and acknowledgement (8% of the
    database's CPU for a claim+complete pair). As PL/pgSQL it is not inlined,
    and still gives the same fingerprints (the tests above)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
            " WHERE p.proname = 'switchboard_error_fingerprint'"
        )
        assert cursor.fetchall() == [("plpgsql",)]
