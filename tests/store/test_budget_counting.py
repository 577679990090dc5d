"""How a report counts against its budgets (CONTRACT §18).

A report that changes nothing but a budget's figures (its window is the
current one, no threshold is reached, no action is in force) gets them
added by one UPDATE of ``switchboard_budget_spend``; any other report goes
through ``switchboard_budget_count``, which rolls windows, marks thresholds
and returns events. Either way a budget must end exactly as the counting
function alone would leave it: a randomized run of reports, replacements
and decisions checks that against twin budgets counted by the function.
"""

import random
from decimal import Decimal

import pytest
from django.db import connection

from todos import store

STATE_SQL = """
SELECT spent_usd, spent_tokens, raised_usd, raised_tokens,
       soft_reached_at IS NOT NULL, exhausted_at IS NOT NULL,
       resumed_at IS NOT NULL, in_force_until IS NOT NULL,
       (SELECT array_agg(e.event ORDER BY e.id) FROM budget_events e
         WHERE e.budget_id = b.id)
  FROM budgets b WHERE b.id = %s
"""

COUNT_SQL = """
INSERT INTO budget_events (budget_id, endpoint_id, event, actor, detail)
SELECT budget_id, endpoint_id, event, actor, detail
  FROM switchboard_budget_count(%s, %s::numeric, %s::bigint)
"""


def state(budget_id):
    """A budget's figures, its marks and the events it recorded, in order."""
    with connection.cursor() as cursor:
        cursor.execute(STATE_SQL, [budget_id])
        return cursor.fetchone()


def count_directly(budget_id, usd, tokens):
    """Count a spend against a budget through the counting function alone."""
    with connection.cursor() as cursor:
        cursor.execute(COUNT_SQL, [budget_id, usd, tokens])


def counting_calls():
    """How often this transaction called switchboard_budget_count."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE funcname = 'switchboard_budget_count'"
        )
        return cursor.fetchone()[0]


@pytest.fixture
def tracked_functions(db):
    with connection.cursor() as cursor:
        cursor.execute("SET track_functions = 'pl'")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET track_functions")


def claimed(scope, count):
    """``count`` todos of queue q, each claimed by worker w."""
    todos = []
    for _ in range(count):
        todo, _ = store.create_todo(scope, queue="q")
        todos.append(store.claim_todo(scope, todo.id, "w"))
    return todos


def test_a_report_below_every_threshold_is_counted_without_the_function(
    scope, tracked_functions
):
    queue_budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=10
    )
    endpoint_budget = store.create_budget(
        scope, scope="endpoint", window="hour", limit_tokens=10_000
    )
    todo = claimed(scope, 1)[0]
    before = counting_calls()
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 1, "input_tokens": 100})
    store.complete_todo(
        scope, todo.id, "w", usage={"cost_usd": 2.5, "output_tokens": 900}
    )
    store.report_usage(scope, queue="q", usage={"cost_usd": 0.5})

    assert counting_calls() == before
    assert state(queue_budget.id)[:2] == (Decimal(3), 1000)
    assert state(endpoint_budget.id)[:2] == (Decimal(3), 1000)


def row_version(budget_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT ctid::text FROM budgets WHERE id = %s", [budget_id])
        return cursor.fetchone()[0]


def test_a_heartbeat_repeating_its_figures_writes_no_budget(scope):
    counted = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=10
    )
    todo = claimed(scope, 1)[0]
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 1, "input_tokens": 5})
    version = row_version(counted.id)
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 1, "input_tokens": 5})
    assert row_version(counted.id) == version
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 2, "input_tokens": 5})
    assert row_version(counted.id) != version
    assert state(counted.id)[:2] == (Decimal(2), 5)


def test_a_report_that_reaches_a_threshold_goes_through_the_function(
    scope, tracked_functions
):
    counted = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=10
    )
    todo = claimed(scope, 1)[0]
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 7})
    before = counting_calls()
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 8})

    assert counting_calls() == before + 1
    assert state(counted.id)[8] == ["budget.soft_limit"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_every_report_leaves_its_budgets_as_the_counting_function_would(
    scope, other_scope, seed
):
    rng = random.Random(seed)
    settings = [
        {"scope": "endpoint", "limit_usd": 6, "limit_tokens": 4000, "soft_percent": 50},
        {"scope": "queue", "queue": "q", "limit_usd": 4},
    ]
    pairs = [
        (
            store.create_budget(scope, window="day", **given).id,
            store.create_budget(other_scope, window="day", **given).id,
        )
        for given in settings
    ]
    todos = claimed(scope, 5)
    last = {todo.id: (Decimal(0), 0) for todo in todos}

    for step in range(40):
        kind = rng.choice(("heartbeat", "heartbeat", "outside", "decide"))
        if kind == "decide":
            budget_id, twin_id = rng.choice(pairs)
            if not state(budget_id)[5]:
                continue
            decision = rng.choice(("resume", "raise"))
            amount = {"amount_usd": 1.5} if decision == "raise" else {}
            store.decide_budget(scope, budget_id, decision, **amount)
            store.decide_budget(other_scope, twin_id, decision, **amount)
        else:
            usd = Decimal(rng.randint(0, 150)) / 100
            tokens = rng.randint(0, 600)
            usage = {"cost_usd": float(usd), "input_tokens": tokens}
            if kind == "heartbeat":
                todo = rng.choice(todos)
                store.heartbeat(scope, todo.id, "w", usage=usage)
                added = (usd - last[todo.id][0], tokens - last[todo.id][1])
                last[todo.id] = (usd, tokens)
            else:
                store.report_usage(scope, queue="q", usage=usage)
                added = (usd, tokens)
            for _, twin_id in pairs:
                count_directly(twin_id, *added)
        for budget_id, twin_id in pairs:
            assert state(budget_id) == state(twin_id), f"step {step}: {kind}"


def test_a_batch_of_reports_counts_each_against_the_budgets_it_falls_under(scope):
    endpoint_budget = store.create_budget(
        scope, scope="endpoint", window="day", limit_usd=100
    )
    q_budget = store.create_budget(
        scope, scope="queue", queue="q", window="hour", limit_tokens=100_000
    )
    r_budget = store.create_budget(
        scope, scope="queue", queue="r", window="day", limit_usd=100
    )
    first, second = claimed(scope, 2)
    other, _ = store.create_todo(scope, queue="r")
    other = store.claim_todo(scope, other.id, "w")
    store.heartbeat(scope, first.id, "w", usage={"cost_usd": 1, "input_tokens": 10})

    store.acknowledge_many(
        scope,
        [
            store.Ack(
                "heartbeat",
                first.id,
                "w",
                first.lease_token,
                usage={"cost_usd": 1.25, "input_tokens": 30},
            ),
            store.Ack(
                "complete",
                second.id,
                "w",
                second.lease_token,
                usage={"cost_usd": 2, "output_tokens": 200},
            ),
            store.Ack(
                "complete",
                other.id,
                "w",
                other.lease_token,
                usage={"cost_usd": 0.5, "input_tokens": 7},
            ),
        ],
    )

    assert state(endpoint_budget.id)[:2] == (Decimal("3.75"), 237)
    assert state(q_budget.id)[:2] == (Decimal("3.25"), 230)
    assert state(r_budget.id)[:2] == (Decimal("0.5"), 7)
    ledger = sum(row.cost_usd for row in store.usage_ledger(scope))
    assert ledger == state(endpoint_budget.id)[0]
