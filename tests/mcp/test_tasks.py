"""Todos as MCP Tasks (CONTRACT §15): the extension io.modelcontextprotocol/tasks.

In process: each outcome's task, tasks/update and tasks/cancel, the errors.
Live: a task created over MCP, worked by a JSON-API worker through a gunicorn
process, answered with tasks/update, its tasks/get at each step, across a
restart of that process.
"""

import json
import uuid

import anyio
import httpx2
import pytest
from django.db import connection
from django.test import Client

from tests.support import database_url, start_gunicorn, stop
from todos import store

VERSION = "2026-07-28"
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


def message(method, capabilities=TASKS, id=1, **params):
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": method,
        "params": {**params, "_meta": meta},
    }


def headers_for(body, token):
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": body["method"],
    }
    if body["method"] == "tools/call":
        headers["Mcp-Name"] = body["params"]["name"]
    task_id = body["params"].get("taskId")
    if body["method"].startswith("tasks/") and isinstance(task_id, str):
        headers["Mcp-Name"] = task_id
    return headers


@pytest.fixture
def rpc(client, endpoint):
    """rpc(method, token=..., capabilities=..., headers=..., **params) ->
    (status, body); ``headers`` replace the ones that follow the body (None
    leaves one out)."""

    def send(method, token=endpoint.token, capabilities=TASKS, headers=(), **params):
        body = message(method, capabilities, **params)
        sent = {**headers_for(body, token), **dict(headers)}
        response = client.post(
            "/mcp",
            data=json.dumps(body),
            content_type="application/json",
            headers={key: value for key, value in sent.items() if value is not None},
        )
        return response.status_code, response.json()

    return send


def create_task(rpc, tool="delegate", **arguments):
    status, body = rpc("tools/call", name=tool, arguments={"queue": "q", **arguments})
    assert status == 200, body
    return body["result"]


def task(rpc, task_id):
    status, body = rpc("tasks/get", taskId=task_id)
    assert status == 200, body
    assert body["result"]["resultType"] == "complete"
    return body["result"]


def test_discover_advertises_the_tasks_extension(rpc):
    _, body = rpc("server/discover")
    assert body["result"]["capabilities"]["extensions"] == TASKS["extensions"]


def test_delegate_answers_a_task_whose_id_is_the_todo(rpc, scope):
    created = create_task(rpc, title="build it")
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    assert created["pollIntervalMs"] > 0 and created["ttlMs"] is None
    todo = store.get_todo(scope, created["taskId"])
    assert todo.title == "build it"


def test_create_todo_answers_a_task_when_the_client_declares_the_extension(rpc):
    assert create_task(rpc, tool="create_todo")["resultType"] == "task"
    _, plain = rpc(
        "tools/call", capabilities={}, name="create_todo", arguments={"queue": "q"}
    )
    assert plain["result"]["resultType"] == "complete"
    assert plain["result"]["structuredContent"]["created"] is True


def test_delegate_without_the_extension_is_a_missing_capability(rpc):
    status, body = rpc(
        "tools/call", capabilities={}, name="delegate", arguments={"queue": "q"}
    )
    assert status == 400
    assert body["error"]["code"] == -32021
    assert body["error"]["data"]["requiredCapabilities"] == TASKS


def test_tasks_get_without_the_extension_is_a_missing_capability(rpc):
    status, body = rpc("tasks/get", capabilities={}, taskId=str(uuid.uuid4()))
    assert status == 400 and body["error"]["code"] == -32021


def test_a_bad_delegate_is_a_tool_error_not_a_task(rpc):
    result = create_task(rpc, max_attempts=0)
    assert result["resultType"] == "complete" and result["isError"] is True


def test_delegate_is_listed_on_2026_07_28(rpc):
    _, body = rpc("tools/list")
    tools = {tool["name"]: tool for tool in body["result"]["tools"]}
    assert tools["delegate"]["inputSchema"]["required"] == ["queue"]


def test_the_task_follows_the_todo_through_each_outcome(rpc, scope):
    """working (with progress) → input_required → working → completed."""
    task_id = create_task(rpc)["taskId"]
    assert task(rpc, task_id)["statusMessage"] == "the todo is pending"
    store.claim_todo(scope, task_id, "w")
    store.heartbeat(scope, task_id, "w", progress={"message": "half way"})
    working = task(rpc, task_id)
    assert (working["status"], working["statusMessage"]) == ("working", "half way")

    store.ask(scope, task_id, "w", question="Ship it?", choices=["yes", "no"])
    held = task(rpc, task_id)
    assert held["status"] == "input_required"
    [(key, request)] = held["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Ship it?"
    schema = request["params"]["requestedSchema"]
    assert schema["properties"]["answer"] == {"type": "string", "enum": ["yes", "no"]}

    answer = {key: {"action": "accept", "content": {"answer": "yes"}}}
    status, body = rpc("tasks/update", taskId=task_id, inputResponses=answer)
    assert status == 200 and body["result"]["resultType"] == "complete"
    assert store.get_todo(scope, task_id).answer["value"] == "yes"
    assert task(rpc, task_id)["status"] == "working"

    store.claim_todo(scope, task_id, "w")
    store.complete_todo(scope, task_id, "w", result={"shipped": True})
    done = task(rpc, task_id)
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"]["todo"]["result"] == {"shipped": True}


def test_a_dead_letter_is_a_completed_task_whose_result_is_an_error(rpc, scope):
    """The extension keeps ``failed`` for JSON-RPC errors: work that failed
    is a completed task whose tool result says so."""
    task_id = create_task(rpc, max_attempts=1)["taskId"]
    store.claim_todo(scope, task_id, "w")
    store.fail_todo(scope, task_id, "w", error="disk full")
    dead = task(rpc, task_id)
    assert dead["status"] == "completed"
    assert "error" not in dead
    assert dead["statusMessage"] == "disk full"
    assert dead["result"]["isError"] is True
    assert "disk full" in dead["result"]["content"][0]["text"]
    todo = dead["result"]["structuredContent"]["todo"]
    assert (todo["id"], todo["outcome"]) == (task_id, "dead_letter")


def test_tasks_cancel_cancels_a_pending_todo(rpc, scope):
    task_id = create_task(rpc)["taskId"]
    status, body = rpc("tasks/cancel", taskId=task_id)
    assert status == 200 and body["result"]["resultType"] == "complete"
    assert task(rpc, task_id)["status"] == "cancelled"
    assert store.get_todo(scope, task_id).outcome == "canceled"
    # A terminal task's cancel is acknowledged all the same.
    assert rpc("tasks/cancel", taskId=task_id)[0] == 200


def test_tasks_cancel_whose_name_header_names_another_task_cancels_nothing(rpc, scope):
    """Mcp-Name must be the body's taskId: an intermediary may have routed
    the request on it."""
    task_id, other_id = create_task(rpc)["taskId"], create_task(rpc)["taskId"]
    status, body = rpc("tasks/cancel", taskId=task_id, headers={"Mcp-Name": other_id})
    assert (status, body["error"]["code"]) == (400, -32020)
    assert store.get_todo(scope, task_id).outcome == "pending"
    assert store.get_todo(scope, other_id).outcome == "pending"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_a_tasks_request_without_its_name_header_is_a_header_mismatch(rpc, method):
    task_id = create_task(rpc)["taskId"]
    status, body = rpc(
        method, taskId=task_id, inputResponses={}, headers={"Mcp-Name": None}
    )
    assert (status, body["error"]["code"]) == (400, -32020)


def test_tasks_cancel_of_a_claimed_todo_asks_its_worker(rpc, scope):
    task_id = create_task(rpc)["taskId"]
    store.claim_todo(scope, task_id, "w")
    rpc("tasks/cancel", taskId=task_id)
    assert store.get_todo(scope, task_id).cancel_requested
    assert task(rpc, task_id)["status"] == "working"
    store.release_todo(scope, task_id, "w")
    assert task(rpc, task_id)["status"] == "cancelled"


def test_an_update_for_another_key_or_a_declined_one_is_ignored(rpc, scope):
    task_id = create_task(rpc)["taskId"]
    store.claim_todo(scope, task_id, "w")
    store.ask(scope, task_id, "w", question="Which?")
    [key] = task(rpc, task_id)["inputRequests"]
    for responses in (
        {"question-then": {"action": "accept", "content": {"answer": "x"}}},
        {key: {"action": "decline"}},
    ):
        status, _ = rpc("tasks/update", taskId=task_id, inputResponses=responses)
        assert status == 200
    assert task(rpc, task_id)["status"] == "input_required"


def test_an_answer_the_question_refuses_is_invalid_params(rpc, scope):
    task_id = create_task(rpc)["taskId"]
    store.claim_todo(scope, task_id, "w")
    store.ask(scope, task_id, "w", question="Ship it?", choices=["yes", "no"])
    [key] = task(rpc, task_id)["inputRequests"]
    for content in ({"answer": "maybe"}, {"other": 1}):
        responses = {key: {"action": "accept", "content": content}}
        status, body = rpc("tasks/update", taskId=task_id, inputResponses=responses)
        assert (status, body["error"]["code"]) == (200, -32602), content
    assert task(rpc, task_id)["status"] == "input_required"


def test_an_update_after_the_board_answered_is_ignored(rpc, scope):
    task_id = create_task(rpc)["taskId"]
    store.claim_todo(scope, task_id, "w")
    store.ask(scope, task_id, "w", question="Which?")
    [key] = task(rpc, task_id)["inputRequests"]
    store.answer_todo_any_endpoint(task_id, "board's", by="alice")
    responses = {key: {"action": "accept", "content": {"answer": "mine"}}}
    assert rpc("tasks/update", taskId=task_id, inputResponses=responses)[0] == 200
    assert store.get_todo(scope, task_id).answer["value"] == "board's"


def test_another_endpoints_task_is_not_found(rpc, other_endpoint, scope):
    task_id = create_task(rpc)["taskId"]
    for method, params in (
        ("tasks/get", {}),
        ("tasks/cancel", {}),
        ("tasks/update", {"inputResponses": {}}),
    ):
        status, body = rpc(method, token=other_endpoint.token, taskId=task_id, **params)
        assert status == 200 and body["error"]["code"] == -32602, method
        assert "not found" in body["error"]["message"].lower()
    assert store.get_todo(scope, task_id).outcome == "pending"


@pytest.mark.parametrize("task_id", [None, "", 7, "not-a-uuid", str(uuid.uuid4())])
def test_a_bad_or_unknown_task_id_is_invalid_params(rpc, task_id):
    status, body = rpc("tasks/get", taskId=task_id)
    assert status == 200 and body["error"]["code"] == -32602


def test_update_needs_input_responses_as_an_object(rpc):
    task_id = create_task(rpc)["taskId"]
    status, body = rpc("tasks/update", taskId=task_id, inputResponses=[1])
    assert body["error"]["code"] == -32602


def test_listen_for_tasks_without_the_extension_is_a_missing_capability(rpc):
    task_id = create_task(rpc)["taskId"]
    status, body = rpc(
        "subscriptions/listen", capabilities={}, notifications={"taskIds": [task_id]}
    )
    assert (status, body["error"]["code"]) == (400, -32021)
    assert body["error"]["data"]["requiredCapabilities"] == TASKS


@pytest.mark.parametrize("task_ids", ["one", [1], [None]])
def test_a_listen_whose_task_ids_are_no_list_of_ids_is_invalid_params(rpc, task_ids):
    status, body = rpc("subscriptions/listen", notifications={"taskIds": task_ids})
    assert (status, body["error"]["code"]) == (200, -32602)


# --- Live: another process, and a restart -----------------------------------------


@pytest.fixture
def gunicorn(django_db_blocker):
    """Start and restart gunicorn processes on the test database."""
    running = []

    def start():
        with django_db_blocker.unblock():
            process, port = start_gunicorn(database_url())
        running.append(process)
        return process, f"http://127.0.0.1:{port}"

    yield start
    for process in running:
        if process.poll() is None:
            stop(process)


def mcp(base, token, method, **params):
    body = message(method, **params)
    response = httpx2.post(
        f"{base}/mcp", json=body, headers=headers_for(body, token), timeout=15
    )
    assert response.status_code == 200, response.text
    return response.json()["result"]


def api(base, token, path, **body):
    response = httpx2.post(
        f"{base}/api/v1/todos{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=15,
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_a_task_is_worked_by_a_json_api_worker_and_survives_a_restart(
    asgi_server, gunicorn, endpoint
):
    """Created over MCP in this process; claimed, asked and completed by a
    JSON-API worker through gunicorn; tasks/get on gunicorn at each step, the
    question answered over MCP after gunicorn restarted."""
    token = endpoint.token
    steps = []

    def seen(base, task_id):
        state = mcp(base, token, "tasks/get", taskId=task_id)
        steps.append((state["status"], state.get("statusMessage")))
        return state

    task_id = mcp(
        asgi_server.url,
        token,
        "tools/call",
        name="delegate",
        arguments={"queue": "deploys", "title": "deploy"},
    )["taskId"]
    process, base = gunicorn()
    seen(base, task_id)
    claimed = api(base, token, "/claim", worker="w", queue="deploys")
    assert claimed["todo"]["id"] == task_id
    api(base, token, f"/{task_id}/heartbeat", worker="w", progress={"message": "50%"})
    seen(base, task_id)
    api(base, token, f"/{task_id}/ask", worker="w", question="Go?", choices=["go"])
    asked = seen(base, task_id)

    stop(process)
    process, base = gunicorn()
    again = seen(base, task_id)
    assert again["inputRequests"] == asked["inputRequests"]
    [key] = again["inputRequests"]
    responses = {key: {"action": "accept", "content": {"answer": "go"}}}
    mcp(base, token, "tasks/update", taskId=task_id, inputResponses=responses)
    seen(base, task_id)
    reclaimed = api(base, token, "/claim", worker="w", queue="deploys")
    assert reclaimed["todo"]["answer"]["value"] == "go"
    api(base, token, f"/{task_id}/complete", worker="w", result={"deployed": 1})
    done = seen(asgi_server.url, task_id)

    assert steps == [
        ("working", "the todo is pending"),
        ("working", "50%"),
        ("input_required", "Go?"),
        ("input_required", "Go?"),
        ("working", "50%"),
        ("completed", None),
    ]
    assert done["result"]["structuredContent"]["todo"]["result"] == {"deployed": 1}


def test_a_question_answered_on_the_board_moves_the_task_on(rpc, scope, endpoint):
    """The owner answers on the Board first: the task is working again, and the
    agent's late tasks/update changes nothing."""
    task_id = create_task(rpc)["taskId"]
    store.claim_todo(scope, task_id, "w")
    store.ask(scope, task_id, "w", question="Ship it?", choices=["yes", "no"])
    [key] = task(rpc, task_id)["inputRequests"]
    operator = Client()  # the Board's, signed in (a sync view: Django's client)
    operator.force_login(endpoint.owner)
    field = f"q{task_id.split('-')[0]}-answer"
    confirm = f"q{task_id.split('-')[0]}-confirm"
    board = operator.post(
        f"/board/todos/{task_id}/answer/", {field: "yes", confirm: "yes"}
    )
    assert board.status_code in (200, 302)
    assert task(rpc, task_id)["status"] == "working"
    late = {key: {"action": "accept", "content": {"answer": "no"}}}
    assert rpc("tasks/update", taskId=task_id, inputResponses=late)[0] == 200
    answer = store.get_todo(scope, task_id).answer
    assert (answer["value"], answer["by"]) == ("yes", "operator:alice")


# --- Live: task status pushed on subscriptions/listen -----------------------------


def in_thread(step, *args):
    """Run a store step from a worker thread, closing that thread's connection."""

    def run():
        try:
            return step(*args)
        finally:
            connection.close()

    return anyio.to_thread.run_sync(run)


def test_listen_pushes_each_status_change_of_the_tasks_it_named(
    asgi_server, endpoint, scope, other_scope
):
    """notifications/tasks, carrying the task as tasks/get has it, at once and
    on each change: working, input_required, working, completed for one task,
    cancelled for another; nothing for a task not named, none for another
    endpoint's."""
    base, token = asgi_server.url, endpoint.token
    shipped, dropped, unnamed = (
        mcp(base, token, "tools/call", name="delegate", arguments={"queue": "q"})[
            "taskId"
        ]
        for _ in range(3)
    )
    foreign, _ = store.create_todo(other_scope, queue="q", title="theirs")
    body = message(
        "subscriptions/listen",
        id=9,
        notifications={"taskIds": [shipped, dropped, foreign.id, "no-such-task"]},
    )
    seen, steps = [], []

    def ask():
        store.claim_todo(scope, shipped, "w")
        store.ask(scope, shipped, "w", question="Ship it?", choices=["yes"])

    def answer():
        store.answer_todo(scope, shipped, "yes")

    def complete():
        store.claim_todo(scope, unnamed, "w")
        store.complete_todo(scope, unnamed, "w", result={})
        store.claim_todo(scope, shipped, "w")
        store.complete_todo(scope, shipped, "w", result={"shipped": True})

    def cancel():
        store.cancel_todo(scope, dropped, reason="not needed")

    # After each expected notification, the next change.
    script = {
        (shipped, "working", 0): ask,
        (dropped, "working", 0): None,
        (shipped, "input_required", 0): answer,
        (shipped, "working", 1): complete,
        (shipped, "completed", 0): cancel,
        (dropped, "cancelled", 0): None,
    }

    async def main():
        async with (
            httpx2.AsyncClient(base_url=base, timeout=20) as http,
            http.stream(
                "POST", "/mcp", headers=headers_for(body, token), json=body
            ) as stream,
        ):
            lines = stream.aiter_lines()
            with anyio.fail_after(15):
                async for line in lines:
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    seen.append(event)
                    if event["method"] != "notifications/tasks":
                        continue
                    task = event["params"]
                    key = (task["taskId"], task["status"])
                    step = script.get((*key, steps.count(key)))
                    steps.append(key)
                    if step is not None:
                        await in_thread(step)
                    if ("cancelled" in dict(steps).values()) or len(steps) > 8:
                        break

    anyio.run(main)
    ack = seen[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [shipped, dropped]
    assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 9
    assert steps == [
        (shipped, "working"),
        (dropped, "working"),
        (shipped, "input_required"),
        (shipped, "working"),
        (shipped, "completed"),
        (dropped, "cancelled"),
    ]
    pushed = [event["params"] for event in seen[1:]]
    assert all(
        task["_meta"]["io.modelcontextprotocol/subscriptionId"] == 9 for task in pushed
    )
    asked = pushed[2]
    [request] = asked["inputRequests"].values()
    assert request["params"]["message"] == "Ship it?"
    done = pushed[4]
    assert done["result"]["structuredContent"]["todo"]["result"] == {"shipped": True}
    assert pushed[5]["statusMessage"] == "not needed"
