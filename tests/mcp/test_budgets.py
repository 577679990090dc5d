"""Budgets on MCP (CONTRACT §18): a create a reject_new budget at its limit
refuses is a tool error ``budget_exhausted`` naming the budget."""

from tests.mcp.test_questions import tool_call
from tests.support import exhausted_budget


def test_create_todo_in_an_exhausted_reject_new_scope_is_a_tool_error(
    post, session_id, scope
):
    budget = exhausted_budget(scope, "q")
    refused = tool_call(post, session_id, "create_todo", {"queue": "q"})
    assert refused["isError"] is True
    text = refused["content"][0]["text"]
    assert "budget_exhausted" in text and budget.id in text
    created = tool_call(post, session_id, "create_todo", {"queue": "other"})
    assert created["isError"] is False
