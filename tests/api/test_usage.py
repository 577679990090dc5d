"""Usage over the JSON API: on heartbeat, complete, fail, a batch, and
outside a todo (CONTRACT §18)."""

import pytest

from tests.api.test_api import Agent, assert_error


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


def claimed(agent):
    return agent.claim(agent.create()["id"])


def test_heartbeat_and_complete_report_the_attempts_running_total(agent):
    todo = claimed(agent)
    path = f"/api/v1/todos/{todo['id']}"
    beat = agent.post(
        f"{path}/heartbeat",
        {"worker": "w1", "usage": {"input_tokens": 1200, "cost_usd": 0.012}},
    )
    assert beat.status_code == 200, beat.content
    assert beat.json()["todo"]["usage"]["input_tokens"] == 1200
    done = agent.post(
        f"{path}/complete",
        {
            "lease_token": todo["lease_token"],
            "usage": {"input_tokens": 3000, "output_tokens": 400, "cost_usd": 0.034},
        },
    )
    assert done.json()["todo"]["usage"] == {
        "input_tokens": 3000,
        "output_tokens": 400,
        "cost_usd": 0.034,
    }
    assert agent.get(path).json()["todo"]["usage"]["cost_usd"] == 0.034


def test_a_todo_without_reports_has_null_usage(agent):
    assert agent.create()["usage"] is None


def test_fail_reports_usage(agent):
    todo = claimed(agent)
    failed = agent.post(
        f"/api/v1/todos/{todo['id']}/fail",
        {"worker": "w1", "error": "x", "usage": {"cost_usd": 2}},
    )
    assert failed.json()["todo"]["usage"]["cost_usd"] == 2


def test_a_batch_action_reports_usage(agent):
    todo = claimed(agent)
    response = agent.post(
        "/api/v1/todos/batch",
        {
            "worker": "w1",
            "actions": [
                {"op": "complete", "id": todo["id"], "usage": {"output_tokens": 9}}
            ],
        },
    )
    (result,) = response.json()["results"]
    assert result["todo"]["usage"]["output_tokens"] == 9


@pytest.mark.parametrize(
    ("usage", "named"),
    [
        ({"input_tokens": -1}, "usage.input_tokens"),
        ({"cost_usd": "1"}, "usage.cost_usd"),
        ({"model": ""}, "usage.model"),
        ({"dollars": 1}, "usage.dollars"),
        ([1], "usage"),
    ],
)
def test_a_bad_usage_is_a_400_naming_the_field(agent, usage, named):
    todo = claimed(agent)
    response = agent.post(
        f"/api/v1/todos/{todo['id']}/heartbeat", {"worker": "w1", "usage": usage}
    )
    assert_error(response, 400, "bad_request")
    assert named in response.json()["detail"]


def test_usage_outside_a_todo_is_201_then_200_for_its_key(agent):
    body = {"queue": "planning", "usage": {"cost_usd": 0.5}, "idempotency_key": "p1"}
    first = agent.post("/api/v1/usage", body)
    assert first.status_code == 201, first.content
    assert first.json()["usage"]["cost_usd"] == 0.5
    again = agent.post("/api/v1/usage", body)
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["usage"]["id"] == first.json()["usage"]["id"]


def test_usage_outside_the_grant_is_403(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("q",)))
    response = narrow.post("/api/v1/usage", {"queue": "b", "usage": {"cost_usd": 1}})
    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize(
    "body",
    [
        {"usage": {"cost_usd": 1}},
        {"queue": "q"},
        {"queue": "q", "usage": {}},
        {"queue": "q", "usage": {"cost_usd": -1}},
    ],
)
def test_a_bad_outside_report_is_a_400(agent, body):
    assert_error(agent.post("/api/v1/usage", body), 400, "bad_request")
