"""The official MCP conformance suite (npm @modelcontextprotocol/conformance)
against /mcp, for the server scenarios that apply to a tools server.

The suite's other server scenarios test the fixtures of its own reference
server (tools named ``test_image_content``, prompts, ``test://`` resources),
which Switchboard does not have; docs/mcp.md lists every scenario and its
result. The suite cannot send a bearer token, so a small proxy adds it.
"""

import os
import subprocess

import pytest

from tests.mcp.js_support import JS, node22  # noqa: F401 (a fixture)
from tests.support import serve_gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CONFORMANCE = JS / "node_modules" / "@modelcontextprotocol" / "conformance"
SCENARIOS = (
    "server-initialize",
    "ping",
    "logging-set-level",
    "tools-list",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
)


@pytest.fixture(scope="module")
def gunicorn_server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


@pytest.fixture
def proxied(node22, gunicorn_server, endpoint):  # noqa: F811
    """The URL of /mcp behind a proxy that adds the endpoint's token."""
    process = subprocess.Popen(
        [node22, "bearer_proxy.mjs"],
        cwd=JS,
        env={**os.environ, "TARGET": gunicorn_server, "TOKEN": endpoint.token},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = process.stdout.readline().strip()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_official_conformance_scenario_passes(node22, proxied, scenario):  # noqa: F811
    completed = subprocess.run(
        [
            node22,
            str(CONFORMANCE / "dist" / "index.js"),
            "server",
            "--url",
            proxied,
            "--scenario",
            scenario,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert " 0 failed" in completed.stdout, completed.stdout
