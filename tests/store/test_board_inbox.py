"""The store's Board side of questions and cancels: recent answers, cancel and
dismiss by a list filter, each within the Board's owner scope."""

from django.db import connection

from todos import store
from todos.store import operator_inbox, stats


def asked_and_answered(scope, title, answer, by="orchestrator"):
    todo, _ = store.create_todo(scope, queue="q", title=title)
    store.claim_todo(scope, todo.id, "w")
    store.ask(scope, todo.id, "w", question=f"{title}?")
    return store.answer_todo(scope, todo.id, answer, worker=by)


def test_recent_answers_come_latest_first_and_stay_after_the_todo_moves_on(
    scope, other_scope
):
    first = asked_and_answered(scope, "first", "yes")
    second = asked_and_answered(scope, "second", {"n": 2})
    asked_and_answered(other_scope, "theirs", "no")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET answer = jsonb_set(answer, '{at}',"
            " '\"2020-01-01T00:00:00.000000Z\"') WHERE id = %s",
            [first.id],
        )
    store.claim_todo(scope, second.id, "w")
    store.complete_todo(scope, second.id, "w")

    mine = store.answered_questions_any_endpoint(endpoint_ids=[scope.endpoint_id])

    assert [todo.title for todo in mine] == ["second", "first"]
    assert mine[0].state == "done" and mine[0].answer["value"] == {"n": 2}
    assert len(store.answered_questions_any_endpoint()) == 3
    assert store.answered_questions_any_endpoint(endpoint_ids=[]) == []


def test_recent_answers_read_their_own_index(db):
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            f"EXPLAIN {operator_inbox.ANSWERED_SQL}",
            {"endpoint_ids": None, "limit": 10},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "todos_answered_idx" in plan


def test_cancel_matching_cancels_in_batches_and_requests_claimed_ones(
    scope, other_scope
):
    for n in range(130):
        store.create_todo(scope, queue="bulk", title=f"t{n}")
    busy, _ = store.create_todo(scope, queue="bulk", title="busy")
    store.claim_todo(scope, busy.id, "w")
    store.create_todo(scope, queue="other", title="not matched")
    store.create_todo(other_scope, queue="bulk", title="not in scope")
    scoped = {"endpoint_ids": [scope.endpoint_id], "queue": "bulk"}

    preview = store.count_cancelable_any_endpoint(**scoped)
    outcome = store.cancel_matching_any_endpoint(**scoped, by="operator:alice")

    assert (preview.now, preview.requested) == (130, 1)
    assert (outcome.canceled, outcome.requested, outcome.more) == (130, 1, False)
    assert store.get_todo_any_endpoint(busy.id).cancel_requested
    assert store.count_cancelable_any_endpoint(**scoped).total == 0
    left = store.list_todos_any_endpoint(state="pending").todos
    assert sorted(todo.title for todo in left) == ["not in scope", "not matched"]


def test_cancel_matching_stops_at_its_limit_and_says_more_remain(scope):
    for n in range(5):
        store.create_todo(scope, queue="bulk", title=f"t{n}")

    outcome = store.cancel_matching_any_endpoint(queue="bulk", limit=3)

    assert (outcome.canceled, outcome.more) == (3, True)
    assert store.count_cancelable_any_endpoint(queue="bulk").total == 2


def test_dismiss_matching_dismisses_one_group_of_the_scope(scope, other_scope):
    def dead(some_scope, error):
        todo, _ = store.create_todo(some_scope, queue="q", max_attempts=1)
        store.claim_todo(some_scope, todo.id, "w")
        return store.fail_todo(some_scope, todo.id, "w", error=error)

    timeouts = [dead(scope, f"timeout after {n}s") for n in (30, 31)]
    full = dead(scope, "disk full")
    theirs = dead(other_scope, "timeout after 32s")
    (group,) = [
        g
        for g in stats.dead_letter_groups()
        if g.endpoint_id == scope.endpoint_id and "timeout" in g.fingerprint
    ]

    dismissed = store.dismiss_matching_any_endpoint(
        endpoint_ids=[scope.endpoint_id],
        endpoint_id=scope.endpoint_id,
        queue="q",
        fingerprint=group.fingerprint,
    )

    assert dismissed == 2
    assert all(store.get_todo_any_endpoint(t.id).dismissed_at for t in timeouts)
    assert store.get_todo_any_endpoint(full.id).dismissed_at is None
    assert store.get_todo_any_endpoint(theirs.id).dismissed_at is None
    foreign = store.dismiss_matching_any_endpoint(
        endpoint_ids=[scope.endpoint_id], endpoint_id=other_scope.endpoint_id
    )
    assert foreign == 0
