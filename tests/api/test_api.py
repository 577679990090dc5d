"""The agent JSON API as served: every verb, success and error paths."""

import json
import logging
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from tests.support import ServedClient
from todos import store
from todos.telemetry.logs import JsonFormatter, TextFormatter


class Agent:
    """A served client (tests.support.ServedClient) that speaks as one endpoint."""

    def __init__(self, endpoint, token=None):
        self.client = ServedClient()
        self.endpoint = endpoint
        self.token = endpoint.token if token is None else token

    def _auth(self):
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}

    def get(self, path, **params):
        return self.client.get(path, params, **self._auth())

    def post(self, path, body=None, *, raw=None):
        data = raw if raw is not None else json.dumps({} if body is None else body)
        return self.client.post(
            path, data, content_type="application/json", **self._auth()
        )

    def create(self, **fields):
        response = self.post("/api/v1/todos", {"queue": "q", **fields})
        assert response.status_code in (200, 201), response.content
        return response.json()["todo"]

    def claim(self, todo_id, worker="w1", **fields):
        response = self.post(
            f"/api/v1/todos/{todo_id}/claim", {"worker": worker, **fields}
        )
        assert response.status_code == 200, response.content
        return response.json()["todo"]


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


@pytest.fixture
def other_agent(other_endpoint):
    return Agent(other_endpoint)


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == code and body["detail"]
    return body["detail"]


# --- Create ---------------------------------------------------------------------


def test_create_returns_201_with_every_column(agent, endpoint):
    response = agent.post(
        "/api/v1/todos",
        {
            "queue": "q",
            "title": "t",
            "payload": {"n": 1},
            "assignee": "w9",
            "max_attempts": 3,
            "idempotency_key": "k1",
        },
    )
    assert response.status_code == 201
    body = response.json()
    assert body["created"] is True
    todo = body["todo"]
    assert set(todo) == set(store.TODO_JSON_FIELDS)
    assert {"question", "answer", "outcome", "progress", "checkpoint"} <= set(todo)
    assert todo["outcome"] == "pending" and todo["cancel_requested"] is False
    assert todo["endpoint_id"] == str(endpoint.id)
    assert todo["state"] == "pending" and todo["payload"] == {"n": 1}
    assert todo["max_attempts"] == 3 and todo["assignee"] == "w9"
    assert todo["created_at"].endswith("Z")


def test_create_collapses_a_live_duplicate_with_200(agent):
    """SPEC: Duplicate delivery collapses to one todo."""
    first = agent.post("/api/v1/todos", {"queue": "q", "idempotency_key": "d1"})
    second = agent.post("/api/v1/todos", {"queue": "q", "idempotency_key": "d1"})
    assert first.status_code == 201 and second.status_code == 200
    assert second.json()["created"] is False
    assert second.json()["todo"]["id"] == first.json()["todo"]["id"]


def test_create_defaults_max_attempts_to_five(agent):
    assert agent.create()["max_attempts"] == 5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "queue"),
        ({"queue": ""}, "queue"),
        ({"queue": 7}, "queue"),
        ({"queue": "q" * 201}, "queue"),
        ({"queue": "q\x00"}, "queue"),
        ({"queue": "q", "title": ["x"]}, "title"),
        ({"queue": "q", "max_attempts": 0}, "max_attempts"),
        ({"queue": "q", "max_attempts": "3"}, "max_attempts"),
        ({"queue": "q", "max_attempts": True}, "max_attempts"),
        ({"queue": "q", "max_attempts": 10**12}, "max_attempts"),
        ({"queue": "q", "idempotency_key": "k" * 201}, "idempotency_key"),
        ({"queue": "q", "assignee": 5}, "assignee"),
        ({"queue": "q", "payload": {"a": "nul\x00"}}, "payload"),
        ({"queue": "q", "payload": {"nul\x00key": 1}}, "payload"),
    ],
)
def test_create_rejects_an_invalid_field_with_400_naming_it(agent, body, field):
    detail = assert_error(agent.post("/api/v1/todos", body), 400, "bad_request")
    assert detail.startswith(field)


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[1, 2]",
        '"text"',
        '{"queue": NaN}',
        '{"queue": "q", "payload": 1e999}',
        "[" * 5000 + "]" * 5000,
        '{"queue": "\\ud800"}',
    ],
)
def test_create_rejects_a_body_that_is_not_a_storable_json_object(agent, raw):
    detail = assert_error(agent.post("/api/v1/todos", raw=raw), 400, "bad_request")
    assert detail.split(":")[0] in {"body", "queue", "payload"}


def test_create_rejects_a_queue_outside_the_grant_with_403(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("reviews",)))
    assert narrow.post("/api/v1/todos", {"queue": "reviews"}).status_code == 201
    assert_error(narrow.post("/api/v1/todos", {"queue": "deploys"}), 403, "forbidden")


def test_a_body_over_256_kib_gets_413(agent):
    big = json.dumps({"queue": "q", "payload": "x" * (256 * 1024)})
    assert_error(agent.post("/api/v1/todos", raw=big), 413, "payload_too_large")
    assert store.list_todos(store.Scope.for_endpoint(agent.endpoint)).todos == []


def test_a_body_just_under_the_limit_is_accepted(agent):
    body = json.dumps({"queue": "q", "payload": "x" * (255 * 1024)})
    assert agent.post("/api/v1/todos", raw=body).status_code == 201


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/todos/{id}/claim",
        "/api/v1/todos/{id}/heartbeat",
        "/api/v1/todos/{id}/complete",
        "/api/v1/todos/{id}/fail",
        "/api/v1/todos/{id}/release",
        "/api/v1/todos/{id}/retry",
        "/api/v1/todos/claim",
    ],
)
def test_every_write_verb_answers_413_for_an_oversized_body(agent, path):
    big = json.dumps({"worker": "w", "result": "x" * (300 * 1024)})
    response = agent.post(path.format(id=uuid.uuid4()), raw=big)
    assert_error(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/todos",
        "/api/v1/todos/claim",
        "/api/v1/todos/{id}/claim",
        "/api/v1/todos/{id}/heartbeat",
        "/api/v1/todos/{id}/complete",
        "/api/v1/todos/{id}/fail",
        "/api/v1/todos/{id}/release",
        "/api/v1/todos/{id}/retry",
    ],
)
def test_every_write_verb_answers_400_for_a_body_that_is_not_json(agent, path):
    todo = agent.create()
    response = agent.post(path.format(id=todo["id"]), raw="{'worker': 'w'}")
    assert assert_error(response, 400, "bad_request").startswith("body")


# --- Auth -----------------------------------------------------------------------

ROUTES = [
    ("GET", "/api/v1/todos"),
    ("POST", "/api/v1/todos"),
    ("GET", "/api/v1/todos/{id}"),
    ("POST", "/api/v1/todos/claim"),
    ("POST", "/api/v1/todos/{id}/claim"),
    ("POST", "/api/v1/todos/{id}/heartbeat"),
    ("POST", "/api/v1/todos/{id}/complete"),
    ("POST", "/api/v1/todos/{id}/fail"),
    ("POST", "/api/v1/todos/{id}/release"),
    ("POST", "/api/v1/todos/{id}/retry"),
    ("GET", "/api/v1/events"),
]


def _call(agent, method, path, todo_id, body=None):
    path = path.format(id=todo_id)
    return agent.get(path) if method == "GET" else agent.post(path, body)


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("token", ["", "sb_not-a-real-token", "revoked"])
def test_every_route_answers_401_without_a_valid_token(endpoint, method, path, token):
    if token == "revoked":
        token = endpoint.token
        endpoint.revoked_at = timezone.now()
        endpoint.save()
    caller = Agent(endpoint, token=token)
    response = _call(caller, method, path, uuid.uuid4(), {"queue": "q", "worker": "w"})
    assert_error(response, 401, "unauthorized")
    assert response["WWW-Authenticate"] == "Bearer"


def test_a_non_bearer_authorization_header_gets_401(agent):
    response = agent.client.get(
        "/api/v1/todos", HTTP_AUTHORIZATION=f"Basic {agent.token}"
    )
    assert_error(response, 401, "unauthorized")


def test_the_openapi_document_needs_no_token(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")


# --- Read -----------------------------------------------------------------------


def test_get_returns_the_todo(agent):
    todo = agent.create(title="hello")
    response = agent.get(f"/api/v1/todos/{todo['id']}")
    assert response.status_code == 200
    assert response.json()["todo"] == todo


def test_list_pages_with_an_opaque_cursor_stable_under_inserts(agent):
    created = [agent.create(title=f"t{i}")["id"] for i in range(5)]
    first = agent.get("/api/v1/todos", limit=2).json()
    assert [t["id"] for t in first["todos"]] == created[:2]
    # A todo inserted between pages lands after the cursor, never shifts a page.
    late = agent.create(title="late")["id"]
    seen = [t["id"] for t in first["todos"]]
    cursor = first["next_cursor"]
    while cursor:
        page = agent.get("/api/v1/todos", limit=2, cursor=cursor).json()
        seen += [t["id"] for t in page["todos"]]
        cursor = page["next_cursor"]
    assert seen == [*created, late]


def test_list_filters_by_queue_and_state(agent):
    a = agent.create(queue="a")
    agent.create(queue="b")
    agent.claim(a["id"])
    assert [t["id"] for t in agent.get("/api/v1/todos", queue="a").json()["todos"]] == [
        a["id"]
    ]
    claimed = agent.get("/api/v1/todos", state="claimed").json()["todos"]
    assert [t["id"] for t in claimed] == [a["id"]]


def test_list_of_a_queue_outside_the_grant_is_403(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("a",)))
    assert narrow.get("/api/v1/todos", queue="a").status_code == 200
    assert_error(narrow.get("/api/v1/todos", queue="b"), 403, "forbidden")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"state": "sleeping"}, "state"),
        ({"cursor": "bm90LW91cnM"}, "cursor"),
        ({"cursor": "%%%"}, "cursor"),
        ({"queue": "a\x00b"}, "queue"),
    ],
)
def test_list_rejects_bad_query_parameters_with_400(agent, params, field):
    detail = assert_error(agent.get("/api/v1/todos", **params), 400, "bad_request")
    assert detail.startswith(field)


# --- Claim ----------------------------------------------------------------------


def test_claim_next_returns_the_oldest_claimable_todo(agent):
    first = agent.create(title="first")
    agent.create(title="second")
    response = agent.post("/api/v1/todos/claim", {"worker": "w1", "lease_seconds": 60})
    assert response.status_code == 200
    todo = response.json()["todo"]
    assert todo["id"] == first["id"]
    assert todo["state"] == "claimed" and todo["owner"] == "w1" and todo["attempt"] == 1


def test_claim_next_answers_404_when_there_is_no_work(agent):
    assert_error(agent.post("/api/v1/todos/claim", {"worker": "w1"}), 404, "not_found")


def test_claim_next_honours_the_queue_filter_and_grant(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("a", "b")))
    narrow.create(queue="a")
    b = narrow.create(queue="b")
    response = narrow.post("/api/v1/todos/claim", {"worker": "w", "queue": "b"})
    assert response.json()["todo"]["id"] == b["id"]
    response = narrow.post("/api/v1/todos/claim", {"worker": "w", "queue": "c"})
    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "worker"),
        ({"worker": ""}, "worker"),
        ({"worker": "w", "wait_seconds": 21}, "wait_seconds"),
        ({"worker": "w", "wait_seconds": -1}, "wait_seconds"),
        ({"worker": "w", "lease_seconds": 0}, "lease_seconds"),
        ({"worker": "w", "lease_seconds": 43201}, "lease_seconds"),
        ({"worker": "w", "lease_seconds": 1.5}, "lease_seconds"),
        ({"worker": "w", "queue": ""}, "queue"),
    ],
)
def test_claim_next_rejects_invalid_fields_with_400(agent, body, field):
    detail = assert_error(agent.post("/api/v1/todos/claim", body), 400, "bad_request")
    assert detail.startswith(field)


def test_claim_of_a_specific_todo_sets_the_lease(agent):
    todo = agent.create()
    claimed = agent.claim(todo["id"], worker="w7", lease_seconds=120)
    assert claimed["owner"] == "w7" and claimed["lease_expires_at"]


def test_claim_of_a_claimed_todo_conflicts(agent):
    """SPEC: Claimed todo is invisible to other consumers."""
    todo = agent.create()
    agent.claim(todo["id"], worker="w1")
    response = agent.post(f"/api/v1/todos/{todo['id']}/claim", {"worker": "w2"})
    assert_error(response, 409, "conflict")


def test_claim_respects_direct_assignment(agent):
    """SPEC: Direct assignment is respected."""
    todo = agent.create(assignee="alice-bot")
    response = agent.post(f"/api/v1/todos/{todo['id']}/claim", {"worker": "other"})
    assert_error(response, 409, "conflict")
    assert agent.claim(todo["id"], worker="alice-bot")["owner"] == "alice-bot"


# --- Owner transitions ----------------------------------------------------------


def test_heartbeat_extends_the_owners_lease(agent, time_travel):
    todo = agent.claim(agent.create()["id"], lease_seconds=30)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w1", "lease_seconds": 600}
    )
    assert response.status_code == 200
    assert response.json()["todo"]["lease_expires_at"] > todo["lease_expires_at"]


def test_heartbeat_by_another_worker_conflicts(agent):
    todo = agent.claim(agent.create()["id"])
    response = agent.post(f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w2"})
    assert_error(response, 409, "conflict")


def test_complete_stores_the_result(agent):
    todo = agent.claim(agent.create()["id"])
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/complete", {"worker": "w1", "result": {"ok": [1]}}
    )
    assert response.status_code == 200
    done = response.json()["todo"]
    assert done["state"] == "done" and done["result"] == {"ok": [1]}


def test_complete_of_a_pending_todo_conflicts(agent):
    """SPEC: Only defined transitions are honored."""
    todo = agent.create()
    response = agent.post(f"/api/v1/todos/{todo['id']}/complete", {"worker": "w1"})
    assert_error(response, 409, "conflict")


def test_complete_by_a_non_owner_conflicts(agent):
    """SPEC: Only the lease owner may complete or fail."""
    todo = agent.claim(agent.create()["id"])
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/complete", {"worker": "intruder"}
    )
    assert_error(response, 409, "conflict")


def test_fail_schedules_a_retry_window(agent):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters."""
    todo = agent.claim(agent.create()["id"])
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/fail", {"worker": "w1", "error": "boom"}
    )
    assert response.status_code == 200
    failed = response.json()["todo"]
    assert failed["state"] == "failed" and failed["last_error"] == "boom"
    assert failed["next_retry_at"] is not None


def test_fail_of_a_pending_todo_conflicts(agent):
    todo = agent.create()
    response = agent.post(f"/api/v1/todos/{todo['id']}/fail", {"worker": "w1"})
    assert_error(response, 409, "conflict")


def test_release_returns_the_todo_to_pending(agent):
    todo = agent.claim(agent.create()["id"])
    response = agent.post(f"/api/v1/todos/{todo['id']}/release", {"worker": "w1"})
    assert response.status_code == 200
    released = response.json()["todo"]
    assert released["state"] == "pending" and released["owner"] is None


def test_release_by_a_non_owner_conflicts(agent):
    todo = agent.claim(agent.create()["id"])
    response = agent.post(f"/api/v1/todos/{todo['id']}/release", {"worker": "w2"})
    assert_error(response, 409, "conflict")


def test_retry_requeues_a_dead_letter(agent):
    todo = agent.claim(agent.create(max_attempts=1)["id"])
    agent.post(f"/api/v1/todos/{todo['id']}/fail", {"worker": "w1", "error": "x"})
    response = agent.post(f"/api/v1/todos/{todo['id']}/retry")
    assert response.status_code == 200
    assert response.json()["todo"]["state"] == "pending"


def test_retry_of_a_pending_todo_conflicts(agent):
    todo = agent.create()
    assert_error(agent.post(f"/api/v1/todos/{todo['id']}/retry"), 409, "conflict")


@pytest.mark.parametrize("verb", ["claim", "heartbeat", "complete", "fail", "release"])
def test_owner_verbs_require_the_worker_field(agent, verb):
    todo = agent.create()
    detail = assert_error(
        agent.post(f"/api/v1/todos/{todo['id']}/{verb}", {}), 400, "bad_request"
    )
    assert detail.startswith("worker")


# --- Endpoint isolation ---------------------------------------------------------

VERBS = [
    ("GET", "/api/v1/todos/{id}"),
    ("POST", "/api/v1/todos/{id}/claim"),
    ("POST", "/api/v1/todos/{id}/heartbeat"),
    ("POST", "/api/v1/todos/{id}/complete"),
    ("POST", "/api/v1/todos/{id}/fail"),
    ("POST", "/api/v1/todos/{id}/release"),
    ("POST", "/api/v1/todos/{id}/retry"),
]


@pytest.mark.parametrize(("method", "path"), VERBS)
@pytest.mark.parametrize("foreign_state", ["pending", "claimed", "failed"])
def test_a_foreign_id_is_byte_identical_to_a_never_minted_one(
    agent, other_agent, method, path, foreign_state
):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one."""
    foreign = other_agent.create()
    if foreign_state != "pending":
        other_agent.claim(foreign["id"], worker="w1")
    if foreign_state == "failed":
        other_agent.post(f"/api/v1/todos/{foreign['id']}/fail", {"worker": "w1"})
    body = {"worker": "w1"}
    answers = [
        _call(agent, method, path, todo_id, body)
        for todo_id in (foreign["id"], uuid.uuid4(), "not-a-uuid", "1" * 300)
    ]
    for response in answers:
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
    assert len({response.content for response in answers}) == 1
    untouched = other_agent.get(f"/api/v1/todos/{foreign['id']}").json()["todo"]
    assert untouched["state"] == foreign_state


def test_endpoints_sharing_queue_and_key_never_see_each_others_todos(
    agent, other_agent
):
    """SPEC: Cross-endpoint queue collision is isolated.
    SPEC: Same delivery routed to two endpoints yields two todos."""
    mine = agent.post("/api/v1/todos", {"queue": "reviews", "idempotency_key": "gh-1"})
    theirs = other_agent.post(
        "/api/v1/todos", {"queue": "reviews", "idempotency_key": "gh-1"}
    )
    assert mine.status_code == 201 and theirs.status_code == 201
    mine, theirs = mine.json()["todo"], theirs.json()["todo"]
    assert mine["id"] != theirs["id"]

    listed = agent.get("/api/v1/todos", queue="reviews").json()["todos"]
    assert [t["id"] for t in listed] == [mine["id"]]
    claimed = agent.post("/api/v1/todos/claim", {"worker": "w", "queue": "reviews"})
    assert claimed.json()["todo"]["id"] == mine["id"]
    # Mine is taken: the other endpoint's pending todo is not work for me.
    response = agent.post("/api/v1/todos/claim", {"worker": "w", "queue": "reviews"})
    assert_error(response, 404, "not_found")
    assert other_agent.get(f"/api/v1/todos/{theirs['id']}").json()["todo"]["state"] == (
        "pending"
    )


# --- The rest of /api/ speaks JSON too ------------------------------------------


def test_an_unknown_api_path_answers_json_404(agent):
    assert_error(agent.get("/api/v1/nothing-here"), 404, "not_found")


def test_a_wrong_method_answers_json_405(agent):
    response = agent.client.delete(
        "/api/v1/todos", HTTP_AUTHORIZATION=f"Bearer {agent.token}"
    )
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, POST"


def test_a_disallowed_host_answers_json_400_not_an_html_page(agent):
    response = agent.client.get(
        "/api/v1/todos", HTTP_HOST="evil.example", HTTP_AUTHORIZATION="Bearer x"
    )
    assert_error(response, 400, "bad_request")


def test_a_post_needs_no_csrf_token(endpoint):
    # Served, a request is checked as in production (Django's test client
    # skips the check unless told).
    response = ServedClient().post(
        "/api/v1/todos",
        json.dumps({"queue": "q"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {endpoint.token}",
    )
    assert response.status_code == 201


# --- Tokens and logs ------------------------------------------------------------


def test_tokens_never_appear_in_the_database_or_the_logs(agent, caplog, capsys):
    caplog.set_level("DEBUG")
    todo = agent.create(title="secret-check")
    agent.claim(todo["id"])
    agent.get("/api/v1/todos")
    Agent(agent.endpoint, token=agent.token + "x").get("/api/v1/todos")
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(e)::text FROM endpoints e")
        rows = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            "SELECT coalesce(string_agg(row_to_json(e)::text, ' '), '')"
            " FROM todo_events e"
        )
        rows += cursor.fetchone()[0]
    assert agent.endpoint.token_hash in rows
    # Render every captured record the way both production formatters would.
    logged = "\n".join(
        formatter.format(record)
        for record in caplog.records
        for formatter in (JsonFormatter(), TextFormatter())
    ) + "".join(capsys.readouterr())
    assert "route=api/v1/todos" in logged and '"route": "api/v1/todos"' in logged
    secret = agent.token.removeprefix("sb_")
    assert secret not in rows and secret not in logged


def test_each_request_logs_one_structured_line(agent, caplog):
    todo = agent.create()
    caplog.clear()
    caplog.set_level("INFO", logger="switchboard.request")
    agent.post(f"/api/v1/todos/{todo['id']}/complete", {"worker": "nobody"})
    records = [r for r in caplog.records if r.name == "switchboard.request"]
    assert len(records) == 1
    fields = records[0].fields
    assert fields["endpoint_id"] == str(agent.endpoint.id)
    assert fields["route"] == "api/v1/todos/<str:todo_id>/complete"
    assert fields["todo_id"] == todo["id"]
    assert fields["outcome"] == "conflict" and fields["status"] == 409
    assert fields["duration_ms"] >= 0


def test_api_requests_skip_the_boards_middleware(agent, client):
    """The Board's middleware (sessions, CSRF, frame options…) runs off /api/ only."""
    response = agent.get("/api/v1/todos")
    assert response.status_code == 200
    assert "X-Frame-Options" not in response
    assert "Cookie" not in response.get("Vary", "")
    assert not response.cookies
    board = client.get("/board/login/")
    assert board["X-Frame-Options"] == "DENY"
    assert "csrftoken" in board.cookies
    refused = ServedClient().post("/board/login/", {"username": "x", "password": "y"})
    assert refused.status_code == 403


def test_a_text_log_line_quotes_each_value_that_would_split_it():
    record = logging.LogRecord(
        "switchboard.request", logging.INFO, "x", 1, "request", None, None
    )
    record.fields = {
        "a": "plain",
        "b": "two words",
        "c": 'x="y"',
        "d": "line\nbreak",
        "e": "",
        "f": "tab\there",
        "g": 7,
    }
    line = TextFormatter().format(record)
    assert line.endswith(
        'a=plain b="two words" c="x=\\"y\\"" d="line\\nbreak" e="" f="tab\\there" g=7'
    )


def test_each_text_log_line_carries_its_own_records_second():
    """The text timestamp is made once a second: each line still shows the
    UTC second its record was made in, not an earlier line's."""
    formatter = TextFormatter()
    lines = []
    for created in (1_800_000_000.2, 1_800_000_000.9, 1_800_000_001.0, 1_700_000_000.5):
        record = logging.LogRecord(
            "switchboard.request", logging.INFO, "x", 1, "request", None, None
        )
        record.created = created
        lines.append(formatter.format(record).split(" ")[0])
    assert lines == [
        "2027-01-15T08:00:00",
        "2027-01-15T08:00:00",
        "2027-01-15T08:00:01",
        "2023-11-14T22:13:20",
    ]
