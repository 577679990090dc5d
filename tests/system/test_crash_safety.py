"""Crash safety with real processes: killed workers, a sweep loop, signals.

The children (``manage.py sweep --loop`` and ``scripts/crash_workers.py``) are
separate processes with their own connections, so the tests are transactional
and hand the children the test database through ``DATABASE_URL``.
"""

import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

from tests.support import ROOT, child_env, database_url
from todos import store
from todos.models import Todo, TodoEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_SECONDS = 2


def worker_env(application_name):
    """A child's environment: this test's database, named in pg_stat_activity."""
    return child_env(database_url(application_name=application_name), LOG_LEVEL="INFO")


class SweepLoop:
    """``manage.py sweep --loop`` as a child process, its log in a file."""

    def __init__(self, tmp_path, interval="1"):
        self.log_path = tmp_path / "sweep.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "sweep", "--loop", "--interval", interval],
            cwd=ROOT,
            env=worker_env("sweep-loop-test"),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self):
        return self.log_path.read_text()

    def wait_for(self, text, timeout=15):
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.process.poll() is None, f"sweep loop died:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()}"
            time.sleep(0.05)

    def terminate(self, signum=signal.SIGTERM, timeout=5):
        """Send SIGTERM (or signum); return (exit status, seconds it took to exit)."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        status = self.process.wait(timeout=timeout)
        return status, time.monotonic() - sent

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def sweep_loop(tmp_path):
    loops = []

    def start(**kwargs):
        loop = SweepLoop(tmp_path, **kwargs)
        loops.append(loop)
        loop.wait_for("sweep loop started")
        return loop

    yield start
    for loop in loops:
        loop.kill()


def assert_consistent():
    """Every todo's columns agree with its state and with its last history row."""
    last_event = {}
    for todo_id, to_state in TodoEvent.objects.order_by("id").values_list(
        "todo_id", "to_state"
    ):
        last_event[todo_id] = to_state
    for todo in Todo.objects.all():
        assert last_event[todo.id] == todo.state, todo.id
        if todo.state == "claimed":
            assert todo.owner and todo.lease_expires_at and todo.claimed_at
            assert todo.next_retry_at is None
        elif todo.state == "pending":
            assert todo.owner is None and todo.lease_expires_at is None
            assert todo.next_retry_at is None
        else:
            assert todo.lease_expires_at is None
        assert todo.attempt <= todo.max_attempts


def wait_until(condition, timeout, message):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def sweep_once_moved():
    return len(store.reap_expired()) + len(store.requeue_due_retries())


class Worker:
    """One ``scripts/crash_workers.py`` process and the lines it prints."""

    def __init__(self, name, endpoint_id, lines, lease=LEASE_SECONDS):
        self.name = name
        self.process = subprocess.Popen(
            [
                sys.executable,
                "scripts/crash_workers.py",
                "--endpoint",
                endpoint_id,
                "--name",
                name,
                "--lease",
                str(lease),
            ],
            cwd=ROOT,
            env=worker_env(name),
            stdout=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self.reader.start()

    def _read(self, lines):
        for line in self.process.stdout:
            lines.put((self, line.split()))

    def kill(self, signum=signal.SIGKILL):
        if self.process.poll() is None:
            self.process.send_signal(signum)
        self.process.wait()


def test_graceful_shutdown_drains_cleanly(scope, time_travel, sweep_loop):
    """SPEC: Graceful shutdown drains cleanly.

    Two worker processes hold leases (on todos that wedge them) when the sweep
    loop and then the workers are told to stop.
    """
    for number in range(2):
        store.create_todo(
            scope, queue="jobs", title=f"wedges {number}", payload={"poison": True}
        )
    waiting, _ = store.create_todo(scope, queue="jobs", title="never claimed")
    # Crashed earlier at its cap: only a sweep can move it (to the dead letters).
    crashed, _ = store.create_todo(scope, queue="jobs", max_attempts=1)
    store.claim_todo(scope, crashed.id, "gone", lease_seconds=30)
    time_travel(crashed.id, lease_expires_at=-60)
    lines = queue.Queue()
    workers = [Worker(f"w{n}", scope.endpoint_id, lines, lease=60) for n in range(2)]
    try:
        held = {lines.get(timeout=20)[1][1] for _ in workers}
        loop = sweep_loop()
        wait_until(
            lambda: store.get_todo(scope, crashed.id).state == "failed",
            10,
            "the sweep loop did not dead-letter the lapsed lease",
        )

        status, seconds = loop.terminate()
    finally:
        for worker in workers:
            worker.kill(signal.SIGTERM)

    assert status == 0, loop.output()
    assert seconds < 2, f"took {seconds:.2f} s to stop"
    assert "sweep loop stopped" in loop.output() and "signal=SIGTERM" in loop.output()
    # The loop left the live leases alone; the stopped workers still own them.
    assert len(held) == 2
    for todo_id in held:
        current = store.get_todo(scope, todo_id)
        assert current.state == "claimed" and current.owner in {"w0", "w1"}
    assert store.get_todo(scope, waiting.id).state == "pending"
    assert_consistent()

    # Their leases lapse; crash safety requeues the todos for the next worker.
    for todo_id in held:
        time_travel(todo_id, lease_expires_at=-61)
    assert sweep_once_moved() == 2
    for todo_id in held:
        current = store.get_todo(scope, todo_id)
        assert current.state == "pending" and current.attempt == 1
    assert_consistent()


def test_sweep_loop_survives_losing_its_database_connection(
    scope, time_travel, sweep_loop
):
    """The loop reconnects after its backend is terminated (a database restart)."""
    loop = sweep_loop(interval="0.3")

    def loop_backends():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                ["sweep-loop-test"],
            )
            return [row[0] for row in cursor.fetchall()]

    wait_until(loop_backends, 10, "the sweep loop never connected")
    with connection.cursor() as cursor:
        for pid in loop_backends():
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    todo, _ = store.create_todo(scope, queue="jobs")
    store.claim_todo(scope, todo.id, "gone", lease_seconds=30)
    time_travel(todo.id, lease_expires_at=-60)
    wait_until(
        lambda: store.get_todo(scope, todo.id).state == "pending",
        10,
        f"the sweep loop did not come back:\n{loop.output()}",
    )
    status, _ = loop.terminate()
    assert status == 0, loop.output()


def test_sweep_loop_stops_on_sigint_with_status_zero(sweep_loop):
    """SPEC: Graceful shutdown drains cleanly."""
    loop = sweep_loop(interval="30")

    status, seconds = loop.terminate(signal.SIGINT)

    assert status == 0, loop.output()
    assert seconds < 2, f"took {seconds:.2f} s to stop"
    assert "signal=SIGINT" in loop.output()
    assert "Traceback" not in loop.output()


def check_history(todo, events, lease):
    """Replay a todo's history; fail if two live leases ever overlapped.

    A lease runs from its claim (or the holder's last heartbeat) for ``lease``
    seconds, or until the holder's next transition. Every event's ``at`` is the
    ``now()`` its statement computed the lease from, so the replay is exact.
    Return the number of claims.
    """
    holder, lease_end, claims, attempt = None, None, 0, 0
    assert (events[0].from_state, events[0].to_state) == (None, "pending")
    for event in events[1:]:
        took_over = event.from_state == "claimed" and event.attempt > attempt
        if event.to_state == "claimed" and (event.from_state != "claimed" or took_over):
            if holder is not None:
                assert event.at > lease_end, (
                    f"{todo.id}: {event.actor} claimed at {event.at} while "
                    f"{holder}'s lease ran until {lease_end}"
                )
            assert event.attempt == attempt + 1, f"{todo.id}: attempt not counted"
            holder, lease_end, claims, attempt = (
                event.actor,
                event.at + lease,
                claims + 1,
                event.attempt,
            )
        elif event.from_state == "claimed" and event.to_state == "claimed":
            assert event.actor == holder, f"{todo.id}: heartbeat by a non-holder"
            lease_end = event.at + lease
        elif event.from_state == "claimed":
            if event.actor == "system:reaper":
                assert event.at > lease_end, f"{todo.id}: reaped a live lease"
            else:
                assert event.actor == holder, f"{todo.id}: {event.actor} not owner"
            holder = None
        else:
            assert holder is None
    return claims


def test_lease_replay_catches_a_claim_inside_a_live_lease():
    """The history check is able to fail: an overlapping claim is reported."""
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def event(seconds, from_state, to_state, attempt, actor):
        at = start + timedelta(seconds=seconds)
        return SimpleNamespace(
            from_state=from_state,
            to_state=to_state,
            attempt=attempt,
            actor=actor,
            at=at,
        )

    todo = SimpleNamespace(id="t1")
    lease = timedelta(seconds=LEASE_SECONDS)
    created = event(0, None, "pending", 0, "")
    claimed = event(1, "pending", "claimed", 1, "w1")
    heartbeat = event(2, "claimed", "claimed", 1, "w1")
    assert check_history(todo, [created, claimed, heartbeat], lease) == 1
    # w1's heartbeat at 2 s kept its lease until 4 s: a take-over at 3.5 s overlaps.
    stolen = event(3.5, "claimed", "claimed", 2, "w2")
    with pytest.raises(AssertionError, match="lease ran until"):
        check_history(todo, [created, claimed, heartbeat, stolen], lease)
    after = event(4.5, "claimed", "claimed", 2, "w2")
    assert check_history(todo, [created, claimed, heartbeat, after], lease) == 2
    late_complete = event(5, "claimed", "done", 2, "w1")
    with pytest.raises(AssertionError, match="not owner"):
        check_history(todo, [created, claimed, heartbeat, after, late_complete], lease)


def test_killed_workers_lose_no_work_and_never_share_a_lease(make_endpoint, sweep_loop):
    """SPEC: Crashed worker's todo is re-claimable.

    SPEC: Repeated expiry dead-letters at the cap. Several worker processes
    drain one endpoint with 2-second leases while a sweep loop runs; workers
    are killed with SIGKILL while they hold a lease (always on a poison todo,
    and on every fourth other claim, four times).
    """
    endpoint = make_endpoint("crash-test")
    scope = store.Scope.for_endpoint(endpoint)
    normal = [
        store.create_todo(scope, queue="jobs", title=f"job {n}", max_attempts=4)[0].id
        for n in range(40)
    ]
    poison = [
        store.create_todo(
            scope,
            queue="jobs",
            title=f"poison {n}",
            payload={"poison": True},
            max_attempts=2,
        )[0].id
        for n in range(2)
    ]
    loop = sweep_loop(interval="0.5")

    lines = queue.Queue()
    workers = [Worker(f"w{n}", scope.endpoint_id, lines) for n in range(4)]
    kills, normal_claims, spawned = Counter(), 0, len(workers)
    try:
        deadline = time.monotonic() + 50

        def unfinished():
            return Todo.objects.filter(state__in=["pending", "claimed"]).count() + (
                Todo.objects.filter(state="failed", next_retry_at__isnull=False).count()
            )

        while unfinished():
            assert time.monotonic() < deadline, "todos left unfinished"
            try:
                worker, words = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if words[0] != "claimed" or worker.process.poll() is not None:
                continue
            todo_id = words[1]
            if todo_id not in poison:
                normal_claims += 1
                if normal_claims % 4 or sum(kills[t] for t in normal) >= 4:
                    continue
            worker.kill()
            # Count the kill only if it landed while the worker held the lease
            # (a fast worker may have finished before the line was read).
            if Todo.objects.filter(id=todo_id, state="claimed", owner=worker.name):
                kills[todo_id] += 1
            workers.remove(worker)
            spawned += 1
            workers.append(Worker(f"w{spawned}", scope.endpoint_id, lines))
    finally:
        for worker in workers:
            worker.kill()
    status, _ = loop.terminate()
    assert status == 0, loop.output()

    todos = {str(t.id): t for t in Todo.objects.all()}
    assert set(todos) == set(normal) | set(poison), "a todo was lost or invented"
    events = defaultdict(list)
    for event in TodoEvent.objects.order_by("id"):
        events[str(event.todo_id)].append(event)
    lease = timedelta(seconds=LEASE_SECONDS)
    for todo_id, todo in todos.items():
        claims = check_history(todo, events[todo_id], lease)
        assert todo.attempt == claims, f"{todo_id}: attempts not counted"
        assert todo.attempt >= kills[todo_id] + (todo.state == "done")
    for todo_id in normal:
        assert todos[todo_id].state == "done", todos[todo_id]
        assert todos[todo_id].result["by"] == todos[todo_id].owner
    for todo_id in poison:
        dead = todos[todo_id]
        assert dead.state == "failed" and dead.next_retry_at is None
        assert dead.attempt == dead.max_attempts == 2
        assert kills[todo_id] == 2
        assert dead.last_error == "lease expired at the attempt cap"
        assert events[todo_id][-1].actor == "system:reaper"
    assert sum(kills[t] for t in normal) == 4, "the kills did not happen"
    assert_consistent()
