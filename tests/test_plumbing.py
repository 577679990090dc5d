"""todos.web.http, the plumbing every surface shares: one error body, one body
reader (bounded, chunked, drained on 413), one strict JSON decoder.
"""

import datetime
import decimal
import http.client
import json
import uuid

import pytest
from django.core.serializers.json import DjangoJSONEncoder

from tests.support import database_url, start_gunicorn, stop
from todos.models import WebhookRoute, WebhookSource
from todos.web import http as plumbing
from todos.webhooks import signatures

SECRET = "plumbing-secret"
OVERSIZED = json.dumps({"queue": "q", "payload": "x" * (300 * 1024)})


@pytest.fixture(scope="module")
def gunicorn_port(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url())
    yield port
    stop(process)


@pytest.fixture
def db(committed):
    """Committed: the servers (in process, or gunicorn) see the test's rows."""


@pytest.fixture
def source(endpoint):
    source = WebhookSource.objects.create(slug="plumbing", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    return source


def surface_requests(token):
    """(path, headers) of one POST per surface."""
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return [
        ("/api/v1/todos", auth),
        ("/mcp", {**auth, "Accept": "application/json, text/event-stream"}),
        ("/hooks/plumbing", {"Content-Type": "application/json"}),
    ]


def error_code(path, body):
    data = json.loads(body)
    return data["error"]["data"]["error"] if path == "/mcp" else data["error"]


def test_every_surface_answers_an_oversized_body_with_the_same_413(
    served_client, endpoint, source
):
    for path, headers in surface_requests(endpoint.token):
        response = served_client.post(
            path,
            data=OVERSIZED,
            content_type="application/json",
            headers={k: v for k, v in headers.items() if k != "Content-Type"},
        )
        assert response.status_code == 413, path
        assert error_code(path, response.content) == "payload_too_large", path


@pytest.mark.slow
def test_every_surface_drains_an_oversized_body_so_keep_alive_survives(
    gunicorn_port, endpoint, source
):
    conn = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=10)
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    sock = conn.sock
    for path, headers in surface_requests(endpoint.token):
        conn.request("POST", path, OVERSIZED, headers)
        response = conn.getresponse()
        assert response.status == 413, path
        assert error_code(path, response.read()) == "payload_too_large", path
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() and conn.sock is sock, path
    conn.close()


@pytest.mark.slow
def test_a_chunked_webhook_delivery_is_read_like_the_api_reads_one(
    gunicorn_port, endpoint, source
):
    body = json.dumps({"action": "opened", "number": 7}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=10)
    conn.request(
        "POST",
        "/hooks/plumbing",
        iter([body[:5], body[5:]]),
        {
            "Content-Type": "application/json",
            "X-GitHub-Delivery": "chunked-1",
            "X-GitHub-Event": "issues",
            "X-Hub-Signature-256": signatures.sign(SECRET, body),
        },
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 202, response.read()
    conn.close()


@pytest.mark.parametrize(
    "text", ["NaN", "[Infinity]", '{"x": -Infinity}'], ids=["nan", "inf", "-inf"]
)
def test_strict_json_refuses_nan_and_infinity(text):
    with pytest.raises(ValueError):
        plumbing.loads(text)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"x": float("inf")}, "numbers must be finite"),
        ({"x": "\x00"}, "NUL characters"),
        (["\ud800"], "lone surrogates"),
        ({"\x00key": 1}, "NUL characters"),
    ],
    ids=["overflow", "nul", "lone-surrogate", "nul-key"],
)
def test_unstorable_names_what_jsonb_would_refuse(value, problem):
    assert problem in plumbing.unstorable(value)


def test_a_json_answer_reads_as_djangos_encoder_wrote_it():
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    data = {"at": moment, "id": uuid.UUID(int=1), "n": decimal.Decimal("1.5")}

    written = json.loads(plumbing.dumps(data))

    assert written == json.loads(json.dumps(data, cls=DjangoJSONEncoder))
    assert written["at"] == "2026-01-02T03:04:05.678Z"


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [2**70, "\ud800", nested(300)],
    ids=["beyond-64-bits", "lone-surrogate", "nested-past-orjsons-limit"],
)
def test_a_json_answer_orjson_refuses_is_encoded_by_the_standard_library(value):
    assert json.loads(plumbing.dumps({"x": value})) == {"x": value}


def test_a_json_answer_is_an_object():
    with pytest.raises(TypeError):
        plumbing.JsonResponse([1])  # type: ignore[arg-type]


def test_the_error_body_has_the_contracts_shape():
    response = plumbing.error_response(413)
    assert json.loads(response.content) == {
        "error": "payload_too_large",
        "detail": "payload too large",
    }
    assert response.error_code == "payload_too_large"
