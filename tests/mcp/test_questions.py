"""Questions, cancel, progress, checkpoints and waiting, over MCP (CONTRACT §14).

Driven by the official ``mcp`` SDK client against a live server, as
``test_mcp.py`` does; the argument checks go through Django's test client.
"""

import json
import time
import uuid

import anyio
import pytest

from tests.mcp.test_mcp import call, mcp_client, run
from tests.mcp.test_stateless import sdk_client
from todos import store
from todos.mcp.tools import TOOLS

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "max_rows": {"type": "integer"}},
    "required": ["approved"],
}


def structured(result):
    assert not result.is_error, result.content[0].text
    return result.structured_content["todo"]


def test_an_agent_asks_another_agent_answers_and_the_asker_resumes(
    asgi_server, endpoint
):
    """The agent loop: claim, heartbeat with progress and a checkpoint, ask, an
    orchestrator of the same endpoint answers, the asker's next claim returns
    question, answer and checkpoint, and it completes."""
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token) as worker,
            mcp_client(asgi_server.url, endpoint.token) as orchestrator,
        ):
            created = await call(orchestrator, "create_todo", queue="ops", title="x")
            todo_id = structured(created)["id"]
            structured(await call(worker, "claim_next", queue="ops"))
            seen["beat"] = structured(
                await call(
                    worker,
                    "heartbeat",
                    todo_id=todo_id,
                    progress={"message": "2 of 3 tables copied", "fraction": 0.66},
                    checkpoint={"copied": ["a", "b"]},
                )
            )
            seen["asked"] = structured(
                await call(
                    worker,
                    "ask",
                    todo_id=todo_id,
                    question="Drop table c? It holds 4 M rows.",
                    answer_schema=APPROVAL,
                    checkpoint={"copied": ["a", "b"], "next": "drop c"},
                    deadline_seconds=3600,
                )
            )
            seen["nothing_for_the_worker"] = await call(worker, "claim_next")
            seen["nothing_for_others"] = await call(orchestrator, "claim_next")
            seen["answered"] = structured(
                await call(
                    orchestrator,
                    "answer",
                    todo_id=todo_id,
                    answer={"approved": True, "max_rows": 5_000_000},
                )
            )
            seen["twice"] = await call(
                orchestrator, "answer", todo_id=todo_id, answer={"approved": False}
            )
            seen["pool_claim"] = await call(orchestrator, "claim_next")
            seen["resumed"] = structured(await call(worker, "claim_next"))
            seen["done"] = structured(
                await call(worker, "complete_todo", todo_id=todo_id, result={"ok": 1})
            )
            seen["worker"] = worker.mcp_session_id

    run(main)
    beat = seen["beat"]
    assert beat["progress"] == {"message": "2 of 3 tables copied", "fraction": 0.66}
    assert beat["checkpoint"] == {"copied": ["a", "b"]}
    assert beat["cancel_requested"] is False
    asked = seen["asked"]
    assert asked["state"] == "pending" and asked["outcome"] == "held"
    assert asked["question"]["asked_by"] == seen["worker"]
    assert asked["assignee"] == seen["worker"]
    for nothing in ("nothing_for_the_worker", "nothing_for_others"):
        assert seen[nothing].structured_content["error"] == "not_found"
    assert seen["answered"]["answer"]["by"] == f"agent:{endpoint.name}"
    assert seen["twice"].is_error
    assert seen["twice"].structured_content["error"] == "conflict"
    assert "not waiting for an answer" in seen["twice"].content[0].text
    # return_to "me": the answered todo is the asker's alone.
    assert seen["pool_claim"].structured_content["error"] == "not_found"
    resumed = seen["resumed"]
    assert resumed["state"] == "claimed" and resumed["owner"] == seen["worker"]
    assert resumed["question"]["text"] == "Drop table c? It holds 4 M rows."
    assert resumed["answer"]["value"] == {"approved": True, "max_rows": 5_000_000}
    assert resumed["checkpoint"] == {"copied": ["a", "b"], "next": "drop c"}
    assert resumed["attempt"] == 1
    assert seen["done"]["outcome"] == "done"


def test_an_answer_off_its_schema_or_choices_is_a_tool_error_naming_the_path(
    asgi_server, endpoint, scope
):
    todo, _ = store.create_todo(scope, queue="ops")
    store.claim_todo(scope, todo.id, "w1")
    store.ask(scope, todo.id, "w1", question="How many?", answer_schema=APPROVAL)
    other, _ = store.create_todo(scope, queue="ops")
    store.claim_todo(scope, other.id, "w1")
    store.ask(scope, other.id, "w1", question="Go?", choices=["go", "stop"])
    results = {}

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token) as session:
            results["type"] = await call(
                session, "answer", todo_id=todo.id, answer={"approved": "yes"}
            )
            results["missing"] = await call(session, "answer", todo_id=todo.id)
            results["choice"] = await call(
                session, "answer", todo_id=other.id, answer="maybe"
            )

    run(main)
    assert all(result.is_error for result in results.values())
    assert {r.structured_content["error"] for r in results.values()} == {"bad_request"}
    assert "answer.approved" in results["type"].content[0].text
    assert "answer: is required" in results["missing"].content[0].text
    assert "one of 'go', 'stop'" in results["choice"].content[0].text
    assert store.get_todo(scope, todo.id).outcome == "held"
    assert store.get_todo(scope, other.id).outcome == "held"


def test_cancel_ends_a_pending_todo_and_asks_the_owner_of_a_claimed_one(
    asgi_server, endpoint
):
    """A pending todo ends canceled at once; a claimed one gets a cancel request
    that its owner sees in its heartbeat, and ends canceled when released."""
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token) as worker,
            mcp_client(asgi_server.url, endpoint.token) as boss,
        ):
            pending = structured(await call(boss, "create_todo", queue="a"))
            seen["pending"] = structured(
                await call(
                    boss, "cancel_todo", todo_id=pending["id"], reason="not needed"
                )
            )
            seen["no_claim"] = await call(worker, "claim_next", queue="a")
            seen["again"] = await call(boss, "cancel_todo", todo_id=pending["id"])

            created = structured(await call(boss, "create_todo", queue="b"))
            structured(await call(worker, "claim_next", queue="b"))
            seen["requested"] = structured(
                await call(boss, "cancel_todo", todo_id=created["id"])
            )
            seen["beat"] = structured(
                await call(worker, "heartbeat", todo_id=created["id"])
            )
            seen["ask"] = await call(
                worker, "ask", todo_id=created["id"], question="Go on?"
            )
            seen["released"] = structured(
                await call(worker, "release_todo", todo_id=created["id"])
            )

    run(main)
    canceled = seen["pending"]
    assert canceled["state"] == "done" and canceled["outcome"] == "canceled"
    assert canceled["result"]["canceled"]["reason"] == "not needed"
    assert canceled["result"]["canceled"]["by"] == f"agent:{endpoint.name}"
    assert seen["no_claim"].structured_content["error"] == "not_found"
    assert seen["again"].structured_content["error"] == "conflict"
    assert "ended" in seen["again"].content[0].text
    requested = seen["requested"]
    assert requested["state"] == "claimed" and requested["cancel_requested"] is True
    assert seen["beat"]["cancel_requested"] is True
    assert seen["ask"].structured_content["error"] == "conflict"
    assert "cancel was requested" in seen["ask"].content[0].text
    assert seen["released"]["outcome"] == "canceled"


def test_release_hands_the_todo_to_a_named_worker_with_note_and_checkpoint(
    asgi_server, endpoint
):
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token) as first,
            mcp_client(asgi_server.url, endpoint.token) as second,
        ):
            todo = structured(await call(first, "create_todo", queue="q"))
            structured(await call(first, "claim_next", queue="q"))
            seen["released"] = structured(
                await call(
                    first,
                    "release_todo",
                    todo_id=todo["id"],
                    assignee="gpu-worker",
                    note="needs a GPU",
                    checkpoint={"epoch": 3},
                )
            )
            seen["stranger"] = await call(second, "claim_next", queue="q")
            seen["named"] = structured(
                await call(second, "claim_next", queue="q", worker="gpu-worker")
            )

    run(main)
    released = seen["released"]
    assert released["state"] == "pending" and released["assignee"] == "gpu-worker"
    assert released["note"] == "needs a GPU"
    assert seen["stranger"].structured_content["error"] == "not_found"
    assert seen["named"]["checkpoint"] == {"epoch": 3}
    assert seen["named"]["note"] == "needs a GPU"


@pytest.mark.parametrize("ending", ["complete", "ask"])
def test_wait_for_todo_returns_when_the_todo_ends_or_asks(
    asgi_server, endpoint, ending
):
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token) as creator,
            mcp_client(asgi_server.url, endpoint.token) as worker,
        ):
            todo = structured(await call(creator, "create_todo", queue="q"))
            structured(await call(worker, "claim_next", queue="q"))

            async def wait():
                started = time.monotonic()
                result = await call(
                    creator, "wait_for_todo", todo_id=todo["id"], wait_seconds=15
                )
                seen["wait"] = structured(result), time.monotonic() - started

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(wait)
                await anyio.sleep(0.5)
                if ending == "complete":
                    await call(worker, "complete_todo", todo_id=todo["id"])
                else:
                    await call(worker, "ask", todo_id=todo["id"], question="Go?")

    run(main)
    todo, waited = seen["wait"]
    assert todo["outcome"] == {"complete": "done", "ask": "held"}[ending]
    if ending == "ask":
        assert todo["question"]["text"] == "Go?"
    assert 0.4 < waited < 5


def test_wait_for_todo_returns_the_todo_as_it_is_when_the_wait_ends(
    asgi_server, endpoint, scope
):
    todo, _ = store.create_todo(scope, queue="q")
    done, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, done.id, "w1")
    store.complete_todo(scope, done.id, "w1")
    seen = {}

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token) as session:
            started = time.monotonic()
            result = await call(
                session, "wait_for_todo", todo_id=todo.id, wait_seconds=1
            )
            seen["timeout"] = structured(result), time.monotonic() - started
            started = time.monotonic()
            result = await call(session, "wait_for_todo", todo_id=done.id)
            seen["settled"] = structured(result), time.monotonic() - started

    run(main)
    pending, waited = seen["timeout"]
    assert pending["outcome"] == "pending" and 0.9 < waited < 3
    settled, waited = seen["settled"]
    # Already done: no wait at all, whatever wait_seconds says.
    assert settled["outcome"] == "done" and waited < 1


def test_wait_for_todo_waits_on_2026_07_28_too(asgi_server, endpoint, scope):
    """The stateless revision: the wait ends on the todo's answer-worthy event."""
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w1")
    seen = {}

    def ask_now():
        store.ask(scope, todo.id, "w1", question="Ship it?", choices=["yes", "no"])

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token)
        async with http, client, anyio.create_task_group() as group:

            async def wait():
                started = time.monotonic()
                result = await client.call_tool(
                    "wait_for_todo", {"todo_id": todo.id, "wait_seconds": 15}
                )
                seen["wait"] = result, time.monotonic() - started
                seen["version"] = client.protocol_version

            group.start_soon(wait)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(ask_now)

    run(main)
    result, waited = seen["wait"]
    assert seen["version"] == "2026-07-28"
    assert structured(result)["outcome"] == "held"
    assert structured(result)["question"]["choices"] == ["yes", "no"]
    assert 0.4 < waited < 5


def test_another_endpoints_todo_is_not_found_by_the_new_tools(
    asgi_server, scope, other_endpoint
):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one"""
    held, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, held.id, "w1")
    store.ask(scope, held.id, "w1", question="Go?")
    claimed, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, claimed.id, "w1")
    calls = {
        "ask": {"question": "Mine?", "worker": "w1"},
        "answer": {"answer": "yes"},
        "cancel_todo": {},
        "wait_for_todo": {"wait_seconds": 0},
    }
    answers = {}

    async def main():
        async with mcp_client(asgi_server.url, other_endpoint.token) as session:
            for tool, arguments in calls.items():
                foreign = claimed.id if tool == "ask" else held.id
                answers[tool] = [
                    await call(session, tool, todo_id=todo_id, **arguments)
                    for todo_id in (foreign, str(uuid.uuid4()), "not-a-uuid")
                ]

    run(main)
    for tool, results in answers.items():
        assert all(result.is_error for result in results), tool
        texts = {result.content[0].text for result in results}
        structured_errors = {json.dumps(r.structured_content) for r in results}
        assert len(texts) == 1 and len(structured_errors) == 1, (tool, texts)
        assert results[0].structured_content["error"] == "not_found"
    assert store.get_todo(scope, held.id).outcome == "held"
    assert store.get_todo(scope, claimed.id).outcome == "claimed"


# --- Arguments (in process) -----------------------------------------------------


def tool_call(post, session_id, tool, arguments):
    response = post(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        },
        session=session_id,
    )
    assert response.status_code == 200
    return response.json()["result"]


@pytest.fixture
def claimed_id(scope, session_id):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, session_id)
    return todo.id


BIG = "x" * (store.MAX_CHECKPOINT_BYTES + 1)


@pytest.mark.parametrize(
    "tool, arguments, code, field",
    [
        ("heartbeat", {"progress": {"fraction": 2}}, "bad_request", "fraction"),
        ("heartbeat", {"progress": {"message": 7}}, "bad_request", "message"),
        ("heartbeat", {"progress": {"eta": 3}}, "bad_request", "progress"),
        ("heartbeat", {"progress": "half"}, "bad_request", "progress"),
        (
            "heartbeat",
            {"progress": {"message": "m" * (store.MAX_PROGRESS_MESSAGE_CHARS + 1)}},
            "bad_request",
            "message",
        ),
        ("heartbeat", {"checkpoint": {"blob": BIG}}, "payload_too_large", "check"),
        ("release_todo", {"assignee": ""}, "bad_request", "assignee"),
        ("release_todo", {"assignee": 7}, "bad_request", "assignee"),
        (
            "release_todo",
            {"note": "n" * (store.MAX_NOTE_CHARS + 1)},
            "bad_request",
            "note",
        ),
        ("ask", {}, "bad_request", "question"),
        ("ask", {"question": ""}, "bad_request", "question"),
        (
            "ask",
            {"question": "q" * (store.MAX_QUESTION_CHARS + 1)},
            "bad_request",
            "question",
        ),
        ("ask", {"question": "Go?", "choices": []}, "bad_request", "choices"),
        ("ask", {"question": "Go?", "choices": ["a", "a"]}, "bad_request", "choices"),
        ("ask", {"question": "Go?", "choices": ["a", 2]}, "bad_request", "choices[1]"),
        (
            "ask",
            {"question": "Go?", "answer_schema": {"type": 12}},
            "bad_request",
            "answer_schema",
        ),
        (
            "ask",
            {"question": "Go?", "answer_schema": {"$ref": "http://10.0.0.1/s"}},
            "bad_request",
            "answer_schema.$ref: only a local reference",
        ),
        (
            "ask",
            {"question": "Go?", "answer_schema": {"pattern": "(x)\\1"}},
            "bad_request",
            "answer_schema.pattern",
        ),
        ("ask", {"question": "Go?", "deadline_seconds": 5}, "bad_request", "deadline"),
        ("ask", {"question": "Go?", "return_to": "you"}, "bad_request", "return_to"),
        (
            "ask",
            {"question": "Go?", "checkpoint": {"blob": BIG}},
            "payload_too_large",
            "checkpoint",
        ),
        (
            "cancel_todo",
            {"reason": "r" * (store.MAX_REASON_CHARS + 1)},
            "bad_request",
            "reason",
        ),
        ("wait_for_todo", {"wait_seconds": 21}, "bad_request", "wait_seconds"),
        ("wait_for_todo", {"wait_seconds": "5"}, "bad_request", "wait_seconds"),
    ],
)
def test_bad_arguments_of_the_new_tools_are_tool_errors_naming_the_field(
    post, session_id, claimed_id, scope, tool, arguments, code, field
):
    result = tool_call(post, session_id, tool, {"todo_id": claimed_id, **arguments})
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == code
    assert field in result["content"][0]["text"]
    todo = store.get_todo(scope, claimed_id)
    assert todo.state == "claimed" and todo.checkpoint is None


def test_the_new_fields_schemas_carry_the_stores_limits():
    schemas = {name: tool.schema()["properties"] for name, tool in TOOLS.items()}
    progress = schemas["heartbeat"]["progress"]["properties"]
    assert progress["message"]["maxLength"] == store.MAX_PROGRESS_MESSAGE_CHARS
    assert (progress["fraction"]["minimum"], progress["fraction"]["maximum"]) == (0, 1)
    ask = schemas["ask"]
    assert ask["question"]["maxLength"] == store.MAX_QUESTION_CHARS
    assert ask["choices"]["maxItems"] == store.MAX_CHOICES
    assert ask["choices"]["items"]["maxLength"] == store.MAX_CHOICE_CHARS
    assert ask["deadline_seconds"]["minimum"] == store.MIN_DEADLINE_SECONDS
    assert ask["deadline_seconds"]["maximum"] == store.MAX_DEADLINE_SECONDS
    assert schemas["release_todo"]["note"]["maxLength"] == store.MAX_NOTE_CHARS
    assert schemas["cancel_todo"]["reason"]["maxLength"] == store.MAX_REASON_CHARS
    assert "64 KiB" in schemas["heartbeat"]["checkpoint"]["description"]
    assert TOOLS["cancel_todo"].to_dict()["annotations"]["destructiveHint"] is True


def test_the_batch_tool_cancels_and_heartbeats_with_progress(
    post, session_id, claimed_id, scope
):
    pending, _ = store.create_todo(scope, queue="q")
    result = tool_call(
        post,
        session_id,
        "batch",
        {
            "actions": [
                {"op": "cancel", "id": pending.id, "reason": "superseded"},
                {"op": "heartbeat", "id": claimed_id, "progress": {"fraction": 0.5}},
            ]
        },
    )
    assert result["isError"] is False
    canceled, beat = result["structuredContent"]["results"]
    assert canceled["status"] == 200 and canceled["todo"]["outcome"] == "canceled"
    assert beat["status"] == 200
    assert beat["todo"]["progress"] == {"message": "", "fraction": 0.5}
