"""Waiting for a result (CONTRACT §14) over a live server: GET
/api/v1/todos/<id>?wait_seconds, the events of /api/v1/events, and a waiting
claim woken by an answer."""

import http.client
import json
import threading
import time
from urllib.parse import urlencode, urlsplit

import pytest

from tests.api import test_events
from tests.api.test_longpoll import claim_in_background, wait_for_listener
from todos import store

open_stream = test_events.open_stream


def get(asgi_server, path, token, **params):
    url = urlsplit(asgi_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request(
            "GET",
            f"{path}?{urlencode(params)}",
            headers={"Authorization": f"Bearer {token}"},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def wait_in_background(asgi_server, endpoint, todo_id, seconds=10):
    result = {}

    def run():
        result["status"], result["body"] = get(
            asgi_server,
            f"/api/v1/todos/{todo_id}",
            endpoint.token,
            wait_seconds=seconds,
        )
        result["returned_at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for_listener()
    return thread, result


@pytest.mark.parametrize("ending", ["complete", "ask", "cancel", "dead_letter"])
def test_a_waiting_get_returns_within_a_second_of_the_todo_settling(
    asgi_server, endpoint, ending
):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q", max_attempts=1)
    if ending != "cancel":
        store.claim_todo(scope, todo.id, "w1")
    thread, result = wait_in_background(asgi_server, endpoint, todo.id)
    # A heartbeat is no result: the wait goes on.
    if ending != "cancel":
        store.heartbeat(scope, todo.id, "w1", progress={"message": "busy"})
    time.sleep(0.3)
    assert thread.is_alive()
    settled_at = time.monotonic()
    if ending == "complete":
        store.complete_todo(scope, todo.id, "w1", result={"ok": True})
    elif ending == "ask":
        store.ask(scope, todo.id, "w1", question="go?")
    elif ending == "cancel":
        store.cancel_todo(scope, todo.id)
    else:
        store.fail_todo(scope, todo.id, "w1", error="boom")
    thread.join(timeout=15)
    assert result["status"] == 200
    expected = {"complete": "done", "ask": "held", "cancel": "canceled"}
    assert result["body"]["todo"]["outcome"] == expected.get(ending, "dead_letter")
    assert result["returned_at"] - settled_at < 1.0


def test_a_waiting_get_answers_with_the_todo_as_it_is_after_the_wait(
    asgi_server, endpoint
):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    started = time.monotonic()
    status, body = get(
        asgi_server, f"/api/v1/todos/{todo.id}", endpoint.token, wait_seconds=1
    )
    assert status == 200 and body["todo"]["outcome"] == "pending"
    assert 0.9 <= time.monotonic() - started < 3


def test_a_get_of_a_settled_todo_answers_at_once(asgi_server, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    store.cancel_todo(scope, todo.id)
    started = time.monotonic()
    status, body = get(
        asgi_server, f"/api/v1/todos/{todo.id}", endpoint.token, wait_seconds=10
    )
    assert status == 200 and body["todo"]["outcome"] == "canceled"
    assert time.monotonic() - started < 1


def test_wait_seconds_over_20_is_400(asgi_server, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    status, body = get(
        asgi_server, f"/api/v1/todos/{todo.id}", endpoint.token, wait_seconds=21
    )
    assert status == 400 and "wait_seconds" in body["detail"]


def test_a_waiting_get_ends_401_when_its_endpoint_is_revoked(asgi_server, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    thread, result = wait_in_background(asgi_server, endpoint, todo.id)
    revoked_at = time.monotonic()
    from todos.access import endpoints

    endpoints.revoke(endpoint)
    thread.join(timeout=15)
    assert result["status"] == 401
    assert result["returned_at"] - revoked_at < 2


def test_a_waiting_claim_gets_the_answered_todo_within_a_second(asgi_server, endpoint):
    """Issue: the agent's waiting claim gets the todo with the answer at once."""
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w1")
    store.ask(scope, todo.id, "w1", question="Approve?", checkpoint={"at": 1})
    thread, result = claim_in_background(
        asgi_server, endpoint.token, {"worker": "w1", "wait_seconds": 10}
    )
    wait_for_listener()
    answered_at = time.monotonic()
    store.answer_todo(scope, todo.id, "yes", worker="lead")
    thread.join(timeout=15)
    assert result["status"] == 200
    claimed = result["body"]["todo"]
    assert claimed["id"] == todo.id and claimed["answer"]["value"] == "yes"
    assert claimed["checkpoint"] == {"at": 1}
    assert result["returned_at"] - answered_at < 1.0


def test_the_event_stream_carries_each_result_event(open_stream, endpoint):
    stream = open_stream(endpoint)
    scope = store.Scope.for_endpoint(endpoint)
    asked, _ = store.create_todo(scope, queue="q")
    done, _ = store.create_todo(scope, queue="q")
    busy, _ = store.create_todo(scope, queue="q")
    dead, _ = store.create_todo(scope, queue="q", max_attempts=1)
    canceled, _ = store.create_todo(scope, queue="q")
    for todo in (asked, done, busy, dead):
        store.claim_todo(scope, todo.id, "w1")
    store.ask(scope, asked.id, "w1", question="?")
    store.complete_todo(scope, done.id, "w1")
    store.cancel_todo(scope, busy.id)
    store.fail_todo(scope, dead.id, "w1", error="boom")
    store.cancel_todo(scope, canceled.id)
    events = stream.events_within(1.5)
    seen = {(e["event"], e["data"]["id"]) for e in events}
    assert {
        ("todo.asked", asked.id),
        ("todo.done", done.id),
        ("todo.cancel_requested", busy.id),
        ("todo.failed", dead.id),
        ("todo.canceled", canceled.id),
    } <= seen
    for event in events:
        assert set(event["data"]) == {"id", "endpoint_id", "queue"}


def test_the_event_stream_never_carries_another_endpoints_events(
    open_stream, endpoint, other_endpoint
):
    stream = open_stream(endpoint)
    other = store.Scope.for_endpoint(other_endpoint)
    todo, _ = store.create_todo(other, queue="q")
    store.cancel_todo(other, todo.id)
    assert stream.events_within(0.8) == []
