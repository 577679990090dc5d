"""Celery on kombu's SQS transport: a real worker consumes what a producer sends.

The worker (``celery -A tests.sqs.celery_app worker``) receives through
kombu's asynchronous SQS client (pycurl), acknowledges with DeleteMessage; a
task that raises is left in its queue, which has a RedrivePolicy, and delivered
again (kombu deletes a rejected message from a queue without one, on SQS as
here); the Board shows the messages as todos, their bodies readable.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model

from tests.sqs import celery_app
from tests.support import ROOT, stop
from todos import store

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def broker_url(sqs_url, issued):
    host = sqs_url.removeprefix("http://")
    return f"sqs://{issued.access_key_id}:{issued.secret_access_key}@{host}"


def wait_for(path, predicate, seconds=40):
    deadline = time.monotonic() + seconds
    lines = []
    while time.monotonic() < deadline:
        if path.exists():
            lines = [json.loads(line) for line in path.read_text().splitlines()]
            if predicate(lines):
                return lines
        time.sleep(0.2)
    raise AssertionError(f"the worker did not get there: {lines}")


@pytest.fixture
def celery_setup(make_sqs, sqs_url, tmp_path):
    endpoint, issued, client = make_sqs()
    client.create_queue(
        QueueName=celery_app.QUEUE,
        Attributes={
            "VisibilityTimeout": "30",
            "RedrivePolicy": json.dumps({"maxReceiveCount": 5}),
        },
    )
    results = tmp_path / "results.jsonl"
    url = broker_url(sqs_url, issued)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.sqs.celery_app",
            "worker",
            "--pool",
            "solo",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env={**os.environ, "SQS_BROKER_URL": url, "CELERY_RESULTS_FILE": str(results)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    producer = celery_app.make_app(url)
    try:
        yield endpoint, producer, results, worker
    finally:
        stop(worker)
        producer.close()


def test_a_celery_worker_consumes_tasks_sent_through_switchboard(celery_setup, client):
    endpoint, producer, results, worker = celery_setup
    for value in range(3):
        producer.send_task("switchboard.record", args=[value])
    lines = wait_for(results, lambda lines: len(lines) >= 3)
    assert sorted(line["value"] for line in lines) == [0, 1, 2]

    scope = store.Scope.for_endpoint(endpoint)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        todos = store.list_todos(scope, queue=celery_app.QUEUE).todos
        if len(todos) == 3 and all(todo.state == "done" for todo in todos):
            break
        time.sleep(0.2)
    assert [todo.state for todo in todos] == ["done"] * 3, worker.poll()

    # The Board shows them: listed in their queue, each body readable.
    operator = get_user_model().objects.create_user("ops", is_staff=True)
    client.force_login(operator)
    listing = client.get(f"/board/todos/?queue={celery_app.QUEUE}").content.decode()
    assert all(todo.id in listing for todo in todos)
    detail = client.get(f"/board/todos/{todos[0].id}/").content.decode()
    assert "SQS message body" in detail and "switchboard.record" in detail


def test_a_celery_task_that_raises_is_delivered_again(celery_setup):
    endpoint, producer, results, _ = celery_setup
    producer.send_task("switchboard.flaky", args=[7])
    lines = wait_for(
        results, lambda lines: any(line.get("outcome") == "ok" for line in lines)
    )
    assert [line["outcome"] for line in lines] == ["raised", "ok"]
    scope = store.Scope.for_endpoint(endpoint)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        (todo,) = store.list_todos(scope, queue=celery_app.QUEUE).todos
        if todo.state == "done":
            break
        time.sleep(0.2)
    assert todo.state == "done" and todo.attempt == 2


def test_a_celery_tasks_trace_context_reaches_its_worker(celery_setup):
    endpoint, producer, results, _ = celery_setup
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    producer.send_task(
        "switchboard.traced", args=[1], headers={"traceparent": traceparent}
    )

    [line] = wait_for(results, lambda lines: len(lines) >= 1)
    assert line["traceparent"] == traceparent
