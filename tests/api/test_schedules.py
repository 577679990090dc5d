"""The schedules of the agent JSON API (CONTRACT §20): create, list, read,
change, pause, resume, fire now, the next slots, delete, and the errors."""

import json
import uuid

import pytest

from tests.api.test_api import Agent, assert_error
from tests.support import DatabaseClock
from todos import store


class ScheduleAgent(Agent):
    def put(self, path, body):
        return self.client.put(
            path, json.dumps(body), content_type="application/json", **self._auth()
        )

    def delete(self, path):
        return self.client.delete(path, **self._auth())

    def schedule(self, **fields):
        body = {"name": "nightly", "queue": "reviews", "cron": "0 2 * * *", **fields}
        response = self.post("/api/v1/schedules", body)
        assert response.status_code == 201, response.content
        return response.json()["schedule"]


@pytest.fixture
def clock(db):
    clock = DatabaseClock().install("2026-03-27T00:00:00Z").use().serve()
    yield clock
    clock.remove()


@pytest.fixture
def agent(endpoint, clock):
    return ScheduleAgent(endpoint)


@pytest.fixture
def other_agent(other_endpoint, clock):
    return ScheduleAgent(other_endpoint)


def test_create_answers_201_with_the_schedule_and_its_first_slot(agent):
    response = agent.post(
        "/api/v1/schedules",
        {
            "name": "nightly",
            "queue": "reviews",
            "cron": "0 2 * * *",
            "time_zone": "Europe/Berlin",
            "todo": {"title": "Review the open PRs", "payload": {"repo": "acme"}},
            "overlap": "skip",
        },
    )

    assert response.status_code == 201, response.content
    schedule = response.json()["schedule"]
    assert schedule["next_slot_at"] == "2026-03-27T01:00:00Z"
    assert schedule["todo"] == {
        "title": "Review the open PRs",
        "payload": {"repo": "acme"},
    }
    assert (schedule["overlap"], schedule["missed"], schedule["paused"]) == (
        "skip",
        "skip",
        False,
    )
    assert (schedule["time_zone"], schedule["every_seconds"]) == ("Europe/Berlin", None)


def test_list_and_get_show_only_this_endpoints_schedules(agent, other_agent):
    mine = agent.schedule(name="a")
    agent.schedule(name="b", cron="@hourly")
    other_agent.schedule(name="c")

    listed = agent.get("/api/v1/schedules", limit=1).json()
    rest = agent.get("/api/v1/schedules", cursor=listed["next_cursor"]).json()

    assert [s["name"] for s in listed["schedules"]] == ["a"]
    assert [s["name"] for s in rest["schedules"]] == ["b"]
    assert rest["next_cursor"] is None
    assert agent.get(f"/api/v1/schedules/{mine['id']}").json()["schedule"] == mine


def test_a_foreign_schedule_answers_exactly_as_a_missing_one(agent, other_agent):
    foreign = other_agent.schedule()["id"]
    missing = str(uuid.uuid4())

    for suffix, call in [
        ("", agent.get),
        ("/next", agent.get),
        ("/pause", agent.post),
        ("/resume", agent.post),
        ("/fire", agent.post),
        ("", agent.delete),
        ("", lambda path: agent.put(path, {"name": "x"})),
    ]:
        answers = [
            call(f"/api/v1/schedules/{schedule_id}{suffix}")
            for schedule_id in (foreign, missing, "not-a-uuid")
        ]
        assert {a.status_code for a in answers} == {404}, suffix
        assert len({a.content for a in answers}) == 1, suffix


def test_put_changes_the_fields_given_and_restarts_the_recurrence(agent, clock):
    schedule = agent.schedule()
    clock.advance(minutes=10)

    response = agent.put(
        f"/api/v1/schedules/{schedule['id']}",
        {"every_seconds": 3600, "todo": {"title": "Hourly"}},
    )

    assert response.status_code == 200, response.content
    changed = response.json()["schedule"]
    assert (changed["cron"], changed["every_seconds"]) == (None, 3600)
    assert changed["next_slot_at"] == "2026-03-27T01:00:00Z"
    assert changed["todo"] == {"title": "Hourly"}
    assert changed["name"] == "nightly"


def test_pause_and_resume(agent):
    schedule = agent.schedule()

    paused = agent.post(f"/api/v1/schedules/{schedule['id']}/pause").json()
    resumed = agent.post(f"/api/v1/schedules/{schedule['id']}/resume").json()

    assert paused["schedule"]["paused"] is True
    assert paused["schedule"]["next_slot_at"] is None
    assert resumed["schedule"]["paused"] is False
    assert resumed["schedule"]["next_slot_at"] == "2026-03-27T02:00:00Z"


def test_fire_now_makes_one_todo_per_call_and_a_key_makes_it_idempotent(agent):
    schedule = agent.schedule(todo={"title": "Review", "max_attempts": 2})
    path = f"/api/v1/schedules/{schedule['id']}/fire"

    first = agent.post(path)
    second = agent.post(path)
    keyed = agent.post(path, {"idempotency_key": "run-1"})
    again = agent.post(path, {"idempotency_key": "run-1"})

    assert [r.status_code for r in (first, second, keyed, again)] == [
        201,
        201,
        201,
        200,
    ]
    todo = first.json()["todo"]
    assert (todo["queue"], todo["title"], todo["max_attempts"]) == (
        "reviews",
        "Review",
        2,
    )
    assert first.json()["todo"]["id"] != second.json()["todo"]["id"]
    assert again.json()["todo"]["id"] == keyed.json()["todo"]["id"]


def test_next_lists_the_coming_slots_in_utc(agent):
    schedule = agent.schedule(cron="30 2 * * *", time_zone="Europe/Berlin")

    response = agent.get(f"/api/v1/schedules/{schedule['id']}/next", n=3)

    assert response.json() == {
        "slots": [
            "2026-03-27T01:30:00Z",
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
        ]
    }
    assert_error(
        agent.get(f"/api/v1/schedules/{schedule['id']}/next", n=0), 400, "bad_request"
    )


def test_delete_answers_204_and_the_schedule_is_gone(agent):
    schedule = agent.schedule()

    assert agent.delete(f"/api/v1/schedules/{schedule['id']}").status_code == 204
    assert agent.get(f"/api/v1/schedules/{schedule['id']}").status_code == 404


def test_a_duplicate_name_answers_409(agent):
    agent.schedule()
    other = agent.schedule(name="other")

    duplicate = agent.post(
        "/api/v1/schedules", {"name": "nightly", "queue": "q", "cron": "@daily"}
    )
    renamed = agent.put(f"/api/v1/schedules/{other['id']}", {"name": "nightly"})

    assert_error(duplicate, 409, "conflict")
    assert_error(renamed, 409, "conflict")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"cron": "0 25 * * *"}, "cron:"),
        ({"cron": "every night"}, "cron:"),
        ({"cron": None}, "cron:"),
        ({"every_seconds": 3600}, "cron:"),
        ({"cron": None, "every_seconds": 10}, "every_seconds:"),
        ({"time_zone": "Europe/Atlantis"}, "time_zone:"),
        ({"todo": "review"}, "todo:"),
        ({"todo": {"title": ["a"]}}, "todo.title:"),
        ({"todo": {"max_attempts": "3"}}, "todo.max_attempts:"),
        ({"todo": {"group": 7}}, "todo.group:"),
        ({"todo": {"priority": 0}}, "todo.priority:"),
        ({"todo": {"max_cost": -1.5}}, "todo.max_cost:"),
        ({"overlap": "queue"}, "overlap:"),
        ({"missed": "every"}, "missed:"),
        ({"name": ""}, "name:"),
        ({"paused": "yes"}, "paused:"),
    ],
)
def test_a_bad_field_answers_400_naming_it(agent, fields, named):
    body = {"name": "nightly", "queue": "reviews", "cron": "0 2 * * *", **fields}

    response = agent.post("/api/v1/schedules", body)

    assert_error(response, 400, "bad_request")
    assert response.json()["detail"].startswith(named), response.json()


def test_a_queue_outside_the_grant_answers_403(make_endpoint, clock):
    agent = ScheduleAgent(make_endpoint("narrow", queues=("a",)))

    response = agent.post(
        "/api/v1/schedules", {"name": "n", "queue": "b", "cron": "@daily"}
    )

    assert_error(response, 403, "forbidden")


def test_the_sweep_fires_a_schedule_created_through_the_api(agent, clock):
    schedule = agent.schedule(cron="@hourly", todo={"title": "Triage"})
    clock.advance(hours=1, seconds=1)

    [todo] = store.fire_due_schedules().todos

    assert todo.title == "Triage"
    assert (
        agent.get(f"/api/v1/schedules/{schedule['id']}").json()["schedule"][
            "last_todo_id"
        ]
        == todo.id
    )
