"""The official MCP conformance suite (npm @modelcontextprotocol/conformance,
pinned in tests/mcp/js) against /mcp, for the server scenarios that apply to
Switchboard's tools, each on the wire of the revision it runs at.

The suite's other server scenarios test the fixtures of its own reference
server (tools named ``test_image_content``, prompts, ``test://`` resources),
which Switchboard does not have; docs/mcp.md lists every scenario and its
result. A scenario run here that calls such a fixture in one of its checks has
that one check in ``conformance-baseline.yml``, so every other check of it must
pass (and a listed check that starts passing fails the run).

The suite's ``server`` command has no way to send a credential (its auth
scenarios test OAuth clients), and /mcp answers 401 without one: a small proxy
(``bearer_proxy.mjs``) adds the endpoint's bearer token to every request.
"""

import os
import re
import subprocess

import pytest

from tests.mcp.js_support import JS, node22  # noqa: F401 (a fixture)
from tests.support import serve_gunicorn
from todos import store

pytestmark = pytest.mark.slow

CONFORMANCE = JS / "node_modules" / "@modelcontextprotocol" / "conformance"
BASELINE = JS / "conformance-baseline.yml"
SESSIONS, STATELESS = "2025-11-25", "2026-07-28"
# (scenario, the revision whose wire it runs on)
SCENARIOS = [
    ("server-initialize", SESSIONS),
    ("server-session-lifecycle", SESSIONS),
    ("ping", SESSIONS),
    ("logging-set-level", SESSIONS),
    ("tools-list", SESSIONS),
    ("dns-rebinding-protection", SESSIONS),
    ("server-sse-multiple-streams", SESSIONS),
    ("server-stateless", STATELESS),
    ("tools-list", STATELESS),
    ("resources-list", STATELESS),
    ("sep-2164-resource-not-found", STATELESS),
    ("caching", STATELESS),
    ("http-header-validation", STATELESS),
    ("input-required-result-unsupported-methods", STATELESS),
    ("dns-rebinding-protection", STATELESS),
    ("server-sse-multiple-streams", STATELESS),
    ("tasks-capability-negotiation", STATELESS),
    ("tasks-dispatch-and-envelope", STATELESS),
    ("tasks-request-headers", STATELESS),
]
# The tasks extension is on no revision's timeline: run at 2026-07-28 on demand.
EXTENSION = re.compile(r"^tasks-")
PASSED = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def gunicorn_server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


@pytest.fixture
def proxied(node22, gunicorn_server, endpoint, scope):  # noqa: F811
    """The URL of /mcp behind a proxy that adds the endpoint's token; the
    endpoint has a queue in use, so that its resource is listed and read."""
    store.create_todo(scope, queue="builds", title="conformance")
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


@pytest.mark.parametrize(("scenario", "revision"), SCENARIOS)
def test_the_official_conformance_scenario_passes(
    node22,  # noqa: F811
    proxied,
    scenario,
    revision,
):
    command = [
        node22,
        str(CONFORMANCE / "dist" / "index.js"),
        "server",
        "--url",
        proxied,
        "--scenario",
        scenario,
        "--spec-version",
        revision,
        "--expected-failures",
        str(BASELINE),
    ]
    if EXTENSION.match(scenario):
        command.append("--force")
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=JS
    )
    output = ANSI.sub("", completed.stdout + completed.stderr)
    assert completed.returncode == 0, output
    # A scenario the suite skipped (not applicable) would exit 0 too.
    counts = PASSED.search(output)
    assert counts is not None and int(counts[1]) > 0, output
