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


# --- At the limit -----------------------------------------------------------------


def exhaust(agent, action="pause", queue="reviews"):
    """A $1 day budget on ``queue``, spent to its limit; return it."""
    created = agent.post(
        "/api/v1/budgets",
        {
            "scope": "queue",
            "queue": queue,
            "window": "day",
            "limit_usd": 1,
            "action": action,
        },
    )
    assert created.status_code == 201, created.content
    agent.post("/api/v1/usage", {"queue": queue, "usage": {"cost_usd": 1}})
    return created.json()["budget"]


def claim_next(agent, queue="reviews"):
    return agent.post("/api/v1/todos/claim", {"worker": "w", "queue": queue})


def test_reject_new_answers_429_budget_exhausted_naming_the_budget(agent):
    budget = exhaust(agent, action="reject_new")
    refused = agent.post("/api/v1/todos", {"queue": "reviews"})
    detail = assert_error(refused, 429, "budget_exhausted")
    assert budget["id"] in detail
    assert 0 < int(refused["Retry-After"]) <= 86400
    batch = agent.post(
        "/api/v1/todos", {"todos": [{"queue": "reviews"}, {"queue": "x"}]}
    )
    results = batch.json()["results"]
    assert results[0]["status"] == 429 and results[0]["error"] == "budget_exhausted"
    assert results[1]["status"] == 201
    assert agent.post("/api/v1/todos", {"queue": "x"}).status_code == 201


def test_a_paused_budget_passes_its_queue_over_until_raised_through_the_api(agent):
    budget = exhaust(agent)
    agent.create(queue="reviews")
    assert claim_next(agent).status_code == 404
    read = agent.get(f"/api/v1/budgets/{budget['id']}").json()["budget"]
    assert (read["state"], read["left_usd"]) == ("exhausted", 0)
    decided = agent.post(
        f"/api/v1/budgets/{budget['id']}/decision",
        {"decision": "raise", "amount_usd": 5},
    )
    assert decided.status_code == 200, decided.content
    assert decided.json()["budget"]["left_usd"] == 5
    assert claim_next(agent).status_code == 200


def test_resume_and_keep_paused_through_the_api(agent):
    budget = exhaust(agent)
    path = f"/api/v1/budgets/{budget['id']}/decision"
    agent.create(queue="reviews")
    kept = agent.post(path, {"decision": "keep_paused"})
    assert kept.status_code == 200 and kept.json()["budget"]["state"] == "exhausted"
    assert claim_next(agent).status_code == 404
    resumed = agent.post(path, {"decision": "resume"})
    assert resumed.json()["budget"]["state"] == "resumed"
    assert claim_next(agent).status_code == 200


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ({}, "decision"),
        ({"decision": "explode"}, "decision"),
        ({"decision": "raise"}, "amount_usd"),
        ({"decision": "raise", "amount_usd": -2}, "amount_usd"),
        ({"decision": "raise", "amount_tokens": 5}, "amount_tokens"),
    ],
)
def test_a_bad_decision_is_400_naming_the_field(agent, body, word):
    budget = exhaust(agent)
    refused = agent.post(f"/api/v1/budgets/{budget['id']}/decision", body)
    assert word in assert_error(refused, 400, "bad_request")


def test_a_decision_on_a_foreign_budget_is_404_like_a_missing_one(
    agent, other_endpoint
):
    from tests.api.test_api import Agent

    foreign = exhaust(Agent(other_endpoint))
    for budget_id in (foreign["id"], "00000000-0000-0000-0000-000000000000", "nope"):
        answer = agent.post(
            f"/api/v1/budgets/{budget_id}/decision", {"decision": "resume"}
        )
        assert_error(answer, 404, "not_found")


def test_create_takes_max_cost_and_the_todo_json_shows_it(agent):
    todo = agent.create(queue="reviews", max_cost=1.25)
    assert todo["max_cost"] == 1.25
    assert agent.create(queue="reviews")["max_cost"] is None
    batch = agent.post(
        "/api/v1/todos", {"todos": [{"queue": "reviews", "max_cost": 0}]}
    )
    assert batch.status_code == 200, batch.content
    assert batch.json()["results"][0]["todo"]["max_cost"] == 0


@pytest.mark.parametrize("value", [-0.01, "1", True, 10**10])
def test_a_bad_max_cost_is_a_400_naming_it(agent, value):
    response = agent.post("/api/v1/todos", {"queue": "reviews", "max_cost": value})
    assert_error(response, 400, "bad_request")
    assert "max_cost" in response.json()["detail"]


def test_a_claim_passes_over_a_todo_whose_max_cost_does_not_fit(agent):
    created = agent.post(
        "/api/v1/budgets",
        {"scope": "queue", "queue": "reviews", "window": "day", "limit_usd": 5},
    )
    assert created.status_code == 201, created.content
    first = agent.create(queue="reviews", max_cost=4)
    agent.create(queue="reviews", max_cost=4)
    taken = claim_next(agent)
    assert taken.status_code == 200, taken.content
    assert taken.json()["todo"]["id"] == first["id"]
    assert claim_next(agent).status_code == 404
    done = agent.post(
        f"/api/v1/todos/{first['id']}/complete",
        {"worker": "w", "usage": {"cost_usd": 0.5}},
    )
    assert done.status_code == 200, done.content
    assert claim_next(agent).status_code == 200
