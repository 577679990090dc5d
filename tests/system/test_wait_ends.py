"""A waiting claim ends without claiming when its caller may no longer claim,
on every surface (CONTRACT §12), against the real serving (gunicorn, uvicorn
workers): the JSON API's long poll, SQS ReceiveMessage, and MCP ``claim_next``
(one todo, and ``max_todos``).

Each case: a claim waits; its endpoint is revoked, re-keyed or narrowed, or
its client goes away, or the endpoint is revoked while the server's LISTEN
connection is down; then a todo it would have claimed arrives. The todo must
stay pending, and the wait must answer before its own deadline (a narrowed
grant waits on, for work of the new grant).
"""

import contextlib
import json
import socket
import threading
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from django.db import connection, transaction

from tests.support import claims_held_back
from tests.system.test_waiters import (
    APP_NAME,
    mcp_session,
    narrow,
    revoke,
    rotate,
    settle,
    start_server,
    stop_server,
    wait_until,
)
from todos import store
from todos.models import Endpoint
from todos.sqs import credentials

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 6
QUEUE = "jobs"


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        started = start_server()
    yield started
    stop_server(started)


class Call(threading.Thread):
    """One HTTP request on a socket of its own, answered in the background."""

    def __init__(self, port, method, path, headers, body):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        headers = {"Host": f"127.0.0.1:{port}", **headers}
        head = [f"{method} {path} HTTP/1.1"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.deadline = time.monotonic() + WAIT
        self.status = self.body = self.answered_at = None
        self.start()

    def run(self):
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in lines
                if line.lower().startswith("content-length:")
            )
            while len(data) < length:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.status = int(lines[0].split()[1])
            self.body = json.loads(data)
            self.answered_at = time.monotonic()

    def leave(self):
        """The client goes away without waiting for the answer."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def answered_in_time(self):
        self.join(timeout=WAIT + 10)
        return self.answered_at is not None and self.answered_at < self.deadline


# --- The surfaces -----------------------------------------------------------------


class Api:
    name = "api"

    def __init__(self, server, endpoint):
        self.server, self.endpoint = server, endpoint

    def wait(self, queue=None):
        body = {"worker": "w", "wait_seconds": WAIT}
        if queue:
            body["queue"] = queue
        return Call(
            self.server.port,
            "POST",
            "/api/v1/todos/claim",
            {
                "Authorization": f"Bearer {self.endpoint.token}",
                "Content-Type": "application/json",
            },
            json.dumps(body).encode(),
        )

    def refused(self, call):
        return call.status == 401 and call.body["error"] == "unauthorized"


class ApiBatch(Api):
    name = "api-batch"

    def wait(self, queue=None):
        body = {"worker": "w", "wait_seconds": WAIT, "max_todos": 3}
        if queue:
            body["queue"] = queue
        return Call(
            self.server.port,
            "POST",
            "/api/v1/todos/claim",
            {
                "Authorization": f"Bearer {self.endpoint.token}",
                "Content-Type": "application/json",
            },
            json.dumps(body).encode(),
        )


class Mcp:
    name = "mcp"
    arguments = {}

    def __init__(self, server, endpoint):
        self.server, self.endpoint = server, endpoint
        self.session_id = mcp_session(server, endpoint)

    def wait(self, queue=None):
        arguments = {"wait_seconds": WAIT, **self.arguments}
        if queue:
            arguments["queue"] = queue
        message = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "claim_next", "arguments": arguments},
        }
        return Call(
            self.server.port,
            "POST",
            "/mcp",
            {
                "Authorization": f"Bearer {self.endpoint.token}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "Mcp-Session-Id": self.session_id,
            },
            json.dumps(message).encode(),
        )

    def refused(self, call):
        return call.status == 401 and call.body["error"]["data"]["error"] == (
            "unauthorized"
        )


class McpBatch(Mcp):
    name = "mcp-batch"
    arguments = {"max_todos": 3}


class Sqs:
    name = "sqs"

    def __init__(self, server, endpoint):
        self.server, self.endpoint = server, endpoint
        self.issued = credentials.issue(endpoint)

    def wait(self, queue=None):
        url = f"http://127.0.0.1:{self.server.port}/"
        body = json.dumps(
            {
                "QueueUrl": f"{url}{self.issued.account_id}/{queue or QUEUE}",
                "WaitTimeSeconds": WAIT,
                "MaxNumberOfMessages": 3,
            }
        ).encode()
        signed = AWSRequest(
            method="POST",
            url=url,
            data=body,
            headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "AmazonSQS.ReceiveMessage",
            },
        )
        SigV4Auth(
            Credentials(self.issued.access_key_id, self.issued.secret_access_key),
            "sqs",
            "us-east-1",
        ).add_auth(signed)
        return Call(self.server.port, "POST", "/", dict(signed.headers), body)

    def refused(self, call):
        return call.status == 403 and "InvalidClientTokenId" in call.body["__type"]


SURFACES = {s.name: s for s in (Api, ApiBatch, Mcp, McpBatch, Sqs)}


@pytest.fixture(params=SURFACES)
def surface(request, server, make_endpoint):
    endpoint = make_endpoint(f"waits-{request.param}")
    made = SURFACES[request.param](server, endpoint)
    if request.param == "sqs":
        # The queue exists (a ReceiveMessage of an unknown queue fails at once).
        store.create_todo(store.Scope.for_endpoint(endpoint), queue=QUEUE)
        store.claim_next(store.Scope.for_endpoint(endpoint), "setup")
    return made


def arrives(surface):
    """A todo the waiting claim would take, created past the grant check."""
    todo, _ = store.create_todo_any_endpoint(str(surface.endpoint.id), queue=QUEUE)
    return todo


def still_pending(todo, seconds=1.0):
    """The todo is pending now and ``seconds`` later (nobody claimed it)."""
    deadline = time.monotonic() + seconds
    while store.get_todo_any_endpoint(todo.id).state == "pending":
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def sqs_rotate(surface):
    credentials.issue(Endpoint.objects.get(pk=surface.endpoint.pk))


# --- The cases ----------------------------------------------------------------------


def test_revoke_ends_a_waiting_claim(surface):
    call = surface.wait(QUEUE)
    settle()
    revoke(surface.endpoint)
    todo = arrives(surface)
    assert call.answered_in_time()
    assert surface.refused(call), (call.status, call.body)
    assert still_pending(todo)


def test_rekey_ends_a_waiting_claim(surface):
    """A rotated bearer token, or for SQS a rotated access key."""
    call = surface.wait(QUEUE)
    settle()
    if surface.name == "sqs":
        sqs_rotate(surface)
    else:
        rotate(surface.endpoint)
    todo = arrives(surface)
    assert call.answered_in_time()
    assert surface.refused(call), (call.status, call.body)
    assert still_pending(todo)


def test_a_narrowed_grant_claims_nothing_from_the_removed_queue(surface):
    # SQS names its queue, so it waits on one; the others wait on the grant.
    call = surface.wait(QUEUE if surface.name == "sqs" else None)
    settle()
    narrow(surface.endpoint)
    todo = arrives(surface)
    call.join(timeout=WAIT + 10)
    assert call.status is not None
    assert still_pending(todo, 0)


def test_a_client_that_went_away_claims_nothing(surface):
    call = surface.wait(QUEUE)
    settle()
    call.leave()
    settle(0.3)
    todo = arrives(surface)
    assert still_pending(todo, 1.5)


def test_a_revoke_while_the_listen_connection_reconnects_ends_the_wait(surface):
    """The revocation's control notice is sent while nobody listens: the
    reconnect must re-validate every waiter before it claims."""
    call = surface.wait(QUEUE)
    settle()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            [APP_NAME],
        )
        assert cursor.rowcount == 1
        revoke(surface.endpoint)
        todo = arrives(surface)
    assert call.answered_in_time()
    assert surface.refused(call), (call.status, call.body)
    assert still_pending(todo)


def handed_back(todo, seconds=5.0):
    """The todo once it was claimed and no claim holds it any more, and its
    last history row."""
    deadline = time.monotonic() + seconds
    while True:
        events = store.todo_events_any_endpoint(todo.id)
        claimed = any(event.to_state == "claimed" for event in events)
        if claimed and events[-1].to_state != "claimed":
            return store.get_todo_any_endpoint(todo.id), events[-1]
        assert time.monotonic() < deadline, "the claim was never handed back"
        time.sleep(0.05)


def test_a_claim_whose_client_left_while_it_ran_leaves_the_todo_as_it_was(surface):
    """CONTRACT §16: the client sends its claim and leaves while the claim
    statement runs. Nobody received the todo, so it is pending with its
    attempt unchanged, not dead-lettered at its cap; its history says why.
    SQS keeps its own rule: a lost ReceiveMessage counts a receive."""
    sqs = surface.name == "sqs"
    todo, _ = store.create_todo_any_endpoint(
        str(surface.endpoint.id), queue=QUEUE, max_attempts=5 if sqs else 1
    )
    with claims_held_back(APP_NAME) as one_waits:
        call = surface.wait(QUEUE)
        wait_until(one_waits, message="the claim never reached its statement")
        call.leave()
        settle(0.5)
    after, last = handed_back(todo)
    if sqs:
        assert (after.state, after.attempt, last.error) == ("pending", 1, "")
    else:
        assert (after.state, after.attempt, after.outcome) == ("pending", 0, "pending")
        assert (last.from_state, last.to_state, last.attempt) == (
            "claimed",
            "pending",
            0,
        )
        assert "client left" in last.error
