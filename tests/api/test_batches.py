"""CONTRACT §10 over the agent API: lease tokens, batch claim, batch acknowledge,
batch create, delayed todos and GET /api/v1/queues."""

import json
import time

import pytest
from django.db import connection

from tests.api.test_api import Agent, assert_error
from todos import store


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


@pytest.fixture
def other_agent(other_endpoint):
    return Agent(other_endpoint)


def claim_next(agent, worker="w1", **fields):
    response = agent.post("/api/v1/todos/claim", {"worker": worker, **fields})
    assert response.status_code == 200, response.content
    return response.json()


def owner_call(agent, verb, todo_id, **fields):
    return agent.post(f"/api/v1/todos/{todo_id}/{verb}", fields)


def todo_row(todo_id):
    """The todo's row as the database holds it (state, owner, lease, token)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT row_to_json(t)::text FROM todos t WHERE id = %s", [todo_id]
        )
        return json.loads(cursor.fetchone()[0])


def history_count(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todo_events WHERE todo_id = %s", [todo_id])
        return cursor.fetchone()[0]


# --- Lease tokens ---------------------------------------------------------------


def test_every_claim_mints_a_fresh_lease_token(agent):
    todo = agent.create()
    first = claim_next(agent)["todo"]
    assert first["id"] == todo["id"] and first["lease_token"]
    owner_call(agent, "release", todo["id"], lease_token=first["lease_token"])
    second = claim_next(agent)["todo"]
    assert second["lease_token"] and second["lease_token"] != first["lease_token"]


@pytest.mark.parametrize(
    ("verb", "fields"),
    [
        ("heartbeat", {"lease_seconds": 600}),
        ("complete", {"result": {"ok": True}}),
        ("fail", {"error": "boom"}),
        ("release", {}),
    ],
)
def test_a_superseded_lease_token_gets_409_and_changes_nothing(agent, verb, fields):
    """CONTRACT §10: a stale token is refused with 409, nothing changed."""
    todo = agent.create()
    stale = claim_next(agent)["todo"]["lease_token"]
    owner_call(agent, "release", todo["id"], lease_token=stale)
    current = claim_next(agent)["todo"]
    before, events = todo_row(todo["id"]), history_count(todo["id"])
    response = owner_call(agent, verb, todo["id"], lease_token=stale, **fields)
    detail = assert_error(response, 409, "conflict")
    assert "lease superseded" in detail
    assert todo_row(todo["id"]) == before and history_count(todo["id"]) == events
    assert todo_row(todo["id"])["lease_token"] == current["lease_token"]


def test_the_owner_verbs_accept_the_lease_token_alone(agent):
    agent.create()
    todo = claim_next(agent, worker="w1")["todo"]
    token = todo["lease_token"]
    beat = owner_call(agent, "heartbeat", todo["id"], lease_token=token)
    assert beat.status_code == 200, beat.content
    done = owner_call(agent, "complete", todo["id"], lease_token=token, result=[1])
    assert done.status_code == 200, done.content
    assert done.json()["todo"]["state"] == "done"


def test_a_heartbeat_keeps_the_lease_token(agent):
    agent.create()
    todo = claim_next(agent)["todo"]
    response = owner_call(
        agent, "heartbeat", todo["id"], worker="w1", lease_seconds=900
    )
    assert response.status_code == 200
    assert response.json()["todo"]["lease_token"] == todo["lease_token"]
    done = owner_call(agent, "complete", todo["id"], lease_token=todo["lease_token"])
    assert done.status_code == 200, done.content


def test_a_complete_repeated_with_the_winning_token_answers_200(agent):
    """CONTRACT §10: acknowledgements are retry-safe (as SQS's DeleteMessage)."""
    agent.create()
    todo = claim_next(agent)["todo"]
    first = owner_call(
        agent, "complete", todo["id"], lease_token=todo["lease_token"], result=1
    )
    again = owner_call(
        agent, "complete", todo["id"], lease_token=todo["lease_token"], result=1
    )
    assert first.status_code == again.status_code == 200, again.content
    assert again.json()["todo"]["state"] == "done"
    assert again.json()["todo"]["id"] == todo["id"]
    stale = owner_call(agent, "complete", todo["id"], lease_token="not-the-token")
    assert_error(stale, 409, "conflict")


def test_an_owner_verb_needs_a_worker_or_a_lease_token(agent):
    todo = agent.create()
    detail = assert_error(owner_call(agent, "complete", todo["id"]), 400, "bad_request")
    assert detail.startswith("worker")


def test_a_lease_token_must_be_a_string(agent):
    todo = agent.create()
    response = owner_call(agent, "complete", todo["id"], lease_token=5)
    assert assert_error(response, 400, "bad_request").startswith("lease_token")


# --- Batch claim ----------------------------------------------------------------


def test_claim_with_max_todos_answers_a_list_of_claimed_todos(agent):
    created = [agent.create(title=f"t{n}")["id"] for n in range(3)]
    body = claim_next(agent, max_todos=2)
    assert [todo["id"] for todo in body["todos"]] == created[:2]
    assert all(t["state"] == "claimed" and t["lease_token"] for t in body["todos"])
    assert len({t["lease_token"] for t in body["todos"]}) == 2
    rest = claim_next(agent, max_todos=10)
    assert [todo["id"] for todo in rest["todos"]] == created[2:]


def test_claim_with_max_todos_answers_200_and_an_empty_list_when_idle(agent):
    assert claim_next(agent, max_todos=5) == {"todos": []}


def test_claim_with_max_todos_waits_then_answers_an_empty_list(agent):
    started = time.monotonic()
    assert claim_next(agent, max_todos=3, wait_seconds=1) == {"todos": []}
    assert time.monotonic() - started >= 0.9


@pytest.mark.parametrize("value", [0, 11, "x", 1.5, True, -1])
def test_claim_rejects_a_bad_max_todos_with_400_naming_it(agent, value):
    agent.create()
    response = agent.post("/api/v1/todos/claim", {"worker": "w", "max_todos": value})
    assert assert_error(response, 400, "bad_request").startswith("max_todos")
    assert agent.get("/api/v1/todos", state="pending").json()["todos"]


# --- Batch acknowledge ----------------------------------------------------------


def test_batch_answers_each_action_with_the_status_of_its_single_call(
    agent, other_agent
):
    """Mixed outcomes: 200, 404 (never minted, foreign, malformed), 409."""
    for _ in range(4):
        agent.create()
    claimed = claim_next(agent, max_todos=4)["todos"]
    foreign = other_agent.create()
    never = "00000000-0000-4000-8000-000000000000"
    pending = agent.create()
    actions = [
        {
            "op": "complete",
            "id": claimed[0]["id"],
            "lease_token": claimed[0]["lease_token"],
            "result": {"n": 1},
        },
        {
            "op": "fail",
            "id": claimed[1]["id"],
            "lease_token": claimed[1]["lease_token"],
            "error": "boom",
        },
        {
            "op": "heartbeat",
            "id": claimed[2]["id"],
            "lease_token": claimed[2]["lease_token"],
            "lease_seconds": 900,
        },
        {"op": "release", "id": claimed[3]["id"], "worker": "w1"},
        {"op": "complete", "id": never, "worker": "w1"},
        {"op": "complete", "id": foreign["id"], "worker": "w1"},
        {"op": "complete", "id": "not-a-uuid", "worker": "w1"},
        {"op": "complete", "id": pending["id"], "worker": "w1"},
        {"op": "complete", "id": claimed[0]["id"], "lease_token": "stale"},
    ]
    response = agent.post("/api/v1/todos/batch", {"actions": actions})
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [
        200, 200, 200, 200, 404, 404, 404, 409, 409,
    ]  # fmt: skip
    assert [r["id"] for r in results] == [a["id"] for a in actions]
    assert results[0]["todo"]["state"] == "done"
    assert results[0]["todo"]["result"] == {"n": 1}
    assert results[1]["todo"]["state"] == "failed"
    assert results[1]["todo"]["last_error"] == "boom"
    assert results[2]["todo"]["lease_token"] == claimed[2]["lease_token"]
    assert results[3]["todo"]["state"] == "pending"
    never_result, foreign_result = dict(results[4]), dict(results[5])
    never_result.pop("id"), foreign_result.pop("id")
    assert never_result == foreign_result, "a foreign id must look never-minted"
    assert results[7]["error"] == results[8]["error"] == "conflict"
    assert other_agent.get(f"/api/v1/todos/{foreign['id']}").json()["todo"][
        "state"
    ] == ("pending")
    assert todo_row(claimed[2]["id"])["state"] == "claimed"


def test_batch_applies_a_default_worker_to_its_actions(agent):
    for _ in range(2):
        agent.create()
    claimed = claim_next(agent, worker="w7", max_todos=2)["todos"]
    response = agent.post(
        "/api/v1/todos/batch",
        {
            "worker": "w7",
            "actions": [{"op": "complete", "id": t["id"]} for t in claimed],
        },
    )
    assert [r["status"] for r in response.json()["results"]] == [200, 200]


def _claimed_ids(agent, count):
    for _ in range(count):
        agent.create()
    return [t["id"] for t in claim_next(agent, max_todos=count)["todos"]]


@pytest.mark.parametrize(
    ("actions", "field"),
    [
        (None, "actions"),
        ("complete", "actions"),
        ([], "actions"),
        ([{"op": "complete", "id": "x", "worker": "w1"}] * 101, "actions"),
        ([{"op": "complete", "id": "x", "worker": "w1"}, 7], "actions[1]"),
        (
            [
                {"op": "complete", "id": "FIRST", "worker": "w1"},
                {"op": "delete", "id": "x", "worker": "w1"},
            ],
            "actions[1].op",
        ),
        ([{"id": "FIRST", "worker": "w1"}], "actions[0].op"),
        (
            [
                {"op": "complete", "id": "FIRST", "worker": "w1"},
                {"op": "heartbeat", "id": "FIRST", "worker": "w1", "lease_seconds": 0},
            ],
            "actions[1].lease_seconds",
        ),
        (
            [
                {"op": "complete", "id": "FIRST", "worker": "w1"},
                {"op": "complete", "id": "FIRST"},
            ],
            "actions[1].worker",
        ),
        ([{"op": "complete", "id": 7, "worker": "w1"}], "actions[0].id"),
        (
            [{"op": "complete", "id": "FIRST", "lease_token": ["x"]}],
            "actions[0].lease_token",
        ),
        (
            [{"op": "complete", "id": "FIRST", "worker": "w1", "result": "a\u0000"}],
            "actions[0].result",
        ),
    ],
)
def test_a_malformed_batch_gets_400_naming_the_field_and_applies_nothing(
    agent, actions, field
):
    (todo_id,) = _claimed_ids(agent, 1)
    if isinstance(actions, list):
        actions = [
            {**a, "id": todo_id}
            if isinstance(a, dict) and a.get("id") == "FIRST"
            else a
            for a in actions
        ]
    body = {"actions": actions} if actions is not None else {}
    response = agent.post("/api/v1/todos/batch", body)
    assert assert_error(response, 400, "bad_request").startswith(field)
    assert todo_row(todo_id)["state"] == "claimed"


def test_a_batch_body_over_the_size_limit_gets_413(agent, settings):
    (todo_id,) = _claimed_ids(agent, 1)
    big = "x" * settings.SWITCHBOARD_MAX_BODY_BYTES
    body = {
        "actions": [{"op": "complete", "id": todo_id, "worker": "w1", "result": big}]
    }  # noqa: E501
    assert_error(agent.post("/api/v1/todos/batch", body), 413, "payload_too_large")
    assert todo_row(todo_id)["state"] == "claimed"


def test_an_oversized_checkpoint_in_a_batch_heartbeat_is_413_as_in_a_single_one(agent):
    (todo_id,) = _claimed_ids(agent, 1)
    checkpoint = {"blob": "x" * (store.MAX_CHECKPOINT_BYTES + 1)}
    action = {"worker": "w1", "checkpoint": checkpoint}

    single = owner_call(agent, "heartbeat", todo_id, **action)
    batch = agent.post(
        "/api/v1/todos/batch",
        {"actions": [{"op": "heartbeat", "id": todo_id, **action}]},
    )

    assert_error(single, 413, "payload_too_large")
    assert batch.status_code == 200, batch.content
    [result] = batch.json()["results"]
    assert (result["status"], result["error"]) == (413, "payload_too_large")
    assert result["detail"] == single.json()["detail"]
    assert todo_row(todo_id)["checkpoint"] is None


def test_batch_needs_a_token_and_post(agent, endpoint):
    assert_error(
        Agent(endpoint, token="").post("/api/v1/todos/batch", {}), 401, "unauthorized"
    )  # noqa: E501
    assert_error(agent.get("/api/v1/todos/batch"), 405, "method_not_allowed")


# --- Batch create ---------------------------------------------------------------


def test_batch_create_answers_one_result_per_item_in_order(agent):
    response = agent.post(
        "/api/v1/todos",
        {"todos": [{"queue": "q", "title": f"t{n}"} for n in range(3)]},
    )
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["todo"]["title"] for r in results] == ["t0", "t1", "t2"]
    assert all(r["created"] is True and r["status"] == 201 for r in results)
    listed = agent.get("/api/v1/todos").json()["todos"]
    assert [todo["title"] for todo in listed] == ["t0", "t1", "t2"]


def test_batch_create_dedups_within_one_batch_and_across_batches(agent):
    """CONTRACT §10: dedup per item; the second of two equal keys collapses."""
    first = agent.post(
        "/api/v1/todos",
        {
            "todos": [
                {"queue": "q", "idempotency_key": "k1"},
                {"queue": "q", "idempotency_key": "k2"},
                {"queue": "q", "idempotency_key": "k1"},
            ]
        },
    ).json()["results"]
    assert [r["created"] for r in first] == [True, True, False]
    assert first[2]["todo"]["id"] == first[0]["todo"]["id"]
    second = agent.post(
        "/api/v1/todos",
        {"todos": [{"queue": "q", "idempotency_key": "k2"}, {"queue": "q"}]},
    ).json()["results"]
    assert [r["created"] for r in second] == [False, True]
    assert second[0]["todo"]["id"] == first[1]["todo"]["id"]
    assert second[0]["status"] == 200


def test_batch_create_answers_a_queue_outside_the_grant_per_item(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("q",)))
    response = narrow.post(
        "/api/v1/todos",
        {"todos": [{"queue": "q", "title": "ok"}, {"queue": "elsewhere"}]},
    )
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert results[0]["created"] is True and results[0]["status"] == 201
    assert results[1]["status"] == 403 and results[1]["error"] == "forbidden"
    assert len(narrow.get("/api/v1/todos").json()["todos"]) == 1


@pytest.mark.parametrize(
    ("todos", "field"),
    [
        ([], "todos"),
        ([{"queue": "q"}] * 101, "todos"),
        ({"queue": "q"}, "todos"),
        ([{"queue": "q"}, "x"], "todos[1]"),
        ([{"queue": "q"}, {"queue": "q", "max_attempts": 0}], "todos[1].max_attempts"),
        ([{"queue": "q"}, {"title": "no queue"}], "todos[1].queue"),
        ([{"queue": "q", "delay_seconds": 43_201}], "todos[0].delay_seconds"),
    ],
)
def test_a_malformed_batch_create_gets_400_and_creates_nothing(agent, todos, field):
    response = agent.post("/api/v1/todos", {"todos": todos})
    assert assert_error(response, 400, "bad_request").startswith(field)
    assert agent.get("/api/v1/todos").json()["todos"] == []


# --- Delayed todos --------------------------------------------------------------


def test_a_delayed_todo_is_not_claimable_before_it_is_due(agent, time_travel):
    todo = agent.create(delay_seconds=600)
    assert todo["state"] == "pending" and todo["available_at"] > todo["created_at"]
    assert_error(agent.post("/api/v1/todos/claim", {"worker": "w"}), 404, "not_found")
    time_travel(todo["id"], available_at=-601)
    assert claim_next(agent)["todo"]["id"] == todo["id"]


def test_an_undelayed_todo_is_available_at_its_creation(agent):
    todo = agent.create()
    assert todo["available_at"] == todo["created_at"]


@pytest.mark.parametrize("value", [-1, 43_201, "soon", 1.5])
def test_create_rejects_a_bad_delay_with_400_naming_it(agent, value):
    response = agent.post("/api/v1/todos", {"queue": "q", "delay_seconds": value})
    assert assert_error(response, 400, "bad_request").startswith("delay_seconds")


# --- Queues ---------------------------------------------------------------------


def test_queues_lists_settings_and_live_figures(agent, other_agent):
    agent.create(queue="alpha")
    agent.create(queue="alpha", delay_seconds=300)
    agent.create(queue="beta")
    agent.claim(agent.create(queue="beta")["id"])
    other_agent.create(queue="gamma")
    response = agent.get("/api/v1/queues")
    assert response.status_code == 200, response.content
    queues = {queue["name"]: queue for queue in response.json()["queues"]}
    assert set(queues) == {"alpha", "beta"}
    alpha, beta = queues["alpha"], queues["beta"]
    assert alpha["pending"] == 1 and alpha["delayed"] == 1
    assert beta["pending"] == 1 and beta["claimed"] == 1
    for key in (
        "lease_seconds",
        "max_attempts",
        "delay_seconds",
        "paused",
        "retry_scheduled",
        "dead_letter",
        "oldest_pending_age_seconds",
        "created_at",
        "updated_at",
    ):
        assert key in alpha


def test_queues_needs_a_token(endpoint):
    response = Agent(endpoint, token="").get("/api/v1/queues")
    assert_error(response, 401, "unauthorized")
