"""Long-poll claim over a live server: woken by its own endpoint's doorbell only."""

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import pytest

from todos import store
from todos.doorbell import Doorbell, hub

pytestmark = pytest.mark.django_db(transaction=True)


def post(live_server, path, token, body, timeout=30):
    """POST JSON to the live server; return (status, decoded body, seconds taken)."""
    url = urlsplit(live_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body),
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read()), time.monotonic() - started
    finally:
        conn.close()


def claim_in_background(live_server, token, body):
    """Start a waiting claim in a thread; return the thread and its result slot."""
    result = {}

    def run():
        result["status"], result["body"], _ = post(
            live_server, "/api/v1/todos/claim", token, body
        )
        result["returned_at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def waiting_listeners():
    """Count the waiters on this process's doorbell hub (the live server's)."""
    return hub.waiter_count()


def wait_for_listener(minimum=1, seconds=5):
    deadline = time.monotonic() + seconds
    while waiting_listeners() < minimum or not hub.connected:
        assert time.monotonic() < deadline, "the claim never started listening"
        time.sleep(0.02)


def test_a_waiting_claim_returns_within_a_second_of_a_create(live_server, endpoint):
    thread, result = claim_in_background(
        live_server, endpoint.token, {"worker": "w1", "wait_seconds": 10}
    )
    wait_for_listener()
    created_at = time.monotonic()
    todo, _ = store.create_todo(store.Scope.for_endpoint(endpoint), queue="q")
    thread.join(timeout=15)
    assert result["status"] == 200
    assert result["body"]["todo"]["id"] == todo.id
    assert result["body"]["todo"]["owner"] == "w1"
    assert result["returned_at"] - created_at < 1.0


def test_a_create_on_another_endpoint_does_not_wake_the_claim(
    live_server, endpoint, other_endpoint
):
    """SPEC: Cross-endpoint queue collision is isolated."""
    thread, result = claim_in_background(
        live_server, endpoint.token, {"worker": "w1", "queue": "q", "wait_seconds": 2}
    )
    wait_for_listener()
    started = time.monotonic()
    foreign, _ = store.create_todo(store.Scope.for_endpoint(other_endpoint), queue="q")
    thread.join(timeout=15)
    assert result["status"] == 404 and result["body"]["error"] == "not_found"
    # It waited out its own deadline instead of answering the foreign ring.
    assert result["returned_at"] - started > 1.5
    assert store.get_todo(
        store.Scope.for_endpoint(other_endpoint), foreign.id
    ).state == ("pending")


def test_a_waiting_claim_ignores_other_queues_of_its_own_filter(live_server, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    thread, result = claim_in_background(
        live_server, endpoint.token, {"worker": "w1", "queue": "a", "wait_seconds": 5}
    )
    wait_for_listener()
    store.create_todo(scope, queue="b")
    time.sleep(0.3)
    wanted, _ = store.create_todo(scope, queue="a")
    thread.join(timeout=15)
    assert result["status"] == 200 and result["body"]["todo"]["id"] == wanted.id


def test_a_claim_without_wait_answers_404_at_once(live_server, endpoint):
    status, body, seconds = post(
        live_server, "/api/v1/todos/claim", endpoint.token, {"worker": "w1"}
    )
    assert status == 404 and body["error"] == "not_found"
    assert seconds < 1.0


def test_a_waiting_claim_leaves_the_doorbell_hub(live_server, endpoint):
    status, _, seconds = post(
        live_server,
        "/api/v1/todos/claim",
        endpoint.token,
        {"worker": "w1", "wait_seconds": 1},
    )
    assert status == 404 and 0.9 < seconds < 3
    deadline = time.monotonic() + 2
    while waiting_listeners() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting_listeners() == 0


def test_a_lapsed_lease_is_claimed_without_any_ring(live_server, endpoint, time_travel):
    """SPEC: Crashed worker's todo is re-claimable."""
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "crashed", lease_seconds=60)
    time_travel(todo.id, lease_expires_at=-120)
    status, body, _ = post(
        live_server,
        "/api/v1/todos/claim",
        endpoint.token,
        {"worker": "w2", "wait_seconds": 2},
    )
    assert status == 200 and body["todo"]["id"] == todo.id
    assert body["todo"]["attempt"] == 2


def test_the_waiting_claims_doorbell_drops_foreign_rings(endpoint, other_endpoint):
    """SPEC: Doorbell never crosses endpoints."""
    mine, theirs = (store.Scope.for_endpoint(e) for e in (endpoint, other_endpoint))
    with Doorbell(mine) as bell:
        store.create_todo(theirs, queue="q")
        assert bell.wait(timeout=0.5) == []
        todo, _ = store.create_todo(mine, queue="q")
        rings = bell.wait(timeout=2)
    assert rings == [{"id": todo.id, "endpoint_id": str(endpoint.id), "queue": "q"}]
