"""A todo's max_cost is reserved against its budgets at claim and released at
the attempt's end (CONTRACT §18), on real PostgreSQL."""

import json
from decimal import Decimal

import pytest
from django.db import connection

from todos import store
from todos.store import lifecycle, sweeps


def budget(caller, **given):
    """A day budget of queue q by default (scope="endpoint": of the endpoint)."""
    given = {"scope": "queue", "window": "day", **given}
    if given["scope"] != "endpoint":
        given.setdefault("queue", "q")
    return store.create_budget(caller, **given)


def reserved(budget_id=None):
    """The reservations held (their attempt running): (todo id, attempt, usd)
    of one budget, or all."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.todo_id::text, r.attempt, r.budget_id::text, r.usd"
            " FROM budget_reservations r JOIN todos t ON t.id = r.todo_id"
            " AND t.state = 'claimed' AND t.attempt = r.attempt"
            " ORDER BY r.todo_id, r.attempt, r.budget_id"
        )
        rows = cursor.fetchall()
    return [
        (todo_id, attempt, usd)
        for todo_id, attempt, held_by, usd in rows
        if budget_id is None or held_by == budget_id
    ]


def lapse(todo_id):
    """Move the todo's lease into the past."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '10 minutes'"
            " WHERE id = %s",
            [todo_id],
        )


def test_max_cost_is_stored_and_shown(scope):
    todo, _ = store.create_todo(scope, queue="q", max_cost=2.5)
    assert todo.max_cost == 2.5
    assert todo.to_dict()["max_cost"] == 2.5
    plain, _ = store.create_todo(scope, queue="q")
    assert plain.to_dict()["max_cost"] is None
    many = store.create_many(scope, [{"queue": "q", "max_cost": 0}, {"queue": "q"}])
    assert [item[0].max_cost for item in many] == [0.0, None]


def test_a_max_cost_of_minus_zero_is_stored_and_shown_as_zero(scope):
    todo, _ = store.create_todo(scope, queue="q", max_cost=-0.0)
    assert str(todo.max_cost) == "0.0"
    assert json.dumps(todo.to_dict()["max_cost"]) == "0.0"


@pytest.mark.parametrize("bad", [-1, "1", True, 10**10])
def test_max_cost_must_be_a_number_of_dollars_from_zero(scope, bad):
    with pytest.raises(ValueError, match="max_cost"):
        store.create_todo(scope, queue="q", max_cost=bad)


def test_a_claim_reserves_max_cost_against_each_budget_of_the_scope(scope):
    of_queue = budget(scope, limit_usd=10)
    of_endpoint = budget(scope, scope="endpoint", limit_usd=100)
    of_tokens = budget(scope, scope="endpoint", limit_tokens=1000)
    other_queue = budget(scope, queue="other", limit_usd=10)
    todo, _ = store.create_todo(scope, queue="q", max_cost=3)
    claimed = store.claim_next(scope, "w", queue="q")
    assert claimed.id == todo.id
    assert reserved(of_queue.id) == [(todo.id, 1, Decimal(3))]
    assert reserved(of_endpoint.id) == [(todo.id, 1, Decimal(3))]
    assert reserved(of_tokens.id) == []
    assert reserved(other_queue.id) == []
    read = store.get_budget(scope, of_queue.id)
    assert (read.reserved_usd, read.to_dict()["reserved_usd"]) == (3, 3.0)
    assert store.get_budget(scope, other_queue.id).reserved_usd == 0
    store.complete_todo(scope, todo.id, "w")
    assert store.get_budget(scope, of_queue.id).reserved_usd == 0


def test_a_claim_whose_reservation_would_pass_the_limit_passes_the_todo_over(scope):
    budget(scope, limit_usd=5)
    first, _ = store.create_todo(scope, queue="q", max_cost=3)
    second, _ = store.create_todo(scope, queue="q", max_cost=3)
    assert store.claim_next(scope, "w", queue="q").id == first.id
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w", queue="q")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, second.id, "w")
    # The first attempt spent 1 of its 3: 1 spent + 3 reserved fits in 5.
    store.complete_todo(scope, first.id, "w", usage={"cost_usd": 1})
    assert store.claim_next(scope, "w", queue="q").id == second.id


def test_a_reservation_counts_what_the_window_spent(scope):
    paid = budget(scope, limit_usd=5, action="reject_new")
    done, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, done.id, "w")
    store.complete_todo(scope, done.id, "w", usage={"cost_usd": 4})
    store.create_todo(scope, queue="q", max_cost=2)
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w", queue="q")
    store.decide_budget(scope, paid.id, "raise", amount_usd=1)
    assert store.claim_next(scope, "w", queue="q").max_cost == 2


def test_a_group_budget_reserves_only_for_its_group(scope):
    budget(scope, scope="group", group="acme", limit_usd=1)
    store.create_todo(scope, queue="q", group="acme", max_cost=2)
    other, _ = store.create_todo(scope, queue="q", group="other", max_cost=2)
    assert store.claim_next(scope, "w", queue="q").id == other.id
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w", queue="q")


def test_a_max_cost_of_zero_always_fits(scope):
    budget(scope, limit_usd=1)
    store.create_todo(scope, queue="q", max_cost=1)
    store.create_todo(scope, queue="q", max_cost=0)
    store.claim_next(scope, "w", queue="q")
    assert store.claim_next(scope, "w", queue="q").max_cost == 0


def end_by_complete(scope, todo):
    store.complete_todo(scope, todo.id, "w", usage={"cost_usd": 0.5})


def end_by_fail_with_a_retry(scope, todo):
    store.fail_todo(scope, todo.id, "w", error="try again")


def end_by_release(scope, todo):
    store.release_todo(scope, todo.id, "w")


def end_by_ask(scope, todo):
    store.ask(scope, todo.id, "w", question="which one?")


def end_by_lapse_and_reaper(scope, todo):
    lapse(todo.id)
    assert sweeps.reap_expired()


def end_by_cancel(scope, todo):
    store.cancel_todo(scope, todo.id, reason="not needed")
    lapse(todo.id)
    sweeps.reap_expired()
    assert store.get_todo(scope, todo.id).is_canceled


def end_by_dead_letter(scope, todo):
    lapse(todo.id)
    sweeps.reap_expired()
    assert store.get_todo(scope, todo.id).is_dead_letter


@pytest.mark.parametrize(
    "end",
    [
        end_by_complete,
        end_by_fail_with_a_retry,
        end_by_release,
        end_by_ask,
        end_by_lapse_and_reaper,
        end_by_cancel,
        end_by_dead_letter,
    ],
)
def test_the_attempts_end_releases_its_reservation(scope, end):
    paid = budget(scope, limit_usd=3)
    max_attempts = 1 if end is end_by_dead_letter else 3
    todo, _ = store.create_todo(scope, queue="q", max_cost=3, max_attempts=max_attempts)
    store.claim_next(scope, "w", queue="q")
    assert reserved(paid.id) == [(todo.id, 1, Decimal(3))]
    end(scope, todo)
    assert reserved() == []
    # The room is back (but what the attempt spent): another reservation fits.
    store.create_todo(scope, queue="q", max_cost=2.5)
    assert store.claim_next(scope, "w", queue="q").max_cost in (2.5, 3)


def test_a_redelivery_reserves_for_its_new_attempt_and_releases_the_last(scope):
    paid = budget(scope, limit_usd=3)
    todo, _ = store.create_todo(scope, queue="q", max_cost=3)
    store.claim_next(scope, "w", queue="q")
    lapse(todo.id)
    again = store.claim_next(scope, "w2", queue="q")
    assert (again.id, again.attempt) == (todo.id, 2)
    assert reserved(paid.id) == [(todo.id, 2, Decimal(3))]


def test_deleting_a_claimed_todo_releases_its_reservation(scope):
    budget(scope, limit_usd=3)
    todo, _ = store.create_todo(scope, queue="q", max_cost=3)
    store.claim_next(scope, "w", queue="q")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos WHERE id = %s", [todo.id])
    assert reserved() == []


def test_a_todo_without_max_cost_is_unaffected_by_reservations(scope):
    budget(scope, limit_usd=3)
    store.create_todo(scope, queue="q", max_cost=3)
    store.claim_next(scope, "w", queue="q")
    plain, _ = store.create_todo(scope, queue="q")
    assert store.claim_next(scope, "w", queue="q").id == plain.id
    assert len(reserved()) == 1


def test_a_todo_without_max_cost_takes_the_plain_claim(scope):
    lifecycle._ADMITTING.clear()
    budget(scope, limit_usd=3)
    store.create_todo(scope, queue="q")
    store.claim_next(scope, "w", queue="q")
    assert lifecycle._ADMITTING == {}, "the plain claim claimed it"
    store.create_todo(scope, queue="q", max_cost=1)
    store.claim_next(scope, "w", queue="q")
    assert lifecycle._ADMITTING, "a todo with max_cost goes to the full claim"
    lifecycle._ADMITTING.clear()


def test_a_claim_under_a_budget_forgets_the_reservations_of_ended_attempts(scope):
    budget(scope, limit_usd=10)
    for _ in range(3):
        todo, _ = store.create_todo(scope, queue="q", max_cost=1)
        store.claim_next(scope, "w", queue="q")
        store.complete_todo(scope, todo.id, "w")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM budget_reservations")
        assert cursor.fetchone()[0] == 1, "only the last attempt's row is left"


def test_two_todos_of_one_claim_count_each_others_reservation(scope):
    budget(scope, limit_usd=5)
    for _ in range(3):
        store.create_todo(scope, queue="q", max_cost=2)
    taken = store.claim_many(scope, "w", limit=3, queue="q")
    assert len(taken) == 2
    assert len(reserved()) == 2
