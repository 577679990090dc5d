"""A delivery's usage on its process span (CONTRACT §18, §19): the
``gen_ai.usage.*`` attributes of what the agent last reported for that
delivery, its cost as ``switchboard.usage.cost_usd``, its model as the
request's and the response's."""

from todos import store

from .test_spans import process_spans

USAGE = {"input_tokens": 1200, "output_tokens": 80, "cost_usd": 0.42, "model": "m-7"}


def test_a_completes_usage_is_on_its_delivery_span(spans, scope):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w1")

    store.complete_todo(scope, todo.id, "w1", usage=USAGE)

    [span] = process_spans(spans)
    assert span.attributes["gen_ai.usage.input_tokens"] == 1200
    assert span.attributes["gen_ai.usage.output_tokens"] == 80
    assert span.attributes["switchboard.usage.cost_usd"] == 0.42
    assert span.attributes["gen_ai.request.model"] == "m-7"
    assert span.attributes["gen_ai.response.model"] == "m-7"
    [settle] = [s for s in spans.get_finished_spans() if s.name == "settle q"]
    assert "gen_ai.usage.input_tokens" not in settle.attributes


def test_a_heartbeats_running_total_is_on_the_span_of_a_failed_delivery(spans, scope):
    todo, _ = store.create_todo(scope, queue="q", max_attempts=3)
    store.claim_next(scope, "w1")
    store.heartbeat(scope, todo.id, "w1", usage={"input_tokens": 10, "cost_usd": 0.1})
    store.heartbeat(scope, todo.id, "w1", usage={"input_tokens": 30, "cost_usd": 0.3})

    store.fail_todo(scope, todo.id, "w1", error="boom", usage={"output_tokens": 5})

    [span] = process_spans(spans)
    assert span.attributes["gen_ai.usage.input_tokens"] == 30
    assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert span.attributes["switchboard.usage.cost_usd"] == 0.3
    assert "gen_ai.request.model" not in span.attributes


def test_a_lapsed_delivery_carries_its_last_report_and_the_next_none(
    spans, scope, time_travel
):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w1")
    store.heartbeat(scope, todo.id, "w1", usage={"input_tokens": 7})
    time_travel(todo.id, lease_expires_at=-3600)
    store.claim_next(scope, "w2")

    store.complete_todo(scope, todo.id, "w2")

    [lapsed, completed] = process_spans(spans)
    assert lapsed.attributes["messaging.switchboard.outcome"] == "lapsed"
    assert lapsed.attributes["gen_ai.usage.input_tokens"] == 7
    assert "gen_ai.usage.input_tokens" not in completed.attributes


def test_a_delivery_without_usage_has_no_usage_attributes(spans, scope):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w1")

    store.complete_todo(scope, todo.id, "w1")

    [span] = process_spans(spans)
    assert not any(name.startswith("gen_ai.") for name in span.attributes)
