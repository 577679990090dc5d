"""Budgets over the JSON API (CONTRACT §18)."""

import pytest

from tests.api.test_api import Agent, assert_error


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


def put(agent, path, body):
    return agent.client.put(
        path, body, content_type="application/json", **agent._auth()
    )


def delete(agent, path):
    return agent.client.delete(path, **agent._auth())


def test_create_read_change_and_delete_a_budget(agent):
    created = agent.post(
        "/api/v1/budgets",
        {
            "scope": "queue",
            "queue": "reviews",
            "window": "day",
            "limit_usd": 50,
            "time_zone": "Europe/Berlin",
        },
    )
    assert created.status_code == 201, created.content
    budget = created.json()["budget"]
    assert (budget["soft_percent"], budget["action"]) == (80, "pause")
    agent.post("/api/v1/usage", {"queue": "reviews", "usage": {"cost_usd": 12.5}})
    path = f"/api/v1/budgets/{budget['id']}"
    read = agent.get(path).json()["budget"]
    assert (read["spent_usd"], read["left_usd"]) == (12.5, 37.5)
    changed = put(agent, path, {"limit_usd": 60})
    assert changed.status_code == 200 and changed.json()["budget"]["left_usd"] == 47.5
    assert [b["id"] for b in agent.get("/api/v1/budgets").json()["budgets"]] == [
        budget["id"]
    ]
    assert delete(agent, path).status_code == 204
    assert_error(agent.get(path), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"scope": "queue", "window": "day", "limit_usd": 1}, "queue"),
        ({"scope": "endpoint", "window": "day"}, "limit_usd"),
        ({"scope": "endpoint", "window": "year", "limit_usd": 1}, "window"),
        ({"scope": "endpoint", "window": "day", "limit_usd": "1"}, "limit_usd"),
        (
            {"scope": "endpoint", "window": "day", "limit_usd": 1, "time_zone": "X/Y"},
            "time_zone",
        ),
    ],
)
def test_a_bad_budget_is_a_400_naming_the_field(agent, body, named):
    response = agent.post("/api/v1/budgets", body)
    assert_error(response, 400, "bad_request")
    assert named in response.json()["detail"]


def test_a_budget_of_a_queue_outside_the_grant_is_403(make_endpoint):
    narrow = Agent(make_endpoint("narrow", queues=("q",)))
    response = narrow.post(
        "/api/v1/budgets",
        {"scope": "queue", "queue": "b", "window": "day", "limit_usd": 1},
    )
    assert_error(response, 403, "forbidden")
