"""The rule of CONTRACT §14: every operation is a SPEC transition or a
composition of them, each with its history row.

A seeded random run of every store operation — create (plain, delayed,
replacing), claim, heartbeat, complete, fail, release (with a handoff), retry,
ask, answer (API, Board, link), cancel (one, many), dismiss, deadlines, lapsed
leases and the sweeps — then every ``todo_events`` row is checked against the
SPEC's permitted transitions, and every todo's last row against its state.
"""

import random

from django.db import connection

from tests.conftest import shift
from todos import store

# SPEC-0003 "Todo Lifecycle State Machine": the permitted transitions.
PERMITTED = {
    (None, "pending"),  # create
    ("pending", "claimed"),  # claim
    ("claimed", "claimed"),  # heartbeat (and a lapsed lease's redelivery)
    ("claimed", "done"),  # complete
    ("claimed", "failed"),  # fail, lease expiry at the cap
    ("claimed", "pending"),  # lease expiry, release
    ("failed", "pending"),  # retry
    ("pending", "pending"),  # answer (the hold ends; the state stays)
}
STATES = {"pending", "claimed", "done", "failed"}
WORKERS = ("w1", "w2", "w3")
STEPS = 600
EXPECTED = (store.NotFound, store.Conflict, ValueError)


def _ops(scope, todos, rng):
    def pick():
        if not todos:
            raise store.NotFound()
        return rng.choice(todos)

    def pick_held():
        # Mostly an open question (a random todo rarely is one), else any todo.
        held = store.open_questions(scope)
        return rng.choice(held).id if held and rng.random() < 0.8 else pick()

    def current(todo_id):
        return store.get_todo(scope, todo_id)

    def create():
        key = rng.choice([None, None, "k1", "k2", "k3"])
        todo, _ = store.create_todo(
            scope,
            queue=rng.choice(["a", "b"]),
            idempotency_key=key,
            max_attempts=rng.choice([1, 2, 5]),
            assignee=rng.choice([None, None, None, "w1"]),
        )
        todos.append(todo.id)

    def create_delayed():
        todo, _ = store.create_todo(scope, queue="a", delay_seconds=600)
        todos.append(todo.id)

    def create_replacing():
        todo, _ = store.create_replacing(
            scope, queue="a", idempotency_key=rng.choice(["k1", "k2", "k3"])
        )
        todos.append(todo.id)

    def claim_next():
        store.claim_next(scope, rng.choice(WORKERS))

    def claim_one():
        store.claim_todo(scope, pick(), rng.choice(WORKERS))

    def pick_in(state):
        # Mostly a todo in the state the call needs, else any todo.
        found = store.list_todos(scope, state=state, limit=200).todos
        return rng.choice(found).id if found and rng.random() < 0.8 else pick()

    def pick_claimed():
        return pick_in("claimed")

    def owner_call(call, **kwargs):
        todo = current(pick_claimed())
        worker = todo.owner or rng.choice(WORKERS)
        if rng.random() < 0.5 and todo.lease_token:
            return call(scope, todo.id, None, lease_token=todo.lease_token, **kwargs)
        return call(scope, todo.id, worker, **kwargs)

    def heartbeat():
        owner_call(
            store.heartbeat,
            progress={"message": "working", "fraction": rng.random()},
            checkpoint={"n": rng.randrange(100)},
        )

    def complete():
        owner_call(store.complete_todo, result={"ok": True})

    def fail():
        owner_call(store.fail_todo, error=rng.choice(["boom", "timeout"]))

    def release():
        owner_call(
            store.release_todo,
            assignee=rng.choice([store.KEEP_ASSIGNEE, None, "w2"]),
            note="handoff",
            checkpoint={"at": 1},
        )

    def retry():
        store.retry_todo(scope, pick_in("failed"))

    def ask():
        owner_call(
            store.ask,
            question="go on?",
            choices=["yes", "no"],
            deadline_seconds=rng.choice([None, 60]),
            return_to=rng.choice(["me", "pool"]),
        )

    def answer():
        store.answer_todo(scope, pick_held(), rng.choice(["yes", "no"]), worker="lead")

    def answer_on_board():
        store.answer_todo_any_endpoint(pick_held(), "yes", by="alice")

    def answer_by_link():
        token = store.answer_link_token(current(pick_held()))
        store.answer_by_link(token, "no")

    def cancel():
        store.cancel_todo(scope, pick(), reason="walk", worker="lead")

    def cancel_many():
        chosen = [(pick(), "walk") for _ in range(3)]
        store.cancel_many(scope, chosen, worker="lead")

    def dismiss():
        store.dismiss_dead_letters_any_endpoint([pick_in("dead_letter")])

    def pass_a_deadline():
        todo_id = pick()
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE todos SET answer_deadline = now() - interval '1 second',"
                " available_at = least(available_at, now() - interval '1 second')"
                " WHERE id = %s AND question_status = 'open'",
                [todo_id],
            )

    def lapse_a_lease():
        shift(pick_claimed(), lease_expires_at=-3600)

    def open_a_retry_window():
        shift(pick_in("retry_scheduled"), next_retry_at=-3600)

    def sweep():
        store.reap_expired()
        store.requeue_due_retries()
        store.expire_questions()

    return [
        create, create, create_delayed, create_replacing, claim_next, claim_next,
        claim_one, heartbeat, complete, fail, release, retry, ask, ask, answer,
        answer_on_board, answer_by_link, cancel, cancel_many, dismiss,
        pass_a_deadline, lapse_a_lease, open_a_retry_window, sweep,
    ]  # fmt: skip


def test_a_random_run_of_every_operation_writes_only_permitted_transitions(scope):
    """SPEC: Only defined transitions are honored (CONTRACT §14's rule)."""
    rng = random.Random(27)
    todos = []
    ops = _ops(scope, todos, rng)
    succeeded = {op.__name__: 0 for op in ops}
    failures = {}
    for _ in range(STEPS):
        op = rng.choice(ops)
        try:
            op()
        except EXPECTED as exc:
            failures.setdefault(op.__name__, []).append(repr(exc)[:80])
            continue
        succeeded[op.__name__] += 1
    never = [name for name, count in succeeded.items() if count == 0]
    assert never == [], {name: failures.get(name) for name in never}
    # The walk's picks follow the todos' random ids, so which endings it
    # reaches varies: each ending is also walked once on purpose.
    for ending in ("done", "dead_letter", "canceled"):
        todo, _ = store.create_todo(scope, queue="endings", max_attempts=1)
        if ending == "canceled":
            store.cancel_todo(scope, todo.id, reason="walk", worker="lead")
            continue
        store.claim_todo(scope, todo.id, "w1")
        if ending == "done":
            store.complete_todo(scope, todo.id, "w1", result={"ok": True})
        else:
            store.fail_todo(scope, todo.id, "w1", error="boom")

    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT from_state, to_state FROM todo_events")
        pairs = set(cursor.fetchall())
        cursor.execute(
            """
            SELECT t.id, t.state, (SELECT e.to_state FROM todo_events e
                                    WHERE e.todo_id = t.id ORDER BY e.id DESC
                                    LIMIT 1)
              FROM todos t
            """
        )
        rows = cursor.fetchall()
    assert pairs - PERMITTED == set()
    assert {state for _, state, _ in rows} <= STATES
    assert [r for r in rows if r[1] != r[2]] == [], "history ends in the state"
    outcomes = {store.get_todo_any_endpoint(r[0]).outcome for r in rows}
    assert {"canceled", "done", "dead_letter"} <= outcomes
