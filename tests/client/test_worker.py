"""The worker runtime in this process (a thread runs Worker.serve) against the
in-process server: how a handler's ending ends the attempt."""

import asyncio
import logging
import threading
import time

import pytest
from switchboard_client import Client, Context, Worker

from tests.client.conftest import QUICK_RETRY
from tests.support import claims_held_back

pytestmark = pytest.mark.django_db(transaction=True)


class Running:
    """A Worker serving in a thread of the test process until ``stop``."""

    def __init__(self, worker):
        self.worker = worker
        self.thread = threading.Thread(target=asyncio.run, args=(worker.serve(),))
        self.thread.start()

    def stop(self):
        deadline = time.monotonic() + 5
        while self.worker._loop is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.fixture
def make_worker(asgi_server, endpoint):
    running = []

    def make(name="rt", **options):
        client = Client(asgi_server.url, endpoint.token, worker=name, retry=QUICK_RETRY)
        worker = Worker(client, wait_seconds=1, **options)
        return worker

    def start(worker):
        running.append(Running(worker))

    make.start = start
    yield make
    for run in running:
        run.stop()


def test_a_return_completes_and_an_exception_fails_with_its_type(client, make_worker):
    worker = make_worker(concurrency=2)

    @worker.handler("jobs")
    def handle(ctx: Context):
        if ctx.payload == "bad":
            raise ValueError("no good")
        return {"doubled": ctx.payload * 2}

    good = client.create("jobs", payload=21).todo
    bad = client.create("jobs", payload="bad", max_attempts=1).todo
    make_worker.start(worker)
    assert client.wait(good, timeout=10).result == {"doubled": 42}
    failed = client.wait(bad, timeout=10)
    assert failed.outcome == "dead_letter"
    assert failed.last_error == "ValueError: no good"


def test_an_async_handler_reports_progress_and_a_checkpoint(client, make_worker):
    worker = make_worker()
    seen = {}

    @worker.handler("async-jobs")
    async def handle(ctx: Context):
        ctx.progress("half", 0.5)
        ctx.save_checkpoint({"half": True}, now=True)
        await asyncio.sleep(0)
        for _ in range(100):
            current = await asyncio.to_thread(client.get, ctx.todo.id)
            if current.checkpoint == {"half": True}:
                seen["todo"] = current
                break
            await asyncio.sleep(0.05)
        return "ok"

    todo = client.create("async-jobs").todo
    make_worker.start(worker)
    assert client.wait(todo, timeout=10).result == "ok"
    assert seen["todo"].progress.message == "half"


def test_ask_parks_the_todo_and_the_answer_resumes_it_with_its_checkpoint(
    client, other_client, make_worker
):
    worker = make_worker()

    @worker.handler("approvals")
    def handle(ctx: Context):
        if ctx.answer is None:
            ctx.save_checkpoint({"plan": "drop table"})
            ctx.ask("Drop it?", choices=["drop", "keep"])
        return {"plan": ctx.checkpoint["plan"], "decision": ctx.answer.value}

    todo = client.create("approvals").todo
    make_worker.start(worker)
    held = client.wait(todo, timeout=10)
    assert held.held and held.question.choices == ["drop", "keep"]
    assert held.checkpoint == {"plan": "drop table"}
    other_client.answer(held, "keep")
    done = client.wait(todo, timeout=15)
    assert done.result == {"plan": "drop table", "decision": "keep"}


def test_a_cancel_request_stops_the_handler_cooperatively(client, make_worker):
    worker = make_worker(lease_seconds=3)
    started = threading.Event()

    @worker.handler("long")
    def handle(ctx: Context):
        ctx.save_checkpoint({"at": 1})
        started.set()
        while not ctx.cancel_requested:
            time.sleep(0.05)
        ctx.give_back("canceled")

    todo = client.create("long").todo
    make_worker.start(worker)
    assert started.wait(10)
    assert client.cancel(todo).cancel_requested
    ended = client.wait(todo, timeout=15)
    assert ended.outcome == "canceled"
    assert ended.checkpoint == {"at": 1}


def test_a_handler_longer_than_its_lease_keeps_it(client, make_worker):
    # A free slot would take the todo again (attempt 2) the moment its lease
    # lapsed.
    worker = make_worker(lease_seconds=1, concurrency=2)

    @worker.handler("slowish")
    def handle(ctx: Context):
        time.sleep(2.5)
        return ctx.attempt

    todo = client.create("slowish").todo
    make_worker.start(worker)
    done = client.wait(todo, timeout=15)
    assert done.outcome == "done" and done.result == 1 and done.attempt == 1


def test_a_result_that_is_not_json_fails_the_todo_and_others_complete(
    client, make_worker
):
    worker = make_worker(concurrency=4)

    @worker.handler("mixed")
    def handle(ctx: Context):
        return {1, 2} if ctx.payload == "set" else ctx.payload

    made = [
        client.create("mixed", payload=p, max_attempts=1).todo for p in (1, "set", 3)
    ]
    make_worker.start(worker)
    ended = [client.wait(todo, timeout=10) for todo in made]
    assert [t.outcome for t in ended] == ["done", "dead_letter", "done"]
    assert ended[1].last_error.startswith("TypeError: the handler's result is not JSON")
    assert [ended[0].result, ended[2].result] == [1, 3]


def test_each_queue_goes_to_its_own_handler(client, make_worker):
    worker = make_worker(concurrency=2)

    @worker.handler("emails")
    def email(ctx: Context):
        return "emailed"

    @worker.handler("reports")
    async def report(ctx: Context):
        return "reported"

    made = [client.create(q).todo for q in ("emails", "reports", "emails")]
    make_worker.start(worker)
    assert [client.wait(t, timeout=10).result for t in made] == [
        "emailed",
        "reported",
        "emailed",
    ]


def test_a_stop_gives_an_async_handlers_todo_back_with_its_checkpoint(
    client, make_worker
):
    worker = make_worker(grace_seconds=0.2)
    started = threading.Event()

    @worker.handler("forever")
    async def forever(ctx: Context):
        ctx.save_checkpoint({"page": 7})
        started.set()
        await asyncio.Event().wait()

    todo = client.create("forever").todo
    running = Running(worker)
    assert started.wait(10)
    running.stop()
    back = client.get(todo.id)
    assert back.state == "pending" and back.checkpoint == {"page": 7}
    assert back.note == "the worker shut down"


def test_a_claim_running_when_its_worker_stops_is_handed_back_before_the_server_settles(
    client, asgi_server, make_worker
):
    """The worker does not wait out its long poll at a stop; a claim the server
    was running for it finishes after the worker returned, and what it claims
    goes back pending, its attempt not spent. The in-process server settles
    (before a test's database is flushed) only once that is done."""
    worker = make_worker()
    worker.handler("jobs")(lambda ctx: {"ran": True})
    todo = client.create("jobs").todo
    with claims_held_back() as one_waits:
        running = Running(worker)
        deadline = time.monotonic() + 10
        while not one_waits():
            assert time.monotonic() < deadline, "the worker's claim never started"
            time.sleep(0.02)
        running.stop()
        # The server hears the hang-up; the claim, held back, runs on.
        outlives = "0 request(s), 1 claim(s) of gone clients"
        deadline = time.monotonic() + 10
        while (still := asgi_server.settle(timeout=0.1)) != outlives:
            assert time.monotonic() < deadline, still
    assert asgi_server.settle() == ""
    back = client.get(todo.id)
    assert back.state == "pending" and back.attempt == 0


def test_the_command_explains_itself_with_help():
    import subprocess
    import sys

    from tests.client.conftest import CLIENT_SRC

    done = subprocess.run(
        [sys.executable, "-m", "switchboard_client", "worker", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(CLIENT_SRC), "PATH": ""},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "MODULE:ATTRIBUTE" in done.stdout and "SWITCHBOARD_URL" in done.stdout
    assert "--grace" in done.stdout and "--log-format" in done.stdout


def test_a_checkpoint_over_its_limit_does_not_cost_the_lease(
    client, make_worker, caplog
):
    # A free slot would take the todo again the moment its lease lapsed.
    worker = make_worker(lease_seconds=1, concurrency=2)

    @worker.handler("big")
    def handle(ctx: Context):
        ctx.save_checkpoint("x" * 70_000)
        time.sleep(2.5)
        return ctx.attempt

    caplog.set_level(logging.WARNING, logger="switchboard_client")
    todo = client.create("big").todo
    make_worker.start(worker)
    done = client.wait(todo, timeout=15)
    assert done.outcome == "done" and done.result == 1 and done.attempt == 1
    refused = [r for r in caplog.records if r.getMessage() == "checkpoint refused"]
    assert refused and "payload_too_large" in refused[0].error
    assert refused[0].todo_id == todo.id and refused[0].queue == "big"


def test_a_heartbeat_in_flight_when_the_handler_returns_ends_before_the_attempt_does():
    """A beat sent just before the handler returned is waited for before the
    complete is sent: a heartbeat that reached the server after the complete
    was refused with 409 and logged as a lost lease (seen in the soak)."""
    from switchboard_client.worker import _Beats

    class Ctx:
        lease_seconds = 60

    class SlowBeat:
        def __init__(self):
            self.started = asyncio.Event()
            self.release = asyncio.Event()
            self.ended = False

        async def _beat(self, ctx):
            self.started.set()
            await self.release.wait()
            self.ended = True

    async def scenario():
        worker = SlowBeat()
        beats = _Beats(worker, Ctx())
        beats.now()
        await worker.started.wait()
        finishing = asyncio.ensure_future(beats.finish())
        await asyncio.sleep(0.05)
        assert not finishing.done(), "finish() returned with a beat in flight"
        worker.release.set()
        await finishing
        assert worker.ended
        beats.now()
        assert beats.task is None and beats.timer is None, "a beat after finish()"

    asyncio.run(scenario())
