"""The worker runtime as a process (``python -m switchboard_client worker``):
killed mid-todo, another finishes it from its checkpoint; SIGTERM gives
in-flight work back with its checkpoint within the grace period."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.client.conftest import CLIENT_SRC
from tests.conftest import shift
from tests.support import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def start_worker(asgi_server, endpoint, name, *flags, pythonpath=()):
    """``python -m switchboard_client worker name`` on the served instance."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, [CLIENT_SRC, ROOT, *pythonpath])),
        "SWITCHBOARD_URL": asgi_server.url,
        "SWITCHBOARD_TOKEN": endpoint.token,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "switchboard_client", "worker", name, *flags],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path, process, seconds=20):
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the worker exited: {process.stderr.read()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_killed_workers_todo_is_finished_by_another_from_its_checkpoint(
    asgi_server, endpoint, client, tmp_path
):
    mark = tmp_path / "started"
    todo = client.create("resumable", payload={"mark": str(mark)}).todo
    first = start_worker(
        asgi_server, endpoint, "tests.client.workers:resumable", "--name", "first"
    )
    try:
        wait_for(mark, first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        first.kill()
    claimed = client.get(todo.id)
    assert claimed.state == "claimed" and claimed.checkpoint == {"step": 1}
    # Its lease lapses (time moves in the database), and another worker takes it.
    shift(todo.id, lease_expires_at=-3600)
    second = start_worker(
        asgi_server, endpoint, "tests.client.workers:resumable", "--name", "second"
    )
    try:
        done = client.wait(todo, timeout=20)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
    assert done.outcome == "done" and done.owner == "second"
    assert done.result == {"resumed_from": {"step": 1}, "attempt": 2}


def test_sigterm_gives_in_flight_work_back_with_its_checkpoint_within_the_grace(
    asgi_server, endpoint, client, tmp_path
):
    marks = [tmp_path / f"started-{n}" for n in range(2)]
    todos = [
        client.create("stubborn", payload={"n": n, "mark": str(mark)}).todo
        for n, mark in enumerate(marks)
    ]
    worker = start_worker(
        asgi_server,
        endpoint,
        "tests.client.workers:stubborn",
        "--grace",
        "1",
        "--log-format",
        "json",
    )
    for mark in marks:
        wait_for(mark, worker)
    stopped_at = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    took = time.monotonic() - stopped_at
    logs = worker.stderr.read()
    for n, todo in enumerate(todos):
        back = client.get(todo.id)
        assert back.state == "pending" and back.owner is None
        assert back.checkpoint == {"done": n}
        assert back.note == "the worker shut down"
    # Far below the default grace (30 s): the one-second grace was kept.
    assert took < 10, f"SIGTERM took {took:.1f} s with a one-second grace"
    assert '"message": "todo given back at shutdown"' in logs
    assert f'"todo_id": "{todos[0].id}"' in logs
