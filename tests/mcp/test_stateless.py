"""MCP 2026-07-28 on /mcp (CONTRACT §15): stateless requests beside 2025-11-25.

The official Python SDK 2.x client drives the live server; raw HTTP checks the
headers, the ``_meta`` rules and the errors in process.
"""

import json

import anyio
import httpx2
import pytest
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from todos import store
from todos.access import endpoints
from todos.mcp import listen, stateless

VERSION = "2026-07-28"


@pytest.fixture(autouse=True)
def quick_keepalive(settings):
    settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS = 1


def run(main):
    anyio.run(main)


def sdk_client(url, token, **options):
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
    )
    transport = streamable_http_client(f"{url}/mcp", http_client=http)
    return http, Client(transport, **options)


# --- The official client ----------------------------------------------------------


def test_sdk_client_speaks_2026_07_28_and_runs_the_agent_loop(asgi_server, endpoint):
    """The SDK's probe finds 2026-07-28; create, claim, heartbeat, complete
    without any session, the worker name derived from token and client."""
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token)
        async with http, client:
            seen["version"] = client.protocol_version
            names = {tool.name for tool in (await client.list_tools()).tools}
            seen["tools"] = "claim_next" in names and "complete_todo" in names
            created = await client.call_tool(
                "create_todo", {"queue": "q", "title": "t"}
            )
            todo_id = created.structured_content["todo"]["id"]
            claimed = await client.call_tool("claim_next", {"queue": "q"})
            seen["claimed"] = claimed.structured_content["todo"]
            beat = await client.call_tool("heartbeat", {"todo_id": todo_id})
            seen["beat"] = beat.is_error
            done = await client.call_tool(
                "complete_todo", {"todo_id": todo_id, "result": {"ok": True}}
            )
            seen["done"] = done.structured_content["todo"]

    run(main)
    assert seen["version"] == VERSION
    assert seen["tools"]
    assert seen["claimed"]["state"] == "claimed"
    assert seen["claimed"]["owner"].startswith("mcp:")
    assert seen["beat"] is False
    assert seen["done"]["state"] == "done"
    assert seen["done"]["result"] == {"ok": True}


@pytest.mark.parametrize(
    ("mode", "version"), [("auto", VERSION), ("legacy", "2025-11-25")]
)
def test_sdk_client_runs_the_whole_agent_loop_on_both_revisions(
    asgi_server, endpoint, mode, version
):
    """Claim, heartbeat with progress, ask, answer, claim again, complete:
    the worker's name left to its default on either revision."""
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token, mode=mode)
        async with http, client:
            seen["version"] = client.protocol_version

            async def call(tool, **arguments):
                result = await client.call_tool(tool, arguments)
                assert result.is_error is False, result.content
                return result.structured_content

            todo_id = (await call("create_todo", queue="loop"))["todo"]["id"]
            await call("claim_next", queue="loop")
            beat = await call("heartbeat", todo_id=todo_id, progress={"message": "1/2"})
            seen["progress"] = beat["todo"]["progress"]["message"]
            asked = await call("ask", todo_id=todo_id, question="Go?", choices=["go"])
            seen["asked"] = asked["todo"]["outcome"]
            await call("answer", todo_id=todo_id, answer="go")
            again = await call("claim_next", queue="loop")
            seen["answer"] = again["todo"]["answer"]["value"]
            done = await call("complete_todo", todo_id=todo_id, result={"went": True})
            seen["done"] = done["todo"]["state"]

    run(main)
    assert seen == {
        "version": version,
        "progress": "1/2",
        "asked": "held",
        "answer": "go",
        "done": "done",
    }


def test_sdk_client_in_legacy_mode_still_speaks_2025_11_25(asgi_server, endpoint):
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token, mode="legacy")
        async with http, client:
            seen["version"] = client.protocol_version
            listed = await client.call_tool("list_todos", {})
            seen["todos"] = listed.structured_content

    run(main)
    assert seen == {
        "version": "2025-11-25",
        "todos": {"todos": [], "next_cursor": None},
    }


def test_claim_next_waits_for_work_on_2026_07_28(asgi_server, endpoint, scope):
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token)
        async with http, client, anyio.create_task_group() as group:

            async def claim():
                result = await client.call_tool(
                    "claim_next", {"queue": "later", "wait_seconds": 10}
                )
                seen["claimed"] = result.structured_content["todo"]

            group.start_soon(claim)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(create, scope, "later", "soon")

    run(main)
    assert seen["claimed"]["title"] == "soon"


def test_queues_are_resources_listed_and_read(asgi_server, endpoint, scope):
    store.create_todo(scope, queue="builds", title="one")
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token)
        async with http, client:
            listed = await client.list_resources()
            seen["uris"] = [str(resource.uri) for resource in listed.resources]
            read = await client.read_resource("switchboard://queues/builds")
            seen["queue"] = json.loads(read.contents[0].text)

    run(main)
    assert seen["uris"] == ["switchboard://queues/builds"]
    assert seen["queue"]["name"] == "builds"
    assert seen["queue"]["pending"] == 1


def test_listen_tells_a_subscribed_queue_that_a_todo_became_claimable(
    asgi_server, endpoint, scope
):
    """subscriptions/listen: updated for the subscribed queue, not for another."""
    seen = {}

    async def main():
        http, client = sdk_client(asgi_server.url, endpoint.token)
        async with (
            http,
            client,
            client.listen(
                resource_subscriptions=["switchboard://queues/watched"]
            ) as subscription,
        ):
            seen["honored"] = list(subscription.honored.resource_subscriptions)
            await anyio.to_thread.run_sync(create, scope, "other", "unheard")
            await anyio.to_thread.run_sync(create, scope, "watched", "heard")
            with anyio.fail_after(10):
                async for event in subscription:
                    seen["event"] = event
                    break

    run(main)
    assert seen["honored"] == ["switchboard://queues/watched"]
    assert "switchboard://queues/watched" in repr(seen["event"])


def test_listen_tells_a_subscribed_queue_of_claimable_todos_only(scope):
    """The stream's waiter hears a todo ending or asking too; a queue's
    subscriber is told only of work it can claim."""
    uri = "switchboard://queues/watched"
    params = {"notifications": {"resourceSubscriptions": [uri]}}
    subscription = listen.Listen.of(None, scope, params, 7)
    ring = {"id": "1", "endpoint_id": str(scope.endpoint_id), "queue": "watched"}
    ended = [{**ring, "event": event} for event in ("todo.done", "todo.asked")]
    assert subscription.updates(ended) == []
    [update] = subscription.updates([*ended, ring])
    assert update["params"]["uri"] == uri


@pytest.mark.parametrize("change", ["revoke", "rekey", "narrow"])
def test_listen_ends_when_the_endpoint_is_revoked_rekeyed_or_narrowed(
    asgi_server, endpoint, change
):
    """The subscription ends gracefully (its result) when the token stops
    opening the same queues, as the event stream does."""
    headers = {
        "Authorization": f"Bearer {endpoint.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "subscriptions/listen",
    }
    body = message(
        "subscriptions/listen",
        notifications={"resourceSubscriptions": ["switchboard://queues/q"]},
    )
    lines = []

    async def main():
        async with (
            httpx2.AsyncClient(base_url=asgi_server.url, timeout=20) as http,
            http.stream("POST", "/mcp", headers=headers, json=body) as s,
        ):
            assert s.headers["content-type"].startswith("text/event-stream")
            stream = s.aiter_lines()
            async for line in stream:
                if line.startswith("data:"):
                    lines.append(json.loads(line[5:]))
                    break
            await anyio.to_thread.run_sync(change_access, endpoint, change)
            with anyio.fail_after(10):
                async for line in stream:
                    if line.startswith("data:"):
                        lines.append(json.loads(line[5:]))

    run(main)
    assert lines[0]["method"] == "notifications/subscriptions/acknowledged"
    assert lines[-1]["id"] == 7
    assert lines[-1]["result"]["resultType"] == "complete"
    assert lines[-1]["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7


def change_access(endpoint, change):
    try:
        if change == "revoke":
            endpoints.revoke(endpoint)
        elif change == "rekey":
            endpoints.rotate_token(endpoint)
        else:
            endpoints.set_grant(endpoint, ["q"])
    finally:
        connection.close()


def create(scope, queue, title):
    """Create a todo from a worker thread, closing that thread's connection."""
    try:
        return store.create_todo(scope, queue=queue, title=title)
    finally:
        connection.close()


# --- Raw HTTP: headers, _meta and errors (in process) -----------------------------


def message(method, id=7, version=VERSION, capabilities=True, **params):
    meta = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "1"},
    }
    if capabilities:
        meta["io.modelcontextprotocol/clientCapabilities"] = {}
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": method,
        "params": {**params, "_meta": meta},
    }


@pytest.fixture
def post(client, endpoint):
    """post(body, **headers): the version and method headers follow the body
    unless given (None leaves a header out)."""

    def send(body, **headers):
        data = body if isinstance(body, str | bytes) else json.dumps(body)
        given = {
            "Authorization": f"Bearer {endpoint.token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
        }
        if isinstance(body, dict):
            given["Mcp-Method"] = body.get("method")
            params = body.get("params")
            params = params if isinstance(params, dict) else {}
            meta = params.get("_meta", {})
            given["MCP-Protocol-Version"] = meta.get(
                "io.modelcontextprotocol/protocolVersion", VERSION
            )
            name = params.get("name") or params.get("uri")
            if name:
                given["Mcp-Name"] = name
        given.update(headers)
        given = {key: value for key, value in given.items() if value is not None}
        return client.post(
            "/mcp", data=data, content_type="application/json", headers=given
        )

    return send


def test_discover_names_both_revisions_and_the_capabilities(post):
    response = post(message("server/discover"))
    assert response.status_code == 200
    assert "Mcp-Session-Id" not in response.headers
    result = response.json()["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][:2] == [VERSION, "2025-11-25"]
    assert set(result["capabilities"]) == {"tools", "resources", "extensions"}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == (
        "switchboard"
    )


def test_every_result_carries_its_result_type(post):
    for body in (
        message("tools/list"),
        message("tools/call", name="list_todos", arguments={}),
        message("resources/list"),
        message("resources/templates/list"),
    ):
        result = post(body).json()["result"]
        assert result["resultType"] == "complete", body["method"]


def test_tools_list_is_cacheable(post):
    result = post(message("tools/list")).json()["result"]
    assert result["cacheScope"] == "private" and result["ttlMs"] > 0


def test_an_unknown_protocol_version_is_unsupported_with_the_supported_list(post):
    response = post(message("tools/list", version="1900-01-01"))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32022
    assert error["data"]["requested"] == "1900-01-01"
    assert VERSION in error["data"]["supported"]


def test_a_legacy_version_in_meta_is_unsupported_statelessly(post):
    response = post(message("tools/list", version="2025-11-25"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32022


def test_missing_client_capabilities_are_invalid_params(post):
    response = post(message("tools/list", capabilities=False))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32602
    assert "clientCapabilities" in error["message"]


def test_a_modern_header_without_meta_is_invalid_params(post):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    response = post(body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32602


@pytest.mark.parametrize(
    "headers",
    [
        {"Mcp-Method": None},
        {"Mcp-Method": "tools/list"},
        {"MCP-Protocol-Version": None},
        {"MCP-Protocol-Version": "2025-11-25"},
        {"Mcp-Name": None},
        {"Mcp-Name": "get_todo"},
        {"Mcp-Name": "=?base64?not base64!?="},
    ],
)
def test_headers_that_disagree_with_the_body_are_a_header_mismatch(post, headers):
    response = post(message("tools/call", name="list_todos", arguments={}), **headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020
    assert response.json()["id"] == 7


def test_a_base64_encoded_name_header_is_decoded(post):
    response = post(
        message("tools/call", name="list_todos", arguments={}),
        **{"Mcp-Name": "=?base64?bGlzdF90b2Rvcw==?="},
    )
    assert response.status_code == 200
    assert response.json()["result"]["isError"] is False


def test_a_version_header_unlike_the_meta_version_is_a_header_mismatch(post):
    """The header and the body are compared before the version is judged: an
    intermediary may have routed on a header that the body contradicts."""
    response = post(
        message("server/discover", version="v999.0.0"),
        **{"MCP-Protocol-Version": VERSION},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020


def test_initialize_sent_as_2026_07_28_is_404_method_not_found(post):
    """The revision removed the handshake: an initialize that carries the
    revision's _meta is a request for a method it does not have."""
    response = post(message("initialize"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == -32601
    assert "Mcp-Session-Id" not in response.headers


def test_an_unknown_method_is_404_method_not_found(post):
    for method in ("nope/nothing", "ping", "logging/setLevel"):
        response = post(message(method))
        assert response.status_code == 404, method
        assert response.json()["error"]["code"] == -32601


def test_an_unknown_tool_is_invalid_params(post):
    response = post(message("tools/call", name="nope", arguments={}))
    assert response.status_code == 200
    assert response.json()["error"]["code"] == -32602


def test_a_modern_request_ignores_no_session_and_mints_none(post):
    response = post(message("tools/call", name="list_todos", arguments={}))
    assert response.status_code == 200
    assert "Mcp-Session-Id" not in response.headers


def test_the_default_worker_is_stable_per_token_and_client(post):
    first = post(message("tools/call", name="create_todo", arguments={"queue": "q"}))
    todo_id = first.json()["result"]["structuredContent"]["todo"]["id"]
    claim = message("tools/call", name="claim_todo", arguments={"todo_id": todo_id})
    owner = post(claim).json()["result"]["structuredContent"]["todo"]["owner"]
    done = post(
        message("tools/call", name="complete_todo", arguments={"todo_id": todo_id})
    )
    assert owner.startswith("mcp:pytest:")
    assert done.json()["result"]["structuredContent"]["todo"]["state"] == "done"


def test_another_client_program_is_another_worker(post, scope):
    todo, _ = store.create_todo(scope, queue="q", title="t")
    claim = message("tools/call", name="claim_todo", arguments={"todo_id": todo.id})
    assert post(claim).json()["result"]["isError"] is False
    other = message("tools/call", name="complete_todo", arguments={"todo_id": todo.id})
    other["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"] = "other"
    assert post(other).json()["result"]["isError"] is True


def test_reading_a_queue_says_how_long_it_may_be_cached(post, scope):
    store.create_todo(scope, queue="builds", title="one")
    response = post(message("resources/read", uri="switchboard://queues/builds"))
    result = response.json()["result"]
    assert result["contents"][0]["uri"] == "switchboard://queues/builds"
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
    assert result["cacheScope"] == "private"


def test_reading_a_queue_outside_the_grant_is_resource_not_found(client, make_endpoint):
    narrow = make_endpoint("narrow", queues=("mine",))
    body = message("resources/read", uri="switchboard://queues/theirs")
    response = client.post(
        "/mcp",
        data=json.dumps(body),
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {narrow.token}",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": "resources/read",
            "Mcp-Name": "switchboard://queues/theirs",
        },
    )
    error = response.json()["error"]
    assert error["code"] == -32602
    assert error["data"]["uri"] == "switchboard://queues/theirs"


@pytest.mark.parametrize(
    "uri", ["switchboard://queues/", "file:///etc/passwd", "switchboard://queues/none"]
)
def test_reading_no_such_queue_is_resource_not_found(post, uri):
    response = post(message("resources/read", uri=uri))
    assert response.json()["error"]["code"] == -32602


@pytest.mark.parametrize(
    "params",
    [
        {"notifications": []},
        {"notifications": {"resourceSubscriptions": "switchboard://queues/q"}},
        {"notifications": {"resourceSubscriptions": [1]}},
    ],
)
def test_a_bad_listen_filter_is_invalid_params(post, params):
    response = post(message("subscriptions/listen", **params))
    assert response.json()["error"]["code"] == -32602


def test_listen_needs_an_event_stream_accept(post):
    response = post(message("subscriptions/listen"), Accept="application/json")
    assert response.status_code == 406


def test_params_that_are_no_object_are_invalid_params(post):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}
    response = post(body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32602


def test_a_modern_notification_is_accepted(post):
    body = message("notifications/whatever")
    del body["id"]
    assert post(body).status_code == 202


def test_supported_versions_are_newest_first():
    assert stateless.supported_versions()[0] == VERSION


def test_the_server_version_is_read_once_per_process(monkeypatch):
    # Every result names the server's version; reading it from the package
    # metadata on each call cost a third of a tools/call's CPU.
    import importlib.metadata

    from todos.mcp import jsonrpc

    reads = []

    def version(name):
        reads.append(name)
        return "9.9.9"

    jsonrpc.server_version.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", version)
    try:
        versions = [stateless.server_meta()[stateless.META_SERVER] for _ in range(3)]
        assert [named["version"] for named in versions] == ["9.9.9"] * 3
        assert reads == ["switchboard"]
    finally:
        jsonrpc.server_version.cache_clear()
