"""The operator and cron commands: sweeps, retention, and their bad input."""

import logging
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import CommandError

from tests.support import command_output
from todos import store
from todos.models import Todo, TodoEvent

run = command_output


@pytest.fixture
def sweep_log():
    """Collect the records of the switchboard.sweep logger (it does not propagate)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("switchboard.sweep")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def expired(scope, time_travel, **create):
    todo, _ = store.create_todo(scope, queue="jobs", **create)
    store.claim_todo(scope, todo.id, "w1", lease_seconds=30)
    time_travel(todo.id, lease_expires_at=-60)
    return todo


def due_retry(scope, time_travel):
    todo, _ = store.create_todo(scope, queue="jobs")
    store.claim_todo(scope, todo.id, "w1")
    store.fail_todo(scope, todo.id, "w1", error="flaky")
    time_travel(todo.id, next_retry_at=-60)
    return todo


def test_reap_expired_prints_requeued_and_dead_lettered_counts(
    scope, other_scope, time_travel, sweep_log
):
    """SPEC: Background sweep spans tenants without a scope."""
    expired(scope, time_travel)
    expired(other_scope, time_travel)
    capped = expired(other_scope, time_travel, max_attempts=1)
    due_retry(scope, time_travel)

    out = run("reap_expired")

    assert "reap_expired: 3 todos moved (2 requeued, 1 dead-lettered)" in out
    assert store.get_todo(other_scope, capped.id).is_dead_letter
    [record] = [r for r in sweep_log if r.getMessage() == "reap_expired done"]
    assert record.fields == {"requeued": 2, "dead_lettered": 1, "canceled": 0}


def test_reap_expired_drains_in_batches(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable."""
    for _ in range(3):
        expired(scope, time_travel)

    out = run("reap_expired", "--batch-size", "2")

    assert "batch 1: 2 todos moved" in out and "batch 2: 1 todos moved" in out
    assert "3 todos moved (3 requeued, 0 dead-lettered)" in out


def test_requeue_due_retries_prints_its_count(scope, time_travel, sweep_log):
    """SPEC: Elapsed backoff re-queues."""
    todo = due_retry(scope, time_travel)
    expired(scope, time_travel)

    out = run("requeue_due_retries")

    assert "requeue_due_retries: 1 todos requeued" in out
    assert store.get_todo(scope, todo.id).state == "pending"
    assert [
        r.fields for r in sweep_log if r.getMessage() == "requeue_due_retries done"
    ] == [{"requeued": 1}]


def test_sweep_runs_both_sweeps_once(scope, time_travel, sweep_log):
    """SPEC: Background sweep spans tenants without a scope."""
    expired(scope, time_travel)
    expired(scope, time_travel, max_attempts=1)
    due_retry(scope, time_travel)

    out = run("sweep")

    assert (
        "sweep: 3 todos moved (1 requeued after lease expiry, 1 dead-lettered at "
        "the attempt cap, 1 retries requeued)" in out
    )
    [record] = [r for r in sweep_log if r.getMessage() == "sweep done"]
    assert record.fields["requeued"] == 1 and record.fields["retried"] == 1
    assert run("sweep").startswith("sweep: 0 todos moved")


@pytest.mark.parametrize(
    "args, message",
    [
        (("sweep", "--interval", "5"), "--interval only applies with --loop"),
        (("sweep", "--loop", "--interval", "0"), "must be above 0"),
        (("sweep", "--loop", "--interval", "soon"), "expected seconds"),
        (("sweep", "--batch-size", "0"), "must be between 1 and 100000"),
        (("reap_expired", "--batch-size", "-5"), "must be between 1"),
        (("sweep", "--batch-size", "99999999999"), "must be between 1"),
        (("requeue_due_retries", "--batch-size", "x"), "expected a whole number"),
        (("purge_terminal",), "--older-than"),
        (("purge_terminal", "--older-than", "-1"), "between 0 and 36500 days"),
        (("purge_terminal", "--older-than", "99999999"), "between 0 and 36500 days"),
        (("purge_terminal", "--older-than", "a week"), "expected whole days"),
        (("purge_terminal", "--older-than", "7", "--batch-size", "0"), "between 1"),
    ],
)
def test_commands_reject_bad_input_with_a_command_error(db, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_purge_terminal_deletes_only_old_terminal_todos_with_their_history(
    scope, time_travel
):
    """SPEC: Terminal states are final."""
    month = 30 * 86400

    def make(state, age_seconds, **create):
        todo, _ = store.create_todo(scope, queue="jobs", **create)
        if state != "pending":
            store.claim_todo(scope, todo.id, "w1")
        if state == "done":
            store.complete_todo(scope, todo.id, "w1")
        elif state in ("dead_letter", "retry_scheduled"):
            store.fail_todo(scope, todo.id, "w1", error="x")
        time_travel(todo.id, updated_at=-age_seconds, created_at=-age_seconds)
        return todo.id

    old_done = make("done", month)
    old_dead = make("dead_letter", month, max_attempts=1)
    recent_done = make("done", 86400)
    old_parked = make("retry_scheduled", month)
    old_pending = make("pending", month)
    old_claimed = make("claimed", month)

    out = run("purge_terminal", "--older-than", "7")

    assert "purge_terminal: 2 terminal todos older than 7 days purged" in out
    remaining = set(Todo.objects.values_list("id", flat=True))
    assert {str(todo_id) for todo_id in remaining} == {
        recent_done,
        old_parked,
        old_pending,
        old_claimed,
    }
    assert not TodoEvent.objects.filter(todo_id__in=[old_done, old_dead]).exists()
    assert TodoEvent.objects.filter(todo_id=recent_done).count() == 3


def test_purge_terminal_ages_from_the_last_transition(scope, time_travel):
    """A todo created long ago but finished yesterday is kept."""
    todo, _ = store.create_todo(scope, queue="jobs")
    time_travel(todo.id, created_at=-90 * 86400)
    store.claim_todo(scope, todo.id, "w1")
    store.complete_todo(scope, todo.id, "w1")
    time_travel(todo.id, updated_at=-86400)

    assert "0 terminal todos" in run("purge_terminal", "--older-than", "7")
    assert "1 terminal todos" in run("purge_terminal", "--older-than", "0")


def test_purge_terminal_drains_in_batches(scope, time_travel):
    for _ in range(3):
        todo, _ = store.create_todo(scope, queue="jobs")
        store.claim_todo(scope, todo.id, "w1")
        store.complete_todo(scope, todo.id, "w1")
        time_travel(todo.id, updated_at=-10 * 86400)

    out = run("purge_terminal", "--older-than", "7", "--batch-size", "2")

    assert "purged 2 so far" in out and "purged 3 so far" in out
    assert not Todo.objects.exists()


@pytest.mark.parametrize("command", ["sweep", "reap_expired", "purge_terminal"])
def test_commands_exit_nonzero_with_a_clear_message_when_the_database_is_down(
    command,
):
    """A cron run against an unreachable database fails loudly, without a traceback."""
    args = [sys.executable, "manage.py", command]
    if command == "purge_terminal":
        args += ["--older-than", "30"]
    env = {
        **os.environ,
        # Port 1 refuses connections at once: an outage without stopping anything.
        "DATABASE_URL": "postgres://postgres@127.0.0.1:1/switchboard",
    }
    finished = subprocess.run(
        args, cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=30
    )

    assert finished.returncode == 1
    assert "database unavailable" in finished.stderr
    # It names where it looked, and what sets that.
    assert "cannot reach the database 'switchboard' at 127.0.0.1:1" in finished.stderr
    assert "SB_PG_PORT" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_reap_expired_counts_lapsed_leases_under_a_cancel_request_as_canceled(
    scope, time_travel
):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w1")
    store.cancel_todo(scope, todo.id, worker="lead")
    time_travel(todo.id, lease_expires_at=-3600)
    out = command_output("reap_expired")
    assert "1 todos moved (0 requeued, 0 dead-lettered, 1 canceled)" in out
    assert store.get_todo(scope, todo.id).outcome == "canceled"
