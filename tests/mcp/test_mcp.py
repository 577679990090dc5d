"""The MCP endpoint, driven by the official ``mcp`` SDK client over Streamable HTTP.

The client tests run against the ASGI app served in the test process
(``asgi_server``, transactional) and one against a gunicorn process beside
it, to show that a session is not held in any one process. The JSON-RPC edge
cases go through Django's test client, in process.
"""

import json
import time
import uuid
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from django.db import connection
from django.test import Client as DjangoClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import INITIALIZE
from tests.support import (
    database_url,
    deadlocked_heartbeat,
    free_port,
    serve_gunicorn,
)
from todos import store
from todos.management.sweeper import sweep_once
from todos.mcp import transport
from todos.mcp.tools import TOOLS
from todos.models import McpSession

TOOL_NAMES = {
    "list_todos",
    "get_todo",
    "create_todo",
    "claim_next",
    "claim_todo",
    "heartbeat",
    "complete_todo",
    "fail_todo",
    "release_todo",
    "retry_todo",
    "batch",
    "list_queues",
    "ask",
    "answer",
    "cancel_todo",
    "wait_for_todo",
    "create_schedule",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "list_budgets",
    "get_queue",
    "update_queue",
    "list_groups",
    "set_group",
    "set_priority",
}


@pytest.fixture(autouse=True)
def quick_keepalive(settings):
    # A stream notices an ended session or a gone client on its next wake-up.
    settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS = 1


class Doorbells:
    """The todo.ready notifications one client session received."""

    def __init__(self):
        self.rings = []

    async def __call__(self, params):
        if isinstance(params.data, dict) and params.data.get("event") == "todo.ready":
            self.rings.append(params.data)

    async def wait_for(self, todo_id, timeout=10):
        with anyio.fail_after(timeout):
            while not any(ring["id"] == todo_id for ring in self.rings):
                await anyio.sleep(0.05)


@asynccontextmanager
async def mcp_client(url, token, doorbells=None):
    """Yield an initialized ClientSession of the endpoint with this token.

    The session also carries ``mcp_session_id``, read from the server's answer.
    """
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
    )
    minted = []

    async def remember_session(response):
        if "Mcp-Session-Id" in response.headers and not minted:
            minted.append(response.headers["Mcp-Session-Id"])

    http.event_hooks["response"].append(remember_session)
    async with (
        http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, logging_callback=doorbells) as session,
    ):
        session.initialize_info = await session.initialize()
        session.mcp_session_id = minted[0]
        yield session


async def call(session, tool, **arguments):
    return await session.call_tool(tool, arguments)


def run(main):
    anyio.run(main)


# --- The official client, against a live server ---------------------------------


def test_sdk_client_creates_claims_heartbeats_and_completes_a_todo(
    asgi_server, endpoint
):
    """SPEC: Claimed todo is invisible to other consumers; Only the lease owner may
    complete or fail."""
    seen = {}

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token) as session:
            seen["version"] = session.initialize_info.protocol_version
            seen["server"] = session.initialize_info.server_info.name
            seen["tools"] = {tool.name for tool in (await session.list_tools()).tools}
            created = await call(
                session,
                "create_todo",
                queue="build",
                title="ship",
                payload={"ref": "main"},
            )
            seen["created"] = created.structured_content
            claimed = await call(session, "claim_next", queue="build")
            seen["claimed"] = claimed.structured_content["todo"]
            todo_id = seen["claimed"]["id"]
            seen["second_claim"] = await call(
                session, "claim_next", queue="build", worker="someone-else"
            )
            seen["stranger"] = await call(
                session, "complete_todo", todo_id=todo_id, worker="someone-else"
            )
            beat = await call(session, "heartbeat", todo_id=todo_id, lease_seconds=900)
            seen["beat"] = beat.structured_content["todo"]
            done = await call(
                session, "complete_todo", todo_id=todo_id, result={"ok": True}
            )
            seen["done"] = done.structured_content["todo"]
            seen["session_id"] = session.mcp_session_id

    run(main)
    assert seen["version"] == "2025-11-25"
    assert seen["server"] == "switchboard"
    assert seen["tools"] == TOOL_NAMES
    assert seen["created"]["created"] is True
    assert seen["created"]["todo"]["payload"] == {"ref": "main"}
    claimed = seen["claimed"]
    assert claimed["id"] == seen["created"]["todo"]["id"]
    assert claimed["state"] == "claimed"
    # With no worker given, the MCP session is the worker.
    assert claimed["owner"] == seen["session_id"]
    assert seen["second_claim"].structured_content["error"] == "not_found"
    assert seen["stranger"].is_error
    assert seen["stranger"].structured_content["error"] == "conflict"
    assert seen["beat"]["lease_expires_at"] > claimed["lease_expires_at"]
    assert seen["done"]["state"] == "done"
    assert seen["done"]["result"] == {"ok": True}
    # The client's DELETE on exit ended the session.
    assert not McpSession.objects.filter(endpoint=endpoint).exists()


def test_sdk_client_claims_a_batch_and_acknowledges_it_with_lease_tokens(
    asgi_server, endpoint
):
    """CONTRACT §10 over MCP: claim_next with max_todos, the owner tools with
    lease_token, the batch tool, create_todo with delay_seconds, list_queues."""
    seen = {}

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token) as session:
            for n in range(3):
                await call(session, "create_todo", queue="jobs", title=f"t{n}")
            delayed = await call(
                session, "create_todo", queue="jobs", delay_seconds=600
            )
            seen["delayed"] = delayed.structured_content["todo"]
            claimed = await call(session, "claim_next", queue="jobs", max_todos=10)
            seen["claimed"] = claimed.structured_content["todos"]
            first, second, third = seen["claimed"]
            seen["stale"] = await call(
                session, "complete_todo", todo_id=first["id"], lease_token="stale"
            )
            done = await call(
                session,
                "complete_todo",
                todo_id=first["id"],
                lease_token=first["lease_token"],
                worker="anyone",
            )
            seen["done"] = done.structured_content["todo"]
            batch = await call(
                session,
                "batch",
                actions=[
                    {
                        "op": "heartbeat",
                        "id": second["id"],
                        "lease_token": second["lease_token"],
                    },
                    {"op": "release", "id": third["id"]},
                    {"op": "complete", "id": str(uuid.uuid4())},
                ],
            )
            seen["batch"] = batch.structured_content["results"]
            seen["bad_batch"] = await call(
                session, "batch", actions=[{"op": "delete", "id": second["id"]}]
            )
            empty = await call(session, "claim_next", queue="nothing", max_todos=2)
            seen["empty"] = empty
            queues = await call(session, "list_queues")
            seen["queues"] = queues.structured_content["queues"]

    run(main)
    assert [todo["title"] for todo in seen["claimed"]] == ["t0", "t1", "t2"]
    assert all(todo["lease_token"] for todo in seen["claimed"])
    assert seen["delayed"]["available_at"] > seen["delayed"]["created_at"]
    assert seen["stale"].is_error
    assert seen["stale"].structured_content["error"] == "conflict"
    assert seen["done"]["state"] == "done"
    assert [result["status"] for result in seen["batch"]] == [200, 200, 404]
    assert seen["batch"][0]["todo"]["lease_token"] == seen["claimed"][1]["lease_token"]
    assert seen["batch"][1]["todo"]["state"] == "pending"
    assert seen["bad_batch"].is_error
    assert "actions[0].op" in seen["bad_batch"].structured_content["detail"]
    assert not seen["empty"].is_error
    assert seen["empty"].structured_content == {"todos": []}
    (jobs,) = seen["queues"]
    assert jobs["name"] == "jobs" and jobs["delayed"] == 1 and jobs["pending"] == 1


def test_foreign_todo_id_gets_the_same_tool_error_as_a_never_minted_one(
    asgi_server, scope, other_endpoint
):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one"""
    foreign, _ = store.create_todo(scope, queue="reviews", title="A's")
    never_minted = str(uuid.uuid4())
    answers = {}

    async def main():
        async with mcp_client(asgi_server.url, other_endpoint.token) as session:
            for tool in (
                "get_todo",
                "claim_todo",
                "heartbeat",
                "complete_todo",
                "fail_todo",
                "release_todo",
                "retry_todo",
            ):
                answers[tool] = [
                    await call(session, tool, todo_id=todo_id)
                    for todo_id in (foreign.id, never_minted, "not-a-uuid")
                ]

    run(main)
    for tool, results in answers.items():
        assert all(result.is_error for result in results), tool
        texts = {result.content[0].text for result in results}
        structured = {json.dumps(result.structured_content) for result in results}
        assert len(texts) == 1 and len(structured) == 1, (tool, texts)
        assert results[0].structured_content["error"] == "not_found"
    assert store.get_todo(scope, foreign.id).state == "pending"


def test_second_endpoint_never_sees_first_endpoints_todos_or_notifications(
    asgi_server, endpoint, other_endpoint
):
    """SPEC: Cross-endpoint queue collision is isolated; Doorbell never crosses
    endpoints"""
    a_bells, b_bells = Doorbells(), Doorbells()
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token, a_bells) as a,
            mcp_client(asgi_server.url, other_endpoint.token, b_bells) as b,
        ):
            a_todo = await call(a, "create_todo", queue="reviews", title="A's review")
            a_id = a_todo.structured_content["todo"]["id"]
            await a_bells.wait_for(a_id)
            # B's stream is live: its own todo reaches it, and A's never did.
            b_todo = await call(b, "create_todo", queue="reviews", title="B's review")
            b_id = b_todo.structured_content["todo"]["id"]
            await b_bells.wait_for(b_id)
            seen["b_list"] = (
                await call(b, "list_todos", queue="reviews")
            ).structured_content
            seen["b_claims"] = [
                (await call(b, "claim_next", queue="reviews")).structured_content,
                await call(b, "claim_next", queue="reviews"),
            ]
            seen["ids"] = a_id, b_id

    run(main)
    a_id, b_id = seen["ids"]
    assert a_id in {ring["id"] for ring in a_bells.rings}
    assert a_id not in {ring["id"] for ring in b_bells.rings}
    assert {ring["endpoint_id"] for ring in b_bells.rings} == {str(other_endpoint.id)}
    assert [todo["id"] for todo in seen["b_list"]["todos"]] == [b_id]
    first, second = seen["b_claims"]
    assert first["todo"]["id"] == b_id
    assert second.is_error and second.structured_content["error"] == "not_found"


def test_a_client_that_turns_logging_above_info_hears_no_doorbell(
    asgi_server, endpoint
):
    quiet_bells, loud_bells = Doorbells(), Doorbells()
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token, quiet_bells) as quiet,
            mcp_client(asgi_server.url, endpoint.token, loud_bells) as loud,
        ):
            await quiet.set_logging_level("warning")
            created = await call(loud, "create_todo", queue="q")
            seen["id"] = created.structured_content["todo"]["id"]
            await loud_bells.wait_for(seen["id"])
            # Past a keep-alive, the quiet stream has surely had its chance.
            await anyio.sleep(1.5)

    run(main)
    assert [ring["id"] for ring in loud_bells.rings] == [seen["id"]]
    assert quiet_bells.rings == []


def test_the_get_stream_draws_each_keep_alive_wait_anew(
    asgi_server, endpoint, monkeypatch
):
    """As /api/v1/events: streams opened together kept their keep-alives in
    step; each wait of the session's GET stream draws its own."""
    from django.conf import settings

    from todos.waiting import streams

    asked = []

    def drawn(seconds):
        asked.append(seconds)
        return 0.2

    monkeypatch.setattr(streams, "keepalive_wait", drawn)

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token):
            await anyio.sleep(1)

    run(main)
    assert len(asked) >= 2
    assert set(asked) == {settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS}


def test_claim_next_waits_for_work_that_arrives_during_the_wait(asgi_server, endpoint):
    """SPEC: Atomic Claim with FOR UPDATE SKIP LOCKED (a long poll, woken by the
    doorbell)"""
    seen = {}

    async def main():
        async with (
            mcp_client(asgi_server.url, endpoint.token) as worker,
            mcp_client(asgi_server.url, endpoint.token) as producer,
        ):

            async def claim():
                started = time.monotonic()
                result = await call(worker, "claim_next", queue="jobs", wait_seconds=15)
                seen["claim"] = result, time.monotonic() - started

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(claim)
                await anyio.sleep(0.5)
                created = await call(producer, "create_todo", queue="jobs")
                seen["created"] = created.structured_content["todo"]["id"]

    run(main)
    result, waited = seen["claim"]
    assert not result.is_error
    assert result.structured_content["todo"]["id"] == seen["created"]
    assert 0.4 < waited < 15  # woken by the create, before its deadline


def test_bad_tool_arguments_come_back_as_tool_errors_naming_the_field(
    asgi_server, make_endpoint
):
    """Bad arguments are tool errors a model can correct, not transport failures."""
    narrow = make_endpoint("narrow", queues=("build",))
    results = {}

    async def main():
        async with mcp_client(asgi_server.url, narrow.token) as session:
            results["lease"] = await call(session, "claim_next", lease_seconds=0)
            results["wait"] = await call(session, "claim_next", wait_seconds=21)
            results["unknown"] = await call(session, "get_todo", id="x")
            results["missing"] = await call(session, "create_todo", title="no queue")
            results["grant"] = await call(session, "create_todo", queue="deploy")
            results["empty"] = await call(session, "claim_next")

    run(main)
    assert all(result.is_error for result in results.values())
    codes = {
        name: result.structured_content["error"] for name, result in results.items()
    }
    assert codes == {
        "lease": "bad_request",
        "wait": "bad_request",
        "unknown": "bad_request",
        "missing": "bad_request",
        "grant": "forbidden",
        "empty": "not_found",
    }
    assert results["lease"].content[0].text.startswith("bad_request: lease_seconds:")
    assert "id: not an argument of get_todo" in results["unknown"].content[0].text
    assert "queue: is required" in results["missing"].content[0].text
    assert "wait_seconds" in results["empty"].content[0].text


# --- Sessions across processes --------------------------------------------------


@pytest.fixture(scope="module")
def gunicorn_server(django_db_setup, django_db_blocker):
    """A gunicorn process on the test database, beside the live server."""
    yield from serve_gunicorn(django_db_blocker)


@pytest.fixture(scope="module")
def outage_server(django_db_setup, django_db_blocker):
    """A gunicorn process whose database is a closed port."""
    yield from serve_gunicorn(django_db_blocker, database_url(port=free_port()))


@pytest.mark.slow
def test_a_session_minted_by_one_process_is_served_by_another(
    asgi_server, gunicorn_server, endpoint, scope
):
    """Sessions live in PostgreSQL: any server process serves any session."""
    headers = {
        "Authorization": f"Bearer {endpoint.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    seen = {}

    async def main():
        async with mcp_client(asgi_server.url, endpoint.token) as session:
            headers["Mcp-Session-Id"] = session.mcp_session_id
            async with httpx2.AsyncClient(
                base_url=gunicorn_server, timeout=10
            ) as other:
                listed = await other.post(
                    "/mcp",
                    headers=headers,
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": "list_todos", "arguments": {}},
                    },
                )
                seen["listed"] = listed.status_code, listed.json()
                async with other.stream("GET", "/mcp", headers=headers) as stream:
                    lines = stream.aiter_lines()
                    created = await call(session, "create_todo", queue="q")
                    todo_id = created.structured_content["todo"]["id"]
                    with anyio.fail_after(10):
                        async for line in lines:
                            if line.startswith("data:") and todo_id in line:
                                seen["ring"] = json.loads(line[5:])
                                break
                    # Ended through the live server, the session's stream on
                    # the gunicorn process ends too.
                    async with httpx2.AsyncClient(base_url=asgi_server.url) as first:
                        ended = await first.delete("/mcp", headers=headers)
                    seen["ended"] = ended.status_code
                    with anyio.fail_after(10):
                        seen["rest"] = [line async for line in lines]
            try:
                await session.send_ping()
            except MCPError as exc:
                seen["after_delete"] = exc

    run(main)
    status, body = seen["listed"]
    assert status == 200 and body["result"]["structuredContent"] == {
        "todos": [],
        "next_cursor": None,
    }
    assert seen["ring"]["method"] == "notifications/message"
    assert seen["ring"]["params"]["data"]["event"] == "todo.ready"
    assert seen["ended"] == 204
    assert not any(line.startswith("data:") for line in seen["rest"])
    assert seen["after_delete"].error.data["error"] == "not_found"


@pytest.mark.slow
def test_a_database_outage_is_503_with_a_json_rpc_error(outage_server):
    headers = {
        "Authorization": "Bearer sb_" + "a" * 43,
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": str(uuid.uuid4()),
    }
    for method, body in [("POST", INITIALIZE), ("GET", None), ("DELETE", None)]:
        response = httpx2.request(
            method, f"{outage_server}/mcp", json=body, headers=headers, timeout=15
        )
        assert response.status_code == 503, (method, response.text)
        error = response.json()["error"]
        assert error["code"] == -32603
        assert error["data"]["error"] == "unavailable"


def test_a_tool_call_stopped_by_a_deadlock_is_the_unavailable_error_saying_busy(
    post, session_id, scope, monkeypatch
):
    """A deadlock is a busy database, not a down one: the transport's 503
    JSON-RPC error of an outage (Retry-After), its words saying busy."""
    # A real Deadlocked (a heartbeat's), raised where the tool's claim meets
    # the store.
    todo, raised = deadlocked_heartbeat(scope)
    assert isinstance(raised, store.Deadlocked)

    def claim_todo(*args, **kwargs):
        raise raised

    monkeypatch.setattr(store, "claim_todo", claim_todo)
    response = post(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "claim_todo", "arguments": {"todo_id": todo.id}},
        },
        session=session_id,
    )

    assert response.status_code == 503 and response["Retry-After"] == "1"
    error = response.json()["error"]
    assert error["code"] == -32603 and error["data"]["error"] == "unavailable"
    assert error["data"]["detail"].startswith("the database is busy")
    assert "the database is busy" in error["message"]
    assert "database is unavailable" not in json.dumps(error)


# --- The transport's answers to bad requests (in process) -----------------------


def rpc_error(response):
    assert response["Content-Type"].startswith("application/json")
    return response.json()["error"]["code"]


def test_malformed_json_is_a_parse_error(post):
    response = post('{"jsonrpc": "2.0", "id": 1, "method": ')
    assert response.status_code == 400
    assert rpc_error(response) == -32700
    assert response.json()["id"] is None


@pytest.mark.parametrize(
    "body",
    [
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}],
        {"id": 1, "method": "ping"},
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1},
        "42",
    ],
)
def test_a_body_that_is_no_json_rpc_message_is_an_invalid_request(
    post, session_id, body
):
    response = post(body, session=session_id)
    assert response.status_code == 400
    assert rpc_error(response) == -32600


def test_unknown_method_is_method_not_found(post, session_id):
    response = post(
        {"jsonrpc": "2.0", "id": "a", "method": "resources/list"}, session=session_id
    )
    assert response.status_code == 200
    assert response.json()["id"] == "a"
    assert rpc_error(response) == -32601


@pytest.mark.parametrize(
    "params",
    [
        [],
        {},
        {"name": 3},
        {"name": "no_such_tool"},
        {"name": "get_todo", "arguments": ["todo_id"]},
    ],
)
def test_wrong_tools_call_params_are_invalid_params(post, session_id, params):
    response = post(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params},
        session=session_id,
    )
    assert response.status_code == 200
    assert rpc_error(response) == -32602


@pytest.mark.parametrize(
    "tool, arguments",
    [
        ("get_todo", {"todo_id": "a\x00b"}),
        ("get_todo", {"todo_id": ""}),
        ("get_todo", {"todo_id": 12}),
        ("get_todo", {"todo_id": "x" * 5000}),
        ("list_todos", {"limit": 5.5}),
        ("list_todos", {"limit": 10**40}),
        ("list_todos", {"cursor": "not-a-cursor"}),
        ("list_todos", {"state": ["pending"]}),
        ("create_todo", {"queue": "q", "payload": {"\ud800": 1}}),
        ("create_todo", {"queue": "q", "max_attempts": 0}),
        ("claim_next", {"worker": "\ud800"}),
        ("claim_next", {"lease_seconds": True}),
        ("fail_todo", {"todo_id": str(uuid.uuid4()), "error": 7}),
    ],
)
def test_nasty_tool_arguments_are_tool_errors_never_a_500(
    post, session_id, tool, arguments
):
    call_tool = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    response = post(
        {**call_tool, "params": {"name": tool, "arguments": arguments}},
        session=session_id,
    )
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"] in {"bad_request", "not_found"}


def test_initialize_without_a_protocol_version_is_invalid_params(post):
    response = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    assert response.status_code == 200
    assert rpc_error(response) == -32602
    assert "Mcp-Session-Id" not in response


def test_initialize_offers_the_newest_revision_for_an_unknown_one(post):
    response = post(
        {
            **INITIALIZE,
            "params": {**INITIALIZE["params"], "protocolVersion": "1999-01-01"},
        }
    )
    assert response.json()["result"]["protocolVersion"] == "2025-11-25"
    older = post(
        {
            **INITIALIZE,
            "params": {**INITIALIZE["params"], "protocolVersion": "2025-06-18"},
        }
    )
    assert older.json()["result"]["protocolVersion"] == "2025-06-18"


def test_initialize_stores_an_unstorable_client_name_cleaned(post):
    params = {**INITIALIZE["params"], "clientInfo": {"name": "a\x00b\ud800", "v": 1}}
    response = post({**INITIALIZE, "params": params})
    assert response.status_code == 200
    session = McpSession.objects.get(pk=response["Mcp-Session-Id"])
    assert session.client_name == "ab?"


@pytest.mark.parametrize("token", [None, "sb_not-a-real-token"])
def test_a_missing_or_bad_token_is_401_json(post, token):
    response = post(INITIALIZE, token=token)
    assert response.status_code == 401
    assert response.json()["error"]["data"]["error"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_401(post, endpoint):
    endpoint.revoked_at = endpoint.created_at
    endpoint.save()
    assert post(INITIALIZE).status_code == 401


def test_messages_after_initialize_need_the_session(post, session_id):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert post(ping).status_code == 400
    assert post(ping, session=str(uuid.uuid4())).status_code == 404
    assert post(ping, session="not-a-session").status_code == 404
    ok = post(ping, session=session_id)
    assert ok.status_code == 200 and ok.json() == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {},
    }
    assert ok["Mcp-Session-Id"] == session_id


def test_a_session_is_bound_to_the_endpoint_that_minted_it(
    post, session_id, other_endpoint
):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    response = post(ping, session=session_id, token=other_endpoint.token)
    assert response.status_code == 404


def test_notifications_are_accepted_with_202(post, session_id):
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = post(initialized, session=session_id)
    assert response.status_code == 202
    assert response.content == b""


def test_logging_set_level_is_kept_on_the_session(post, session_id):
    """The doorbell is sent at level info: a client may turn it down."""
    set_level = {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel"}
    ok = post({**set_level, "params": {"level": "warning"}}, session=session_id)
    assert ok.json()["result"] == {}
    assert McpSession.objects.get(pk=session_id).log_level == "warning"
    wrong = post({**set_level, "params": {"level": "loud"}}, session=session_id)
    assert rpc_error(wrong) == -32602


def test_a_session_idle_for_a_week_is_gone(post, session_id, endpoint):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE mcp_sessions SET last_seen_at = now() - interval '8 days'"
            " WHERE id = %s",
            [session_id],
        )
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert post(ping, session=session_id).status_code == 404
    # The endpoint's next initialize forgets it.
    post(INITIALIZE)
    assert not McpSession.objects.filter(pk=session_id).exists()


def test_an_unsupported_protocol_version_header_is_400(post, session_id):
    response = post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        session=session_id,
        **{"MCP-Protocol-Version": "2026-07-28"},
    )
    assert response.status_code == 400
    assert rpc_error(response) == -32600


def test_delete_ends_the_session(client, post, endpoint, session_id):
    auth = {"Authorization": f"Bearer {endpoint.token}", "Mcp-Session-Id": session_id}
    assert client.delete("/mcp", headers=auth).status_code == 204
    assert client.delete("/mcp", headers=auth).status_code == 404
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert post(ping, session=session_id).status_code == 404


def test_a_foreign_origin_is_refused(post):
    response = post(INITIALIZE, Origin="http://evil.example")
    assert response.status_code == 403


def test_a_body_over_the_limit_is_413(post):
    response = post({**INITIALIZE, "padding": "x" * (300 * 1024)})
    assert response.status_code == 413
    assert response.json()["error"]["data"]["error"] == "payload_too_large"


def test_other_methods_and_media_types_are_refused(client, post, endpoint):
    auth = {"Authorization": f"Bearer {endpoint.token}"}
    assert client.put("/mcp", headers=auth).status_code == 405
    form = client.post("/mcp", data={"a": "b"}, headers=auth)
    assert form.status_code == 415


def test_every_tool_has_an_object_schema_and_a_description():
    for tool in TOOLS.values():
        described = tool.to_dict()
        assert described["inputSchema"]["type"] == "object"
        assert len(described["description"]) > 40
        assert set(described["inputSchema"]["required"]) <= set(
            described["inputSchema"]["properties"]
        )


def test_list_todos_on_an_ungranted_queue_is_forbidden_like_the_json_api(
    post, client, make_endpoint
):
    """Defect: MCP list_todos answered an empty page where the JSON API says 403."""
    narrow = make_endpoint("narrow", queues=("build",))
    session = post(INITIALIZE, token=narrow.token)["Mcp-Session-Id"]
    call_tool = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "list_todos", "arguments": {"queue": "deploy"}},
    }

    result = post(call_tool, session=session, token=narrow.token).json()["result"]
    api = client.get(
        "/api/v1/todos",
        {"queue": "deploy"},
        headers={"Authorization": f"Bearer {narrow.token}"},
    )

    assert api.status_code == 403
    assert result["isError"] is True
    assert result["structuredContent"] == api.json()


def test_an_origin_that_is_not_a_url_is_refused_with_json(post):
    """Defect: Origin "http://[::1" (a urlsplit ValueError) answered HTML 500."""
    response = post(INITIALIZE, Origin="http://[::1")

    assert response.status_code == 403
    assert response.json()["error"]["data"]["error"] == "forbidden"


@pytest.mark.parametrize("depth", [150, 1000])
def test_a_create_todo_nested_too_deep_is_refused_before_anything_is_committed(
    post, session_id, depth
):
    """Defect: a payload nested ~1000 deep was committed, then rendering the
    result overflowed (HTML 500; a client that retries creates duplicates)."""
    payload = json.loads("[" * depth + "]" * depth)
    call_tool = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "create_todo", "arguments": {"queue": "q", "payload": {}}},
    }
    body = json.dumps(call_tool).replace(
        '"payload": {}', f'"payload": {json.dumps(payload)}'
    )

    response = post(body, session=session_id)

    assert response["Content-Type"].startswith("application/json")
    answer = response.json()
    if "result" in answer:
        assert answer["result"]["isError"] is True
        assert "nest deeper" in answer["result"]["structuredContent"]["detail"]
    else:
        assert response.status_code == 400
    assert not store.list_todos_any_endpoint().todos


def test_an_unexpected_failure_is_a_json_rpc_500_never_the_html_page(
    endpoint, session_id, monkeypatch
):
    """Defect: /mcp could answer Django's HTML 500 page."""

    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(transport, "_dispatch", broken)
    response = DjangoClient(raise_request_exception=False).post(
        "/mcp",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {endpoint.token}",
            "Mcp-Session-Id": session_id,
        },
    )

    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == -32603 and error["data"]["error"] == "internal_error"


def age_session(session_id, seconds):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE mcp_sessions SET last_seen_at = now() - make_interval(secs => %s)"
            " WHERE id = %s",
            [seconds, session_id],
        )


def test_a_session_idle_past_the_configured_limit_is_a_404(post, session_id, settings):
    """Defect: MCP sessions never expired (a fixed week, rows kept forever)."""
    settings.SWITCHBOARD_MCP_SESSION_IDLE_SECONDS = 60
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert post(ping, session=session_id).status_code == 200

    age_session(session_id, 120)

    response = post(ping, session=session_id)
    assert response.status_code == 404
    assert response.json()["error"]["data"]["error"] == "not_found"


def test_the_sweep_deletes_expired_sessions_of_every_endpoint(
    post, session_id, other_endpoint
):
    """Defect: MCP sessions never expired (a fixed week, rows kept forever)."""
    other = post(INITIALIZE, token=other_endpoint.token)["Mcp-Session-Id"]
    fresh = post(INITIALIZE)["Mcp-Session-Id"]
    age_session(session_id, 8 * 86400)
    age_session(other, 8 * 86400)

    result = sweep_once()

    assert result.sessions_expired == 2
    assert list(McpSession.objects.values_list("id", flat=True)) == [uuid.UUID(fresh)]
