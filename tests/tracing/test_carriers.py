"""W3C trace context in and out of every create surface (CONTRACT §19).

A valid context is kept on the todo and handed on by every claim; a malformed
one is ignored, never an error. Tracing is off here (the default): the context
is still stored and handed on, with no span.
"""

import json

import pytest

from tests.tracing.test_journey import SECRET, Mcp, deliver_pull_request
from todos import store
from todos.models import WebhookRoute, WebhookSource
from todos.telemetry import tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"
MALFORMED = [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",  # 00 + more
    "not a traceparent",
    "",
]


@pytest.fixture
def db(asgi_server, committed):
    """Committed: the surfaces answer on the served path (``client``)."""


@pytest.fixture
def client(served_client):
    return served_client


def api_post(client, endpoint, path, body, **headers):
    return client.post(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {endpoint.token}", **headers},
    )


# --- Parsing ----------------------------------------------------------------------


def test_a_valid_traceparent_and_tracestate_are_kept():
    context = tracing.parse(TRACEPARENT, "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")

    assert context is not None
    assert context.to_dict() == {
        "traceparent": TRACEPARENT,
        "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    }
    assert (context.trace_id, context.span_id, context.sampled) == (TRACE, SPAN, True)


@pytest.mark.parametrize("traceparent", MALFORMED)
def test_a_malformed_traceparent_is_ignored(traceparent):
    assert tracing.parse(traceparent, "rojo=1") is None


def test_a_later_versions_traceparent_is_read_as_version_00():
    context = tracing.parse(f"cc-{TRACE}-{SPAN}-01-what-comes-later")

    assert context is not None and context.traceparent == TRACEPARENT


def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept():
    context = tracing.parse(TRACEPARENT, "no equals sign, =")

    assert context is not None
    assert context.to_dict() == {"traceparent": TRACEPARENT}


def test_an_x_ray_trace_header_becomes_a_w3c_context():
    header = (
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    )

    context = tracing.from_xray(header)

    assert context is not None
    assert context.traceparent == (
        "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    )


@pytest.mark.parametrize(
    "header",
    [
        "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",  # no parent
        "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
        "Root=1-5759e988;Parent=53995c3f42cd8ad8",
        "Parent=53995c3f42cd8ad8",
        "garbage",
        None,
        17,
    ],
)
def test_a_malformed_x_ray_trace_header_is_ignored(header):
    assert tracing.from_xray(header) is None


def test_a_w3c_context_goes_back_to_x_ray_as_it_came():
    header = (
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    )

    context = tracing.from_xray(header)

    assert context is not None and tracing.to_xray(context) == header


def test_an_unsampled_x_ray_header_stays_unsampled():
    header = (
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0"
    )

    context = tracing.from_xray(header)

    assert context is not None and not context.sampled


@pytest.mark.parametrize("meta", [None, "x", [], {"traceparent": 5}, {}])
def test_mcp_meta_without_a_valid_traceparent_carries_nothing(meta):
    assert tracing.from_meta(meta) is None


def test_tracing_is_off_unless_the_environment_names_an_exporter(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.configure() is False
    assert not tracing.enabled()

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.configure() is False
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert tracing.configure() is False
    assert not tracing.enabled()


# --- The surfaces -----------------------------------------------------------------


def test_the_json_api_keeps_the_request_context_and_every_claim_hands_it_on(
    client, endpoint
):
    created = api_post(
        client,
        endpoint,
        "/api/v1/todos",
        {"queue": "q", "title": "t"},
        traceparent=TRACEPARENT,
        tracestate="rojo=00f067aa0ba902b7",
    )
    assert created.status_code == 201
    carried = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7"}
    todo = created.json()["todo"]
    assert todo["trace_context"] == carried

    claimed = api_post(
        client, endpoint, f"/api/v1/todos/{todo['id']}/claim", {"worker": "w"}
    )
    assert claimed.json()["todo"]["trace_context"] == carried


def test_claim_next_and_a_batch_claim_hand_on_the_context(client, endpoint):
    for _ in range(2):
        api_post(
            client, endpoint, "/api/v1/todos", {"queue": "q"}, traceparent=TRACEPARENT
        )

    one = api_post(client, endpoint, "/api/v1/todos/claim", {"worker": "w"})
    many = api_post(
        client, endpoint, "/api/v1/todos/claim", {"worker": "w", "max_todos": 5}
    )

    assert one.json()["todo"]["trace_context"] == {"traceparent": TRACEPARENT}
    [todo] = many.json()["todos"]
    assert todo["trace_context"] == {"traceparent": TRACEPARENT}


def test_a_batch_create_keeps_the_request_context_on_each_todo(client, endpoint):
    created = api_post(
        client,
        endpoint,
        "/api/v1/todos",
        {"todos": [{"queue": "q"}, {"queue": "q", "idempotency_key": "k"}]},
        traceparent=TRACEPARENT,
    )

    assert created.status_code == 200
    results = created.json()["results"]
    assert [r["todo"]["trace_context"] for r in results] == [
        {"traceparent": TRACEPARENT}
    ] * 2


@pytest.mark.parametrize("traceparent", MALFORMED)
def test_the_json_api_ignores_a_malformed_traceparent(client, endpoint, traceparent):
    created = api_post(
        client, endpoint, "/api/v1/todos", {"queue": "q"}, traceparent=traceparent
    )

    assert created.status_code == 201
    assert created.json()["todo"]["trace_context"] is None


def test_a_todo_created_without_a_context_has_none(client, endpoint):
    created = api_post(client, endpoint, "/api/v1/todos", {"queue": "q"})

    assert created.json()["todo"]["trace_context"] is None


def test_mcp_create_todo_keeps_the_context_of_params_meta(client, endpoint):
    mcp = Mcp(client, endpoint.token)
    response = mcp.post(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "create_todo",
                "arguments": {"queue": "q"},
                "_meta": {"traceparent": TRACEPARENT, "tracestate": "rojo=1"},
            },
        }
    )

    todo = response.json()["result"]["structuredContent"]["todo"]
    assert todo["trace_context"] == {"traceparent": TRACEPARENT, "tracestate": "rojo=1"}
    claim = mcp.call("claim_todo", todo_id=todo["id"], worker="w")
    assert claim["_meta"] == todo["trace_context"]


def test_mcp_ignores_a_malformed_meta_traceparent(client, endpoint):
    mcp = Mcp(client, endpoint.token)
    response = mcp.post(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "create_todo",
                "arguments": {"queue": "q"},
                "_meta": {"traceparent": "00-zz-yy-01"},
            },
        }
    )

    result = response.json()["result"]
    assert not result["isError"]
    assert result["structuredContent"]["todo"]["trace_context"] is None
    claim = mcp.call("claim_todo", todo_id=result["structuredContent"]["todo"]["id"])
    assert "_meta" not in claim


@pytest.fixture
def webhook_source(endpoint):
    source = WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    return source


def test_a_webhook_delivery_keeps_the_context_of_its_headers(
    client, webhook_source, scope
):
    delivered = deliver_pull_request(client, {"traceparent": TRACEPARENT})

    assert delivered.status_code == 202
    [todo] = store.list_todos(scope).todos
    assert todo.trace_context == {"traceparent": TRACEPARENT}


def test_a_webhook_delivery_with_a_malformed_traceparent_is_still_taken(
    client, webhook_source, scope
):
    delivered = deliver_pull_request(client, {"traceparent": "00-nonsense"})

    assert delivered.status_code == 202
    [todo] = store.list_todos(scope).todos
    assert todo.trace_context is None


def test_with_tracing_on_a_malformed_context_starts_a_trace_of_its_own(
    client, endpoint, spans
):
    created = api_post(
        client, endpoint, "/api/v1/todos", {"queue": "q"}, traceparent="00-bad"
    )

    assert created.status_code == 201
    [send] = spans.get_finished_spans()
    assert send.name == "send q" and send.parent is None
    stored = created.json()["todo"]["trace_context"]["traceparent"]
    context = send.context
    assert stored == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
