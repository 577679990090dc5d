"""Served claims and acknowledgements run their statements from the event loop
(todos/inloop.py): no thread hop, on the in-loop pool's own connections, with
the same answers, the same revocation, and 503 when a connection is lost."""

import psycopg
import pytest
from django.db import connection

from tests.api.test_longpoll import post
from todos import aio, endpoints, inloop, store

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
    """Count the calls handed to todos.aio's threads (the server's included)."""
    counted = []
    original = aio.run_in_thread

    async def counting(fn, *args):
        counted.append(getattr(fn, "__name__", repr(fn)))
        return await original(fn, *args)

    monkeypatch.setattr(aio, "run_in_thread", counting)
    return counted


def pool_backends():
    """The backend pids of the in-loop pool's idle connections."""
    pool = inloop._pool
    assert pool is not None, "the in-loop pool never opened"
    return [conn.info.backend_pid for conn in list(pool._pool)]


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
    # The first call reads the token (a pooled call); it is cached after.
    status, body = claim_and_complete(asgi_server, endpoint.token)
    assert status == 200 and body["todo"]["state"] == "done"
    hops.clear()
    status, body = claim_and_complete(asgi_server, endpoint.token)
    assert status == 200 and body["todo"]["state"] == "done"
    assert body["todo"]["result"] == {"ok": 1}
    assert hops == []
    assert pool_backends(), "the statements ran on the in-loop pool"


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


def test_a_lost_in_loop_connection_answers_503_and_the_next_call_works(
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


def test_in_loop_connections_are_made_as_djangos(db):
    params = inloop.connection_params()
    ours = connection.get_connection_params()
    assert params["autocommit"] is True
    assert params["cursor_factory"] is psycopg.AsyncCursor
    assert params["options"] == ours["options"]  # the statement timeout
    assert params["prepare_threshold"] == ours["prepare_threshold"]
    assert params["context"] is ours["context"]  # the same loaders
