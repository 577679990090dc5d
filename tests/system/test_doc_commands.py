"""The shell blocks of README.md and docs/*.md, copied as written, run with bash
against a served instance: what a user pastes after `make run` works.

Each page's blocks run in order in one bash (as a user pastes them into one
shell), from the checkout, against a gunicorn this module serves on the test
database. Only what the docs tell a user to put in is substituted:

- the endpoint token the docs write ``sb_...`` or ``sb_…`` (the one `make
  run` prints): a token of an endpoint made here;
- ``http://127.0.0.1:8000``, where `make run` serves: the served instance;
- ``ENDPOINT_ID``: the id of an endpoint of one's own;
- ``SBIA…`` and ``AWS_SECRET_ACCESS_KEY=…``: an SQS key pair issued here.

Lines that start with ``make run`` are played by this module (it serves the
checkout as `make run` does). An event stream (``curl -sN``) never ends by
itself: it runs under ``timeout 3``, and being stopped is its success.

The blocks not run, each with why, are SKIPPED below; a new block is either
run or added there (test_every_shell_block_is_run_or_skipped_with_a_reason).
"""

import json
import os
import re
import subprocess

import pytest
from django.db import connection

from tests.support import ROOT, child_env, database_url, serve_gunicorn
from todos.access import endpoints
from todos.sqs import credentials

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)

# The blocks this module does not run: (page, the block's first line) → why.
SKIPPED = {
    ("README.md", "make run"): "`make run` and `make test` bootstrap the checkout "
    "(venv, install, cluster): this module serves the checkout itself, and "
    "`make test` is the suite that runs it",
    ("benchmarks.md", "make bench"): "the benchmarks take about 20 minutes "
    "(tests/bench covers their scaffolding)",
    ("board.md", "SWITCHBOARD_SCREENSHOTS=docs/screenshots"): "it runs the browser "
    "suite and rewrites docs/screenshots",
    ("client.md", "pip install ./clients/python"): "it installs the client into "
    "the running Python, which `make venv` has done (tests/client uses it)",
    ("client.md", "SWITCHBOARD_URL="): "it runs the reader's own worker module "
    "(myapp.workers) until stopped; tests/client runs the worker",
    ("mcp.md", "claude mcp add"): "it needs the Claude Code CLI, which the project "
    "does not install (tests/mcp drives /mcp with the MCP SDKs)",
    ("operations.md", "make ha"): "it starts a Patroni and etcd failover pair "
    "(tests/system/test_failover.py)",
    ("operations.md", "make resilience"): "it restarts PostgreSQL under load for "
    "minutes (tests/system/test_resilience.py)",
    ("operations.md", "export OTEL_EXPORTER_OTLP_ENDPOINT="): "it sets a "
    "deployment's environment for the reader's own collector "
    "(tests/tracing/test_otlp.py sets the same against a receiver it starts)",
    ("operations.md", "export SWITCHBOARD_TRACE_URL="): "it sets a deployment's "
    "link to the reader's trace viewer (tests/tracing/test_spans.py renders it)",
    ("webhooks.md", ".venv/bin/python manage.py create_webhook acme-app"): "a "
    "synopsis ([…] marks options), not a command "
    "(tests/commands/test_create_webhook.py runs each form)",
    ("webhooks.md", ".venv/bin/python manage.py create_webhook github-pushes"): "it "
    "needs a GitHub organisation sending pushes to the reader's host "
    "(tests/webhooks/test_admission.py delivers GitHub-shaped pushes to such a "
    "route, and api.md's worked example runs the queue's PATCH)",
}
# The pages whose blocks a test below runs.
RUN_PAGES = {"README.md", "api.md", "board.md", "schedules.md", "sqs.md"}
PLAYED = "make run"
STREAM = "curl -sN "


def shell_blocks():
    """(page name, first line, body) of every ```sh block of the docs."""
    for page in PAGES:
        for body in SH_BLOCK.findall(page.read_text()):
            yield page.name, body.splitlines()[0], body


def skip_reason(name, first):
    """Why the block (its page, its first line) is not run, or None."""
    for (page, start), reason in SKIPPED.items():
        if name == page and first.startswith(start):
            return reason
    return None


def blocks_to_run(page_name):
    return [
        body
        for name, first, body in shell_blocks()
        if name == page_name and skip_reason(name, first) is None
    ]


def test_every_shell_block_is_run_or_skipped_with_a_reason():
    """Each skipped block still exists, and says why it is skipped; every
    other block belongs to a page a test below runs."""
    blocks = list(shell_blocks())
    for page, start in SKIPPED:
        assert any(n == page and f.startswith(start) for n, f, _ in blocks), start
    assert all(len(reason) > 20 for reason in SKIPPED.values())
    run = {name for name, first, _ in blocks if skip_reason(name, first) is None}
    assert run == RUN_PAGES


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


@pytest.fixture
def own(served):
    """What a user has after `make run`: an endpoint's token and SQS key pair,
    and the id of another endpoint of theirs."""
    endpoint, token = endpoints.create("demo", "operator", ["*"])
    issued = credentials.issue(endpoint)
    other, _ = endpoints.create("mine", "operator", ["*"])
    return {
        "token": token,
        "url": served,
        "endpoint_id": str(other.id),
        "key_id": issued.access_key_id,
        "secret": issued.secret_access_key,
    }


def as_pasted(body, own):
    """The block as a user runs it: their values in place of the docs'."""
    lines = []
    for line in body.splitlines():
        if line.startswith(PLAYED):
            continue
        if line.lstrip().startswith(STREAM):
            # Its comment runs to the end of the line: the check goes below.
            lines += [
                "set +e",
                f"timeout 3 {line.lstrip()}",
                "[ $? -eq 124 ] || exit 1",
            ]
            lines.append("set -e")
            continue
        lines.append(line)
    script = "\n".join(lines) + "\n"
    for placeholder in ("sb_...", "sb_…"):
        script = script.replace(placeholder, own["token"])
    script = script.replace("http://127.0.0.1:8000", own["url"])
    script = script.replace("ENDPOINT_ID", own["endpoint_id"])
    script = script.replace("SBIA…", own["key_id"])
    return script.replace(
        "AWS_SECRET_ACCESS_KEY=…", f"AWS_SECRET_ACCESS_KEY={own['secret']}"
    )


def run_page(page_name, own):
    """Run the page's blocks in one bash, from the checkout; return its output."""
    script = "".join(as_pasted(body, own) for body in blocks_to_run(page_name))
    environment = child_env(
        database_url(),
        PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    finished = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert finished.returncode == 0, (finished.stdout, finished.stderr)
    assert "Traceback" not in finished.stderr
    return finished.stdout


def json_lines(output):
    """Each answer printed on its own line, as JSON (none glued to the next)."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_readmes_first_api_call_works_as_written(own):
    output = run_page("README.md", own)

    created, heartbeat, completed, listed = json_lines(output)
    assert created["created"] is True
    todo_id = created["todo"]["id"]
    assert f"claimed {todo_id}" in output.splitlines()
    assert heartbeat["todo"]["state"] == "claimed"
    assert completed["todo"]["state"] == "done"
    assert [todo["id"] for todo in listed["todos"]] == [todo_id]
    assert output.rstrip().endswith(": keep-alive") or "event:" in output


def test_the_readmes_first_api_call_says_nothing_to_claim_when_nothing_came(own):
    """A claim that answers no todo prints "nothing to claim", not a traceback
    (an endpoint without the reviews queue: its claim has nothing, at once)."""
    endpoint, own["token"] = endpoints.create("elsewhere", "operator", ["other"])

    output = run_page("README.md", own)

    assert "nothing to claim" in output.splitlines()


def test_the_api_pages_commands_work_as_written(own):
    output = run_page("api.md", own)

    minted = json.loads(output.splitlines()[0])
    assert minted["name"] == "reviewer" and minted["token"].startswith("sb_")
    answers = json_lines(output)
    # The budgets' worked example: a todo with max_cost, the budget read, raised.
    *_, resumed, done, reported, capped, budget, raised = answers
    assert capped["todo"]["max_cost"] == 2.5 and capped["created"] is True
    assert budget["budget"]["queue"] == "reviews"
    assert budget["budget"]["limit_usd"] == 50
    assert raised["budget"]["id"] == budget["budget"]["id"]
    assert raised["budget"]["raised_usd"] == 20
    assert done["todo"]["usage"] == {
        "input_tokens": 51000,
        "output_tokens": 3100,
        "cost_usd": 0.19,
    }
    assert reported["created"] is True and reported["usage"]["cost_usd"] == 0.004
    answer = resumed["todo"]["answer"]
    assert (answer["value"], answer["by"], answer["worker"]) == (
        "archive first",
        "agent:demo",
        "lead",
    )
    assert resumed["todo"]["checkpoint"] == {"step": "drop", "tables_done": 12}
    # One agent per repository: the batch claim takes one push of each.
    answers = json_lines(output)
    (queue,) = [a["queue"] for a in answers if a.get("queue", {}).get("fair")]
    assert queue["name"] == "pushes" and queue["group_concurrency"] == 1
    (claimed,) = [a["todos"] for a in answers if "todos" in a]
    assert sorted(todo["group"] for todo in claimed) == ["acme/api", "acme/web"]
    (groups,) = [a["groups"] for a in answers if "groups" in a]
    assert [(g["group"], g["in_flight"], g["pending"]) for g in groups] == [
        ("acme/api", 1, 2),
        ("acme/web", 1, 0),
    ]


def test_the_schedules_pages_worked_example_works_as_written(own):
    output = run_page("schedules.md", own)

    created, slots, fired, paused, resumed = json_lines(output)
    schedule = created["schedule"]
    assert (schedule["name"], schedule["time_zone"]) == (
        "review-open-prs",
        "Europe/Berlin",
    )
    assert len(slots["slots"]) == 3 and slots["slots"][0] == schedule["next_slot_at"]
    assert fired["created"] is True
    assert fired["todo"]["title"] == "Review the open PRs"
    assert (paused["schedule"]["paused"], resumed["schedule"]["paused"]) == (
        True,
        False,
    )


def test_the_board_pages_demo_data_command_works_as_written(own):
    run_page("board.md", own)

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos")
        assert cursor.fetchone()[0] > 10


def test_the_sqs_pages_commands_work_as_written(own):
    output = run_page("sqs.md", own)

    minted = json.loads(output.splitlines()[0])
    assert minted["sqs_access_key_id"].startswith("SBIA")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state FROM todos WHERE endpoint_id = "
            "(SELECT id FROM endpoints WHERE name = 'demo') AND queue = 'jobs'"
        )
        assert cursor.fetchall() == [("done",)]
