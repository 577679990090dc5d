"""The exporter's own encoding (todos.telemetry.otlp) writes what the SDK's would.

Each test encodes the same finished spans with ``otlp.encode`` and with the
OTLP exporter's own ``encode_spans``, and reads ours back with
opentelemetry-proto: the two requests are equal, field for field.
"""

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from tests.tracing.receiver import received_spans, receiving
from todos import store
from todos.telemetry import otlp, tracing

REMOTE = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "a1"), ("other", "b2")]),
)


def decoded(spans):
    return ExportTraceServiceRequest.FromString(otlp.encode(spans))


def assert_encoded_alike(spans):
    ours, theirs = decoded(spans), encode_spans(spans)
    assert ours == theirs
    assert len(otlp.encode(spans)) == len(theirs.SerializeToString())


@pytest.fixture
def finished():
    """Two tracers of one provider; the spans they end, kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "t", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ours = provider.get_tracer("switchboard", "1.0", schema_url="https://s/1.0")
    theirs = provider.get_tracer("other")
    yield exporter, ours, theirs
    provider.shutdown()


def test_every_kind_of_value_event_link_and_status_encodes_as_the_sdk_does(finished):
    exporter, tracer, other = finished
    remote_parent = set_span_in_context(NonRecordingSpan(REMOTE))
    for number in range(12):
        span = tracer.start_span(
            f"process q{number % 3}",
            context=remote_parent if number % 2 else None,
            kind=list(SpanKind)[number % 5],
            attributes={
                "text": f"q{number % 3}",
                "empty": "",
                "unicode": "ünïcode ✓",
                "int": number - 6,
                "zero": 0,
                "int64": -(1 << 40),
                "bool": number % 2 == 0,
                "float": number / 7,
                "texts": ("a", "b"),
                "ints": [1, -2, 3],
                "shared": "same",
            },
            links=[Link(REMOTE, {"link": "previous", "shared": "same"})]
            if number % 2
            else [],
        )
        span.add_event("progress", {"fraction": 0.5, "shared": "same", "n": 1})
        span.add_event("bare")
        if number % 3 == 0:
            span.set_status(Status(StatusCode.ERROR, "linker crashed"))
        elif number % 3 == 1:
            span.set_status(Status(StatusCode.OK))
        child = tracer.start_span("settle", context=set_span_in_context(span))
        child.end()
        span.end()
        with other.start_as_current_span("another scope"):
            pass

    spans = exporter.get_finished_spans()
    assert_encoded_alike(spans)
    # The same attribute under a span, an event and a link is encoded once for
    # each: the remembered bytes carry their field.
    assert_encoded_alike(spans)


def test_spans_of_two_resources_group_as_the_sdk_groups_them():
    exporter = InMemorySpanExporter()
    spans = []
    for name in ("a", "b", "a"):
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("switchboard").start_span(f"from {name}").end()
        spans = exporter.get_finished_spans()
    assert len(spans) == 3

    assert_encoded_alike(spans)
    assert len(decoded(spans).resource_spans) == 2


def test_a_journey_of_switchboard_spans_encodes_as_the_sdk_does(
    spans, scope, time_travel
):
    parent = tracing.parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    todo, _ = store.create_todo(scope, queue="builds", trace_context=parent)
    store.claim_next(scope, "w1")
    store.heartbeat(scope, todo.id, "w1", progress={"message": "half", "fraction": 0.5})
    store.fail_todo(scope, todo.id, "w1", error="linker crashed")
    time_travel(todo.id, next_retry_at=-3600)
    store.claim_next(scope, "w2")
    store.complete_todo(scope, todo.id, "w2", result={"ok": True})

    finished = spans.get_finished_spans()
    assert len(finished) == 5
    assert_encoded_alike(finished)


def test_the_exporter_posts_the_encoded_spans_to_its_endpoint(finished):
    exporter, tracer, _ = finished
    tracer.start_span("send q", attributes={"messaging.system": "switchboard"}).end()
    with receiving() as (url, received):
        sender = otlp.SpanExporter(endpoint=f"{url}/v1/traces")
        assert sender.export(exporter.get_finished_spans()) == SpanExportResult.SUCCESS
        sender.shutdown()

        assert sender.export(exporter.get_finished_spans()) == SpanExportResult.FAILURE
    [(path, kind, _)] = received
    assert (path, kind) == ("/v1/traces", "application/x-protobuf")
    [span] = received_spans(received, service="t")
    assert span.name == "send q"


def test_the_exporter_reports_a_refused_export_as_failed(finished, monkeypatch):
    exporter, tracer, _ = finished
    tracer.start_span("send q").end()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    # Nothing listens there: the post fails (connection refused), after the
    # client's one immediate retry.
    sender = otlp.SpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout=1)

    assert sender.export(exporter.get_finished_spans()) == SpanExportResult.FAILURE
