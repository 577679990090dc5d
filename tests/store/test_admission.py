"""Admission control (CONTRACT §17): priority, groups, limits, fair turns, rates.

Real PostgreSQL; time moves in the database (todos' and buckets' timestamps).
Exactness under concurrency is shown with real threads, each on its own
connection, and the history checker (todos.store.admission_check).
"""

import contextlib
import json
import random
import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from tests.support import due_redeliveries
from todos import store
from todos.store import admission, admission_check, lifecycle, rows, sql, sweeps
from todos.waiting import doorbell

# The claim as it was before admission control (its statement at the commit
# before), run against the same rows to show that a todo without priority,
# group or limits is claimed exactly as before.
OLD_CLAIM_SQL = """
WITH RECURSIVE pending_queue (name) AS (
    (SELECT queue FROM todos
      WHERE endpoint_id = (SELECT %(endpoint_id)s::uuid) AND state = 'pending'
        AND (SELECT %(queues)s::text[]) IS NULL
      ORDER BY queue
      LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM todos t
             WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
               AND t.state = 'pending' AND t.queue > p.name
             ORDER BY t.queue
             LIMIT 1)
      FROM pending_queue p
     WHERE p.name IS NOT NULL
), lane (queue, assignee_key) AS (
    SELECT q.name, k.assignee_key
      FROM (SELECT name FROM pending_queue WHERE name IS NOT NULL
            UNION
            SELECT unnest((SELECT %(queues)s::text[]))) q (name)
     CROSS JOIN (SELECT ''
                 UNION
                 SELECT (SELECT %(worker)s::text)
                  WHERE (SELECT %(worker)s::text) <> '') k (assignee_key)
     WHERE NOT EXISTS (
         SELECT 1 FROM queues p
          WHERE p.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND p.name = q.name
            AND p.paused_at IS NOT NULL)
), due AS (
    SELECT t.id, t.state AS from_state, 0 AS rank, t.created_at AS rank_at
      FROM todos t
     WHERE ((t.state = 'claimed' AND t.lease_expires_at < now()
             AND t.attempt < t.max_attempts AND t.cancel_request IS NULL)
         OR (t.state = 'failed' AND t.next_retry_at <= now()))
       AND t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
       AND ((SELECT %(queues)s::text[]) IS NULL
            OR t.queue = ANY((SELECT %(queues)s::text[])::text[]))
       AND (t.assignee IS NULL OR t.assignee = (SELECT %(worker)s::text))
       AND NOT EXISTS (
           SELECT 1 FROM queues p
            WHERE p.endpoint_id = t.endpoint_id AND p.name = t.queue
              AND p.paused_at IS NOT NULL)
     ORDER BY t.created_at
     LIMIT (SELECT %(limit)s::int)
       FOR UPDATE OF t SKIP LOCKED
), fresh AS (
    SELECT c.id, 'pending'::text AS from_state, 1 AS rank, c.available_at AS rank_at
      FROM lane
     CROSS JOIN LATERAL (
         SELECT t.id, t.available_at FROM todos t
          WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
            AND t.state = 'pending' AND t.queue = lane.queue
            AND coalesce(t.assignee, '') = lane.assignee_key
            AND t.available_at <= statement_timestamp()
          ORDER BY t.available_at
          LIMIT (SELECT %(limit)s::int)
            FOR UPDATE SKIP LOCKED) c
     ORDER BY c.available_at
     LIMIT (SELECT %(limit)s::int) - (SELECT count(*) FROM due)
), candidate AS (
    SELECT * FROM due UNION ALL SELECT * FROM fresh
), moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = (SELECT %(worker)s::text),
           attempt = t.attempt + 1, claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => coalesce(
               (SELECT %(lease)s::int),
               (SELECT q.lease_seconds FROM queues q
                 WHERE q.endpoint_id = t.endpoint_id AND q.name = t.queue),
               (SELECT %(default_lease)s::int))),
           lease_token = replace(gen_random_uuid()::text, '-', ''),
           next_retry_at = NULL, updated_at = now(),
           question_status = CASE WHEN t.question_status = 'open' THEN 'expired'
                                  ELSE t.question_status END
      FROM candidate c
     WHERE t.id = c.id AND t.id = ANY(ARRAY(SELECT id FROM candidate))
 RETURNING {T_COLUMNS}, c.from_state, c.rank, c.rank_at
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT m.id, m.endpoint_id, step.from_state, step.to_state, step.attempt,
           coalesce((SELECT %(worker)s::text), ''), '', now()
      FROM moved m
     CROSS JOIN LATERAL ({CLAIM_STEPS}) step
)
SELECT {TODO_COLUMNS} FROM moved ORDER BY rank, rank_at

"""


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def claimed_in(scope, queue, group):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM todos WHERE endpoint_id = %s AND queue = %s"
            " AND group_key = %s AND state = 'claimed'",
            [scope.endpoint_id, queue, group],
        )
        return cursor.fetchone()[0]


def age_buckets(scope, seconds):
    """Move every rate bucket of the scope's endpoint ``seconds`` into the past."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE rate_buckets SET refilled_at = refilled_at"
            " - make_interval(secs => %s) WHERE endpoint_id = %s",
            [seconds, scope.endpoint_id],
        )


def _raw_connection():
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


# --- Unchanged without admission ----------------------------------------------


def _old_claim(scope, worker, limit, queue=None):
    params = lifecycle.bind_claim(scope, worker, limit=limit, queue=queue)
    sql = OLD_CLAIM_SQL.format(
        T_COLUMNS=lifecycle.T_COLUMNS,
        CLAIM_STEPS=lifecycle.CLAIM_STEPS,
        TODO_COLUMNS=rows.TODO_COLUMNS,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [str(row[0]) for row in cursor.fetchall()]


def test_a_todo_without_admission_is_claimed_exactly_as_before(scope, time_travel):
    """CONTRACT §17: a todo without priority, group or limits, in a queue with
    none, is claimed exactly as before: a mixed workload (queues, delays,
    assignments, lapsed leases, due retries, single and batch claims) gets
    the same todos in the same order from the claim before and the claim now.
    """
    rng = random.Random(45)
    todos = []
    for n in range(60):
        fields = {"title": f"t{n}"}
        if rng.random() < 0.2:
            fields["assignee"] = rng.choice(["w1", "w2"])
        if rng.random() < 0.15:
            fields["delay_seconds"] = rng.choice([0, 30, 600])
        todos.append(new(scope, queue=rng.choice(["a", "b", "c"]), **fields))
    # Some claimed and lapsed, some failed with an elapsed window.
    due_redeliveries(scope, todos, 10, rng, time_travel)
    shift_delays = [t for t in todos if t.available_at > t.created_at]
    for todo in shift_delays[:3]:
        time_travel(todo.id, available_at=-700)
    steps = 0
    while True:
        worker = rng.choice(["w1", "w2", "w3"])
        limit = rng.choice([1, 1, 3, 10])
        queue = rng.choice([None, None, "a", "b"])
        with transaction.atomic():
            sid = transaction.savepoint()
            before = _old_claim(scope, worker, limit, queue)
            transaction.savepoint_rollback(sid)
            now = [
                t.id for t in store.claim_many(scope, worker, limit=limit, queue=queue)
            ]
        assert now == before, (steps, worker, limit, queue)
        steps += 1
        if not now and queue is None and worker == "w3":
            break
        assert steps < 200
    assert steps > 10


# --- Priority -------------------------------------------------------------------


def claim_statements(scope, **claim):
    """The todos a claim took and the claim statements it ran."""
    with CaptureQueriesContext(connection) as ran:
        taken = store.claim_many(scope, "w", **claim)
    return taken, [q["sql"] for q in ran.captured_queries if "UPDATE todos" in q["sql"]]


def test_a_scope_without_admission_is_claimed_in_one_plain_statement(scope):
    """CONTRACT §17: a todo without priority, group or limits is claimed as
    before: one statement with no admission step (CLAIM_PLAIN_SQL)."""
    new(scope, queue="a")
    admission.set_admission(scope, "b", group_concurrency=1)
    new(scope, queue="b", priority=1)
    taken, statements = claim_statements(scope, limit=2)
    assert len(taken) == 2 and len(statements) == 1
    assert "switchboard_admit" not in statements[0]


def test_a_plain_claim_meeting_a_full_group_leaves_it_to_admission(scope):
    """CONTRACT §17: the plain claim takes nothing when a candidate has a
    group; the admitting claim passes over the full group, every time."""
    admission.set_admission(scope, "q", group_concurrency=1)
    first = new(scope, title="g0", group="g")
    waiting = new(scope, title="g1", group="g")
    loose = new(scope, title="loose")
    assert store.claim_todo(scope, first.id, "w").state == "claimed"
    lifecycle._ADMITTING.clear()
    taken, statements = claim_statements(scope, limit=1)
    assert [todo.id for todo in taken] == [loose.id]
    # The plain claim, the fair claim (its lane is not fair: it defers), the
    # admitting claim.
    assert len(statements) == 3 and "switchboard_admit" in statements[2]
    assert "fresh_aged" not in statements[1]
    # Remembered: the scope's next claim runs the admitting claim alone.
    assert claim_statements(scope, limit=1) == ([], statements[2:])
    assert claimed_in(scope, "q", "g") == 1 and waiting.state == "pending"


@pytest.mark.parametrize(
    "setting",
    [
        {"fair": True},
        {"priority_aging_seconds": 60},
        {"rate_limit": {"count": 1, "per_seconds": 60}},
    ],
    ids=["fair", "aging", "rate"],
)
def test_a_queue_with_a_control_is_claimed_by_admission_alone(scope, setting):
    """CONTRACT §17: fair turns, aging and rate limits apply to ungrouped
    todos too: the plain claim of such a queue claims nothing."""
    admission.set_admission(scope, "q", **setting)
    new(scope)
    new(scope)
    lifecycle._ADMITTING.clear()
    taken, statements = claim_statements(scope, limit=2)
    # After the plain claim, the fair claim, and unless the lane is fair the
    # admitting claim.
    assert len(statements) == (2 if "fair" in setting else 3)
    assert "switchboard_admit" in statements[-1]
    assert len(taken) == (1 if "rate_limit" in setting else 2)


def test_a_claim_takes_the_highest_priority_first_then_the_oldest(scope):
    """CONTRACT §17: priority 1 (highest) to 5, default 3; the highest level
    first, the oldest available_at first within it."""
    low = new(scope, title="low", priority=5)
    default_old = new(scope, title="default-old")
    urgent = new(scope, title="urgent", priority=1)
    default_new = new(scope, title="default-new")
    urgent_later = new(scope, title="urgent-later", priority=1)

    order = [store.claim_next(scope, "w").id for _ in range(5)]

    assert default_old.priority == 3
    assert order == [urgent.id, urgent_later.id, default_old.id, default_new.id, low.id]


def test_a_batch_claim_takes_the_highest_priority_first(scope):
    """CONTRACT §17: a batch claim orders by priority as a single claim does."""
    for n in range(4):
        new(scope, title=f"p3-{n}")
    top = new(scope, title="p2", priority=2)
    batch = store.claim_many(scope, "w", limit=2)
    assert batch[0].id == top.id and batch[1].title == "p3-0"


@pytest.mark.parametrize("bad", [0, 6, "1", 2.5, True])
def test_priority_outside_one_to_five_is_refused(scope, bad):
    """CONTRACT §17: priority is a whole number from 1 to 5."""
    with pytest.raises(ValueError, match="priority"):
        store.create_todo(scope, queue="q", priority=bad)


def test_a_pending_todos_priority_can_be_changed_a_claimed_ones_cannot(scope):
    """CONTRACT §17: POST /todos/<id>/priority changes a pending todo's priority."""
    first = new(scope, title="first")
    second = new(scope, title="second")
    moved = admission.set_priority(scope, second.id, 1)
    assert moved.priority == 1
    assert store.claim_next(scope, "w").id == second.id
    with pytest.raises(store.Conflict):
        admission.set_priority(scope, second.id, 2)
    with pytest.raises(store.NotFound):
        admission.set_priority(scope, "00000000-0000-4000-8000-000000000000", 2)
    assert store.claim_next(scope, "w").id == first.id


def test_priority_aging_raises_a_waiting_todo_one_level_per_period(scope, time_travel):
    """CONTRACT §17: priority_aging_seconds raises a waiting todo one level per
    that many seconds, so no level waits forever."""
    admission.set_admission(scope, "q", priority_aging_seconds=60)
    old_low = new(scope, title="old-low", priority=5)
    time_travel(old_low.id, available_at=-250)  # 4 levels up: level 1
    fresh_urgent = new(scope, title="urgent", priority=1)
    younger_low = new(scope, title="younger-low", priority=5)
    time_travel(younger_low.id, available_at=-130)  # level 3

    order = [store.claim_next(scope, "w").id for _ in range(3)]
    # Level 1 (aged) is older than the fresh level-1 todo.
    assert order == [old_low.id, fresh_urgent.id, younger_low.id]


def test_without_aging_a_low_priority_waits_behind_urgent_work(scope, time_travel):
    """CONTRACT §17: aging is off by default (null)."""
    old_low = new(scope, title="old-low", priority=5)
    time_travel(old_low.id, available_at=-10_000)
    urgent = new(scope, title="urgent", priority=1)
    assert store.claim_next(scope, "w").id == urgent.id


# --- Groups and their limits ------------------------------------------------------


def test_the_todo_json_carries_priority_group_and_cost(scope):
    """CONTRACT §17: the todo JSON gains priority, group, cost."""
    todo = new(scope, group="acme/repo", priority=2, cost=2.5)
    shown = store.get_todo(scope, todo.id).to_dict()
    assert (shown["priority"], shown["group"], shown["cost"]) == (2, "acme/repo", 2.5)
    plain = new(scope).to_dict()
    assert (plain["priority"], plain["group"], plain["cost"]) == (3, None, 1.0)


@pytest.mark.parametrize("bad", ["", "x" * 201, 5])
def test_a_group_is_null_or_one_to_two_hundred_characters(scope, bad):
    """CONTRACT §17: group (text ≤ 200, null = none)."""
    with pytest.raises(ValueError, match="group"):
        store.create_todo(scope, queue="q", group=bad)


@pytest.mark.parametrize("bad", [0, -1, "1", True])
def test_a_cost_is_a_number_above_zero(scope, bad):
    """CONTRACT §17: cost (number > 0, default 1)."""
    with pytest.raises(ValueError, match="cost"):
        store.create_todo(scope, queue="q", cost=bad)


def test_group_concurrency_caps_claimed_todos_per_group(scope):
    """CONTRACT §17: group_concurrency N = at most N claimed todos per group,
    for single and batch claims; other groups and ungrouped todos pass."""
    admission.set_admission(scope, "q", group_concurrency=2)
    for n in range(5):
        new(scope, title=f"a{n}", group="a")
    b = new(scope, title="b0", group="b")
    loose = new(scope, title="loose")

    batch = store.claim_many(scope, "w", limit=10)
    titles = sorted(t.title for t in batch)
    assert titles == ["a0", "a1", "b0", "loose"]
    assert store.claim_many(scope, "w", limit=10) == []
    assert claimed_in(scope, "q", "a") == 2
    assert {b.id, loose.id} <= {t.id for t in batch}


def test_a_batch_claim_never_takes_more_of_a_group_than_its_room(scope):
    """CONTRACT §17: a batch claim admits a group's todos up to its room only."""
    admission.set_admission(scope, "q", group_concurrency=1)
    for n in range(10):
        new(scope, title=f"a{n}", group="a")
    batch = store.claim_many(scope, "w", limit=10)
    assert [t.title for t in batch] == ["a0"]


def test_group_concurrency_zero_holds_every_group(scope):
    """CONTRACT §17: 0 holds every group (ungrouped todos still go)."""
    admission.set_admission(scope, "q", group_concurrency=0)
    new(scope, group="a")
    loose = new(scope)
    assert [t.id for t in store.claim_many(scope, "w", limit=10)] == [loose.id]


def test_a_named_claim_of_a_full_group_conflicts(scope):
    """CONTRACT §17: claiming a specific todo respects its group's limit."""
    admission.set_admission(scope, "q", group_concurrency=1)
    first = new(scope, group="a")
    second = new(scope, group="a")
    store.claim_todo(scope, first.id, "w")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, second.id, "w")


def test_a_group_override_and_pause_replace_the_queues_setting(scope):
    """CONTRACT §17: PUT /queues/<name>/groups/<group> concurrency, weight,
    paused override the queue's setting."""
    admission.set_admission(scope, "q", group_concurrency=1)
    admission.set_group(scope, "q", "big", concurrency=3)
    admission.set_group(scope, "q", "held", paused=True)
    for n in range(4):
        new(scope, group="big", title=f"big{n}")
        new(scope, group="held", title=f"held{n}")
        new(scope, group="small", title=f"small{n}")
    batch = store.claim_many(scope, "w", limit=10)
    groups = sorted(t.group for t in batch)
    assert groups == ["big", "big", "big", "small"]
    info = admission.get_group(scope, "q", "big")
    assert (info.in_flight, info.pending, info.limit, info.concurrency) == (3, 1, 3, 3)
    listed = {g.group: g for g in admission.list_groups(scope, "q")}
    assert listed["held"].paused and listed["held"].in_flight == 0
    assert listed["small"].limit == 1
    admission.set_group(scope, "q", "held", paused=False)
    assert [t.group for t in store.claim_many(scope, "w", limit=10)] == ["held"]


@pytest.mark.parametrize("limit", [1, 3])
def test_a_claim_judges_the_groups_at_its_lanes_head_as_the_limits_say(scope, limit):
    """CONTRACT §17: a lane's head (its first pending rows, judged group by
    group) passes over full, paused and zero-override groups, opens a group
    an override opens in a queue that holds every group, and takes the first
    group with room; past the head the claim judges as before."""
    admission.set_admission(scope, "q", group_concurrency=1)
    for group in ("full-a", "full-b"):
        store.claim_todo(scope, new(scope, group=group).id, "w")
        new(scope, group=group)
    admission.set_group(scope, "q", "paused", paused=True)
    admission.set_group(scope, "q", "zero", concurrency=0)
    admission.set_group(scope, "q", "two", concurrency=2)
    for group in ("paused", "zero", "two", "two", "free"):
        new(scope, group=group, title=group)
    for n in range(20):
        new(scope, group="full-a", title=f"deep{n}")
    behind = new(scope, group="behind", title="behind")
    taken = store.claim_many(scope, "w2", limit=limit)
    titles = ["two", "two", "free"][:limit]
    assert [todo.title for todo in taken] == titles
    rest = store.claim_many(scope, "w3", limit=10)
    assert [todo.title for todo in rest] == (["two", "free", "behind"][limit - 1 :])
    assert behind.id in [todo.id for todo in taken + rest]
    admission.set_admission(scope, "q", group_concurrency=0)
    admission.set_group(scope, "q", "opened", concurrency=1)
    new(scope, group="closed")
    opened = new(scope, group="opened")
    assert [todo.id for todo in store.claim_many(scope, "w4", limit=10)] == [opened.id]


def test_an_override_applies_without_a_queue_limit(scope):
    """CONTRACT §17: a group's concurrency override holds with no queue limit."""
    admission.set_group(scope, "q", "solo", concurrency=1)
    new(scope, group="solo")
    new(scope, group="solo")
    assert len(store.claim_many(scope, "w", limit=10)) == 1


def test_lowering_a_limit_takes_nothing_back(scope):
    """CONTRACT §17: lowering a limit below what is in flight takes nothing
    back; no new claim is admitted until the group is under it."""
    admission.set_admission(scope, "q", group_concurrency=3)
    for n in range(5):
        new(scope, group="a", title=f"a{n}")
    held = store.claim_many(scope, "w", limit=10)
    assert len(held) == 3
    admission.set_admission(scope, "q", group_concurrency=1)
    assert claimed_in(scope, "q", "a") == 3
    assert store.claim_many(scope, "w", limit=10) == []
    store.complete_todo(scope, held[0].id, "w")
    assert store.claim_many(scope, "w", limit=10) == []
    store.complete_todo(scope, held[1].id, "w")
    assert store.claim_many(scope, "w", limit=10) == []
    store.complete_todo(scope, held[2].id, "w")
    assert len(store.claim_many(scope, "w", limit=10)) == 1


def test_a_lapsed_lease_keeps_its_slot_and_reclaiming_it_transfers_it(
    scope, time_travel
):
    """CONTRACT §17: a lapsed lease still claimed holds its slot; the next
    claim takes that todo over (the slot passes with it), not another."""
    admission.set_admission(scope, "q", group_concurrency=1)
    first = new(scope, group="a", title="first")
    new(scope, group="a", title="second")
    taken = store.claim_next(scope, "w1")
    time_travel(taken.id, lease_expires_at=-900)
    again = store.claim_next(scope, "w2")
    assert again.id == first.id and again.owner == "w2"
    assert claimed_in(scope, "q", "a") == 1
    assert store.claim_many(scope, "w3", limit=10) == []


def test_held_and_delayed_todos_hold_no_slot(scope):
    """CONTRACT §17: a held (asked) or delayed todo holds no slot."""
    admission.set_admission(scope, "q", group_concurrency=1)
    asker = new(scope, group="a", title="asker")
    new(scope, group="a", title="later", delay_seconds=600)
    new(scope, group="a", title="next")
    claimed = store.claim_next(scope, "w")
    assert claimed.id == asker.id
    store.ask(scope, asker.id, "w", question="which branch?")
    assert store.claim_next(scope, "w").title == "next"


ENDINGS = {
    "complete": lambda s, t, tt: store.complete_todo(s, t.id, "w"),
    "fail": lambda s, t, tt: store.fail_todo(s, t.id, "w", error="x"),
    "release": lambda s, t, tt: store.release_todo(s, t.id, "w"),
    "ask": lambda s, t, tt: store.ask(s, t.id, "w", question="?"),
    "operator_release": lambda s, t, tt: store.release_todo_any_endpoint(t.id),
    "unclaim": lambda s, t, tt: lifecycle.unclaim(s, t),
    "cancel_then_release": lambda s, t, tt: (
        store.cancel_todo(s, t.id),
        store.release_todo(s, t.id, "w"),
    ),
    "reaper": lambda s, t, tt: (tt(t.id, lease_expires_at=-900), sweeps.reap_expired()),
    "reaper_at_cap": lambda s, t, tt: (
        tt(t.id, lease_expires_at=-900),
        _set_attempts(t.id),
        sweeps.reap_expired(),
    ),
    "batch_complete": lambda s, t, tt: store.acknowledge_many(
        s, [store.Ack("complete", t.id, "w")]
    ),
}


def _set_attempts(todo_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET max_attempts = attempt WHERE id = %s", [todo_id]
        )


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_way_a_claim_ends_frees_its_slot(scope, time_travel, ending):
    """CONTRACT §17: every way a claim ends frees its slot in the same
    transaction (complete, fail, release, ask, an operator's release, a
    claim handed back, cancel, the reaper)."""
    admission.set_admission(scope, "q", group_concurrency=1)
    first = new(scope, group="a", title="first")
    new(scope, group="a", title="second")
    claimed = store.claim_next(scope, "w")
    assert claimed.id == first.id
    assert store.claim_many(scope, "w2", limit=10) == []
    ENDINGS[ending](scope, claimed, time_travel)
    assert claimed_in(scope, "q", "a") == 0
    assert len(store.claim_many(scope, "w2", limit=1)) == 1


def test_a_due_retry_needs_a_slot(scope, time_travel):
    """CONTRACT §17: limits never delay a todo's own retry rules, but a retry
    that comes due is a new claim: it waits for its group's room."""
    admission.set_admission(scope, "q", group_concurrency=1)
    retried = new(scope, group="a", title="retried")
    new(scope, group="a", title="other")
    store.claim_next(scope, "w")
    store.fail_todo(scope, retried.id, "w", error="x")
    other = store.claim_next(scope, "w")
    time_travel(retried.id, next_retry_at=-60)
    assert store.claim_many(scope, "w", limit=10) == []
    store.complete_todo(scope, other.id, "w")
    assert store.claim_next(scope, "w").id == retried.id


# --- Exactness under concurrency -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_group_concurrency_is_never_exceeded_under_concurrent_claimants(
    make_endpoint,
):
    """CONTRACT §17 Exactness: 12 threads, each its own connection, claim
    (single and batch), complete, fail, release and ask at random in a queue
    of 6 groups limited to 2 while the limit moves; a watcher samples the
    claimed counts, and the history checker replays the events after."""
    scope = store.Scope.for_endpoint(make_endpoint("exact"))
    admission.set_admission(scope, "q", group_concurrency=2)
    groups = [f"g{n}" for n in range(6)]
    store.create_many(
        scope, [{"queue": "q", "group": groups[n % 6]} for n in range(100)]
    )
    store.create_many(
        scope, [{"queue": "q", "group": groups[n % 6]} for n in range(100)]
    )
    errors, over = [], []
    stop = threading.Event()
    start = threading.Barrier(13)

    def worker(index):
        rng = random.Random(index)
        try:
            start.wait()
            while not stop.is_set():
                batch = store.claim_many(
                    scope, f"w{index}", limit=rng.choice([1, 1, 5]), queue="q"
                )
                for todo in batch:
                    roll = rng.random()
                    if roll < 0.6:
                        store.complete_todo(scope, todo.id, f"w{index}")
                    elif roll < 0.75:
                        store.release_todo(scope, todo.id, f"w{index}")
                    elif roll < 0.9:
                        store.fail_todo(scope, todo.id, f"w{index}", error="x")
                    else:
                        store.ask(
                            scope, todo.id, f"w{index}", question="?", return_to="pool"
                        )
                        store.answer_todo(scope, todo.id, "yes")
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    def watcher():
        try:
            start.wait()
            while not stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT group_key, count(*) FROM todos"
                        " WHERE endpoint_id = %s AND state = 'claimed'"
                        " GROUP BY group_key",
                        [scope.endpoint_id],
                    )
                    over.extend(r for r in cursor.fetchall() if r[1] > 2)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    threads.append(threading.Thread(target=watcher))
    for thread in threads:
        thread.start()
    time.sleep(4)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    assert over == []
    report = admission_check.check(endpoint_id=scope.endpoint_id)
    assert report.claims > 100
    assert report.violations == []


# --- Fair turns ---------------------------------------------------------------------


def test_a_fair_queue_serves_its_groups_in_turn(scope):
    """CONTRACT §17: fair: claims serve the queue's groups in turn, oldest
    first within a group, instead of oldest first overall."""
    admission.set_admission(scope, "q", fair=True)
    store.create_many(
        scope, [{"queue": "q", "group": "flood", "title": f"f{n}"} for n in range(50)]
    )
    small = [new(scope, group="small", title=f"s{n}") for n in range(3)]
    first_ten = [t.title for t in store.claim_many(scope, "w", limit=10)]
    assert first_ten[:2] == ["f0", "s0"] or first_ten[:2] == ["s0", "f0"]
    assert {t.title for t in small} <= set(first_ten)
    flood = [title for title in first_ten if title.startswith("f")]
    assert flood == sorted(flood, key=lambda title: int(title[1:]))


def test_fair_weights_split_the_claims(scope):
    """CONTRACT §17: a group's weight is its share of the turns (1:3)."""
    admission.set_admission(scope, "q", fair=True)
    admission.set_group(scope, "q", "heavy", weight=3)
    store.create_many(scope, [{"queue": "q", "group": "light"}] * 100)
    store.create_many(scope, [{"queue": "q", "group": "heavy"}] * 100)
    taken = [t.group for _ in range(4) for t in store.claim_many(scope, "w", limit=10)]
    assert 27 <= taken.count("heavy") <= 33


def test_a_queue_turning_fair_gives_its_waiting_todos_turns(scope):
    """CONTRACT §17: todos waiting when a queue turns fair take turns too."""
    store.create_many(scope, [{"queue": "q", "group": "flood"}] * 20)
    late = new(scope, group="late")
    admission.set_admission(scope, "q", fair=True)
    ids = [t.id for t in store.claim_many(scope, "w", limit=3)]
    assert late.id in ids


def test_ungrouped_todos_form_one_group_in_a_fair_queue(scope):
    """CONTRACT §17: todos with no group form one group of their own."""
    admission.set_admission(scope, "q", fair=True)
    store.create_many(scope, [{"queue": "q", "group": "flood"}] * 20)
    loose = new(scope)
    assert loose.id in [t.id for t in store.claim_many(scope, "w", limit=3)]


def _blocked_by(watch, holder):
    """Wait until a backend waits for a lock ``holder`` holds."""
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
    )
    deadline = time.monotonic() + 10
    while watch.execute(waiting, [holder.info.backend_pid]).fetchone()[0] == 0:
        assert time.monotonic() < deadline, "nothing waited for the holder"
        time.sleep(0.01)


def _beside_a_holder_of_a_then_b(scope, call):
    """Run ``call`` in a thread while another transaction holds fair group a's
    row of queue q, waits until ``call`` waits for it, then asks for group b's:
    {"result" or "error": the call's, "holder": the holder's deadlock, if any}."""
    tag = "SELECT switchboard_fair_tag(%s::uuid, 'q', %s, 1)"
    outcome = {}

    def run():
        try:
            outcome["result"] = call()
        except Exception as exc:  # noqa: BLE001 - the caller asserts on it
            outcome["error"] = exc
        finally:
            connection.close()

    holder, watch = _raw_connection(), _raw_connection()
    thread = threading.Thread(target=run)
    try:
        holder.autocommit = False
        holder.execute(tag, [scope.endpoint_id, "a"])
        thread.start()
        _blocked_by(watch, holder)  # the call waits for group a
        try:
            holder.execute(tag, [scope.endpoint_id, "b"])
            holder.commit()
        except psycopg.errors.DeadlockDetected as exc:
            holder.rollback()
            outcome["holder"] = exc
        thread.join(timeout=10)
    finally:
        holder.close()
        watch.close()
    return outcome


@pytest.mark.django_db(transaction=True)
def test_a_batch_takes_its_fair_groups_in_order_whatever_its_items_order(
    make_endpoint,
):
    """CONTRACT §17: a batch create takes its fair groups' rows in (queue,
    group) order. Taken in item order, a batch [b, a] held b while it waited
    for a, and a transaction holding a that then wanted b made a lock cycle:
    PostgreSQL stopped one after deadlock_timeout (a POST /todos answered 503
    "database unavailable" under load, the database up)."""
    scope = store.Scope.for_endpoint(make_endpoint("fair-order"))
    admission.set_admission(scope, "q", fair=True)
    outcome = _beside_a_holder_of_a_then_b(
        scope,
        lambda: store.create_many(
            scope, [{"queue": "q", "group": "b"}, {"queue": "q", "group": "a"}]
        ),
    )
    assert "holder" not in outcome and "error" not in outcome
    assert [created for _, created in outcome["result"]] == [True, True]
    todos = [todo for todo, _ in outcome["result"]]
    # Each group's tag follows the holder's todo of that group (cost 1 each).
    assert [fair_tag_of(todo.id) for todo in todos] == [1.0, 1.0]


@pytest.mark.django_db(transaction=True)
def test_a_schedule_pass_takes_its_fair_groups_in_order_whatever_its_firing_order(
    make_endpoint,
):
    """CONTRACT §17: a pass firing several schedules into a fair queue takes
    their groups' rows in (queue, group) order, as a batch create does. Taken
    in firing order (most overdue first), a pass firing b then a held b while
    it waited for a, and a transaction holding a that then wanted b made a
    lock cycle: PostgreSQL stopped one of them."""
    scope = store.Scope.for_endpoint(make_endpoint("fair-schedules"))
    admission.set_admission(scope, "q", fair=True)
    for name, group, late in [("first", "b", 2), ("second", "a", 1)]:
        schedule = store.create_schedule(
            scope, name=name, queue="q", every_seconds=3600, todo={"group": group}
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE schedules SET next_slot_at = now() - make_interval("
                "secs => %s) WHERE id = %s",
                [late, schedule.id],
            )
    outcome = _beside_a_holder_of_a_then_b(scope, store.fire_due_schedules)
    assert "holder" not in outcome and "error" not in outcome
    fired = outcome["result"]
    assert fired.fired == 2
    # Fired most overdue first; each group's tag follows the holder's todo.
    assert [todo.group for todo in fired.todos] == ["b", "a"]
    assert [fair_tag_of(todo.id) for todo in fired.todos] == [1.0, 1.0]


@pytest.mark.django_db(transaction=True)
def test_making_a_queue_fair_takes_its_groups_in_order(make_endpoint):
    """CONTRACT §17: stamping the pending todos of a queue just made fair
    takes their groups' rows in (queue, group) order, as a batch create
    does, so it waits for a transaction holding a group rather than holding
    another that transaction then wants."""
    scope = store.Scope.for_endpoint(make_endpoint("fair-stamp"))
    todos = [
        store.create_todo(scope, queue="q", group=group)[0]
        for group in ["b", "a", "b", "a"]
    ]
    outcome = _beside_a_holder_of_a_then_b(
        scope, lambda: admission.set_admission(scope, "q", fair=True)
    )
    assert "holder" not in outcome and "error" not in outcome
    assert outcome["result"].fair
    # Each group's two todos follow on from its own start (the holder's tags
    # moved no todo: the stamp reads the rows' finish before it waits).
    assert [fair_tag_of(todo.id) for todo in todos] == [0.0, 0.0, 1.0, 1.0]


def fair_tag_of(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT fair_tag FROM todos WHERE id = %s", [todo_id])
        return cursor.fetchone()[0]


# --- Rate limits --------------------------------------------------------------------


def test_a_rate_limit_admits_its_burst_then_one_per_refill(scope):
    """CONTRACT §17: rate_limit {"count", "per_seconds", "burst"}: claims per
    window across every server; the bucket refills with time."""
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 10, "burst": 3}
    )
    for _ in range(6):
        new(scope)
    assert len(store.claim_many(scope, "w", limit=10)) == 3
    assert store.claim_many(scope, "w", limit=10) == []
    age_buckets(scope, 10)
    assert len(store.claim_many(scope, "w", limit=10)) == 1
    age_buckets(scope, 25)
    assert len(store.claim_many(scope, "w", limit=10)) == 2


def test_a_todos_cost_counts_against_the_rate_limit(scope):
    """CONTRACT §17: a todo's cost (default 1) is what it counts."""
    admission.set_admission(scope, "q", rate_limit={"count": 10, "per_seconds": 60})
    new(scope, cost=6, title="big")
    new(scope, cost=3, title="mid")
    new(scope, cost=2, title="small")
    assert [t.title for t in store.claim_many(scope, "w", limit=10)] == ["big", "mid"]


def test_a_group_rate_limit_holds_per_group(scope):
    """CONTRACT §17: group_rate_limit: the same limit, per group."""
    admission.set_admission(
        scope, "q", group_rate_limit={"count": 2, "per_seconds": 60}
    )
    for group in ("a", "b"):
        for _ in range(4):
            new(scope, group=group)
    groups = sorted(t.group for t in store.claim_many(scope, "w", limit=10))
    assert groups == ["a", "a", "b", "b"]


def test_a_cost_above_a_shards_share_is_judged_against_the_whole_bucket(scope):
    """CONTRACT §17: a queue's bucket is kept in shards (each a share of the
    rate and the burst); a cost no one shard holds is taken from all of them,
    judged as one bucket: the burst still admits it, and no more than it."""
    admission.set_admission(
        scope, "q", rate_limit={"count": 8, "per_seconds": 60, "burst": 8}
    )
    new(scope, title="warm")
    assert len(store.claim_many(scope, "w", limit=1)) == 1  # makes the shards
    new(scope, cost=5, title="big")
    new(scope, cost=3, title="over")
    assert [t.title for t in store.claim_many(scope, "w", limit=10)] == ["big"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), sum(tokens) FROM rate_buckets WHERE endpoint_id = %s",
            [scope.endpoint_id],
        )
        shards, tokens = cursor.fetchone()
    assert shards == 4
    assert tokens == pytest.approx(2, abs=0.01)


def test_a_cost_taken_from_every_shard_leaves_no_shard_below_zero(scope):
    """CONTRACT §17: a rate limit never admits more than its burst at once,
    whatever the shards hold: a cost taken from every shard is taken in
    proportion to what each holds, so that a shard holding a later cost means
    the bucket holds it."""
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 3600, "burst": 10}
    )
    for cost in (1, 2, 2, 2, 3, 1.5):
        new(scope, cost=cost)
    # 1 (making four shards of 2.5), three of 2 from three shards, 3 from every
    # shard (the four held 3 together): the burst of 10 is spent.
    taken = [store.claim_many(scope, "w", limit=1) for _ in range(5)]
    assert [t[0].cost for t in taken] == [1, 2, 2, 2, 3]
    assert store.claim_many(scope, "w", limit=1) == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(tokens), sum(tokens) FROM rate_buckets WHERE endpoint_id = %s",
            [scope.endpoint_id],
        )
        lowest, total = cursor.fetchone()
    assert lowest >= -1e-9 and total == pytest.approx(0, abs=0.01)


@pytest.mark.django_db(transaction=True)
def test_claims_under_one_rate_limit_do_not_wait_for_each_others_commit(
    make_endpoint,
):
    """CONTRACT §17, cheap: a claim takes its cost from a shard of the bucket
    that no claim in flight holds, instead of waiting for that claim's commit
    (one bucket row made every claim of the queue wait for the last one's WAL
    flush)."""
    scope = store.Scope.for_endpoint(make_endpoint("sharded"))
    admission.set_admission(scope, "q", rate_limit={"count": 100, "per_seconds": 1})
    for _ in range(3):
        new(scope)
    assert len(store.claim_many(scope, "w0", limit=1)) == 1  # makes the shards
    other = _raw_connection()
    try:
        other.autocommit = False
        other.execute("SET lock_timeout = '2s'")
        params = lifecycle.bind_claim(scope, "w2", limit=1, queue="q")
        with transaction.atomic():
            first = store.claim_many(scope, "w1", limit=1)  # holds its shard
            second = other.execute(lifecycle.CLAIM_SQL, params).fetchall()
        other.commit()
    finally:
        other.close()
    assert len(first) == 1
    assert len([row for row in second if row[0] is not None]) == 1


@contextlib.contextmanager
def shards_hold(scope, tokens, held):
    """Set the queue bucket's four shards to ``tokens`` (the last one's: 1),
    then have another transaction hold shard ``held`` locked while the
    caller claims (a claim that waited for it would hit its lock_timeout)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE rate_buckets SET tokens = CASE WHEN shard = 3 THEN 1 ELSE %s"
            " END, refilled_at = now() WHERE endpoint_id = %s AND group_key = ''",
            [tokens, scope.endpoint_id],
        )
        assert cursor.rowcount == 4
    other = _raw_connection()
    try:
        other.autocommit = False
        other.execute(
            "SELECT 1 FROM rate_buckets WHERE endpoint_id = %s AND group_key = ''"
            " AND shard = %s FOR UPDATE",
            [scope.endpoint_id, held],
        )
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            yield
        other.rollback()
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_locked_a_shard_never_waits_for_the_others(make_endpoint):
    """CONTRACT §17, no deadlock between claims: a claim that has locked a
    shard of a rate bucket never waits for another shard. Its shard may be
    one it cannot use: a row a concurrent claim drained, locked in its newer
    version, stays locked even when it no longer meets the query's
    conditions. A claim that then waited for every shard, while a claim that
    held one of them waited for it, deadlocked (found by
    bench/admission_run.py). Here the only shard that holds a token is held
    by another transaction: the claim passes its todo over at once."""
    scope = store.Scope.for_endpoint(make_endpoint("held"))
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 3600, "burst": 4}
    )
    for _ in range(3):
        new(scope)
    assert len(store.claim_many(scope, "w0", limit=1)) == 1  # makes the shards
    with shards_hold(scope, tokens=0, held=3):  # three drained, one held
        assert store.claim_many(scope, "w3", limit=1) == []
    assert len(store.claim_many(scope, "w3", limit=1)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_batch_claim_holding_shards_it_could_not_use_waits_for_none(
    make_endpoint,
):
    """CONTRACT §17, no deadlock between claims: a batch claim whose first
    todo found its free shards each short of the cost (it holds them, and
    passes that todo over) does not then wait for every shard for a later
    todo whose cost is above one shard's share: it passes that one over too.
    (Waiting there while holding shards deadlocked two claims in
    bench/admission_run.py.)"""
    scope = store.Scope.for_endpoint(make_endpoint("holding"))
    admission.set_admission(
        scope,
        "q",
        rate_limit={"count": 1, "per_seconds": 3600, "burst": 4},
        group_rate_limit={"count": 100, "per_seconds": 1},
    )
    new(scope, title="warm")
    assert len(store.claim_many(scope, "w0", limit=1)) == 1  # makes the shards
    new(scope, group="a", title="first")
    new(scope, cost=2, title="big")
    with shards_hold(scope, tokens=0.5, held=3):  # three of half a token, one held
        assert store.claim_many(scope, "w1", limit=10) == []
    # With every shard free, the bucket's 2.5 tokens admit "first" (1) and
    # then "big" (2) no more.
    assert [t.title for t in store.claim_many(scope, "w1", limit=10)] == ["first"]


@pytest.mark.parametrize(
    "bad",
    [{"count": 0, "per_seconds": 1}, {"count": 1, "per_seconds": 0}, {"x": 1}, 5],
)
def test_a_bad_rate_limit_is_refused(scope, bad):
    """CONTRACT §17: rate limits are {count ≥ 1, per_seconds ≥ 1, burst ≥ 1}."""
    with pytest.raises(ValueError, match="rate_limit"):
        admission.set_admission(scope, "q", rate_limit=bad)


# --- Waking -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_freed_slot_rings_the_queues_doorbell(make_endpoint):
    """CONTRACT §17 Waking: a freed slot rings the doorbell for the queue."""
    scope = store.Scope.for_endpoint(make_endpoint("waker"))
    admission.set_admission(scope, "q", group_concurrency=1)
    new(scope, group="a")
    new(scope, group="a")
    claimed = store.claim_next(scope, "w")
    listener = _raw_connection()
    try:
        listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
        store.complete_todo(scope, claimed.id, "w")
        rings = [
            json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=1)
        ]
    finally:
        listener.close()
    assert rings and rings[0]["queue"] == "q"
    assert rings[0]["endpoint_id"] == scope.endpoint_id


def _rings_heard(change):
    """The doorbell's rings sent by ``change()``, as the hub reads them."""
    listener = _raw_connection()
    try:
        listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
        change()
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    finally:
        listener.close()
    return [doorbell.parse(payload, doorbell.RING_FIELDS) for payload in payloads]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "hold, release",
    [
        ({"concurrency": 0}, {"concurrency": 1}),
        ({"paused": True}, {"paused": False}),
    ],
    ids=["limit_raised", "group_resumed"],
)
def test_a_group_let_in_rings_for_each_of_its_due_todos(make_endpoint, hold, release):
    """CONTRACT §17 Waking: a ring names a real todo (the doorbell drops one
    that does not): the group's due pending todos ring, no other's."""
    scope = store.Scope.for_endpoint(make_endpoint("waker"))
    admission.set_group(scope, "q", "g", **hold)
    held = {new(scope, group="g").id, new(scope, group="g").id}
    new(scope, group="other")
    new(scope, group="g", delay_seconds=600)
    rings = _rings_heard(lambda: admission.set_group(scope, "q", "g", **release))
    assert all(ring is not None and doorbell.is_ring(ring) for ring in rings)
    assert {ring["id"] for ring in rings} == held
    assert {(ring["endpoint_id"], ring["queue"]) for ring in rings} == {
        (scope.endpoint_id, "q")
    }


@pytest.mark.django_db(transaction=True)
def test_a_raised_queue_limit_rings_for_each_of_its_due_todos(make_endpoint):
    """CONTRACT §17 Waking: the queue's due pending todos ring, with their ids."""
    scope = store.Scope.for_endpoint(make_endpoint("waker"))
    admission.set_admission(scope, "q", group_concurrency=0)
    held = {new(scope, group="a").id, new(scope, group="b").id}
    new(scope, queue="elsewhere")
    rings = _rings_heard(
        lambda: admission.set_admission(scope, "q", group_concurrency=1)
    )
    assert all(ring is not None and doorbell.is_ring(ring) for ring in rings)
    assert {ring["id"] for ring in rings} == held


@pytest.mark.django_db(transaction=True)
def test_a_resumed_queue_rings_for_each_of_its_due_todos(make_endpoint):
    """A resumed queue's waiting claims look again: its due todos ring."""
    scope = store.Scope.for_endpoint(make_endpoint("waker"))
    first = new(scope)
    store.pause_queue(scope, "q")
    held = {first.id, new(scope, group="g").id}
    new(scope, queue="elsewhere")
    rings = _rings_heard(lambda: store.resume_queue(scope, "q"))
    assert all(ring is not None and doorbell.is_ring(ring) for ring in rings)
    assert {ring["id"] for ring in rings} == held


@pytest.mark.django_db(transaction=True)
def test_a_scopes_rings_stop_at_the_bound(make_endpoint):
    """A change rings for at most RING_DUE_LIMIT todos: a woken claim passes
    its ring on."""
    scope = store.Scope.for_endpoint(make_endpoint("waker"))
    for _ in range(sql.RING_DUE_LIMIT + 5):
        new(scope)
    store.pause_queue(scope, "q")
    rings = _rings_heard(lambda: store.resume_queue(scope, "q"))
    assert len(rings) == sql.RING_DUE_LIMIT


# --- The checker ---------------------------------------------------------------------


def _at(seconds):
    return f"2026-01-01T00:00:{seconds:06.3f}+00:00"


def _claim(event_id, todo, group="g", limit=1, at=0.0, transfer=False, **rates):
    admitted = {"group": group, "limit": limit, "cost": rates.pop("cost", 1.0)}
    admitted.update(at=_at(at), transfer=transfer, **rates)
    return (event_id, todo, "e", "pending", "claimed", admitted, "q", group)


def _end(event_id, todo, group="g", to="done"):
    return (event_id, todo, "e", "claimed", to, None, "q", group)


def test_the_checker_passes_a_clean_history():
    """Jepsen's habit: a history within its limits passes."""
    events = [
        _claim(1, "a"),
        _end(2, "a"),
        _claim(3, "b"),
        _claim(4, "b", transfer=True),
        _end(5, "b", to="pending"),
        _claim(6, "c"),
        # A cancel's composed claim of a pending todo claims nothing.
        (7, "d", "e", "pending", "claimed", None, "q", "g"),
        (8, "d", "e", "claimed", "done", None, "q", "g"),
    ]
    report = admission_check.check_events(events)
    assert report.violations == []
    assert report.claims == 4 and report.ends == 2


def test_the_checker_finds_a_planted_group_violation():
    """The checker fails a history with two claimed in a group limited to 1."""
    events = [_claim(1, "a"), _claim(2, "b"), _end(3, "a"), _end(4, "b")]
    report = admission_check.check_events(events)
    assert len(report.violations) == 1
    assert "over its limit 1" in report.violations[0]


def test_the_checker_finds_a_planted_rate_violation():
    """The checker fails a window with more cost than the bucket allows
    (burst 2, one a second: three claims within half a second)."""
    rate = {"count": 1, "per_seconds": 1, "burst": 2}
    clean = [
        _claim(n, f"t{n}", group=None, limit=None, at=n * 1.0, rate=rate)
        for n in range(1, 6)
    ]
    assert admission_check.check_events(clean).violations == []
    burst = [
        _claim(n, f"t{n}", group=None, limit=None, at=1 + n * 0.1, rate=rate)
        for n in range(1, 4)
    ]
    report = admission_check.check_events(burst)
    assert report.violations and "bucket" in report.violations[0]


def test_the_checker_finds_a_violation_planted_in_the_database(scope):
    """The checker reads todo_events: a claim slipped past admission (a
    second claimed todo written by hand, recorded as admitted under limit 1)
    is found."""
    admission.set_admission(scope, "q", group_concurrency=1)
    first = new(scope, group="a")
    second = new(scope, group="a")
    store.claim_next(scope, "w")
    assert admission_check.check(endpoint_id=scope.endpoint_id).violations == []
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET state = 'claimed', owner = 'rogue' WHERE id = %s",
            [second.id],
        )
        cursor.execute(
            "INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state,"
            " attempt, actor, error, at, admission)"
            " VALUES (%s, %s, 'pending', 'claimed', 1, 'rogue', '', now(),"
            " jsonb_build_object('group', 'a', 'limit', 1, 'cost', 1,"
            " 'at', now(), 'transfer', false))",
            [second.id, scope.endpoint_id],
        )
    report = admission_check.check(endpoint_id=scope.endpoint_id)
    assert len(report.violations) == 1, report.violations
    assert first.id != second.id


@pytest.mark.django_db(transaction=True)
def test_a_claim_passes_over_a_group_whose_end_is_in_flight_instead_of_waiting(
    make_endpoint,
):
    """CONTRACT §17 Exactness: a claim never waits for a group's lock (an end
    holds it until it commits): it passes over that group this time, so a
    claim and the reaper's batch of ends can never deadlock."""
    scope = store.Scope.for_endpoint(make_endpoint("passer"))
    admission.set_admission(scope, "q", group_concurrency=2)
    ending = new(scope, group="busy", title="ending")
    new(scope, group="busy", title="busy-next")
    store.claim_todo(scope, ending.id, "w")
    free = new(scope, group="free", title="free")
    other = _raw_connection()
    try:
        other.autocommit = False
        other.execute(
            "UPDATE todos SET state = 'done' WHERE id = %s", [ending.id]
        )  # the end's trigger holds busy's lock until this commits
        started = time.monotonic()
        taken = store.claim_many(scope, "w2", limit=10)
        waited = time.monotonic() - started
        other.rollback()
    finally:
        other.close()
    assert [t.id for t in taken] == [free.id]
    assert waited < 2


def test_an_opening_rate_window_is_when_a_waiting_claim_looks_again(scope):
    """CONTRACT §17 Waking: a waiting claim that found the bucket empty is
    told when the window opens (next_due), as for a lease lapsing."""
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 10, "burst": 1}
    )
    new(scope)
    new(scope)
    assert len(store.claim_many(scope, "w", limit=10)) == 1
    assert store.claim_many(scope, "w", limit=10) == []
    due = store.next_due(scope, 20)
    assert due is not None and 8 < due <= 10
    assert store.next_due(scope, 5) is None


def test_deleting_a_queue_forgets_its_groups_overrides_and_buckets(scope):
    """CONTRACT §17: a queue deleted and made again starts with no override
    and a full bucket (SQS's DeleteQueue, then CreateQueue)."""
    admission.set_admission(scope, "q", rate_limit={"count": 1, "per_seconds": 60})
    admission.set_group(scope, "q", "a", concurrency=0)
    new(scope, group="a")
    store.claim_many(scope, "w", limit=10)
    new(scope)
    assert len(store.claim_many(scope, "w", limit=10)) == 1
    store.delete_queue(scope, "q")
    admission.set_admission(scope, "q", rate_limit={"count": 1, "per_seconds": 60})
    new(scope, group="a")
    assert len(store.claim_many(scope, "w", limit=10)) == 1
    assert admission.get_group(scope, "q", "a").concurrency is None


def test_a_queues_rate_limits_read_back_as_objects(scope):
    """Defect: the sync read gave the jsonb rate limits as text (Django's
    connection hands jsonb to raw cursors as text); every reader had to parse."""
    admission.set_admission(
        scope,
        "q",
        rate_limit={"count": 10, "per_seconds": 60},
        group_rate_limit={"count": 2, "per_seconds": 1, "burst": 4},
    )
    settings = admission.get_admission(scope, "q")
    assert settings.rate_limit == {"count": 10, "per_seconds": 60, "burst": 10}
    assert settings.group_rate_limit == {"count": 2, "per_seconds": 1, "burst": 4}
