"""CONTRACT §17 over the agent API: priority, group and cost on create and in
the todo JSON, PATCH /queues/<name>, the groups endpoints, a todo's priority."""

import json

import pytest

from tests.api.test_api import Agent, assert_error


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


def send(agent, method, path, body):
    call = getattr(agent.client, method)
    return call(
        path, json.dumps(body), content_type="application/json", **agent._auth()
    )


def claim_batch(agent, **fields):
    response = agent.post(
        "/api/v1/todos/claim", {"worker": "w1", "max_todos": 10, **fields}
    )
    assert response.status_code == 200, response.content
    return response.json()["todos"]


def test_create_takes_priority_group_and_cost_and_the_todo_json_shows_them(agent):
    """CONTRACT §17: priority, group, cost on create and in the todo JSON."""
    todo = agent.create(priority=1, group="acme/api", cost=2.5)
    assert (todo["priority"], todo["group"], todo["cost"]) == (1, "acme/api", 2.5)
    plain = agent.create()
    assert (plain["priority"], plain["group"], plain["cost"]) == (3, None, 1.0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("priority", 0),
        ("priority", 6),
        ("group", ""),
        ("group", "x" * 201),
        ("cost", 0),
        ("cost", "1"),
    ],
)
def test_create_refuses_a_bad_priority_group_or_cost_with_400(agent, field, value):
    """CONTRACT §17: bad input gets a 400 naming the field."""
    response = agent.post("/api/v1/todos", {"queue": "q", field: value})
    assert_error(response, 400, "bad_request")
    assert field in response.json()["detail"]


def test_a_batch_create_takes_priority_group_and_cost(agent):
    """CONTRACT §17: every create surface: the batch too."""
    response = agent.post(
        "/api/v1/todos", {"todos": [{"queue": "q", "group": "g", "priority": 2}]}
    )
    assert response.status_code == 200, response.content
    todo = response.json()["results"][0]["todo"]
    assert (todo["group"], todo["priority"]) == ("g", 2)


def test_patch_queue_sets_admission_and_answers_the_queue(agent):
    """CONTRACT §17: PATCH /api/v1/queues/<name> takes §10's settings and
    admission's, creates the queue on first use, answers 200 {"queue"}."""
    response = send(
        agent,
        "patch",
        "/api/v1/queues/fresh",
        {
            "group_concurrency": 1,
            "fair": True,
            "rate_limit": {"count": 5, "per_seconds": 60},
            "priority_aging_seconds": 300,
            "lease_seconds": 120,
        },
    )
    assert response.status_code == 200, response.content
    queue = response.json()["queue"]
    assert queue["name"] == "fresh" and queue["lease_seconds"] == 120
    assert queue["group_concurrency"] == 1 and queue["fair"] is True
    assert queue["rate_limit"] == {"count": 5, "per_seconds": 60, "burst": 5}
    assert queue["priority_aging_seconds"] == 300
    assert queue["groups_at_limit"] == 0
    cleared = send(agent, "patch", "/api/v1/queues/fresh", {"rate_limit": None})
    assert cleared.json()["queue"]["rate_limit"] is None
    assert cleared.json()["queue"]["group_concurrency"] == 1


def test_patch_queue_refuses_bad_settings_and_queues_outside_the_grant(
    make_endpoint,
):
    """CONTRACT §17: 400 for a bad or unknown setting, 403 outside the grant."""
    agent = Agent(make_endpoint("narrow", queues=("mine",)))
    bad = send(agent, "patch", "/api/v1/queues/mine", {"group_concurrency": -1})
    assert_error(bad, 400, "bad_request")
    unknown = send(agent, "patch", "/api/v1/queues/mine", {"colour": "red"})
    assert_error(unknown, 400, "bad_request")
    outside = send(agent, "patch", "/api/v1/queues/theirs", {"fair": True})
    assert_error(outside, 403, "forbidden")


def test_groups_at_limit_and_the_groups_listing(agent):
    """CONTRACT §17: GET /queues/<name>/groups: in flight, pending, oldest
    wait, limit, weight, paused; the queue counts its groups at the limit."""
    send(agent, "patch", "/api/v1/queues/q", {"group_concurrency": 1})
    for group in ("a", "a", "b"):
        agent.create(group=group)
    assert len(claim_batch(agent)) == 2
    queue = agent.get("/api/v1/queues").json()["queues"][0]
    assert queue["groups_at_limit"] == 2
    listed = agent.get("/api/v1/queues/q/groups").json()
    groups = {group["group"]: group for group in listed["groups"]}
    assert groups["a"]["in_flight"] == 1 and groups["a"]["pending"] == 1
    assert groups["a"]["limit"] == 1 and groups["b"]["pending"] == 0
    assert listed["next_after"] is None
    page = agent.get("/api/v1/queues/q/groups", limit=1).json()
    assert [g["group"] for g in page["groups"]] == ["a"] and page["next_after"] == "a"
    rest = agent.get("/api/v1/queues/q/groups", after="a").json()
    assert [g["group"] for g in rest["groups"]] == ["b"]


def test_put_group_sets_an_override_and_a_slash_in_the_name_works(agent):
    """CONTRACT §17: PUT /queues/<name>/groups/<group>: concurrency, weight,
    paused; a repository's name (with a slash) is a group name."""
    send(agent, "patch", "/api/v1/queues/q", {"group_concurrency": 1})
    response = send(
        agent,
        "put",
        "/api/v1/queues/q/groups/acme/api",
        {"concurrency": 2, "weight": 3, "paused": False},
    )
    assert response.status_code == 200, response.content
    group = response.json()["group"]
    assert (group["group"], group["limit"], group["weight"]) == ("acme/api", 2, 3)
    for _ in range(3):
        agent.create(group="acme/api")
    assert len(claim_batch(agent)) == 2
    read = agent.get("/api/v1/queues/q/groups/acme/api").json()["group"]
    assert read["in_flight"] == 2
    bad = send(agent, "put", "/api/v1/queues/q/groups/acme/api", {"weight": 0})
    assert_error(bad, 400, "bad_request")


def test_post_priority_changes_a_pending_todo_and_conflicts_once_claimed(agent):
    """CONTRACT §17: POST /api/v1/todos/<id>/priority."""
    first = agent.create()
    second = agent.create()
    response = agent.post(f"/api/v1/todos/{second['id']}/priority", {"priority": 1})
    assert response.status_code == 200, response.content
    assert response.json()["todo"]["priority"] == 1
    assert claim_batch(agent, max_todos=1)[0]["id"] == second["id"]
    conflict = agent.post(f"/api/v1/todos/{second['id']}/priority", {"priority": 2})
    assert_error(conflict, 409, "conflict")
    bad = agent.post(f"/api/v1/todos/{first['id']}/priority", {"priority": 9})
    assert_error(bad, 400, "bad_request")
