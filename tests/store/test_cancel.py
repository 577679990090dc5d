"""Cancel, replace on create, dismissing dead letters (CONTRACT §14)."""

import pytest

from tests.conftest import shift
from todos import store
from todos.store import stats

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def history(todo_id):
    return [(e.from_state, e.to_state) for e in store.todo_events_any_endpoint(todo_id)]


def dead_letter(scope, **fields):
    todo = new(scope, max_attempts=1, **fields)
    store.claim_todo(scope, todo.id, "w1")
    return store.fail_todo(scope, todo.id, "w1", error="boom")


def test_cancel_of_a_pending_todo_ends_it_done_and_canceled(scope):
    """CONTRACT §14: pending → claimed → done, each with its history row."""
    todo = new(scope)
    canceled = store.cancel_todo(scope, todo.id, reason="not needed", worker="lead")
    assert canceled.state == "done" and canceled.outcome == "canceled"
    assert canceled.result["canceled"]["reason"] == "not needed"
    assert canceled.result["canceled"]["by"] == "agent:agent-a"
    assert canceled.result["canceled"]["worker"] == "lead"
    assert canceled.result["canceled"]["at"].endswith("Z")
    assert canceled.attempt == 0 and canceled.owner is None
    assert history(todo.id) == [
        (None, "pending"),
        ("pending", "claimed"),
        ("claimed", "done"),
    ]
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1")


def test_cancel_of_a_delayed_todo_is_at_once(scope):
    todo = new(scope, delay_seconds=600)
    assert store.cancel_todo(scope, todo.id).outcome == "canceled"


def test_cancel_of_a_held_todo_is_at_once_and_closes_its_question(scope, endpoint):
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.ask(scope, todo.id, "w1", question="?")
    token = store.answer_link_token(store.get_todo(scope, todo.id))
    canceled = store.cancel_todo(scope, todo.id, worker="lead")
    assert canceled.outcome == "canceled"
    assert store.open_questions_any_endpoint(endpoint_ids=[endpoint.id]) == []
    with pytest.raises(store.StaleLink):
        store.answer_by_link(token, "yes")


def test_cancel_of_a_retry_scheduled_todo_composes_three_transitions(scope):
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.fail_todo(scope, todo.id, "w1", error="flaky")
    canceled = store.cancel_todo(scope, todo.id)
    assert canceled.outcome == "canceled" and canceled.next_retry_at is None
    assert history(todo.id)[-3:] == [
        ("failed", "pending"),
        ("pending", "claimed"),
        ("claimed", "done"),
    ]


def test_cancel_of_a_claimed_todo_asks_its_owner(scope):
    """CONTRACT §14: a claimed todo gets a cancel request (202 on the API)."""
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    before = history(todo.id)
    requested = store.cancel_todo(scope, todo.id, reason="stop", worker="lead")
    assert requested.state == "claimed" and requested.cancel_requested
    assert requested.to_dict()["cancel_requested"] is True
    assert history(todo.id) == before, "a request is no transition"
    beat = store.heartbeat(scope, todo.id, "w1")
    assert beat.cancel_requested


def test_release_under_a_cancel_request_ends_canceled(scope):
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.cancel_todo(scope, todo.id, reason="stop", worker="lead")
    ended = store.release_todo(scope, todo.id, "w1")
    assert ended.state == "done" and ended.outcome == "canceled"
    assert ended.result == {"canceled": ended.cancel_request}
    assert history(todo.id)[-1] == ("claimed", "done")


def test_fail_under_a_cancel_request_ends_canceled_keeping_the_error(scope):
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.cancel_todo(scope, todo.id, worker="lead")
    ended = store.fail_todo(scope, todo.id, "w1", error="stopped early")
    assert ended.outcome == "canceled" and ended.last_error == "stopped early"
    assert ended.next_retry_at is None


def test_complete_under_a_cancel_request_keeps_the_workers_result(scope):
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.cancel_todo(scope, todo.id, worker="lead")
    done = store.complete_todo(scope, todo.id, "w1", result={"ok": 1})
    assert done.outcome == "done" and done.result == {"ok": 1}


def test_a_lapsed_lease_under_a_cancel_request_ends_canceled(scope):
    """CONTRACT §14: a lease that lapses under a cancel request ends cancelled."""
    todo = new(scope)
    store.claim_todo(scope, todo.id, "w1")
    store.cancel_todo(scope, todo.id, worker="lead")
    shift(todo.id, lease_expires_at=-600)
    # The claim does not redeliver it ...
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w2")
    assert store.pending_doorbell_todos(scope) == []
    # ... the reaper ends it canceled.
    moved = store.reap_expired()
    assert [(m.id, m.state) for m in moved] == [(todo.id, "done")]
    after = store.get_todo(scope, todo.id)
    assert after.outcome == "canceled"
    assert after.result["canceled"]["by"] == "agent:agent-a"


def test_cancel_of_a_terminal_todo_conflicts(scope):
    todo = new(scope)
    store.cancel_todo(scope, todo.id)
    with pytest.raises(store.Conflict):
        store.cancel_todo(scope, todo.id)
    with pytest.raises(store.Conflict) as caught:
        store.cancel_todo(scope, dead_letter(scope).id)
    assert caught.value.state == "dead_letter"


def test_cancel_of_another_endpoints_todo_is_not_found(scope, other_scope):
    todo = new(other_scope)
    for todo_id in (todo.id, NEVER_MINTED, "nope"):
        with pytest.raises(store.NotFound):
            store.cancel_todo(scope, todo_id)
    assert store.get_todo(other_scope, todo.id).state == "pending"


def test_a_canceled_todo_frees_its_idempotency_key(scope):
    todo = new(scope, idempotency_key="k")
    store.cancel_todo(scope, todo.id)
    again, created = store.create_todo(scope, queue="q", idempotency_key="k")
    assert created and again.id != todo.id


def test_cancel_many_answers_each_in_order(scope, other_scope):
    pending, claimed = new(scope), new(scope)
    store.claim_todo(scope, claimed.id, "w1")
    foreign = new(other_scope)
    results = store.cancel_many(
        scope,
        [(pending.id, "a"), (claimed.id, "b"), (foreign.id, ""), ("bad", "")],
        worker="lead",
    )
    assert results[0].outcome == "canceled"
    assert results[1].state == "claimed" and results[1].cancel_requested
    assert isinstance(results[2], store.NotFound)
    assert isinstance(results[3], store.NotFound)


def test_cancel_refuses_an_overlong_reason(scope):
    todo = new(scope)
    with pytest.raises(ValueError, match="reason"):
        store.cancel_todo(scope, todo.id, reason="x" * 1001)


def test_board_cancels_any_endpoints_todos(other_scope):
    first, second = new(other_scope), new(other_scope)
    results = store.cancel_many_any_endpoint([first.id, second.id], by="alice")
    assert [t.outcome for t in results] == ["canceled", "canceled"]
    assert store.cancel_todo_any_endpoint(new(other_scope).id).outcome == "canceled"


# --- Replace --------------------------------------------------------------------


def test_create_with_replace_cancels_the_pending_duplicate(scope):
    old = new(scope, idempotency_key="build-42", title="old")
    fresh, created = store.create_replacing(
        scope, queue="q", idempotency_key="build-42", title="new"
    )
    assert created and fresh.id != old.id and fresh.title == "new"
    replaced = store.get_todo(scope, old.id)
    assert replaced.outcome == "canceled"
    assert replaced.result["canceled"]["reason"] == "replaced"


def test_create_with_replace_and_no_duplicate_just_creates(scope):
    fresh, created = store.create_replacing(scope, queue="q", idempotency_key="k")
    assert created and fresh.state == "pending"


def test_create_with_replace_asks_a_claimed_duplicate_to_cancel(scope):
    old = new(scope, idempotency_key="k")
    store.claim_todo(scope, old.id, "w1")
    with pytest.raises(store.ReplaceBlocked) as caught:
        store.create_replacing(scope, queue="q", idempotency_key="k")
    assert caught.value.todo_id == old.id
    assert store.get_todo(scope, old.id).cancel_requested
    page = store.list_todos(scope)
    assert [t.id for t in page.todos] == [old.id]


def test_create_with_replace_needs_a_key(scope):
    with pytest.raises(ValueError, match="idempotency_key"):
        store.create_replacing(scope, queue="q", idempotency_key=None)


def test_a_failed_create_with_replace_keeps_the_duplicate(scope):
    old = new(scope, idempotency_key="k")
    with pytest.raises(ValueError):
        store.create_replacing(scope, queue="q", idempotency_key="k", max_attempts=0)
    assert store.get_todo(scope, old.id).state == "pending"


# --- Dismissing dead letters ----------------------------------------------------


def test_dismissed_dead_letters_leave_their_group(scope, endpoint):
    first, second = dead_letter(scope), dead_letter(scope)
    groups = stats.dead_letter_groups(endpoint_ids=[endpoint.id])
    assert groups[0].count == 2
    assert store.dismiss_dead_letters_any_endpoint([first.id]) == 1
    assert store.dismiss_dead_letters_any_endpoint([first.id]) == 0
    groups = stats.dead_letter_groups(endpoint_ids=[endpoint.id])
    assert groups[0].count == 1 and groups[0].example_id == second.id
    store.dismiss_dead_letters_any_endpoint([second.id])
    assert stats.dead_letter_groups(endpoint_ids=[endpoint.id]) == []


def test_dismiss_is_limited_to_dead_letters_of_the_owner_scope(
    scope, other_scope, endpoint
):
    foreign = dead_letter(other_scope)
    pending = new(scope)
    assert (
        store.dismiss_dead_letters_any_endpoint(
            [foreign.id], endpoint_ids=[endpoint.id]
        )
        == 0
    )
    assert store.dismiss_dead_letters_any_endpoint([pending.id, "bad"]) == 0
    assert store.dismiss_dead_letters_any_endpoint([foreign.id], endpoint_ids=[]) == 0


def test_a_retried_dead_letter_is_no_longer_dismissed(scope):
    todo = dead_letter(scope)
    store.dismiss_dead_letters_any_endpoint([todo.id])
    retried = store.retry_todo(scope, todo.id)
    assert retried.dismissed_at is None
