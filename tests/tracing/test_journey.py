"""One todo's trace across the surfaces (CONTRACT §19), in the SDK's memory.

A GitHub webhook delivery creates it, an agent claims it over MCP and asks,
an operator answers on the Board, the agent claims it again and completes it
over the JSON API: one trace for the first delivery (the webhook's), a trace
of its own for the redelivery, linked to the first.
"""

import json

import pytest
from opentelemetry.trace import SpanKind

from todos import store
from todos.models import WebhookRoute, WebhookSource
from todos.webhooks import signatures

SECRET = "it's-a-secret-to-everybody"
WEBHOOK_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
WEBHOOK_SPAN = "00f067aa0ba902b7"
SESSION_INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "pytest", "version": "1"},
    },
}


def deliver_pull_request(client, headers):
    body = json.dumps({"action": "opened", "number": 7}).encode()
    return client.post(
        "/hooks/acme-app",
        data=body,
        content_type="application/json",
        headers={
            "X-GitHub-Delivery": "delivery-7",
            "X-GitHub-Event": "pull_request",
            "X-Hub-Signature-256": signatures.sign(SECRET, body),
            **headers,
        },
    )


class Mcp:
    """An MCP session (2025-11-25) through a test client."""

    def __init__(self, client, token):
        self.client, self.token = client, token
        first = self.post(SESSION_INIT)
        self.session = first["Mcp-Session-Id"]

    def post(self, body):
        headers = {"Authorization": f"Bearer {self.token}"}
        if getattr(self, "session", None):
            headers["Mcp-Session-Id"] = self.session
        return self.client.post(
            "/mcp",
            data=json.dumps(body),
            content_type="application/json",
            headers=headers,
        )

    def call(self, tool, **arguments):
        response = self.post(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            }
        )
        assert response.status_code == 200, response.content
        result = response.json()["result"]
        assert not result["isError"], result
        return result


@pytest.fixture
def db(asgi_server, committed):
    """Committed: the agent surfaces answer on the served path (``served_client``)."""


def by_name(finished):
    named = {}
    for span in finished:
        named.setdefault(span.name, []).append(span)
    return named


def messaging(span, operation, todo_id, queue="github"):
    attributes = span.attributes
    assert attributes["messaging.system"] == "switchboard"
    assert attributes["messaging.destination.name"] == queue
    assert attributes["messaging.message.id"] == todo_id
    assert attributes["messaging.operation.type"] == operation


def test_a_webhook_todo_asked_answered_and_redelivered_makes_two_linked_traces(
    client, served_client, spans, endpoint, operator
):
    """One trace from the webhook to the first delivery's question; the
    redelivery after the answer is a trace of its own, linked to it."""
    source = WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    webhook = f"00-{WEBHOOK_TRACE}-{WEBHOOK_SPAN}-01"

    delivered = deliver_pull_request(client, {"traceparent": webhook})
    assert delivered.status_code == 202
    todo_id = delivered.json()["targets"][0]["todo_id"]

    mcp = Mcp(served_client, endpoint.token)
    first = mcp.call("claim_next", worker="reviewer", queue="github")
    claimed = first["structuredContent"]["todo"]
    assert claimed["id"] == todo_id
    assert first["_meta"] == claimed["trace_context"]
    first_context = first["_meta"]["traceparent"]
    assert first_context.startswith(f"00-{WEBHOOK_TRACE}-")

    mcp.call(
        "ask",
        todo_id=todo_id,
        worker="reviewer",
        question="Merge with failing lint?",
        choices=["yes", "no"],
    )
    client.force_login(operator)
    answer_field = f"q{todo_id.split('-')[0]}-answer"
    answered = client.post(
        f"/board/todos/{todo_id}/answer/",
        {answer_field: "yes", f"q{todo_id.split('-')[0]}-confirm": "yes"},
    )
    assert answered.status_code in (200, 302)
    assert store.get_todo_any_endpoint(todo_id).answer["value"] == "yes"

    second = mcp.call("claim_next", worker="reviewer", queue="github")
    again = second["structuredContent"]["todo"]
    assert again["id"] == todo_id
    second_context = again["trace_context"]["traceparent"]
    assert WEBHOOK_TRACE not in second_context

    completed = served_client.post(
        f"/api/v1/todos/{todo_id}/complete",
        {"worker": "reviewer", "lease_token": again["lease_token"], "result": {}},
        content_type="application/json",
        headers={"Authorization": f"Bearer {endpoint.token}"},
    )
    assert completed.status_code == 200

    named = by_name(spans.get_finished_spans())
    [send] = named["send github"]
    first_process, second_process = sorted(
        named["process github"],
        key=lambda span: span.attributes["messaging.switchboard.delivery"],
    )
    [settle] = named["settle github"]

    # The create: a producer span in the webhook's trace, its child.
    assert send.kind == SpanKind.PRODUCER
    messaging(send, "send", todo_id)
    assert format(send.context.trace_id, "032x") == WEBHOOK_TRACE
    assert format(send.parent.span_id, "016x") == WEBHOOK_SPAN

    # The first delivery: a consumer span, child of the send span, the span
    # the claim handed the agent, ended by the question.
    assert first_process.kind == SpanKind.CONSUMER
    messaging(first_process, "process", todo_id)
    assert first_process.context.trace_id == send.context.trace_id
    assert first_process.parent.span_id == send.context.span_id
    assert first_context == (
        f"00-{first_process.context.trace_id:032x}"
        f"-{first_process.context.span_id:016x}-01"
    )
    assert first_process.attributes["messaging.switchboard.outcome"] == "ask"
    assert first_process.attributes["messaging.switchboard.attempt"] == 1
    assert [event.name for event in first_process.events] == ["question asked"]
    asked = first_process.events[0].attributes
    assert asked["switchboard.question.asked_by"] == "reviewer"
    assert first_process.attributes["messaging.client.id"] == "reviewer"
    assert not first_process.links

    # The redelivery: a trace of its own, linked to the first delivery, with
    # the answer that ended the hold; settled by the complete.
    assert second_process.kind == SpanKind.CONSUMER
    messaging(second_process, "process", todo_id)
    assert second_process.parent is None
    assert second_process.context.trace_id != send.context.trace_id
    assert second_context == (
        f"00-{second_process.context.trace_id:032x}"
        f"-{second_process.context.span_id:016x}"
        f"-{second_process.context.trace_flags:02x}"
    )
    assert second_context.endswith("-03")  # sampled, and a random trace id
    [link] = second_process.links
    assert link.context.trace_id == first_process.context.trace_id
    assert link.context.span_id == first_process.context.span_id
    assert [event.name for event in second_process.events] == ["answered"]
    answered_event = second_process.events[0]
    assert answered_event.attributes["switchboard.answer.by"] == "operator:ops"
    assert second_process.attributes["messaging.switchboard.attempt"] == 1
    assert second_process.attributes["messaging.switchboard.outcome"] == "complete"
    assert second_process.start_time < second_process.end_time

    assert settle.kind == SpanKind.CLIENT
    messaging(settle, "settle", todo_id)
    assert settle.attributes["messaging.operation.name"] == "complete"
    assert settle.context.trace_id == second_process.context.trace_id
    assert settle.parent.span_id == second_process.context.span_id
