"""Admission control over MCP (CONTRACT §17): create_todo takes priority,
group and cost and the todo shows them; get_queue, update_queue, list_groups,
set_group and set_priority read and set what the claim decides by, as the
JSON API's views do (the same operations), with bad input a tool error."""

import pytest

from tests.mcp.test_questions import tool_call
from todos import store
from todos.store import admission


def ok(result):
    assert result["isError"] is False, result["content"][0]["text"]
    return result["structuredContent"]


def refused(result, code="bad_request"):
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == code
    return result["structuredContent"]["detail"]


def test_create_todo_takes_priority_group_and_cost_and_the_todo_shows_them(
    post, session_id
):
    created = ok(
        tool_call(
            post,
            session_id,
            "create_todo",
            {"queue": "q", "priority": 1, "group": "acme/app", "cost": 2.5},
        )
    )["todo"]
    assert (created["priority"], created["group"], created["cost"]) == (
        1,
        "acme/app",
        2.5,
    )
    fetched = ok(tool_call(post, session_id, "get_todo", {"todo_id": created["id"]}))
    assert fetched["todo"]["group"] == "acme/app"


@pytest.mark.parametrize(
    ("field", "value"), [("priority", 0), ("priority", 6), ("cost", 0), ("group", "")]
)
def test_create_todo_refuses_a_bad_priority_group_or_cost_naming_it(
    post, session_id, field, value
):
    result = tool_call(post, session_id, "create_todo", {"queue": "q", field: value})
    assert refused(result).startswith(f"{field}:")


def test_update_queue_sets_admission_makes_the_queue_and_get_queue_reads_it(
    post, session_id, scope
):
    settings = {
        "queue": "repos",
        "group_concurrency": 1,
        "fair": True,
        "rate_limit": {"count": 10, "per_seconds": 60},
        "priority_aging_seconds": 300,
        "lease_seconds": 120,
    }
    queue = ok(tool_call(post, session_id, "update_queue", settings))["queue"]
    assert queue["group_concurrency"] == 1 and queue["fair"] is True
    assert queue["rate_limit"] == {"count": 10, "per_seconds": 60, "burst": 10}
    assert (queue["priority_aging_seconds"], queue["lease_seconds"]) == (300, 120)
    read = ok(tool_call(post, session_id, "get_queue", {"queue": "repos"}))["queue"]
    assert read == {**queue, "updated_at": read["updated_at"]}
    assert admission.get_admission(scope, "repos").group_concurrency == 1


def test_update_queue_changes_only_the_settings_given_and_null_turns_one_off(
    post, session_id
):
    tool_call(
        post,
        session_id,
        "update_queue",
        {"queue": "q", "group_concurrency": 2, "rate_limit": {"count": 5}},
    )
    queue = ok(
        tool_call(post, session_id, "update_queue", {"queue": "q", "rate_limit": None})
    )["queue"]
    assert (queue["group_concurrency"], queue["rate_limit"]) == (2, None)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"group_concurrency": -1}, "group_concurrency"),
        ({"fair": "yes"}, "fair"),
        ({"rate_limit": {"count": 0}}, "rate_limit.count"),
        ({"priority_aging_seconds": "soon"}, "priority_aging_seconds"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_update_queue_refuses_a_bad_setting_naming_it(
    post, session_id, arguments, named
):
    result = tool_call(post, session_id, "update_queue", {"queue": "q", **arguments})
    assert named in refused(result)


def test_update_queue_outside_the_grant_is_forbidden(post, session_id, endpoint):
    endpoint.queues = ["mine"]
    endpoint.save()
    result = tool_call(post, session_id, "update_queue", {"queue": "theirs"})
    refused(result, "forbidden")


def test_get_queue_of_a_queue_never_used_is_not_found(post, session_id):
    refused(tool_call(post, session_id, "get_queue", {"queue": "nope"}), "not_found")


def test_set_group_overrides_one_group_and_list_groups_shows_it(
    post, session_id, scope
):
    store.create_todo(scope, queue="q", group="acme/app")
    tool_call(post, session_id, "update_queue", {"queue": "q", "group_concurrency": 1})
    group = ok(
        tool_call(
            post,
            session_id,
            "set_group",
            {"queue": "q", "group": "acme/app", "concurrency": 3, "weight": 2},
        )
    )["group"]
    assert (group["limit"], group["weight"], group["paused"]) == (3, 2, False)
    paused = ok(
        tool_call(
            post,
            session_id,
            "set_group",
            {"queue": "q", "group": "acme/app", "paused": True},
        )
    )["group"]
    assert (paused["concurrency"], paused["weight"], paused["paused"]) == (3, 2, True)
    page = ok(tool_call(post, session_id, "list_groups", {"queue": "q"}))
    (listed,) = page["groups"]
    assert (listed["group"], listed["pending"], listed["paused"]) == (
        "acme/app",
        1,
        True,
    )
    assert page["next_after"] is None


def test_a_paused_group_is_passed_over_by_claim_next(post, session_id, scope):
    held, _ = store.create_todo(scope, queue="q", group="held")
    free, _ = store.create_todo(scope, queue="q", group="free")
    tool_call(
        post, session_id, "set_group", {"queue": "q", "group": "held", "paused": True}
    )
    claimed = ok(tool_call(post, session_id, "claim_next", {"queue": "q"}))["todo"]
    assert claimed["id"] == free.id != held.id


def test_set_group_refuses_a_bad_weight(post, session_id):
    result = tool_call(
        post, session_id, "set_group", {"queue": "q", "group": "g", "weight": 0}
    )
    assert refused(result).startswith("weight:")


def test_set_priority_changes_a_pending_todo_and_conflicts_once_claimed(
    post, session_id, scope
):
    first, _ = store.create_todo(scope, queue="q")
    second, _ = store.create_todo(scope, queue="q")
    raised = ok(
        tool_call(
            post, session_id, "set_priority", {"todo_id": second.id, "priority": 1}
        )
    )["todo"]
    assert raised["priority"] == 1
    claimed = ok(tool_call(post, session_id, "claim_next", {"queue": "q"}))["todo"]
    assert claimed["id"] == second.id != first.id
    again = tool_call(
        post, session_id, "set_priority", {"todo_id": second.id, "priority": 5}
    )
    refused(again, "conflict")


def test_create_todo_takes_max_cost_and_the_todo_shows_it(post, session_id):
    """CONTRACT §18: max_cost on MCP's create_todo, as on the JSON API."""
    created = ok(
        tool_call(post, session_id, "create_todo", {"queue": "q", "max_cost": 0.75})
    )["todo"]
    assert created["max_cost"] == 0.75
    detail = refused(
        tool_call(post, session_id, "create_todo", {"queue": "q", "max_cost": -1})
    )
    assert "max_cost" in detail
