"""Trace context through the client (docs/client.md "Tracing"): a create sends
the caller's current span, and the worker runs each handler in its todo's
delivery, so the agent's spans nest under the server's ``process`` span.

The agent's spans go to an SDK tracer provider of the test's own, in memory;
the in-process server's spans to its own (todos.telemetry.tracing), also in
memory, so one test sees both sides of the trace.
"""

import asyncio
import subprocess
import sys
import time

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from switchboard_client import Client, Context, Worker

from tests.client.conftest import CLIENT_SRC, QUICK_RETRY
from tests.client.test_worker import Running
from todos.telemetry import tracing

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


@pytest.fixture
def agent():
    """The agent's tracer (``.tracer``) and what it recorded (``.exporter``)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.tracer = provider.get_tracer("agent")
    provider.exporter = exporter
    yield provider
    provider.shutdown()


@pytest.fixture
def server_spans():
    """The in-process server traces, into memory."""
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.disable()


@pytest.fixture
def serve(asgi_server, endpoint):
    """Serve a worker's handlers in a thread until the test ends."""
    running = []

    def start(handler):
        client = Client(asgi_server.url, endpoint.token, worker="rt", retry=QUICK_RETRY)
        worker = Worker(client, wait_seconds=1)
        worker.handler("reviews")(handler)
        running.append(Running(worker))

    yield start
    for run in running:
        run.stop()


def finished(exporter, name, timeout=5.0):
    """The finished spans named ``name``, once there is one: the server ends a
    delivery's span after its complete's statement, so a reader that saw the
    todo done may be a moment ahead of it."""
    deadline = time.monotonic() + timeout
    while True:
        found = [s for s in exporter.get_finished_spans() if s.name == name]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def hex_ids(span):
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def traceparent(span):
    """The span's W3C traceparent (the SDK sets the random-id flag beside
    the sampled one)."""
    trace_id, span_id = hex_ids(span)
    return f"00-{trace_id}-{span_id}-{int(span.get_span_context().trace_flags):02x}"


def test_a_create_inside_a_span_keeps_the_callers_context(client, agent):
    with agent.tracer.start_as_current_span("plan") as span:
        todo = client.create("reviews", title="PR 7").todo
    assert todo.trace_context == {"traceparent": traceparent(span)}


def test_a_create_sends_the_tracestate_with_the_traceparent(client):
    state = TraceState([("vendor", "opaque")])
    parent = SpanContext(
        int(TRACE, 16), int(SPAN, 16), True, TraceFlags(1), trace_state=state
    )
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        todo = client.create("reviews").todo
    finally:
        otel_context.detach(token)
    assert todo.trace_context == {
        "traceparent": f"00-{TRACE}-{SPAN}-01",
        "tracestate": "vendor=opaque",
    }


def test_a_create_outside_any_span_sends_no_context(client):
    assert client.create("reviews").todo.trace_context is None


def test_a_batch_create_gives_each_todo_the_callers_context(client, agent):
    with agent.tracer.start_as_current_span("fan out") as span:
        results = client.create_many([{"queue": "a"}, {"queue": "b"}])
    assert [r.created.todo.trace_context for r in results] == [
        {"traceparent": traceparent(span)}
    ] * 2


def test_the_async_client_sends_the_context_of_the_task_that_creates(
    aclient_factory, agent
):
    async def create_in_spans():
        async with aclient_factory() as aclient:

            async def one(name):
                with agent.tracer.start_as_current_span(name) as span:
                    todo = (await aclient.create("reviews")).todo
                return traceparent(span), todo.trace_context

            return await asyncio.gather(one("first"), one("second"))

    for sent, context in asyncio.run(create_in_spans()):
        assert context == {"traceparent": sent}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handlers_spans_nest_under_its_deliverys_process_span(
    kind, client, serve, agent, server_spans
):
    seen = []

    def handle(ctx: Context):
        with agent.tracer.start_as_current_span("llm call"):
            seen.append(ctx.todo.trace_context)
        return {"ok": True}

    async def ahandle(ctx: Context):
        return handle(ctx)

    with agent.tracer.start_as_current_span("webhook received") as caller:
        todo = client.create("reviews").todo
    serve(handle if kind == "sync" else ahandle)
    assert client.wait(todo, timeout=10).outcome == "done"

    [llm] = [s for s in agent.exporter.get_finished_spans() if s.name == "llm call"]
    [process] = finished(server_spans, "process reviews")
    [send] = [s for s in server_spans.get_finished_spans() if s.name == "send reviews"]
    caller_trace, caller_span = hex_ids(caller)
    assert hex_ids(send)[0] == caller_trace
    assert send.parent.span_id == int(caller_span, 16)
    assert process.parent.span_id == send.context.span_id
    assert llm.context.trace_id == process.context.trace_id == int(caller_trace, 16)
    assert llm.parent.span_id == process.context.span_id
    [handed] = seen
    assert handed["traceparent"][3:52] == "%s-%s" % hex_ids(process)  # noqa: UP031


def test_a_handler_of_a_todo_without_context_starts_its_own_trace(client, serve, agent):
    def handle(ctx: Context):
        with agent.tracer.start_as_current_span("llm call"):
            return {"ok": True}

    todo = client.create("reviews").todo
    serve(handle)
    assert client.wait(todo, timeout=10).outcome == "done"
    [llm] = agent.exporter.get_finished_spans()
    assert llm.parent is None


def test_the_client_works_without_opentelemetry_installed():
    """The tracing extra is optional: with ``opentelemetry`` unimportable, a
    create sends no context and a handler runs as it is."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if not installed
from switchboard_client import _core, _tracing
assert _tracing.headers() is None
assert _core.create("q").headers is None
with _tracing.within({"traceparent": "00-%s-%s-01"}):
    pass
print("ok")
""" % (TRACE, SPAN)  # noqa: UP031
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(CLIENT_SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stderr
