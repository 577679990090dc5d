"""The agent API of CONTRACT §14: ask, answer, cancel, progress, handoffs,
replace on create, the batch's cancel, and bad input on each."""

import pytest

from tests.api.test_api import Agent, assert_error
from todos import store

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


@pytest.fixture
def other_agent(other_endpoint):
    return Agent(other_endpoint)


def claimed(agent, worker="w1", **fields):
    todo = agent.create(**fields)
    return agent.claim(todo["id"], worker)


def ask(agent, todo_id, **body):
    body.setdefault("worker", "w1")
    body.setdefault("question", "Drop the staging database?")
    return agent.post(f"/api/v1/todos/{todo_id}/ask", body)


# --- Ask and answer -------------------------------------------------------------


def test_ask_holds_the_todo_and_answer_returns_it_to_the_asker(agent):
    todo = claimed(agent)
    response = ask(
        agent,
        todo["id"],
        choices=["approve", "deny"],
        checkpoint={"step": 2},
        deadline_seconds=3600,
    )
    assert response.status_code == 200, response.content
    held = response.json()["todo"]
    assert held["state"] == "pending" and held["outcome"] == "held"
    assert held["question"]["choices"] == ["approve", "deny"]
    assert held["question"]["deadline"].endswith("Z")
    assert held["answer"] is None and held["checkpoint"] == {"step": 2}
    assert "answer_nonce" not in held
    nothing = agent.post("/api/v1/todos/claim", {"worker": "w1"})
    assert_error(nothing, 404, "not_found")

    answered = agent.post(
        f"/api/v1/todos/{todo['id']}/answer",
        {"answer": "approve", "worker": "orchestrator"},
    )
    assert answered.status_code == 200, answered.content
    answer = answered.json()["todo"]["answer"]
    assert (answer["by"], answer["worker"]) == (
        f"agent:{agent.endpoint.name}",
        "orchestrator",
    )
    assert_error(agent.post("/api/v1/todos/claim", {"worker": "w2"}), 404, "not_found")
    again = agent.post("/api/v1/todos/claim", {"worker": "w1"}).json()["todo"]
    assert again["id"] == todo["id"]
    assert again["question"]["text"] == "Drop the staging database?"
    assert again["answer"]["value"] == "approve"
    assert again["checkpoint"] == {"step": 2}


def test_ask_with_the_lease_token_alone(agent):
    todo = claimed(agent)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/ask",
        {"lease_token": todo["lease_token"], "question": "ok?"},
    )
    assert response.status_code == 200


def test_ask_with_a_stale_lease_token_or_as_another_worker_is_a_conflict(agent):
    todo = claimed(agent)
    stale = {"lease_token": "stale", "question": "?"}
    assert_error(agent.post(f"/api/v1/todos/{todo['id']}/ask", stale), 409, "conflict")
    assert_error(ask(agent, todo["id"], worker="w2"), 409, "conflict")


def test_ask_and_answer_of_another_endpoints_todo_are_404(agent, other_agent):
    todo = claimed(other_agent)
    for path, body in (
        ("ask", {"worker": "w1", "question": "?"}),
        ("answer", {"answer": "x"}),
        ("cancel", {}),
    ):
        foreign = agent.post(f"/api/v1/todos/{todo['id']}/{path}", body)
        never = agent.post(f"/api/v1/todos/{NEVER_MINTED}/{path}", body)
        assert_error(foreign, 404, "not_found")
        assert foreign.content == never.content
    waited = agent.get(f"/api/v1/todos/{todo['id']}", wait_seconds=1)
    assert_error(waited, 404, "not_found")


@pytest.mark.parametrize(
    "body, field",
    [
        ({"question": ""}, "question"),
        ({"question": 5}, "question"),
        ({"question": "?", "choices": []}, "choices"),
        ({"question": "?", "choices": "yes"}, "choices"),
        ({"question": "?", "choices": ["ok", "nul\u0000"]}, "choices[1]"),
        ({"question": "?", "answer_schema": {"type": 7}}, "answer_schema"),
        ({"question": "?", "deadline_seconds": 10}, "deadline_seconds"),
        ({"question": "?", "return_to": "elsewhere"}, "return_to"),
        (
            {"question": "?", "answer_schema": {"$ref": "file:///etc/passwd"}},
            "answer_schema.$ref: only a local reference",
        ),
        (
            {
                "question": "?",
                "answer_schema": {"properties": {"u": {"$ref": "http://x.test/"}}},
            },
            "answer_schema.properties.u.$ref",
        ),
        (
            {"question": "?", "answer_schema": {"pattern": "(?<=a)b"}},
            "answer_schema.pattern",
        ),
    ],
)
def test_ask_with_bad_fields_is_400_naming_the_field(agent, body, field):
    todo = claimed(agent)
    detail = assert_error(
        agent.post(f"/api/v1/todos/{todo['id']}/ask", {"worker": "w1", **body}),
        400,
        "bad_request",
    )
    assert field in detail


def test_a_question_over_its_limit_is_400_and_a_checkpoint_413(agent):
    todo = claimed(agent)
    detail = assert_error(
        ask(agent, todo["id"], question="x" * 4001), 400, "bad_request"
    )
    assert "question" in detail
    big = {"blob": "x" * 70_000}
    assert_error(ask(agent, todo["id"], checkpoint=big), 413, "payload_too_large")
    beat = agent.post(
        f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w1", "checkpoint": big}
    )
    assert_error(beat, 413, "payload_too_large")


def test_an_answer_failing_its_schema_is_400_naming_the_path(agent):
    todo = claimed(agent)
    schema = {
        "type": "object",
        "properties": {"budget": {"type": "number", "maximum": 100}},
        "required": ["budget"],
    }
    ask(agent, todo["id"], answer_schema=schema)
    path = f"/api/v1/todos/{todo['id']}/answer"
    detail = assert_error(
        agent.post(path, {"answer": {"budget": 500}}), 400, "bad_request"
    )
    assert "answer.budget" in detail
    assert_error(agent.post(path, {}), 400, "bad_request")
    assert agent.post(path, {"answer": {"budget": 50}}).status_code == 200
    assert_error(agent.post(path, {"answer": {"budget": 5}}), 409, "conflict")


def test_an_answer_not_among_the_choices_is_400(agent):
    todo = claimed(agent)
    ask(agent, todo["id"], choices=["yes", "no"])
    response = agent.post(f"/api/v1/todos/{todo['id']}/answer", {"answer": "maybe"})
    assert "answer" in assert_error(response, 400, "bad_request")


def test_answering_a_todo_that_is_not_asking_is_409(agent):
    todo = agent.create()
    response = agent.post(f"/api/v1/todos/{todo['id']}/answer", {"answer": 1})
    assert_error(response, 409, "conflict")


# --- Cancel ---------------------------------------------------------------------


def test_cancel_of_a_pending_todo_is_200_and_canceled(agent):
    todo = agent.create()
    response = agent.post(f"/api/v1/todos/{todo['id']}/cancel", {"reason": "dup"})
    assert response.status_code == 200, response.content
    canceled = response.json()["todo"]
    assert canceled["state"] == "done" and canceled["outcome"] == "canceled"
    assert canceled["result"]["canceled"]["reason"] == "dup"
    assert canceled["result"]["canceled"]["by"] == f"agent:{agent.endpoint.name}"
    again = agent.post(f"/api/v1/todos/{todo['id']}/cancel", {})
    assert_error(again, 409, "conflict")


def test_cancel_of_a_claimed_todo_is_202_and_its_owner_sees_it(agent):
    todo = claimed(agent)
    response = agent.post(f"/api/v1/todos/{todo['id']}/cancel", {"reason": "stop"})
    assert response.status_code == 202
    assert response.json()["todo"]["cancel_requested"] is True
    beat = agent.post(f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w1"})
    assert beat.json()["todo"]["cancel_requested"] is True
    released = agent.post(f"/api/v1/todos/{todo['id']}/release", {"worker": "w1"})
    assert released.json()["todo"]["outcome"] == "canceled"


def test_cancel_with_an_overlong_reason_is_400(agent):
    todo = agent.create()
    response = agent.post(f"/api/v1/todos/{todo['id']}/cancel", {"reason": "x" * 1001})
    assert "reason" in assert_error(response, 400, "bad_request")


def test_the_batch_cancels_with_the_single_calls_statuses(agent, other_agent):
    pending, busy = agent.create(), claimed(agent)
    foreign = other_agent.create()
    response = agent.post(
        "/api/v1/todos/batch",
        {
            "worker": "w1",
            "actions": [
                {"op": "cancel", "id": pending["id"], "reason": "r"},
                {"op": "heartbeat", "id": busy["id"], "progress": {"fraction": 0.5}},
                {"op": "cancel", "id": busy["id"]},
                {"op": "cancel", "id": foreign["id"]},
            ],
        },
    )
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [200, 200, 202, 404]
    assert results[0]["todo"]["outcome"] == "canceled"
    assert results[1]["todo"]["progress"] == {"message": "", "fraction": 0.5}
    assert [r["id"] for r in results] == [
        pending["id"],
        busy["id"],
        busy["id"],
        foreign["id"],
    ]


# --- Replace on create ----------------------------------------------------------


def test_create_with_replace_cancels_the_pending_duplicate(agent):
    old = agent.create(idempotency_key="deploy-7")
    response = agent.post(
        "/api/v1/todos", {"queue": "q", "idempotency_key": "deploy-7", "replace": True}
    )
    assert response.status_code == 201
    assert response.json()["todo"]["id"] != old["id"]
    assert agent.get(f"/api/v1/todos/{old['id']}").json()["todo"]["outcome"] == (
        "canceled"
    )


def test_create_with_replace_of_a_claimed_duplicate_is_409_naming_it(agent):
    old = claimed(agent, idempotency_key="deploy-8")
    response = agent.post(
        "/api/v1/todos", {"queue": "q", "idempotency_key": "deploy-8", "replace": True}
    )
    assert old["id"] in assert_error(response, 409, "conflict")
    assert agent.get(f"/api/v1/todos/{old['id']}").json()["todo"]["cancel_requested"]


def test_create_with_replace_must_be_a_boolean(agent):
    body = {"queue": "q", "replace": "yes", "idempotency_key": "k"}
    response = agent.post("/api/v1/todos", body)
    assert "replace" in assert_error(response, 400, "bad_request")


def test_create_with_replace_and_no_key_is_a_plain_create(agent):
    response = agent.post("/api/v1/todos", {"queue": "q", "replace": True})
    assert response.status_code == 201


def test_batch_create_with_replace(agent):
    old = agent.create(idempotency_key="k")
    response = agent.post(
        "/api/v1/todos",
        {
            "todos": [
                {"queue": "q", "title": "a"},
                {"queue": "q", "idempotency_key": "k", "replace": True},
            ]
        },
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 201]
    assert store.get_todo_any_endpoint(old["id"]).outcome == "canceled"


# --- Progress and handoffs ------------------------------------------------------


def test_heartbeat_takes_progress_and_checkpoint(agent):
    todo = claimed(agent)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/heartbeat",
        {
            "worker": "w1",
            "progress": {"message": "35 of 60 min", "fraction": 0.58},
            "checkpoint": {"epoch": 35},
        },
    )
    beat = response.json()["todo"]
    assert beat["progress"] == {"message": "35 of 60 min", "fraction": 0.58}
    assert beat["checkpoint"] == {"epoch": 35}


@pytest.mark.parametrize(
    "progress",
    [{"fraction": 2}, {"message": "x" * 501}, {"other": 1}, "half", {"fraction": True}],
)
def test_heartbeat_with_bad_progress_is_400(agent, progress):
    todo = claimed(agent)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w1", "progress": progress}
    )
    assert "progress" in assert_error(response, 400, "bad_request")


def test_release_hands_off_to_a_named_worker(agent):
    todo = claimed(agent)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/release",
        {
            "worker": "w1",
            "assignee": "reviewer",
            "note": "needs a human-grade review",
            "checkpoint": {"draft": 3},
        },
    )
    handed = response.json()["todo"]
    assert handed["assignee"] == "reviewer" and handed["note"].startswith("needs")
    assert handed["checkpoint"] == {"draft": 3}
    taken = agent.post("/api/v1/todos/claim", {"worker": "reviewer"}).json()["todo"]
    assert taken["id"] == todo["id"]


def test_release_with_a_null_assignee_returns_to_the_pool(agent):
    todo = claimed(agent, assignee="w1")
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/release", {"worker": "w1", "assignee": None}
    )
    assert response.json()["todo"]["assignee"] is None


def test_a_batch_create_of_only_replacing_items(agent):
    """A batch whose every item replaces made an empty store batch: a 500."""
    old = agent.create(idempotency_key="k")
    body = {"todos": [{"queue": "q", "idempotency_key": "k", "replace": True}]}
    response = agent.post("/api/v1/todos", body)
    assert response.status_code == 200, response.content
    assert [r["status"] for r in response.json()["results"]] == [201]
    assert store.get_todo_any_endpoint(old["id"]).outcome == "canceled"


def test_an_answer_schema_nested_too_deep_is_400_naming_the_limit(agent):
    todo = claimed(agent)
    deep = {"type": "string"}
    for _ in range(60):
        deep = {"items": deep}
    response = ask(agent, todo["id"], answer_schema=deep)
    assert "deeper than 32 levels" in assert_error(response, 400, "bad_request")
