"""Budgets and what their scope spent in the current window (CONTRACT §18)."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection

from todos import store
from todos.store.budgets import window_bounds


def spend(scope, queue="q", group=None, **usage):
    store.report_usage(scope, queue=queue, group=group, usage=usage)


def test_a_budget_reads_what_its_queue_spent_in_the_window_and_what_is_left(scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=5, limit_tokens=1000
    )
    spend(scope, cost_usd=1.25, input_tokens=300)
    spend(scope, queue="other", cost_usd=9)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w")
    store.complete_todo(
        scope, todo.id, "w", usage={"cost_usd": 0.5, "output_tokens": 9}
    )

    read = store.get_budget(scope, budget.id)

    assert (read.spent_usd, read.spent_tokens) == (Decimal("1.75"), 309)
    assert (read.left_usd, read.left_tokens) == (Decimal("3.25"), 691)
    assert read.to_dict()["left_usd"] == 3.25


def test_an_endpoint_budget_counts_every_queue_and_a_group_budget_its_group(scope):
    whole = store.create_budget(scope, scope="endpoint", window="hour", limit_usd=10)
    group = store.create_budget(
        scope, scope="group", queue="q", group="g", window="hour", limit_usd=10
    )
    spend(scope, cost_usd=1)
    spend(scope, queue="r", cost_usd=2)
    spend(scope, group="g", cost_usd=4)
    by_id = {budget.id: budget for budget in store.list_budgets(scope)}
    assert by_id[whole.id].spent_usd == 7
    assert by_id[group.id].spent_usd == 4


def test_spend_before_the_window_does_not_count(scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="hour", limit_usd=1
    )
    spend(scope, cost_usd=0.75)
    # Two hours pass: the report, and the window the budget counted it in,
    # move into the past.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE usage_ledger SET reported_at = reported_at - interval '2 hours'"
        )
        cursor.execute(
            "UPDATE budgets SET window_start = window_start - interval '2 hours',"
            " window_end = window_end - interval '2 hours'"
        )
    assert store.get_budget(scope, budget.id).spent_usd == 0


def test_the_window_is_read_in_the_budgets_time_zone():
    now = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # 01:30 in Berlin, DST day
    start, end = window_bounds("day", "Europe/Berlin", now)
    assert start == datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    assert end == datetime(2026, 3, 29, 22, 0, tzinfo=UTC)  # a 23-hour day
    start, end = window_bounds("month", "America/New_York", now)
    assert start == datetime(2026, 3, 1, 5, 0, tzinfo=UTC)
    assert end == datetime(2026, 4, 1, 4, 0, tzinfo=UTC)
    start, end = window_bounds("month", "UTC", datetime(2026, 12, 9, tzinfo=UTC))
    assert end == datetime(2027, 1, 1, tzinfo=UTC)


def test_update_changes_only_the_fields_given(scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=5
    )
    changed = store.update_budget(scope, budget.id, limit_usd=8, action="reject_new")
    assert (changed.limit_usd, changed.action, changed.window) == (
        Decimal(8),
        "reject_new",
        "day",
    )


def test_delete_removes_the_budget(scope):
    budget = store.create_budget(scope, scope="endpoint", window="day", limit_usd=5)
    store.delete_budget(scope, budget.id)
    with pytest.raises(store.NotFound):
        store.get_budget(scope, budget.id)


def test_another_endpoints_budget_is_not_found(scope, other_scope):
    budget = store.create_budget(scope, scope="endpoint", window="day", limit_usd=5)
    with pytest.raises(store.NotFound):
        store.get_budget(other_scope, budget.id)
    with pytest.raises(store.NotFound):
        store.delete_budget(other_scope, budget.id)
    with pytest.raises(store.NotFound):
        store.get_budget(scope, "not-an-id")


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"scope": "queue", "window": "day", "limit_usd": 1}, "queue"),
        ({"scope": "group", "queue": "q", "window": "day", "limit_usd": 1}, "group"),
        ({"scope": "endpoint", "queue": "q", "window": "day", "limit_usd": 1}, "scope"),
        ({"scope": "endpoint", "window": "week", "limit_usd": 1}, "window"),
        ({"scope": "endpoint", "window": "day"}, "limit_usd"),
        ({"scope": "endpoint", "window": "day", "limit_usd": -1}, "limit_usd"),
        (
            {
                "scope": "endpoint",
                "window": "day",
                "limit_usd": 1,
                "time_zone": "Mars/Olympus",
            },
            "time_zone",
        ),
        (
            {"scope": "endpoint", "window": "day", "limit_usd": 1, "soft_percent": 0},
            "soft_percent",
        ),
        (
            {"scope": "endpoint", "window": "day", "limit_usd": 1, "action": "explode"},
            "action",
        ),
    ],
)
def test_a_bad_budget_is_refused_naming_the_field(scope, given, field):
    with pytest.raises(store.InvalidBudget) as caught:
        store.create_budget(scope, **given)
    assert caught.value.field == field


def test_a_budget_outside_the_grant_is_refused(make_endpoint):
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("q",)))
    with pytest.raises(store.QueueNotGranted):
        store.create_budget(narrow, scope="queue", queue="r", window="day", limit_usd=1)
    with pytest.raises(store.QueueNotGranted):
        store.create_budget(narrow, scope="endpoint", window="day", limit_usd=1)
