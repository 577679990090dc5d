"""What a budget does at its limit (CONTRACT §18): the report that reaches it
pauses the scope's claims or refuses its creates, until the window ends or
the owner decides."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection

from todos import store
from todos.store.budgets import window_bounds


def budget(caller, **given):
    """A day budget of queue q by default (scope="endpoint": of the endpoint)."""
    given = {"scope": "queue", "window": "day", **given}
    if given["scope"] != "endpoint":
        given.setdefault("queue", "q")
    return store.create_budget(caller, **given)


def work(scope, queue="q", group=None, **usage):
    """Create, claim and complete one todo of ``queue`` reporting ``usage``."""
    todo, _ = store.create_todo(scope, queue=queue, group=group)
    claimed = store.claim_todo(scope, todo.id, "w")
    store.complete_todo(scope, claimed.id, "w", usage=usage)
    return todo


def claimable(scope, queue="q"):
    """Whether a claim of ``queue`` takes a todo (created for it)."""
    store.create_todo(scope, queue=queue)
    try:
        store.claim_next(scope, "w", queue=queue)
    except store.NotFound:
        return False
    return True


def events(scope, budget_id):
    return [event.event for event in store.budget_history(scope, budget_id)][::-1]


def travel_past_the_window(budget_id):
    """Move a budget's window (and what it decided) a window into the past."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE budgets SET window_start = window_start - interval '2 days',"
            " window_end = window_end - interval '2 days',"
            " in_force_until = in_force_until - interval '2 days'"
            " WHERE id = %s",
            [budget_id],
        )


def test_the_report_that_reaches_the_limit_pauses_the_queues_claims(scope):
    paused = budget(scope, limit_usd=1)
    work(scope, cost_usd=0.6)
    assert claimable(scope)
    work(scope, cost_usd=0.4)

    read = store.get_budget(scope, paused.id)
    assert (read.state, read.spent_usd, read.left_usd) == ("exhausted", 1, 0)
    assert read.in_force_until == read.window_end
    assert not claimable(scope)
    assert claimable(scope, queue="other")
    assert events(scope, paused.id) == ["budget.soft_limit", "budget.exhausted"]


def test_a_named_claim_passes_over_a_paused_scope_too(scope):
    budget(scope, limit_usd=1)
    waiting, _ = store.create_todo(scope, queue="q")
    work(scope, cost_usd=1)
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, waiting.id, "w")


def test_a_lapsed_lease_of_a_paused_scope_is_not_redelivered(scope, time_travel):
    budget(scope, limit_usd=1)
    lapsed, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, lapsed.id, "w")
    time_travel(lapsed.id, lease_expires_at=-60)
    work(scope, cost_usd=1)
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")


def test_a_queue_without_a_budget_is_claimed_as_before(scope):
    budget(scope, queue="other", limit_usd=1)
    work(scope, queue="other", cost_usd=5)
    for _ in range(3):
        assert claimable(scope)


def test_an_endpoint_budget_pauses_every_queue_and_a_group_budget_its_group(scope):
    grouped = budget(scope, scope="group", group="g", limit_tokens=100)
    work(scope, group="g", input_tokens=60, output_tokens=40)
    assert store.get_budget(scope, grouped.id).state == "exhausted"
    store.create_todo(scope, queue="q", group="g")
    store.create_todo(scope, queue="q", group="h")
    taken = store.claim_many(scope, "w", limit=10, queue="q")
    assert [todo.group for todo in taken] == ["h"]

    budget(scope, scope="endpoint", limit_usd=2)
    work(scope, queue="r", cost_usd=2)
    assert not claimable(scope, queue="r")
    assert not claimable(scope, queue="s")


def test_the_soft_threshold_is_an_event_and_pauses_nothing(scope):
    soft = budget(scope, limit_usd=10, soft_percent=50)
    work(scope, cost_usd=4)
    assert store.get_budget(scope, soft.id).state == "ok"
    work(scope, cost_usd=1)
    read = store.get_budget(scope, soft.id)
    assert read.state == "soft_limit" and read.soft_reached_at is not None
    assert claimable(scope)
    assert events(scope, soft.id) == ["budget.soft_limit"]


def test_a_heartbeats_report_replaces_the_attempts_figure_in_the_budget(scope):
    counted = budget(scope, limit_usd=10)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w")
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 2, "input_tokens": 5})
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 3})
    store.complete_todo(scope, todo.id, "w", usage={"cost_usd": 3.5})
    read = store.get_budget(scope, counted.id)
    assert (read.spent_usd, read.spent_tokens) == (Decimal("3.5"), 5)


def test_a_report_outside_a_todo_counts_against_its_queues_budgets(scope):
    counted = budget(scope, scope="group", group="g", limit_usd=1)
    store.report_usage(scope, queue="q", group="g", usage={"cost_usd": 1})
    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    read = store.get_budget(scope, counted.id)
    assert (read.spent_usd, read.state) == (1, "exhausted")


def test_a_new_budget_starts_from_what_the_ledger_holds_in_its_window(scope):
    store.report_usage(scope, queue="q", usage={"cost_usd": 3})
    late = budget(scope, limit_usd=2)
    assert (late.spent_usd, late.state) == (3, "exhausted")
    assert not claimable(scope)


def test_a_higher_limit_lifts_the_pause(scope):
    raised = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    assert not claimable(scope)
    changed = store.update_budget(scope, raised.id, limit_usd=5)
    assert (changed.state, changed.spent_usd) == ("soft_limit", 1)
    assert claimable(scope)


def test_deleting_a_budget_lifts_its_pause(scope):
    doomed = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    store.delete_budget(scope, doomed.id)
    assert claimable(scope)


def test_reject_new_refuses_creates_in_its_scope_naming_the_budget(scope):
    refusing = budget(scope, limit_usd=1, action="reject_new")
    work(scope, cost_usd=1)
    with pytest.raises(store.BudgetExhausted) as caught:
        store.create_todo(scope, queue="q")
    assert caught.value.budget.id == refusing.id
    assert refusing.id in caught.value.detail
    store.create_todo(scope, queue="other")
    results = store.create_many(scope, [{"queue": "q"}, {"queue": "other"}])
    assert isinstance(results[0], store.BudgetExhausted)
    assert results[1][1] is True
    # reject_new leaves the claims alone: what is queued still runs.
    assert claimable(scope, queue="other")


def test_reject_new_returns_a_live_duplicate_rather_than_refusing(scope):
    budget(scope, limit_usd=1, action="reject_new")
    first, _ = store.create_todo(scope, queue="q", idempotency_key="k")
    work(scope, cost_usd=1)
    again, created = store.create_todo(scope, queue="q", idempotency_key="k")
    assert (again.id, created) == (first.id, False)


def test_raise_for_this_window_lifts_the_pause_until_the_new_limit(scope):
    raised = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    decided = store.decide_budget(
        scope, raised.id, "raise", amount_usd=2, actor="operator:alice"
    )
    assert (decided.state, decided.raised_usd, decided.left_usd) == (
        "soft_limit",
        2,
        2,
    )
    assert claimable(scope)
    work(scope, cost_usd=2)
    assert store.get_budget(scope, raised.id).state == "exhausted"
    history = store.budget_history(scope, raised.id)
    decision = next(event for event in history if event.event == "budget.decision")
    assert decision.actor == "operator:alice"
    assert decision.detail == {
        "decision": "raise",
        "amount_usd": 2,
        "amount_tokens": None,
    }
    assert events(scope, raised.id) == [
        "budget.soft_limit",
        "budget.exhausted",
        "budget.decision",
        "budget.resumed",
        "budget.exhausted",
    ]


def test_resume_lifts_the_pause_for_the_rest_of_the_window(scope):
    resumed = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    decided = store.decide_budget(scope, resumed.id, "resume")
    assert (decided.state, decided.in_force) == ("resumed", False)
    work(scope, cost_usd=5)
    assert claimable(scope)
    assert store.exhausted_budgets(scope) == []


def test_keep_paused_is_recorded_and_changes_nothing(scope):
    kept = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    decided = store.decide_budget(scope, kept.id, "keep_paused", actor="me")
    assert decided.state == "exhausted"
    assert not claimable(scope)
    assert [b.id for b in store.exhausted_budgets(scope)] == [kept.id]
    assert events(scope, kept.id)[-1] == "budget.decision"


@pytest.mark.parametrize(
    ("decision", "given", "field"),
    [
        ("explode", {}, "decision"),
        ("raise", {}, "amount_usd"),
        ("raise", {"amount_usd": -1}, "amount_usd"),
        ("raise", {"amount_tokens": 5}, "amount_tokens"),
        ("resume", {"amount_usd": 1}, "decision"),
    ],
)
def test_a_bad_decision_is_refused_naming_the_field(scope, decision, given, field):
    bad = budget(scope, limit_usd=1)
    with pytest.raises(store.InvalidBudget) as caught:
        store.decide_budget(scope, bad.id, decision, **given)
    assert caught.value.field == field


def test_a_decision_on_a_foreign_budget_is_not_found(scope, other_scope):
    foreign = budget(other_scope, limit_usd=1)
    with pytest.raises(store.NotFound):
        store.decide_budget(scope, foreign.id, "resume")
    with pytest.raises(store.NotFound):
        store.decide_budget_any_endpoint(
            foreign.id, "resume", endpoint_ids=[scope.endpoint_id]
        )
    assert store.exhausted_budgets_any_endpoint(endpoint_ids=[]) == []


def test_the_board_sees_its_owners_exhausted_budgets_only(scope, other_scope):
    mine = budget(scope, limit_usd=1)
    theirs = budget(other_scope, limit_usd=1)
    work(scope, cost_usd=1)
    work(other_scope, cost_usd=1)
    own = store.exhausted_budgets_any_endpoint(endpoint_ids=[scope.endpoint_id])
    assert [b.id for b in own] == [mine.id]
    every = {b.id for b in store.exhausted_budgets_any_endpoint()}
    assert every == {mine.id, theirs.id}
    decided = store.decide_budget_any_endpoint(
        mine.id, "resume", endpoint_ids=[scope.endpoint_id], actor="operator:alice"
    )
    assert decided.state == "resumed"


def test_the_window_rolling_over_ends_the_pause_and_starts_the_figures_over(scope):
    rolled = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    store.decide_budget(scope, rolled.id, "raise", amount_usd=0.5)
    work(scope, cost_usd=0.5)
    assert not claimable(scope)
    travel_past_the_window(rolled.id)
    assert claimable(scope)
    read = store.get_budget(scope, rolled.id)
    assert (read.spent_usd, read.raised_usd, read.state) == (0, 0, "ok")
    work(scope, cost_usd=0.25)
    read = store.get_budget(scope, rolled.id)
    assert (read.spent_usd, read.raised_usd, read.state) == (Decimal("0.25"), 0, "ok")


def test_a_report_replaced_in_a_later_window_counts_whole_in_it(scope):
    counted = budget(scope, limit_usd=10)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w")
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 2})
    travel_past_the_window(counted.id)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE usage_ledger SET reported_at = reported_at - interval '2 days'"
        )
    store.complete_todo(scope, todo.id, "w", usage={"cost_usd": 3})
    assert store.get_budget(scope, counted.id).spent_usd == 3


@pytest.mark.parametrize(
    ("window", "zone", "at"),
    [
        ("day", "Europe/Berlin", datetime(2026, 3, 29, 0, 30, tzinfo=UTC)),
        ("month", "America/New_York", datetime(2026, 3, 29, 0, 30, tzinfo=UTC)),
        ("hour", "Asia/Kolkata", datetime(2026, 7, 1, 12, 10, tzinfo=UTC)),
        ("month", "UTC", datetime(2026, 12, 9, tzinfo=UTC)),
        ("day", "Pacific/Apia", datetime(2026, 1, 1, 10, 0, tzinfo=UTC)),
    ],
)
def test_the_databases_window_is_the_one_a_read_shows(db, window, zone, at):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT start_at, end_at FROM switchboard_budget_window(%s, %s, %s)",
            [window, zone, at],
        )
        assert cursor.fetchone() == window_bounds(window, zone, at)


def test_a_waiting_claim_is_due_when_its_pause_reaches_the_windows_end(scope):
    paused = budget(scope, limit_usd=1)
    work(scope, cost_usd=1)
    store.create_todo(scope, queue="q")
    assert store.next_due(scope, 1) is None
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE budgets SET window_end = now() + interval '20 seconds',"
            " in_force_until = now() + interval '20 seconds' WHERE id = %s",
            [paused.id],
        )
    assert 15 < store.next_due(scope, 60) <= 20
    assert store.next_due(store.Scope(scope.endpoint_id, ("other",)), 60) is None
