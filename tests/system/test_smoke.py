import importlib
import inspect
import re

import pytest

from todos import store


def test_healthz_answers_ok_when_the_database_is_up(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_create_then_claim_round_trip(scope):
    todo, created = store.create_todo(scope, queue="q", title="t")
    assert created
    claimed = store.claim_next(scope, "w1")
    assert claimed.id == todo.id and claimed.state == "claimed"


AGENT_FACING_MODULES = (
    "api.plumbing",
    "api.operations",
    "api.views",
    "api.events",
    "mcp.transport",
    "mcp.tools",
)


@pytest.mark.parametrize("module_name", AGENT_FACING_MODULES)
def test_the_agent_facing_path_never_calls_an_operator_twin(module_name):
    """SPEC requirement: Endpoint Ownership (Tenant Isolation)

    The agent-facing path MUST NOT call an *AnyEndpoint variant: every name it
    uses from the store is a scoped one.
    """
    module = importlib.import_module(f"todos.{module_name}")
    source = inspect.getsource(module)
    assert "store" in source
    assert not re.findall(r"\w*_any_endpoint\b|\w*ANY_SQL\b", source)
