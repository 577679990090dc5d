"""A waiting ReceiveMessage costs what the JSON API's waiting claim costs: it
parks no server thread and holds no database connection (CONTRACT §12), and a
message created meanwhile wakes it through the doorbell hub.
"""

import threading
import time

import pytest

from tests.sqs.conftest import client_for
from tests.system.test_waiters import (
    server_connections,
    settle,
    start_server,
    stop_server,
    worker_threads,
)
from todos import store
from todos.sqs import credentials

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        started = start_server()
    yield started
    stop_server(started)


def sqs_client(server, endpoint):
    issued = credentials.issue(endpoint)
    return client_for(
        f"http://127.0.0.1:{server.port}",
        issued.access_key_id,
        issued.secret_access_key,
        max_pool_connections=64,
        read_timeout=30,
    )


class Receive(threading.Thread):
    def __init__(self, client, url, seconds):
        super().__init__(daemon=True)
        self.client, self.url, self.seconds = client, url, seconds
        self.answer = None
        self.deadline = time.monotonic() + seconds
        self.start()

    def run(self):
        self.answer = self.client.receive_message(
            QueueUrl=self.url, WaitTimeSeconds=self.seconds
        )


def test_waiting_receives_park_no_thread_and_hold_no_connection(server, make_endpoint):
    endpoint = make_endpoint("sqs-waiters")
    client = sqs_client(server, endpoint)
    url = client.create_queue(QueueName="idle")["QueueUrl"]
    for warm in [Receive(client, url, 1) for _ in range(4)]:
        warm.join(timeout=15)
    before = worker_threads(server)
    waiting = [Receive(client, url, 5) for _ in range(40)]
    settle(1.5)
    assert all(receive.answer is None for receive in waiting)
    assert worker_threads(server) <= before + 2
    total, busy = server_connections()
    assert busy == 0 and total <= 6
    for receive in waiting:
        receive.join(timeout=20)
    assert all("Messages" not in receive.answer for receive in waiting)


def test_a_waiting_receive_wakes_on_a_create(server, make_endpoint):
    endpoint = make_endpoint("sqs-wake")
    client = sqs_client(server, endpoint)
    url = client.create_queue(QueueName="wake")["QueueUrl"]
    receive = Receive(client, url, 10)
    settle()
    todo, _ = store.create_todo(
        store.Scope.for_endpoint(endpoint), queue="wake", title="t"
    )
    receive.join(timeout=15)
    assert receive.answer["Messages"][0]["MessageId"] == todo.id
    assert time.monotonic() < receive.deadline  # woken, not timed out


def test_a_waiting_receive_wakes_when_its_queue_is_resumed(server, make_endpoint):
    """A resumed queue rings: the waiting receive gets its message at once, not
    at its WaitTimeSeconds (the periodic re-check is off)."""
    endpoint = make_endpoint("sqs-resume")
    scope = store.Scope.for_endpoint(endpoint)
    client = sqs_client(server, endpoint)
    url = client.create_queue(QueueName="held")["QueueUrl"]
    todo, _ = store.create_todo(scope, queue="held", title="t")
    store.pause_queue(scope, "held")
    receive = Receive(client, url, 10)
    settle()
    assert receive.answer is None
    resumed = time.monotonic()
    store.resume_queue(scope, "held")
    receive.join(timeout=15)
    assert receive.answer["Messages"][0]["MessageId"] == todo.id
    assert time.monotonic() - resumed < 2


def test_a_waiting_receive_gets_a_message_whose_visibility_lapses_meanwhile(
    server, make_endpoint
):
    """moto's test_receive_message_that_becomes_visible_while_long_polling: the
    message turns visible 1 s into a 2 s wait and is received then, not at the
    periodic re-check (off here)."""
    endpoint = make_endpoint("sqs-lapse")
    client = sqs_client(server, endpoint)
    url = client.create_queue(QueueName="lapse")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="x")
    first = client.receive_message(QueueUrl=url)["Messages"][0]
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=1
    )
    started = time.monotonic()
    again = client.receive_message(QueueUrl=url, WaitTimeSeconds=2)
    assert time.monotonic() - started < 2
    assert [m["MessageId"] for m in again["Messages"]] == [first["MessageId"]]
