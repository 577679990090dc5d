"""Usage reports on acknowledgements and outside a todo (CONTRACT §18)."""

from decimal import Decimal

import pytest

from tests.conftest import shift
from todos import store


def claimed(scope, worker="w1", **fields):
    todo, _ = store.create_todo(scope, queue="q", **fields)
    return store.claim_todo(scope, todo.id, worker)


def ledger(scope, todo_id=None):
    return store.usage_ledger(scope, todo_id=todo_id)


def test_a_heartbeat_report_replaces_the_attempts_last_one_never_adds(scope):
    todo = claimed(scope)
    store.heartbeat(scope, todo.id, "w1", usage={"input_tokens": 100, "cost_usd": 0.1})
    beat = store.heartbeat(
        scope, todo.id, "w1", usage={"input_tokens": 250, "cost_usd": 0.25}
    )
    assert beat.usage == {"input_tokens": 250, "output_tokens": 0, "cost_usd": 0.25}
    (row,) = ledger(scope, todo.id)
    assert (row.input_tokens, row.cost_usd, row.attempt) == (250, Decimal("0.25"), 1)


def test_a_field_left_out_keeps_the_attempts_last_value(scope):
    todo = claimed(scope)
    store.heartbeat(
        scope, todo.id, "w1", usage={"input_tokens": 10, "model": "claude-x"}
    )
    done = store.complete_todo(
        scope, todo.id, "w1", usage={"output_tokens": 5, "cost_usd": 0.01}
    )
    assert done.usage == {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.01}
    (row,) = ledger(scope, todo.id)
    assert (row.input_tokens, row.output_tokens, row.model) == (10, 5, "claude-x")


def test_a_retried_complete_with_the_same_lease_token_counts_once(scope):
    todo = claimed(scope)
    usage = {"input_tokens": 7, "cost_usd": 1.5}
    store.complete_todo(scope, todo.id, None, lease_token=todo.lease_token, usage=usage)
    again = store.complete_todo(
        scope, todo.id, None, lease_token=todo.lease_token, usage=usage
    )
    assert again.state == "done" and again.usage["cost_usd"] == 1.5
    assert [row.cost_usd for row in ledger(scope, todo.id)] == [Decimal("1.5")]


def test_a_superseded_lease_reports_nothing(scope):
    todo = claimed(scope)
    shift(todo.id, lease_expires_at=-600)
    taken = store.claim_next(scope, "w2")
    with pytest.raises(store.LeaseSuperseded):
        store.heartbeat(
            scope, todo.id, None, lease_token=todo.lease_token, usage={"cost_usd": 9}
        )
    assert ledger(scope, todo.id) == [] and taken.usage is None


def test_each_attempt_has_its_own_row_and_the_todo_sums_them(scope):
    todo = claimed(scope)
    store.fail_todo(scope, todo.id, "w1", error="boom", usage={"cost_usd": 0.3})
    store.retry_todo(scope, todo.id)
    store.claim_todo(scope, todo.id, "w2")
    store.heartbeat(scope, todo.id, "w2", usage={"cost_usd": 0.1, "input_tokens": 3})
    done = store.complete_todo(scope, todo.id, "w2", usage={"cost_usd": 0.2})
    assert done.usage == {"input_tokens": 3, "output_tokens": 0, "cost_usd": 0.5}
    rows = ledger(scope, todo.id)
    assert [(r.attempt, r.cost_usd) for r in rows] == [
        (1, Decimal("0.3")),
        (2, Decimal("0.2")),
    ]


def test_an_attempt_given_back_by_a_question_keeps_its_spend(scope):
    """Asking gives the attempt back; the next delivery's report is its own row."""
    todo = claimed(scope)
    store.heartbeat(scope, todo.id, "w1", usage={"cost_usd": 1})
    store.ask(scope, todo.id, "w1", question="which?", return_to="pool")
    store.answer_todo(scope, todo.id, answer="this")
    again = store.claim_next(scope, "w2")
    assert again.attempt == 1
    done = store.complete_todo(scope, todo.id, "w2", usage={"cost_usd": 2})
    assert done.usage["cost_usd"] == 3
    assert sum(r.cost_usd for r in ledger(scope, todo.id)) == 3


def test_an_acknowledgement_without_usage_keeps_the_attempts_figure(scope):
    """An acknowledgement that reports nothing leaves the todo's usage, the
    attempt's figure and the ledger as the last report made them."""
    todo = claimed(scope)
    other = claimed(scope)
    for each in (todo, other):
        store.heartbeat(scope, each.id, "w1", usage={"input_tokens": 9, "model": "m"})
    done = store.complete_todo(scope, todo.id, "w1")
    failed, beat = store.acknowledge_many(
        scope,
        [
            store.Ack("fail", other.id, "w1", error="boom"),
            store.Ack("heartbeat", todo.id, "w1"),
        ],
    )
    assert isinstance(beat, store.Conflict)
    for each in (done, failed):
        assert each.usage == {"input_tokens": 9, "output_tokens": 0, "cost_usd": 0}
        assert each.attempt_usage["input_tokens"] == 9
        (row,) = ledger(scope, each.id)
        assert (row.input_tokens, row.model) == (9, "m")


def test_the_history_shows_each_reports_attempt_figure(scope):
    todo = claimed(scope)
    store.heartbeat(scope, todo.id, "w1", usage={"output_tokens": 4})
    store.complete_todo(scope, todo.id, "w1")
    events = store.todo_events_any_endpoint(todo.id)
    beat, done = events[-2], events[-1]
    assert beat.usage["output_tokens"] == 4 and beat.usage["attempt"] == 1
    assert done.usage is None


def test_a_batch_action_reports_usage(scope):
    todo = claimed(scope)
    (result,) = store.acknowledge_many(
        scope, [store.Ack("complete", todo.id, "w1", usage={"cost_usd": 0.75})]
    )
    assert result.usage["cost_usd"] == 0.75


def test_a_batch_with_one_report_among_plain_actions_records_it(scope):
    """A batch runs the ledger's step when any of its actions carries usage."""
    todos = [claimed(scope) for _ in range(3)]
    plain, reported, also_plain = store.acknowledge_many(
        scope,
        [
            store.Ack("complete", todos[0].id, "w1"),
            store.Ack("complete", todos[1].id, "w1", usage={"cost_usd": 0.5}),
            store.Ack("fail", todos[2].id, "w1", error="x"),
        ],
    )
    assert plain.usage is None and also_plain.usage is None
    assert reported.usage["cost_usd"] == 0.5
    assert [row.todo_id for row in ledger(scope)] == [todos[1].id]


@pytest.mark.parametrize(
    ("usage", "named"),
    [
        ({"input_tokens": -1}, "usage.input_tokens"),
        ({"output_tokens": 1.5}, "usage.output_tokens"),
        ({"output_tokens": "3"}, "usage.output_tokens"),
        ({"cost_usd": -0.01}, "usage.cost_usd"),
        ({"cost_usd": True}, "usage.cost_usd"),
        ({"model": 3}, "usage.model"),
        ({"model": "m" * 201}, "usage.model"),
        ({"tokens": 3}, "usage.tokens"),
        ("lots", "usage"),
    ],
)
def test_a_bad_usage_is_refused_naming_the_field(scope, usage, named):
    todo = claimed(scope)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        store.heartbeat(scope, todo.id, "w1", usage=usage)
    assert ledger(scope, todo.id) == []


def test_usage_outside_a_todo_is_recorded_against_a_queue(scope):
    report, created = store.report_usage(
        scope, queue="planning", usage={"input_tokens": 50, "cost_usd": 0.02}
    )
    assert created and report.todo_id is None and report.queue == "planning"
    assert report.to_dict()["cost_usd"] == 0.02


def test_a_repeated_outside_report_with_its_key_counts_once(scope):
    usage = {"cost_usd": 0.5}
    first, _ = store.report_usage(scope, queue="q", usage=usage, idempotency_key="k")
    again, created = store.report_usage(
        scope, queue="q", usage=usage, idempotency_key="k"
    )
    assert not created and again.id == first.id
    assert len(ledger(scope)) == 1


def test_usage_outside_the_grant_is_refused(make_endpoint):
    scope = store.Scope.for_endpoint(make_endpoint("narrow", queues=("q",)))
    with pytest.raises(store.QueueNotGranted):
        store.report_usage(scope, queue="other", usage={"cost_usd": 1})


def test_an_empty_outside_report_is_refused(scope):
    with pytest.raises(ValueError, match="usage"):
        store.report_usage(scope, queue="q", usage={})
