"""Budgets on MCP (CONTRACT §18): a create a reject_new budget at its limit
refuses is a tool error ``budget_exhausted`` naming the budget."""

from tests.mcp.test_questions import tool_call
from todos import store


def test_create_todo_in_an_exhausted_reject_new_scope_is_a_tool_error(
    post, session_id, scope
):
    budget = store.create_budget(
        scope,
        scope="queue",
        queue="q",
        window="day",
        limit_usd=1,
        action="reject_new",
    )
    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    refused = tool_call(post, session_id, "create_todo", {"queue": "q"})
    assert refused["isError"] is True
    text = refused["content"][0]["text"]
    assert "budget_exhausted" in text and budget.id in text
    created = tool_call(post, session_id, "create_todo", {"queue": "other"})
    assert created["isError"] is False
