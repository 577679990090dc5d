"""The fair claims: a scope whose lanes are all fair is claimed by a
statement without the plain and aged lanes and without reservations
(lifecycle.CLAIM_FAIR_SQL), which takes exactly what CLAIM_SQL takes, and
defers to it when a lane is not fair or a candidate has a max_cost (CONTRACT
§17, §18); a claim of one from a scope with one fair queue is claimed by
switchboard_claim_fair (lifecycle.CLAIM_FAIR_ONE_SQL), which takes exactly
what they take, or defers to CLAIM_FAIR_SQL.

Real PostgreSQL; time moves in the database (todos' timestamps).
"""

import importlib
import json
import random

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.support import due_redeliveries
from todos import store
from todos.store import admission, lifecycle


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def claim_statements(scope, **claim):
    """The todos a claim took and the claim statements it ran, by name."""
    names = {
        lifecycle.CLAIM_PLAIN_SQL: "plain",
        lifecycle.CLAIM_FAIR_ONE_SQL: "fair one",
        lifecycle.CLAIM_FAIR_SQL: "fair",
        lifecycle.CLAIM_SQL: "admitting",
    }
    with CaptureQueriesContext(connection) as ran:
        taken = store.claim_many(scope, "w", **claim)
    statements = [
        q["sql"]
        for q in ran.captured_queries
        if "UPDATE todos" in q["sql"] or "switchboard_claim_fair(" in q["sql"]
    ]
    return taken, [next(n for s, n in names.items() if _same(s, q)) for q in statements]


def _same(template, ran):
    """Whether ``ran`` is ``template`` with its parameters bound."""
    head = template.split("%(")[0]
    return ran.startswith(head) and len(ran.split("\n")) == len(template.split("\n"))


def run(statement, scope, worker, limit, queue=None):
    """Run one claim statement; its claimed ids in order, what it passed over
    (reasons), and whether it deferred."""
    params = lifecycle.bind_claim(scope, worker, limit=limit, queue=queue)
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    deferring = statement in (lifecycle.CLAIM_FAIR_SQL, lifecycle.CLAIM_FAIR_ONE_SQL)
    defers = deferring and bool(rows and rows[0][-1])
    if deferring:
        rows = [row[:-1] for row in rows]
    over = rows[0][-1] if rows else None
    if isinstance(over, str):
        over = json.loads(over)
    passed = sorted(p["passed"] for p in over or [])
    return [str(row[0]) for row in rows if row[0] is not None], passed, defers


def fair_world(scope, rng, count, queues):
    """Fair queues a and b (b under a rate limit), with overrides, weights and
    a paused group; ``count`` todos over ``queues`` with random groups,
    priorities and assignments."""
    admission.set_admission(scope, "a", fair=True, group_concurrency=1)
    admission.set_admission(
        scope,
        "b",
        fair=True,
        group_concurrency=2,
        rate_limit={"count": 12, "per_seconds": 3600, "burst": 12},
    )
    admission.set_group(scope, "a", "g1", weight=3)
    admission.set_group(scope, "a", "g2", concurrency=2)
    admission.set_group(scope, "b", "g3", paused=True)
    todos = []
    for n in range(count):
        fields = {"title": f"t{n}"}
        if rng.random() < 0.8:
            fields["group"] = rng.choice(["g0", "g1", "g2", "g3", "g4"])
        if rng.random() < 0.2:
            fields["priority"] = rng.choice([1, 2, 4])
        if rng.random() < 0.15:
            fields["assignee"] = rng.choice(["w1", "w2"])
        todos.append(new(scope, queue=rng.choice(queues), **fields))
    return todos


def end_some(scope, rng):
    """Complete some claimed todos (up to two, each at even odds), freeing
    their groups' slots."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, owner, lease_token FROM todos WHERE endpoint_id = %s"
            " AND state = 'claimed' ORDER BY random() LIMIT 2",
            [scope.endpoint_id],
        )
        ending = cursor.fetchall()
    for todo_id, owner, token in ending:
        if rng.random() < 0.5:
            store.complete_todo(scope, todo_id, owner, lease_token=token)


def test_the_fair_claims_plan_is_smaller_than_the_admitting_claims():
    """The fair claim carries none of the plain and aged lanes' nodes, nor the
    reservations'."""
    for name in ("head", "fresh_plain", "fresh_aged", "reserved"):
        assert f"), {name} " in lifecycle.CLAIM_SQL
        assert f"), {name} " not in lifecycle.CLAIM_FAIR_SQL
    assert "switchboard_reserve" not in lifecycle.CLAIM_FAIR_SQL


def test_a_fair_scope_is_claimed_by_the_fair_claim_alone(scope):
    """CONTRACT §17: after the plain claim finds admission to do, a scope
    whose lanes are all fair runs the fair claim, and only it, from then on."""
    admission.set_admission(scope, "q", fair=True, group_concurrency=1)
    first = new(scope, group="a")
    new(scope, group="a")
    second = new(scope, group="b")
    lifecycle._ADMITTING.clear()
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["plain", "fair one"] and [t.id for t in taken] == [first.id]
    # A batch goes past the claim of one to the fair claim.
    taken, statements = claim_statements(scope, limit=5)
    assert statements == ["fair"] and [t.id for t in taken] == [second.id]
    taken, statements = claim_statements(scope, limit=5)
    assert statements == ["fair"] and taken == []
    lifecycle._ADMITTING.clear()


def test_the_fair_claim_defers_when_a_lane_is_not_fair(scope):
    """CONTRACT §17: a scope with a lane that is not fair is claimed by the
    admitting claim (the fair claim claims nothing and admits nothing)."""
    admission.set_admission(scope, "f", fair=True)
    admission.set_admission(scope, "g", group_concurrency=1)
    older = new(scope, queue="g", group="x")
    new(scope, queue="f", group="y")
    lifecycle._ADMITTING.clear()
    assert run(lifecycle.CLAIM_FAIR_SQL, scope, "w", 2) == ([], [], True)
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1) == ([], [], True)
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["plain", "fair one", "fair", "admitting"]
    assert [t.id for t in taken] == [older.id]
    # Remembered: the scope's next claim runs the admitting claim alone.
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["admitting"] and len(taken) == 1
    lifecycle._ADMITTING.clear()


def test_the_fair_claim_defers_a_todo_with_max_cost_to_its_reservation(scope):
    """CONTRACT §18: a todo with a max_cost in a fair queue is reserved
    against its budget: the fair claim defers to the admitting claim."""
    admission.set_admission(scope, "q", fair=True)
    store.create_budget(scope, scope="queue", queue="q", window="day", limit_usd=3)
    todo = new(scope, group="a", max_cost=2)
    assert run(lifecycle.CLAIM_FAIR_SQL, scope, "w", 1) == ([], [], True)
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1) == ([], [], True)
    lifecycle._ADMITTING.clear()
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["plain", "fair one", "fair", "admitting"]
    assert [t.id for t in taken] == [todo.id]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM budget_reservations WHERE todo_id = %s", [todo.id]
        )
        assert cursor.fetchone()[0] == 1
    lifecycle._ADMITTING.clear()


def test_the_fair_claim_takes_exactly_what_the_admitting_claim_takes(
    scope, time_travel
):
    """CONTRACT §17: on the same rows, the fair claim and the admitting claim
    take the same todos in the same order and pass over the same ones: fair
    queues with groups, limits, overrides, weights, paused groups, priorities,
    a rate limit, assignments, lapsed leases and due retries, single and batch
    claims, one queue or the whole scope."""
    rng = random.Random(17)
    todos = fair_world(scope, rng, 70, ["a", "b"])
    due_redeliveries(scope, todos, 8, rng, time_travel)
    steps = claimed = 0
    while steps < 60:
        worker = rng.choice(["w1", "w2", "w3"])
        limit = rng.choice([1, 1, 3, 10])
        queue = rng.choice([None, None, "a", "b"])
        with transaction.atomic():
            sid = transaction.savepoint()
            admitting = run(lifecycle.CLAIM_SQL, scope, worker, limit, queue)
            transaction.savepoint_rollback(sid)
            fair = run(lifecycle.CLAIM_FAIR_SQL, scope, worker, limit, queue)
        context = (steps, worker, limit, queue)
        assert fair[1:] == (admitting[1], False), context
        assert fair[0] == admitting[0], context
        claimed += len(fair[0])
        steps += 1
        end_some(scope, rng)
    assert claimed > 20


def test_claim_order_is_total_todos_that_tie_on_every_key_go_by_id(scope):
    """CONTRACT §17: the first todos of six groups in a fair queue tie on
    priority and fair tag (each group starts at tag 0); every claim statement
    returns them in one order, by id, not in whatever order its plan met
    them (creation order here)."""
    admission.set_admission(scope, "q", fair=True)
    todos = [new(scope, group=f"g{n}") for n in range(6)]
    by_id = sorted(str(t.id) for t in todos)
    for statement in (lifecycle.CLAIM_FAIR_SQL, lifecycle.CLAIM_SQL):
        with transaction.atomic():
            sid = transaction.savepoint()
            assert run(statement, scope, "w", 10)[0] == by_id
            transaction.savepoint_rollback(sid)


def test_the_claim_of_one_takes_exactly_what_the_admitting_claim_takes(
    scope, time_travel
):
    """CONTRACT §17: on the same rows, a claim of one by switchboard_claim_fair
    takes the todo the admitting claim takes and passes over what it passes
    over, or defers (claiming nothing): fair queues with groups, limits,
    overrides, weights, paused groups, priorities, a rate limit, assignments,
    lapsed leases and due retries, a queue that is not fair, one queue or
    the whole scope."""
    rng = random.Random(29)
    admission.set_admission(scope, "c", group_concurrency=1)
    admission.set_group(scope, "a", "g4", concurrency=0)
    todos = fair_world(scope, rng, 90, ["a", "a", "b", "b", "c"])
    steps = claimed = deferred = 0
    while steps < 80:
        if steps == 40:
            due_redeliveries(scope, todos, 6, rng, time_travel)
        worker = rng.choice(["w1", "w2", "w3", ""])
        queue = rng.choice([None, "a", "a", "b", "b", "c"])
        with transaction.atomic():
            sid = transaction.savepoint()
            admitting = run(lifecycle.CLAIM_SQL, scope, worker, 1, queue)
            transaction.savepoint_rollback(sid)
            one = run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, worker, 1, queue)
        context = (steps, worker, queue)
        if one[2]:
            assert one == ([], [], True), context
            deferred += 1
        else:
            # Todos that tie on priority and fair tag (each group's first is at
            # tag 0) are all the lane's head: which one a statement meets
            # first is its plan's order, so a tie is compared by its keys.
            assert [_turn(i) for i in one[0]] == [_turn(i) for i in admitting[0]], (
                context
            )
            assert one[1:] == (admitting[1], False), context
            claimed += len(one[0])
        steps += 1
        end_some(scope, rng)
    assert claimed > 20 and deferred > 5


def test_the_claim_of_one_claims_nothing_from_a_paused_queue(scope):
    """CONTRACT §17: a paused fair queue has nothing to claim."""
    admission.set_admission(scope, "q", fair=True)
    new(scope, group="a")
    store.pause_queue(scope, "q")
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1, "q") == ([], [], False)


def test_the_claim_of_one_reads_past_full_groups_only_so_far(scope):
    """CONTRACT §17: behind a group whose slot is taken, the claim of one reads
    the lane's rows on and takes the first with room; past HEAD_ROWS rows with
    none it defers to the fair claim, which takes what the admitting claim
    takes, instead of probing thousands of rows one by one."""
    migration = importlib.import_module("todos.migrations.0043_fair_claim_one")
    admission.set_admission(scope, "q", fair=True, group_concurrency=1)
    for _ in range(migration.HEAD_ROWS - 4):
        new(scope, group="big")
    held = store.claim_next(scope, "holder", queue="q")
    assert held.group == "big"
    later = new(scope, group="small", priority=4)
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1, "q") == (
        [str(later.id)],
        [],
        False,
    )
    store.complete_todo(scope, later.id, "w", lease_token=_token(later.id))
    for _ in range(8):
        new(scope, group="big")
    last = new(scope, group="small", priority=4)
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1, "q") == ([], [], True)
    assert run(lifecycle.CLAIM_FAIR_SQL, scope, "w", 1, "q") == (
        [str(last.id)],
        [],
        False,
    )


def _token(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_token FROM todos WHERE id = %s", [todo_id])
        return cursor.fetchone()[0]


def test_a_claim_of_one_deferred_by_a_due_redelivery_is_asked_again(scope, time_travel):
    """CONTRACT §17: a due redelivery is claimed first, by the fair claim; the
    scope's next claim of one asks switchboard_claim_fair again (a passing
    reason), where a queue that is not fair is remembered."""
    admission.set_admission(scope, "q", fair=True, group_concurrency=1)
    lapsed = store.claim_todo(scope, new(scope, group="a").id, "w")
    time_travel(lapsed.id, lease_expires_at=-900)
    waiting = new(scope, group="b")
    lifecycle._ADMITTING.clear()
    assert run(lifecycle.CLAIM_FAIR_ONE_SQL, scope, "w", 1, "q") == ([], [], True)
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["plain", "fair one", "fair"]
    assert [t.id for t in taken] == [lapsed.id]
    taken, statements = claim_statements(scope, limit=1)
    assert statements == ["fair one"] and [t.id for t in taken] == [waiting.id]
    lifecycle._ADMITTING.clear()


def _turn(todo_id):
    """A todo's place in its fair lane's turn order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, coalesce(assignee, ''), priority, fair_tag FROM todos"
            " WHERE id = %s",
            [todo_id],
        )
        return cursor.fetchone()
