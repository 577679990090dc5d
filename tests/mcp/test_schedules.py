"""The schedule tools of MCP (CONTRACT §20): an agent creates, lists, pauses
and resumes its own schedules, and fails as the JSON API does."""

import uuid

import pytest

from tests.mcp.conftest import INITIALIZE
from tests.support import DatabaseClock


@pytest.fixture
def clock(db):
    clock = DatabaseClock().install("2026-03-27T00:00:00Z").use().serve()
    yield clock
    clock.remove()


@pytest.fixture
def tool(post, session_id, endpoint, clock):
    """Return tool(name, **arguments) -> the tools/call result."""

    def call(tool_name, /, token=endpoint.token, session=session_id, **arguments):
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool_name, "arguments": arguments},
        }
        return post(body, session=session, token=token).json()["result"]

    return call


def test_an_agent_creates_lists_pauses_and_resumes_its_schedule(tool):
    created = tool(
        "create_schedule",
        name="nightly",
        queue="reviews",
        cron="0 2 * * *",
        time_zone="Europe/Berlin",
        todo={"title": "Review the open PRs"},
    )
    schedule_id = created["structuredContent"]["schedule"]["id"]

    listed = tool("list_schedules")
    paused = tool("pause_schedule", schedule_id=schedule_id)
    resumed = tool("resume_schedule", schedule_id=schedule_id)

    assert created["isError"] is False
    assert created["structuredContent"]["schedule"]["next_slot_at"] == (
        "2026-03-27T01:00:00Z"
    )
    assert [s["name"] for s in listed["structuredContent"]["schedules"]] == ["nightly"]
    assert paused["structuredContent"]["schedule"]["paused"] is True
    assert resumed["structuredContent"]["schedule"]["paused"] is False


def test_a_bad_cron_and_a_taken_name_are_tool_errors_naming_what_to_fix(tool):
    tool("create_schedule", name="nightly", queue="q", cron="@daily")

    bad = tool("create_schedule", name="other", queue="q", cron="every night")
    taken = tool("create_schedule", name="nightly", queue="q", cron="@hourly")

    assert bad["isError"] is True
    assert bad["structuredContent"]["error"] == "bad_request"
    assert bad["structuredContent"]["detail"].startswith("cron:")
    assert taken["isError"] is True
    assert taken["structuredContent"]["error"] == "conflict"
    assert "pick another name" in taken["content"][0]["text"]


def test_another_endpoints_schedule_is_the_same_tool_error_as_a_missing_one(
    tool, post, other_endpoint
):
    created = tool("create_schedule", name="s", queue="q", cron="@daily")
    schedule_id = created["structuredContent"]["schedule"]["id"]
    other_session = post(INITIALIZE, token=other_endpoint.token)["Mcp-Session-Id"]

    for name in ("pause_schedule", "resume_schedule"):
        answers = [
            tool(
                name,
                token=other_endpoint.token,
                session=other_session,
                schedule_id=given,
            )
            for given in (schedule_id, str(uuid.uuid4()), "not-a-uuid")
        ]
        assert all(answer["isError"] for answer in answers)
        assert len({answer["content"][0]["text"] for answer in answers}) == 1
        assert answers[0]["structuredContent"]["error"] == "not_found"
