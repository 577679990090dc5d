"""The spans of each way a delivery ends, and what the Board and the logs show."""

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from todos import store
from todos.telemetry import tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE}-b7ad6b7169203331-01"


def process_spans(spans):
    return sorted(
        (s for s in spans.get_finished_spans() if s.name.startswith("process ")),
        key=lambda s: s.attributes["messaging.switchboard.delivery"],
    )


def test_a_lapsed_lease_ends_its_delivery_when_the_reaper_sweeps_it(
    spans, scope, time_travel
):
    todo, _ = store.create_todo(scope, queue="q", trace_context=None)
    store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-3600)

    assert len(store.reap_expired()) == 1

    [lapsed] = process_spans(spans)
    assert lapsed.attributes["messaging.switchboard.outcome"] == "lapsed"
    assert lapsed.status.description == "lease expired"
    redelivered = store.claim_next(scope, "w2")
    link_target = redelivered.trace_carrier()
    assert link_target is not None
    store.complete_todo(scope, todo.id, "w2")
    [_, completed] = process_spans(spans)
    [link] = completed.links
    assert link.context.span_id == lapsed.context.span_id


@pytest.mark.parametrize("claim", ["next", "named"])
def test_a_claim_that_takes_a_lapsed_lease_ends_the_lapsed_delivery(
    spans, scope, time_travel, claim
):
    todo, _ = store.create_todo(scope, queue="q")
    first = store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-3600, claimed_at=-3700)

    if claim == "next":
        again = store.claim_next(scope, "w2")
    else:
        again = store.claim_todo(scope, todo.id, "w2")

    [lapsed] = process_spans(spans)
    assert lapsed.attributes["messaging.switchboard.outcome"] == "lapsed"
    assert lapsed.attributes["messaging.switchboard.delivery"] == 1
    assert lapsed.attributes["messaging.switchboard.attempt"] == 1
    assert "messaging.client.id" not in lapsed.attributes
    assert (
        f"{lapsed.context.span_id:016x}" == first.trace_carrier()["traceparent"][36:52]
    )
    lapsed_for = (lapsed.end_time - lapsed.start_time) / 1e9
    # From its claim to its lease's end: 300 s, moved 3 700 s and 3 600 s back.
    assert 399 <= lapsed_for <= 401
    store.complete_todo(scope, todo.id, "w2", lease_token=again.lease_token)
    [_, completed] = process_spans(spans)
    [link] = completed.links
    assert link.context.span_id == lapsed.context.span_id


def test_a_cancel_request_is_an_event_of_the_delivery_it_interrupts(spans, scope):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w1")

    store.cancel_todo(scope, todo.id, reason="superseded")
    store.release_todo(scope, todo.id, "w1")

    [process] = process_spans(spans)
    assert [event.name for event in process.events] == ["cancel requested"]
    assert process.attributes["messaging.switchboard.outcome"] == "canceled"
    [settle] = [s for s in spans.get_finished_spans() if s.name == "settle q"]
    assert settle.attributes["messaging.operation.name"] == "cancel"


def test_a_release_ends_the_delivery_without_settling_it(spans, scope):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w1")

    store.release_todo(scope, todo.id, "w1")

    [process] = process_spans(spans)
    assert process.attributes["messaging.switchboard.outcome"] == "release"
    assert process.attributes["messaging.client.id"] == "w1"
    assert not [s for s in spans.get_finished_spans() if s.name == "settle q"]


def test_a_fail_at_the_cap_settles_as_a_dead_letter(spans, scope):
    todo, _ = store.create_todo(scope, queue="q", max_attempts=1)
    store.claim_next(scope, "w1")

    store.fail_todo(scope, todo.id, "w1", error="boom")

    [settle] = [s for s in spans.get_finished_spans() if s.name == "settle q"]
    assert settle.attributes["messaging.operation.name"] == "dead_letter"


def test_a_batch_acknowledgement_ends_each_delivery(spans, scope):
    store.create_many(scope, [{"queue": "q"}, {"queue": "q"}])
    claimed = store.claim_many(scope, "w", limit=2)

    store.acknowledge_many(
        scope, [store.Ack("complete", todo.id, "w") for todo in claimed]
    )

    assert len(process_spans(spans)) == 2
    sends = [s for s in spans.get_finished_spans() if s.name == "send q"]
    assert len(sends) == 2


def test_an_unsampled_create_hands_on_an_unsampled_delivery_and_exports_none(scope):
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter), sampler=ParentBased(ALWAYS_OFF))
    try:
        unsampled = tracing.parse(f"00-{TRACE}-b7ad6b7169203331-00")
        todo, _ = store.create_todo(scope, queue="q", trace_context=unsampled)
        claimed = store.claim_next(scope, "w")
        store.complete_todo(scope, todo.id, "w")
    finally:
        tracing.disable()

    assert claimed.trace_carrier()["traceparent"].endswith("-00")
    assert exporter.get_finished_spans() == ()


def test_spans_carry_the_resource_and_scope_of_the_sdks_tracer(spans, scope):
    """Spans are written whole, not through the SDK's tracer: they still
    name the provider's resource and the ``switchboard`` scope as its would."""
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "w")
    store.complete_todo(scope, todo.id, "w")
    tracing._tracer.start_span("reference").end()

    *ours, reference = spans.get_finished_spans()
    assert [s.name for s in ours] == ["send q", "settle q", "process q"]
    for span in ours:
        assert span.resource is reference.resource
        assert span.instrumentation_scope == reference.instrumentation_scope


def test_the_span_limits_the_environment_sets_bound_each_span(scope, monkeypatch):
    """OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT and OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    as the SDK applies them: the oldest attributes beyond the count dropped
    (and counted), each text value cut to the length."""
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    try:
        todo, _ = store.create_todo(scope, queue="q")
        store.claim_next(scope, "w")
        store.heartbeat(scope, todo.id, "w", progress={"message": "halfway"})
        store.complete_todo(scope, todo.id, "w")
    finally:
        tracing.disable()

    finished = exporter.get_finished_spans()
    assert {s.name for s in finished} == {"send q", "process q", "settle q"}
    for span in finished:
        assert len(span.attributes) == 3
        assert span.dropped_attributes > 0
        texts = [v for v in span.attributes.values() if isinstance(v, str)]
        assert texts and all(len(text) <= 4 for text in texts)
    (process,) = [s for s in finished if s.name == "process q"]
    assert process.events[0].attributes["switchboard.progress.message"] == "half"


def traceparent_of(span):
    context = span.context
    return (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )


@pytest.mark.parametrize(
    "carried",
    [None, f"00-{TRACE}-b7ad6b7169203331-01", f"00-{TRACE}-b7ad6b7169203331-03"],
)
def test_a_claim_hands_out_the_traceparent_its_process_span_is_exported_with(
    spans, scope, carried
):
    """The flags too: the SDK sets W3C's random-trace-id flag (02) on a trace
    it started (the create's, a redelivery's own) and keeps a parent's."""
    todo, _ = store.create_todo(scope, queue="q", trace_context=tracing.parse(carried))
    first = store.claim_next(scope, "w1")
    store.release_todo(scope, todo.id, "w1")
    second = store.claim_next(scope, "w2")
    store.complete_todo(scope, todo.id, "w2")

    exported = [traceparent_of(span) for span in process_spans(spans)]
    handed_out = [t.trace_carrier()["traceparent"] for t in (first, second)]
    assert handed_out == exported
    # A trace the create started, and the redelivery's own, have random ids.
    first_flags = "01" if carried and carried.endswith("-01") else "03"
    assert [t[-2:] for t in handed_out] == [first_flags, "03"]


# --- The Board and the logs --------------------------------------------------------


@pytest.fixture
def traced_todo(scope):
    todo, _ = store.create_todo(
        scope, queue="q", trace_context=tracing.parse(TRACEPARENT)
    )
    return todo


def test_the_board_links_a_todos_trace_through_the_url_template(
    client, operator, traced_todo, settings
):
    settings.SWITCHBOARD_TRACE_URL = "https://jaeger.example/trace/{trace_id}?a=1&b=2"
    client.force_login(operator)

    page = client.get(f"/board/todos/{traced_todo.id}/").content.decode()

    assert f'<a href="https://jaeger.example/trace/{TRACE}?a=1&amp;b=2"' in page


def test_the_board_shows_the_trace_id_without_a_link_when_no_template_is_set(
    client, operator, traced_todo, settings
):
    settings.SWITCHBOARD_TRACE_URL = ""
    client.force_login(operator)

    page = client.get(f"/board/todos/{traced_todo.id}/").content.decode()

    assert f"<code>{TRACE}</code>" in page
    assert "jaeger" not in page


@pytest.mark.parametrize(
    "template",
    [
        "javascript:alert(1)//{trace_id}",
        "ftp://traces.example/{trace_id}",
        "https://traces.example/trace/",
        "//traces.example/{trace_id}",
    ],
)
def test_a_trace_url_that_is_not_an_http_template_is_refused(monkeypatch, template):
    from board.settings import env_trace_url

    monkeypatch.setenv("SWITCHBOARD_TRACE_URL", template)

    with pytest.raises(ImproperlyConfigured):
        env_trace_url("SWITCHBOARD_TRACE_URL")


def test_a_request_log_line_carries_its_todos_trace_id(client, endpoint, caplog):
    with caplog.at_level(logging.INFO, logger="switchboard.request"):
        response = client.post(
            "/api/v1/todos",
            {"queue": "q"},
            content_type="application/json",
            headers={
                "Authorization": f"Bearer {endpoint.token}",
                "traceparent": TRACEPARENT,
            },
        )

    assert response.status_code == 201
    [line] = [r for r in caplog.records if r.name == "switchboard.request"]
    assert line.fields["trace_id"] == TRACE
