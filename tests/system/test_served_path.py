"""The agent surfaces as served: an ``async def`` view is served in the event
loop and awaits its statements on the async pool (todos/db/pool.py), so a
claim and its acknowledgement, a woken long poll, an SQS receive and delete,
make no thread hop; with the same answers, the same revocation, 503 when a
connection is lost, and transactions that commit or roll back as one."""

import asyncio
import threading

import psycopg
import pytest
from django.db import connection

from tests.api.test_longpoll import post, wait_for_listener
from tests.sqs.conftest import client_for
from todos import store
from todos.access import endpoints
from todos.db import pool
from todos.db.params import async_params, utc_timestamps
from todos.sqs import credentials
from todos.web import threads

pytestmark = pytest.mark.django_db(transaction=True)


def call(asgi_server, path, token, body):
    """POST JSON to the in-process server: (status, decoded body)."""
    status, answer, _ = post(asgi_server, path, token, body, timeout=10)
    return status, answer


def claim_one(asgi_server, token, worker="w1"):
    status, body = call(
        asgi_server, "/api/v1/todos/claim", token, {"worker": worker, "queue": "q"}
    )
    assert status == 200, body
    return body["todo"]


@pytest.fixture
def hops(monkeypatch):
    """Count the calls handed to todos.web.threads (the server's included)."""
    counted = []
    original = threads.run_in_thread

    async def counting(fn, *args):
        counted.append(getattr(fn, "__name__", repr(fn)))
        return await original(fn, *args)

    monkeypatch.setattr(threads, "run_in_thread", counting)
    return counted


def pool_backends():
    """The backend pids of the async pool's idle connections."""
    opened = pool.current()
    assert opened is not None, "the async pool never opened"
    return [conn.info.backend_pid for conn in list(opened._pool)]


def claim_and_complete(asgi_server, token, worker="w1"):
    todo = claim_one(asgi_server, token, worker)
    return call(
        asgi_server,
        f"/api/v1/todos/{todo['id']}/complete",
        token,
        {"worker": worker, "lease_token": todo["lease_token"], "result": {"ok": 1}},
    )


def test_a_served_claim_and_complete_make_no_thread_hop(
    asgi_server, endpoint, scope, hops
):
    for n in range(3):
        store.create_todo(scope, title=f"t{n}", queue="q")
    # The first call reads the token from the loop too; it is cached after.
    status, body = claim_and_complete(asgi_server, endpoint.token)
    assert status == 200 and body["todo"]["state"] == "done"
    assert hops == []
    status, body = claim_and_complete(asgi_server, endpoint.token)
    assert status == 200 and body["todo"]["state"] == "done"
    assert body["todo"]["result"] == {"ok": 1}
    assert hops == []
    assert pool_backends(), "the statements ran on the async pool"


def test_a_woken_long_poll_makes_no_thread_hop(asgi_server, endpoint, scope, hops):
    answers = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            call(
                asgi_server,
                "/api/v1/todos/claim",
                endpoint.token,
                {"worker": "w1", "queue": "q", "wait_seconds": 5},
            )
        )
    )
    waiting.start()
    # The poll waits (its first try found nothing); a create rings it.
    wait_for_listener()
    store.create_todo(scope, title="late", queue="q")
    waiting.join(10)
    ((status, body),) = answers
    assert status == 200 and body["todo"]["title"] == "late"
    assert hops == []


def test_a_batch_of_acknowledgements_is_served_in_the_loop_and_a_cancel_is_not(
    asgi_server, endpoint, scope, hops
):
    for n in range(3):
        store.create_todo(scope, title=f"t{n}", queue="q")
    claim_and_complete(asgi_server, endpoint.token)
    status, body = call(
        asgi_server,
        "/api/v1/todos/claim",
        endpoint.token,
        {"worker": "w1", "queue": "q", "max_todos": 2},
    )
    assert status == 200 and len(body["todos"]) == 2
    first, second = body["todos"]
    hops.clear()
    status, body = call(
        asgi_server,
        "/api/v1/todos/batch",
        endpoint.token,
        {
            "worker": "w1",
            "actions": [
                {
                    "op": "complete",
                    "id": first["id"],
                    "lease_token": first["lease_token"],
                },
                {"op": "fail", "id": second["id"], "lease_token": "not-the-token"},
            ],
        },
    )
    assert status == 200
    assert [item["status"] for item in body["results"]] == [200, 409]
    assert hops == []
    status, body = call(
        asgi_server,
        "/api/v1/todos/batch",
        endpoint.token,
        {"worker": "w1", "actions": [{"op": "cancel", "id": second["id"]}]},
    )
    assert status == 200 and body["results"][0]["status"] in {200, 202}
    assert hops == ["closing"]


def test_a_token_revoked_between_two_completes_is_refused_in_the_loop(
    asgi_server, endpoint, scope
):
    for n in range(2):
        store.create_todo(scope, title=f"t{n}", queue="q")
    status, _ = claim_and_complete(asgi_server, endpoint.token)
    assert status == 200
    todo = claim_one(asgi_server, endpoint.token)
    endpoints.revoke(endpoint)
    status, body = call(
        asgi_server,
        f"/api/v1/todos/{todo['id']}/complete",
        endpoint.token,
        {"worker": "w1", "lease_token": todo["lease_token"]},
    )
    assert (status, body["error"]) == (401, "unauthorized")
    assert store.get_todo(scope, todo["id"]).state == "claimed"


def test_a_lost_pool_connection_answers_503_and_the_next_call_works(
    asgi_server, endpoint, scope
):
    for n in range(3):
        store.create_todo(scope, title=f"t{n}", queue="q")
    assert claim_and_complete(asgi_server, endpoint.token)[0] == 200
    todo = claim_one(asgi_server, endpoint.token)
    killed = pool_backends()
    with connection.cursor() as cursor:
        for pid in killed:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    acknowledgement = {"worker": "w1", "lease_token": todo["lease_token"]}
    path = f"/api/v1/todos/{todo['id']}/complete"
    status, body = call(asgi_server, path, endpoint.token, acknowledgement)
    assert (status, body["error"]) == (503, "unavailable")
    assert store.get_todo(scope, todo["id"]).state == "claimed"
    # Each lost connection fails at most one call; the pool replaces it.
    for _ in killed:
        status, body = call(asgi_server, path, endpoint.token, acknowledgement)
        if status == 200:
            break
        assert (status, body["error"]) == (503, "unavailable")
    assert status == 200 and body["todo"]["state"] == "done"


def test_pool_connections_are_made_as_djangos(db):
    params = async_params()
    ours = connection.get_connection_params()
    assert params["autocommit"] is True
    assert params["cursor_factory"] is psycopg.AsyncCursor
    assert params["options"] == ours["options"]  # the statement timeout
    assert params["prepare_threshold"] == ours["prepare_threshold"]
    # Django's loaders, but psycopg's own for timestamptz (Django's zone is UTC)
    assert params["context"] is utc_timestamps(ours["context"])


def test_an_sqs_receive_and_delete_batch_make_no_thread_hop(
    asgi_server, endpoint, scope, hops
):
    issued = credentials.issue(endpoint)
    client = client_for(asgi_server.url, issued.access_key_id, issued.secret_access_key)
    for n in range(3):
        store.create_todo(scope, title=f"t{n}", queue="q", payload={"n": n})
    url = client.get_queue_url(QueueName="q")["QueueUrl"]
    hops.clear()
    received = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    handles = [message["ReceiptHandle"] for message in received["Messages"]]
    assert len(handles) == 3
    deleted = client.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(handles)],
    )
    assert len(deleted["Successful"]) == 3 and not deleted.get("Failed")
    assert hops == []
    states = {store.get_todo(scope, m["MessageId"]).state for m in received["Messages"]}
    assert states == {"done"}
    client.send_message(QueueUrl=url, MessageBody="b")
    assert hops == []
    # A sync action (queue administration) runs in a pooled thread.
    client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert hops == ["closing"]


MCP = "2026-07-28"


def mcp_call(asgi_server, token, tool, arguments, body=None):
    """A 2026-07-28 tools/call as a client sends it (or ``body`` under its
    headers): (status, answer)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MCP,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = body or {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MCP,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    status, answer, _ = post(asgi_server, "/mcp", token, body, 10, headers.items())
    return status, answer


def test_an_mcp_claim_next_and_complete_todo_make_no_thread_hop(
    asgi_server, endpoint, scope, hops
):
    store.create_todo(scope, title="t", queue="q")
    status, answer = mcp_call(
        asgi_server, endpoint.token, "claim_next", {"worker": "w1", "queue": "q"}
    )
    assert status == 200, answer
    todo = answer["result"]["structuredContent"]["todo"]
    status, answer = mcp_call(
        asgi_server,
        endpoint.token,
        "complete_todo",
        {"worker": "w1", "todo_id": todo["id"], "lease_token": todo["lease_token"]},
    )
    assert status == 200, answer
    assert answer["result"]["structuredContent"]["todo"]["state"] == "done"
    assert hops == []


def test_an_mcp_body_that_is_not_the_tool_its_header_names_is_served_in_a_thread(
    asgi_server, endpoint, hops
):
    # An initialize makes a session (the ORM): the header alone does not
    # send it to the loop, and it is answered as it always is.
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
    }
    status, answer = mcp_call(
        asgi_server, endpoint.token, "complete_todo", {}, initialize
    )
    assert status == 200, answer
    assert answer["result"]["protocolVersion"]
    assert hops == ["closing"]


def in_a_loop(coroutine_function):
    """Await ``coroutine_function()`` in a loop of its own, then close the pool."""

    async def main():
        try:
            return await coroutine_function()
        finally:
            await pool.close()

    return asyncio.run(main())


def test_a_pool_transaction_commits_or_rolls_back_as_one(endpoint, scope):
    store.create_todo(scope, title="t", queue="q")
    claimed = store.claim_next(scope, "w1", queue="q")

    async def complete(fail):
        async with pool.transaction() as tx:
            steps = store.acknowledge_many_steps(
                scope, [store.Ack("complete", claimed.id, "w1")]
            )
            (done,) = await store.arun_steps(steps, tx)
            assert done.state == "done"
            if fail:
                raise RuntimeError("after the statement, before the commit")

    with pytest.raises(RuntimeError, match="before the commit"):
        in_a_loop(lambda: complete(True))
    assert store.get_todo(scope, claimed.id).state == "claimed"
    in_a_loop(lambda: complete(False))
    assert store.get_todo(scope, claimed.id).state == "done"


def test_closing_forgets_a_pool_whose_loop_has_ended(db):
    """Defect: a pool opened in a loop that has since ended (its workers
    cancelled with it) made the server's close raise CancelledError."""

    async def open_one():
        opened = await pool.open_pool()
        await opened.wait()  # as a served request leaves it: open, and used
        return opened

    opened = asyncio.run(open_one())
    assert opened is not None and pool.current() is opened

    asyncio.run(pool.close())

    assert pool.current() is None


def test_a_request_is_served_in_the_loop_exactly_when_its_view_is_async():
    from board.serving.asgi import in_loop

    todo = "/api/v1/todos/00000000-0000-4000-8000-000000000000"
    for path in ("/api/v1/todos/claim", "/api/v1/todos/batch", "/api/v1/events"):
        assert in_loop(path), path
    for path in (todo, f"{todo}/complete", f"{todo}/heartbeat", "/mcp", "/"):
        assert in_loop(path), path
    for path in ("/api/v1/todos", f"{todo}/claim", f"{todo}/cancel", "/healthz"):
        assert not in_loop(path), path
    assert not in_loop("/board/")
    assert not in_loop("/no/such/path")
