"""The HTTP server span of each request (OpenTelemetry's Django instrumentation,
board.serving.requestspans), in the SDK's memory."""

import asyncio
import json
import threading

import pytest
from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode, get_current_span

from board.serving import requestspans
from todos.telemetry import tracing
from todos.web import threads

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"


@pytest.fixture
def spans(monkeypatch):
    """Tracing on with request spans asked for, every span kept in memory."""
    monkeypatch.setenv("OTEL_PYTHON_DJANGO_INSTRUMENT", "true")
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.disable()


def by_name(spans):
    named = {}
    for span in spans.get_finished_spans():
        named.setdefault(span.name, []).append(span)
    return named


def test_a_create_is_a_child_of_its_requests_server_span(client, endpoint, spans):
    created = client.post(
        "/api/v1/todos",
        {"queue": "q"},
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {endpoint.token}",
            "traceparent": TRACEPARENT,
        },
    )
    assert created.status_code == 201

    named = by_name(spans)
    [request] = named["POST api/v1/todos"]
    [send] = named["send q"]
    assert request.kind == SpanKind.SERVER
    assert format(request.context.trace_id, "032x") == TRACE
    assert format(request.parent.span_id, "016x") == SPAN
    assert request.attributes["http.route"] == "api/v1/todos"
    assert request.attributes["http.status_code"] == 201
    assert send.parent.span_id == request.context.span_id
    # The todo keeps the send span's context: the claim's process span is its child.
    stored = created.json()["todo"]["trace_context"]["traceparent"]
    assert stored.split("-")[2] == format(send.context.span_id, "016x")


def test_a_create_carrying_another_trace_than_its_request_is_a_child_of_that_one(
    client, endpoint, spans
):
    """An MCP ``_meta`` context names the message's trace: the send span
    follows it, not the HTTP request's."""
    client.post(
        "/api/v1/todos",
        {"queue": "q"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {endpoint.token}"},
    )
    request_span = tracing._tracer.start_span("request")  # a request in its own trace
    from opentelemetry.trace import use_span

    carried = tracing.parse(TRACEPARENT)
    with use_span(request_span, end_on_exit=True):
        sent = tracing.send("q", carried)

    assert sent.context is not None and sent.parent is not None
    assert format(sent.context.trace_id, "032x") == TRACE
    assert format(sent.parent.span_id, "016x") == SPAN


def asgi_request(path, headers=(), body=b"{}"):
    """Serve one POST through a new board.serving.asgi Handler: (status, sent)."""
    from board.serving.asgi import Handler

    handler = Handler()  # loads the middleware with tracing as it is now
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    sent = []

    async def run():
        requested = asyncio.Event()

        async def receive():
            if not requested.is_set():
                requested.set()
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            sent.append(message)

        await handler(scope, receive, send)

    asyncio.run(run())
    return sent[0]["status"], sent


def test_a_view_served_in_the_loop_has_its_server_span_made_in_the_loop(
    spans, monkeypatch
):
    """A claim (an async view, board.serving) is served in the event loop; its
    request span too, with no thread hop (Django would hop for a sync-only
    middleware)."""
    made_in = []
    middleware = requestspans.middleware_class()
    original = middleware.process_request

    def recording(self, request):
        made_in.append(threading.current_thread())
        return original(self, request)

    monkeypatch.setattr(middleware, "process_request", recording)

    status, _ = asgi_request(
        "/api/v1/todos/claim", headers=[(b"traceparent", TRACEPARENT.encode())]
    )

    assert status == 401  # no token: answered by the view, no database
    assert made_in == [threading.current_thread()]  # asyncio.run's own thread
    [request] = by_name(spans)["POST api/v1/todos/claim"]
    assert request.kind == SpanKind.SERVER
    assert format(request.parent.span_id, "016x") == SPAN
    assert request.attributes["http.route"] == "api/v1/todos/claim"
    assert request.attributes["http.status_code"] == 401


def test_a_request_whose_client_leaves_still_ends_its_span(spans, rf):
    """A waiting view is cancelled when its client goes: the span ends, in error."""

    async def waits(request):
        await asyncio.Event().wait()

    middleware = requestspans.request_spans(waits)

    async def leave():
        task = asyncio.create_task(middleware(rf.post("/api/v1/todos/claim")))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())

    [request] = by_name(spans)["POST api/v1/todos/claim"]
    assert request.status.status_code == StatusCode.ERROR
    assert request.attributes["error.type"] == "CancelledError"


def test_a_thread_call_runs_in_the_requests_trace(spans):
    """The sync work of a view served in the loop (an MCP create) is a child
    of the request's span."""

    async def in_a_span():
        with tracing._tracer.start_as_current_span("request") as span:
            seen = await threads.run_in_thread(get_current_span)
        return span, seen

    span, seen = asyncio.run(in_a_span())

    assert seen is span


def test_off_nothing_is_instrumented(client, endpoint, spans):
    tracing.disable()

    with pytest.raises(MiddlewareNotUsed):
        requestspans.request_spans(lambda request: None)
    assert not DjangoInstrumentor().is_instrumented_by_opentelemetry
    assert settings.MIDDLEWARE[0] == "board.serving.requestspans.request_spans"
    assert len(settings.MIDDLEWARE) == len(set(settings.MIDDLEWARE))
    client.post(
        "/api/v1/todos",
        {"queue": "q"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {endpoint.token}"},
    )
    assert spans.get_finished_spans() == ()


def test_on_each_request_has_one_server_span(client, db, spans):
    """The instrumentor's own middleware is not served beside ours."""
    assert DjangoInstrumentor().is_instrumented_by_opentelemetry
    assert [m for m in settings.MIDDLEWARE if "opentelemetry" in m] == []

    client.get("/healthz")

    servers = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == ["GET healthz"]
    assert json.dumps(dict(servers[0].attributes))  # plain attributes


@pytest.mark.parametrize(
    "environment",
    [
        {},
        {"OTEL_PYTHON_DJANGO_INSTRUMENT": "false"},
        {
            "OTEL_PYTHON_DJANGO_INSTRUMENT": "true",
            "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "flask, django",
        },
    ],
)
def test_with_tracing_on_requests_have_no_span_unless_asked(
    client, db, monkeypatch, environment
):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    try:
        assert not tracing.requests_traced()
        assert not DjangoInstrumentor().is_instrumented_by_opentelemetry
        with pytest.raises(MiddlewareNotUsed):
            requestspans.request_spans(lambda request: None)
        client.get("/healthz")
    finally:
        tracing.disable()

    assert exporter.get_finished_spans() == ()
