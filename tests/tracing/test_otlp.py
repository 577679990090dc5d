"""Spans on the wire: OTLP over HTTP to a receiver the test starts.

No collector installs here, so the receiver is a small HTTP server that reads
what the SDK's OTLP/HTTP exporter posts to ``/v1/traces`` with
opentelemetry-proto's ``ExportTraceServiceRequest``, as a collector would.
Tracing is set up by ``todos.telemetry.tracing.configure`` from the OTEL_* environment
alone, as a deployment sets it.
"""

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.tracing.receiver import received_spans, receiving
from todos import store
from todos.telemetry import tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


@pytest.fixture
def receiver(monkeypatch):
    """A receiver on a free port, named to tracing by the OTEL_* environment."""
    with receiving() as (url, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "switchboard-under-test")
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        yield received
        tracing.disable()


def attributes(span):
    return {a.key: a.value for a in span.attributes}


def text(value):
    return value.string_value


def test_a_todo_retried_and_completed_reaches_an_otlp_receiver_over_http(
    receiver, scope, time_travel
):
    assert tracing.configure() is True
    parent = tracing.parse(f"00-{TRACE}-{SPAN}-01")
    todo, _ = store.create_todo(scope, queue="builds", trace_context=parent)
    first = store.claim_next(scope, "w1")
    store.heartbeat(
        scope, todo.id, "w1", progress={"message": "compiling", "fraction": 0.5}
    )
    store.fail_todo(scope, todo.id, "w1", error="linker crashed")
    time_travel(todo.id, next_retry_at=-3600)
    second = store.claim_next(scope, "w2")
    store.complete_todo(scope, todo.id, "w2", result={"ok": True})
    tracing.flush()

    assert receiver, "no export reached the receiver"
    paths = {path for path, _, _ in receiver}
    assert paths == {"/v1/traces"}
    assert {kind for _, kind, _ in receiver} == {"application/x-protobuf"}
    spans = received_spans(receiver, service="switchboard-under-test")
    named = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    assert sorted(named) == ["process builds", "send builds", "settle builds"]
    [send] = named["send builds"]
    failed, completed = sorted(
        named["process builds"],
        key=lambda s: attributes(s)["messaging.switchboard.delivery"].int_value,
    )
    settles = {
        text(attributes(s)["messaging.operation.name"]): s
        for s in named["settle builds"]
    }

    assert send.kind == Span.SPAN_KIND_PRODUCER
    assert send.trace_id.hex() == TRACE and send.parent_span_id.hex() == SPAN
    assert text(attributes(send)["messaging.system"]) == "switchboard"
    assert text(attributes(send)["messaging.message.id"]) == todo.id

    assert failed.kind == Span.SPAN_KIND_CONSUMER
    assert failed.trace_id.hex() == TRACE
    assert failed.parent_span_id == send.span_id
    assert first.trace_carrier()["traceparent"] == (
        f"00-{TRACE}-{failed.span_id.hex()}-01"
    )
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    [progress] = failed.events
    assert progress.name == "progress"
    progress_attributes = {a.key: a.value for a in progress.attributes}
    assert text(progress_attributes["switchboard.progress.message"]) == "compiling"
    assert progress_attributes["switchboard.progress.fraction"].double_value == 0.5
    assert attributes(failed)["messaging.switchboard.attempt"].int_value == 1
    assert settles["fail"].parent_span_id == failed.span_id

    assert completed.kind == Span.SPAN_KIND_CONSUMER
    assert completed.trace_id.hex() != TRACE and not completed.parent_span_id
    assert second.trace_carrier()["traceparent"] == (
        f"00-{completed.trace_id.hex()}-{completed.span_id.hex()}-03"
    )  # sampled, and a random trace id (the exporter sends no W3C flags)
    [link] = completed.links
    assert (link.trace_id, link.span_id) == (failed.trace_id, failed.span_id)
    assert attributes(completed)["messaging.switchboard.attempt"].int_value == 2
    assert settles["complete"].trace_id == completed.trace_id
    assert settles["complete"].parent_span_id == completed.span_id
    assert settles["complete"].kind == Span.SPAN_KIND_CLIENT


def test_the_exporter_posts_through_urllib3_unless_given_a_requests_session(
    monkeypatch,
):
    """urllib3 costs a post less than half of requests' CPU; a requests
    session (given, or a credential provider's) is still used as given."""
    import requests
    from opentelemetry.exporter.http.transport._requests import RequestsHTTPTransport
    from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport

    from todos.telemetry.otlp import SpanExporter

    url = "http://127.0.0.1:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")
    default = SpanExporter(endpoint=url)._client._transport
    given = SpanExporter(endpoint=url, session=requests.Session())._client._transport

    assert isinstance(default, Urllib3HTTPTransport)
    assert default._pool.connection_pool_kw["ca_certs"] == "/nonexistent/ca.pem"
    assert isinstance(given, RequestsHTTPTransport)
