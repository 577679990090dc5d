"""Long-poll claim over the ASGI serving: woken by its own endpoint's doorbell only."""

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

from tests.support import InProcessServer, claims_held_back
from todos import store
from todos.store import admission
from todos.waiting.doorbell import hub


def post(asgi_server, path, token, body, timeout=30, headers=()):
    """POST JSON to the live server; return (status, decoded body, seconds taken)."""
    url = urlsplit(asgi_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body),
            {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                **dict(headers),
            },
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read()), time.monotonic() - started
    finally:
        conn.close()


def claim_in_background(asgi_server, token, body):
    """Start a waiting claim in a thread; return the thread and its result slot."""
    result = {"deadline": time.monotonic() + body.get("wait_seconds", 0)}

    def run():
        result["status"], result["body"], _ = post(
            asgi_server, "/api/v1/todos/claim", token, body
        )
        result["returned_at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def waiting_listeners():
    """Count the waiters on this process's doorbell hub (the live server's),
    in its loop."""
    return InProcessServer.current.in_loop(
        lambda: sum(len(group) for group in hub.by_endpoint.values())
    )


def wait_for_listener(minimum=1, seconds=5):
    deadline = time.monotonic() + seconds
    while waiting_listeners() < minimum or not hub.connected:
        assert time.monotonic() < deadline, "the claim never started listening"
        time.sleep(0.02)


def test_a_waiting_claim_returns_within_a_second_of_a_create(asgi_server, endpoint):
    thread, result = claim_in_background(
        asgi_server, endpoint.token, {"worker": "w1", "wait_seconds": 10}
    )
    wait_for_listener()
    created_at = time.monotonic()
    todo, _ = store.create_todo(store.Scope.for_endpoint(endpoint), queue="q")
    thread.join(timeout=15)
    assert result["status"] == 200
    assert result["body"]["todo"]["id"] == todo.id
    assert result["body"]["todo"]["owner"] == "w1"
    # Woken by the ring: well before its own deadline.
    assert created_at < result["returned_at"] < result["deadline"]


def test_a_create_on_another_endpoint_does_not_wake_the_claim(
    asgi_server, endpoint, other_endpoint
):
    """SPEC: Cross-endpoint queue collision is isolated."""
    thread, result = claim_in_background(
        asgi_server, endpoint.token, {"worker": "w1", "queue": "q", "wait_seconds": 2}
    )
    wait_for_listener()
    foreign, _ = store.create_todo(store.Scope.for_endpoint(other_endpoint), queue="q")
    thread.join(timeout=15)
    assert result["status"] == 404 and result["body"]["error"] == "not_found"
    # It waited out its own deadline instead of answering the foreign ring.
    assert result["returned_at"] >= result["deadline"]
    assert store.get_todo(
        store.Scope.for_endpoint(other_endpoint), foreign.id
    ).state == ("pending")


def test_a_waiting_claim_ignores_other_queues_of_its_own_filter(asgi_server, endpoint):
    scope = store.Scope.for_endpoint(endpoint)
    thread, result = claim_in_background(
        asgi_server, endpoint.token, {"worker": "w1", "queue": "a", "wait_seconds": 5}
    )
    wait_for_listener()
    store.create_todo(scope, queue="b")
    time.sleep(0.3)
    wanted, _ = store.create_todo(scope, queue="a")
    thread.join(timeout=15)
    assert result["status"] == 200 and result["body"]["todo"]["id"] == wanted.id


def test_a_claim_without_wait_answers_404_at_once(asgi_server, endpoint):
    status, body, seconds = post(
        asgi_server, "/api/v1/todos/claim", endpoint.token, {"worker": "w1"}
    )
    assert status == 404 and body["error"] == "not_found"


def test_a_waiting_claim_leaves_the_doorbell_hub(asgi_server, endpoint):
    status, _, seconds = post(
        asgi_server,
        "/api/v1/todos/claim",
        endpoint.token,
        {"worker": "w1", "wait_seconds": 1},
    )
    assert status == 404 and seconds >= 1
    deadline = time.monotonic() + 2
    while waiting_listeners() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting_listeners() == 0


def test_a_lapsed_lease_is_claimed_without_any_ring(asgi_server, endpoint, time_travel):
    """SPEC: Crashed worker's todo is re-claimable."""
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_next(scope, "crashed", lease_seconds=60)
    time_travel(todo.id, lease_expires_at=-120)
    status, body, _ = post(
        asgi_server,
        "/api/v1/todos/claim",
        endpoint.token,
        {"worker": "w2", "wait_seconds": 2},
    )
    assert status == 200 and body["todo"]["id"] == todo.id
    assert body["todo"]["attempt"] == 2


def test_a_claim_whose_client_left_while_it_ran_is_not_charged(asgi_server, endpoint):
    """CONTRACT §16: the client leaves while its claim statement runs. Nobody
    received the todo: it stays pending with its attempt unspent, so a todo
    with one attempt is not dead-lettered without ever being delivered."""
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q", max_attempts=1)
    body = json.dumps({"worker": "w1", "wait_seconds": 5}).encode()
    head = (
        "POST /api/v1/todos/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {endpoint.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with claims_held_back() as one_waits:
        client = socket.create_connection(("127.0.0.1", asgi_server.port))
        client.sendall(head.encode() + body)
        deadline = time.monotonic() + 5
        while not one_waits():
            assert time.monotonic() < deadline, "the claim never reached its statement"
            time.sleep(0.02)
        client.close()
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while len(events := store.todo_events_any_endpoint(todo.id)) < 3:
        assert time.monotonic() < deadline, "the claim was never handed back"
        time.sleep(0.05)
    after = store.get_todo_any_endpoint(todo.id)
    assert (after.state, after.attempt, after.outcome) == ("pending", 0, "pending")
    assert [(e.from_state, e.to_state) for e in events] == [
        (None, "pending"),
        ("pending", "claimed"),
        ("claimed", "pending"),
    ]


# --- Wakes on a change that lets a waiting claim in -------------------------------

# A change that lets a waiting claim in must wake it at once, not at the
# periodic re-check (off here) nor at the end of its wait.
HELD_WAIT_SECONDS = 10


def held_claim(asgi_server, endpoint, settings):
    """A long poll on queue "q" that waits (the periodic re-check off), once
    listening."""
    settings.SWITCHBOARD_LONG_POLL_RECHECK_SECONDS = 600
    thread, result = claim_in_background(
        asgi_server,
        endpoint.token,
        {"worker": "w1", "queue": "q", "wait_seconds": HELD_WAIT_SECONDS},
    )
    wait_for_listener()
    wait_until_parked()
    assert "status" not in result
    return thread, result


def wait_until_parked(seconds=5):
    """Wait until a claim waiter's try found nothing and it waits for a ring."""
    deadline = time.monotonic() + seconds
    while not InProcessServer.current.in_loop(
        lambda: any(
            waiter.kind == "claim" and waiter._woken is not None
            for group in hub.by_endpoint.values()
            for waiter in group
        )
    ):
        assert time.monotonic() < deadline, "the claim never waited"
        time.sleep(0.02)


def assert_woken_within_a_second(thread, result, todo, changed_at):
    thread.join(timeout=HELD_WAIT_SECONDS + 5)
    assert result["status"] == 200, result
    assert result["body"]["todo"]["id"] == todo.id
    assert result["returned_at"] - changed_at < 1.0


def test_a_waiting_claim_wakes_within_a_second_when_its_queue_is_resumed(
    asgi_server, endpoint, settings
):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="q")
    store.pause_queue(scope, "q")
    thread, result = held_claim(asgi_server, endpoint, settings)
    changed_at = time.monotonic()
    store.resume_queue(scope, "q")
    assert_woken_within_a_second(thread, result, todo, changed_at)


def test_a_waiting_claim_wakes_within_a_second_when_a_groups_limit_is_raised(
    asgi_server, endpoint, settings
):
    scope = store.Scope.for_endpoint(endpoint)
    admission.set_group(scope, "q", "g", concurrency=0)
    todo, _ = store.create_todo(scope, queue="q", group="g")
    thread, result = held_claim(asgi_server, endpoint, settings)
    changed_at = time.monotonic()
    admission.set_group(scope, "q", "g", concurrency=1)
    assert_woken_within_a_second(thread, result, todo, changed_at)


def test_a_waiting_claim_wakes_within_a_second_when_its_group_is_resumed(
    asgi_server, endpoint, settings
):
    scope = store.Scope.for_endpoint(endpoint)
    admission.set_group(scope, "q", "g", paused=True)
    todo, _ = store.create_todo(scope, queue="q", group="g")
    thread, result = held_claim(asgi_server, endpoint, settings)
    changed_at = time.monotonic()
    admission.set_group(scope, "q", "g", paused=False)
    assert_woken_within_a_second(thread, result, todo, changed_at)


def test_a_waiting_claim_wakes_within_a_second_when_its_queues_group_limit_is_raised(
    asgi_server, endpoint, settings
):
    scope = store.Scope.for_endpoint(endpoint)
    admission.set_admission(scope, "q", group_concurrency=0)
    todo, _ = store.create_todo(scope, queue="q", group="g")
    thread, result = held_claim(asgi_server, endpoint, settings)
    changed_at = time.monotonic()
    admission.set_admission(scope, "q", group_concurrency=1)
    assert_woken_within_a_second(thread, result, todo, changed_at)
