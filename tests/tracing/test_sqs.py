"""SQS keeps the trace: boto3's SendMessage with AWSTraceHeader, served by a
real gunicorn whose tracing exports to a receiver the test starts."""

import time

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.sqs.conftest import client_for
from tests.support import database_url, start_gunicorn, stop
from tests.tracing.receiver import received_spans, receiving
from todos import store
from todos.sqs import credentials

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = "5759e988bd862e3fe1be46a994272793"
PARENT = "53995c3f42cd8ad8"
X_RAY = f"Root=1-{ROOT[:8]}-{ROOT[8:]};Parent={PARENT};Sampled=1"


@pytest.fixture(scope="module")
def traced_server(django_db_setup, django_db_blocker):
    """gunicorn with tracing on, exporting to this module's receiver."""
    with receiving() as (url, received):
        with django_db_blocker.unblock():
            process, port = start_gunicorn(
                database_url(),
                OTEL_EXPORTER_OTLP_ENDPOINT=url,
                OTEL_SERVICE_NAME="switchboard-sqs",
                OTEL_BSP_SCHEDULE_DELAY="50",
            )
        try:
            yield f"http://127.0.0.1:{port}", received
        finally:
            stop(process)


@pytest.fixture
def sqs(make_endpoint, traced_server):
    url, _ = traced_server
    endpoint = make_endpoint("sqs-agent")
    issued = credentials.issue(endpoint)
    client = client_for(url, issued.access_key_id, issued.secret_access_key)
    return endpoint, client


def spans_named(received, *names, timeout=10.0):
    """The receiver's spans once every name has arrived (the batch exporter
    sends within its schedule delay)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = received_spans(received, service="switchboard-sqs")
        found = {span.name for span in spans}
        if set(names) <= found or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def test_send_message_with_an_aws_trace_header_keeps_the_trace_to_the_receive(sqs):
    endpoint, client = sqs
    queue_url = client.create_queue(QueueName="traced")["QueueUrl"]

    sent = client.send_message(
        QueueUrl=queue_url,
        MessageBody="build it",
        MessageSystemAttributes={
            "AWSTraceHeader": {"DataType": "String", "StringValue": X_RAY}
        },
    )

    [todo] = store.list_todos(store.Scope.for_endpoint(endpoint)).todos
    assert todo.id == sent["MessageId"]
    assert todo.trace_context["traceparent"].startswith(f"00-{ROOT}-")
    received = client.receive_message(
        QueueUrl=queue_url,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["AWSTraceHeader"],
    )
    [message] = received["Messages"]
    traceparent = message["MessageAttributes"]["traceparent"]["StringValue"]
    assert traceparent.startswith(f"00-{ROOT}-")
    assert message["Attributes"]["AWSTraceHeader"].startswith(
        f"Root=1-{ROOT[:8]}-{ROOT[8:]};Parent={traceparent[36:52]};"
    )
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def test_the_served_spans_continue_the_senders_x_ray_trace(sqs, traced_server):
    _, received = traced_server
    endpoint, client = sqs
    queue_url = client.create_queue(QueueName="wired")["QueueUrl"]
    client.send_message(
        QueueUrl=queue_url,
        MessageBody="ship it",
        MessageSystemAttributes={
            "AWSTraceHeader": {"DataType": "String", "StringValue": X_RAY}
        },
    )
    [message] = client.receive_message(
        QueueUrl=queue_url, MessageAttributeNames=["traceparent"]
    )["Messages"]
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])

    spans = spans_named(received, "send wired", "process wired", "settle wired")
    named = {span.name: span for span in spans if span.name.endswith(" wired")}
    send, process = named["send wired"], named["process wired"]
    assert send.kind == Span.SPAN_KIND_PRODUCER
    assert send.trace_id.hex() == ROOT and send.parent_span_id.hex() == PARENT
    assert process.parent_span_id == send.span_id
    traceparent = message["MessageAttributes"]["traceparent"]["StringValue"]
    assert traceparent[36:52] == process.span_id.hex()
    assert named["settle wired"].parent_span_id == process.span_id


def test_a_traceparent_message_attribute_is_taken_when_there_is_no_trace_header(
    sqs,
):
    endpoint, client = sqs
    queue_url = client.create_queue(QueueName="attributed")["QueueUrl"]
    traceparent = f"00-{ROOT}-{PARENT}-01"

    client.send_message(
        QueueUrl=queue_url,
        MessageBody="x",
        MessageAttributes={
            "traceparent": {"DataType": "String", "StringValue": traceparent}
        },
    )

    [todo] = store.list_todos(store.Scope.for_endpoint(endpoint)).todos
    assert todo.trace_context["traceparent"].startswith(f"00-{ROOT}-")


def test_a_malformed_aws_trace_header_is_ignored(sqs):
    endpoint, client = sqs
    queue_url = client.create_queue(QueueName="garbled")["QueueUrl"]

    client.send_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {
                "Id": "a",
                "MessageBody": "x",
                "MessageSystemAttributes": {
                    "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=no"}
                },
            },
            {
                "Id": "b",
                "MessageBody": "y",
                "MessageSystemAttributes": {
                    "AWSTraceHeader": {"DataType": "String", "StringValue": X_RAY}
                },
            },
        ],
    )

    todos = store.list_todos(store.Scope.for_endpoint(endpoint)).todos
    by_body = {todo.title: todo for todo in todos}
    assert by_body["x"].trace_context is not None  # the server's own send span
    assert not by_body["x"].trace_context["traceparent"].startswith(f"00-{ROOT}-")
    assert by_body["y"].trace_context["traceparent"].startswith(f"00-{ROOT}-")
