"""No lease is lost to a handler that runs longer than its lease, over 1,000
todos at concurrency 8: every todo is done in its first attempt, and no
heartbeat or acknowledgement was refused."""

import logging
import time

import pytest
from switchboard_client import Client, Context, Worker

from tests.client.conftest import QUICK_RETRY
from tests.client.test_worker import Running

# Four and a half minutes: `make test-long` (and CI) runs it, `make test` does not.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.long,
]

TODOS = 1_000
# Two seconds: a heartbeat every 0.67 s, each with 1.3 s to arrive on a busy
# machine (a one-second lease leaves a loaded two-core machine 0.67 s).
LEASE_SECONDS = 2
# Each handler outlives its lease by a tenth.
HANDLER_SECONDS = 2.2


def test_heartbeats_keep_every_lease_of_a_thousand_long_handlers(
    asgi_server, endpoint, client, caplog
):
    for start in range(0, TODOS, 100):
        client.create_many(
            [{"queue": "long", "payload": n} for n in range(start, start + 100)]
        )
    worker = Worker(
        Client(asgi_server.url, endpoint.token, worker="rt", retry=QUICK_RETRY),
        concurrency=8,
        lease_seconds=LEASE_SECONDS,
        wait_seconds=1,
    )

    @worker.handler("long")
    def handle(ctx: Context):
        time.sleep(HANDLER_SECONDS)
        return ctx.attempt

    caplog.set_level(logging.WARNING, logger="switchboard_client")
    running = Running(worker)
    try:
        deadline = time.monotonic() + TODOS * HANDLER_SECONDS / 8 * 3
        while client.queues()[0].pending + client.queues()[0].claimed:
            assert time.monotonic() < deadline, "the queue did not drain"
            time.sleep(1)
    finally:
        running.stop()
    todos = list(client.iter_todos(queue="long", limit=200))
    assert len(todos) == TODOS
    assert {t.outcome for t in todos} == {"done"}
    assert {t.attempt for t in todos} == {1} and {t.result for t in todos} == {1}
    # The runtime's warnings: a lost lease, a refused heartbeat or acknowledgement.
    warned = [r for r in caplog.records if r.name.startswith("switchboard_client")]
    assert [(r.getMessage(), r.__dict__.get("error")) for r in warned] == []
