"""Usage on the MCP owner tools (CONTRACT §18): heartbeat, complete_todo and
fail_todo take the attempt's running total; a bad one is a tool error naming
the field."""

import pytest

from tests.mcp.test_questions import tool_call
from todos import store
from todos.mcp.tools import TOOLS


@pytest.fixture
def claimed(scope, session_id):
    todo, _ = store.create_todo(scope, queue="q")
    return store.claim_todo(scope, todo.id, session_id).id


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("heartbeat", {}),
        ("complete_todo", {"result": {"ok": True}}),
        ("fail_todo", {"error": "boom"}),
    ],
)
def test_the_owner_tools_report_usage(
    post, session_id, claimed, scope, tool, arguments
):
    usage = {"input_tokens": 12, "output_tokens": 3, "cost_usd": 0.05, "model": "m"}
    result = tool_call(
        post, session_id, tool, {"todo_id": claimed, "usage": usage, **arguments}
    )
    assert result["isError"] is False, result["content"][0]["text"]
    reported = result["structuredContent"]["todo"]["usage"]
    assert reported == {"input_tokens": 12, "output_tokens": 3, "cost_usd": 0.05}
    (row,) = store.usage_ledger(scope, todo_id=claimed)
    assert row.model == "m"


def test_a_bad_usage_is_a_tool_error_naming_the_field(post, session_id, claimed, scope):
    result = tool_call(
        post,
        session_id,
        "heartbeat",
        {"todo_id": claimed, "usage": {"cost_usd": -1}},
    )
    assert result["isError"] is True
    assert "usage.cost_usd" in result["content"][0]["text"]
    assert store.usage_ledger(scope, todo_id=claimed) == []


def test_the_usage_schema_carries_the_stores_limits():
    for name in ("heartbeat", "complete_todo", "fail_todo"):
        usage = TOOLS[name].schema()["properties"]["usage"]["properties"]
        assert usage["input_tokens"]["maximum"] == store.MAX_USAGE_TOKENS
        assert usage["model"]["maxLength"] == store.MAX_MODEL_CHARS


def test_list_budgets_reads_each_budgets_spend(post, session_id, scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=2
    )
    store.report_usage(scope, queue="q", usage={"cost_usd": 0.5})
    result = tool_call(post, session_id, "list_budgets", {})
    assert result["isError"] is False
    (listed,) = result["structuredContent"]["budgets"]
    assert listed["id"] == budget.id
    assert (listed["spent_usd"], listed["left_usd"]) == (0.5, 1.5)
