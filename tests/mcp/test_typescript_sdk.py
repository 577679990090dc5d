"""The official TypeScript SDK clients run the agent loop over /mcp (claim,
heartbeat with progress, ask, answer, complete): v2
(@modelcontextprotocol/client, in its "auto" negotiation) on 2026-07-28 and
v1 (@modelcontextprotocol/sdk) on 2025-11-25 (tests/mcp/js/agent_loop.mjs)."""

import json
import os
import subprocess

import pytest

from tests.mcp.js_support import JS, node22  # noqa: F401 (a fixture)
from tests.support import serve_gunicorn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gunicorn_server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


@pytest.mark.parametrize(
    ("sdk", "version", "owner_prefix"),
    [("v2", "2026-07-28", "mcp:ts-sdk-v2:"), ("v1", "2025-11-25", "")],
)
def test_typescript_sdk_client_runs_the_agent_loop(
    node22,  # noqa: F811
    gunicorn_server,
    endpoint,
    sdk,
    version,
    owner_prefix,
):
    completed = subprocess.run(
        [node22, "agent_loop.mjs"],
        cwd=JS,
        env={
            **os.environ,
            "MCP_URL": f"{gunicorn_server}/mcp",
            "TOKEN": endpoint.token,
            "SDK": sdk,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    assert seen["version"] == version
    assert seen["tools"] is True
    assert seen["owner"].startswith(owner_prefix)
    assert (seen["progress"], seen["asked"], seen["answer"]) == (
        "half way",
        "held",
        "go",
    )
    assert seen["state"] == "done"
    assert seen["result"] == {"by": f"ts-sdk-{sdk}"}
