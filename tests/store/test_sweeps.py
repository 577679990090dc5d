"""The background sweeps: lease reaper and retry scheduler, across every endpoint.

Time moves by editing timestamps in the database (conftest.shift); the sweeps
read PostgreSQL's clock.
"""

import json
import threading
import time
from collections import Counter

import psycopg
import pytest
from django.db import connection, connections

from todos import store
from todos.management.sweeper import Sweeper, drain, sweep_once
from todos.models import TodoEvent


def events_of(todo_id):
    return list(
        TodoEvent.objects.filter(todo_id=todo_id)
        .order_by("id")
        .values_list("from_state", "to_state", "attempt", "actor")
    )


def claimed_then_expired(scope, time_travel, worker="w1", **create):
    """Create and claim a todo, then make its lease lapse a minute ago."""
    todo, _ = store.create_todo(scope, queue=create.pop("queue", "jobs"), **create)
    store.claim_todo(scope, todo.id, worker, lease_seconds=30)
    time_travel(todo.id, lease_expires_at=-90)
    return todo


def failed_then_due(scope, time_travel, **create):
    """Create, claim and fail a todo below its cap, then let its backoff elapse."""
    todo, _ = store.create_todo(scope, queue=create.pop("queue", "jobs"), **create)
    store.claim_todo(scope, todo.id, "w1")
    store.fail_todo(scope, todo.id, "w1", error="boom")
    time_travel(todo.id, next_retry_at=-3600)
    return todo


def test_reaper_returns_a_crashed_workers_todo_to_pending(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable."""
    todo = claimed_then_expired(scope, time_travel, worker="crashed")

    result = sweep_once()

    assert (result.requeued, result.dead_lettered, result.retried) == (1, 0, 0)
    requeued = store.get_todo(scope, todo.id)
    assert requeued.state == "pending"
    assert requeued.owner is None and requeued.lease_expires_at is None
    assert events_of(todo.id)[-1] == ("claimed", "pending", 1, "system:reaper")
    reclaimed = store.claim_next(scope, "survivor")
    assert reclaimed.id == todo.id and reclaimed.attempt == 2
    # The crashed worker, back from the dead, can no longer finish it.
    with pytest.raises(store.Conflict):
        store.complete_todo(scope, todo.id, "crashed")


def test_reaper_leaves_live_leases_alone(scope):
    """SPEC: Claimed todo is invisible to other consumers."""
    todo, _ = store.create_todo(scope, queue="jobs")
    store.claim_todo(scope, todo.id, "w1", lease_seconds=60)

    assert store.reap_expired() == []
    assert store.get_todo(scope, todo.id).state == "claimed"


def test_repeated_expiry_dead_letters_at_the_cap(scope, time_travel):
    """SPEC: Repeated expiry dead-letters at the cap."""
    todo = claimed_then_expired(scope, time_travel, max_attempts=2)
    assert sweep_once().requeued == 1
    store.claim_todo(scope, todo.id, "w2", lease_seconds=30)
    time_travel(todo.id, lease_expires_at=-90)

    result = sweep_once()

    assert (result.requeued, result.dead_lettered) == (0, 1)
    dead = store.get_todo(scope, todo.id)
    assert dead.state == "failed" and dead.is_dead_letter
    assert dead.attempt == 2 and dead.lease_expires_at is None
    assert dead.last_error == "lease expired at the attempt cap"
    assert events_of(todo.id)[-1] == ("claimed", "failed", 2, "system:reaper")
    # Not requeued forever: later sweeps and claims leave the dead letter alone.
    assert sweep_once().moved == 0
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w3")


def test_elapsed_backoff_requeues(scope, time_travel):
    """SPEC: Elapsed backoff re-queues."""
    todo, _ = store.create_todo(scope, queue="jobs")
    store.claim_todo(scope, todo.id, "w1")
    parked = store.fail_todo(scope, todo.id, "w1", error="flaky")
    assert parked.is_retry_scheduled
    assert sweep_once().moved == 0, "the window is still open"

    time_travel(todo.id, next_retry_at=-31)
    result = sweep_once()

    assert (result.requeued, result.dead_lettered, result.retried) == (0, 0, 1)
    requeued = store.get_todo(scope, todo.id)
    assert requeued.state == "pending"
    assert requeued.owner is None
    assert requeued.lease_expires_at is None and requeued.next_retry_at is None
    assert events_of(todo.id)[-1] == ("failed", "pending", 1, "system:retry-scheduler")
    assert store.claim_next(scope, "w2").attempt == 2


def test_retry_scheduler_leaves_dead_letters_alone(scope, time_travel):
    """SPEC: Terminal states are final."""
    todo, _ = store.create_todo(scope, queue="jobs", max_attempts=1)
    store.claim_todo(scope, todo.id, "w1")
    store.fail_todo(scope, todo.id, "w1", error="fatal")
    time_travel(todo.id, updated_at=-86400)

    assert sweep_once().moved == 0
    assert store.get_todo(scope, todo.id).is_dead_letter


def test_requeue_of_a_parked_retry_keeps_its_dedup_slot(scope, time_travel):
    """SPEC: Redelivery during a backoff window does not duplicate."""
    todo = failed_then_due(scope, time_travel, idempotency_key="delivery-1")
    again, created = store.create_todo(
        scope, queue="jobs", idempotency_key="delivery-1"
    )
    assert not created and again.id == todo.id

    assert sweep_once().retried == 1
    assert store.get_todo(scope, todo.id).state == "pending"


def test_sweeps_drain_every_batch(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable."""
    todos = [claimed_then_expired(scope, time_travel) for _ in range(5)]

    batches = [len(batch) for batch in drain(store.reap_expired, batch_size=2)]

    assert batches == [2, 2, 1]
    assert {store.get_todo(scope, t.id).state for t in todos} == {"pending"}


def test_drain_refuses_an_empty_batch_size():
    with pytest.raises(ValueError):
        next(drain(store.reap_expired, batch_size=0))


def _raw_connection():
    """Open a plain psycopg connection to the test database, beside Django's."""
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


def _listen():
    """Open a LISTEN connection of its own on the doorbell channel."""
    listener = _raw_connection()
    listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
    return listener


def _rings(listener, expected, timeout=5.0):
    deadline = time.monotonic() + timeout
    rings = []
    while len(rings) < expected and time.monotonic() < deadline:
        remaining = deadline - time.monotonic()
        for notify in listener.notifies(timeout=remaining, stop_after=1):
            rings.append(json.loads(notify.payload))
    # Anything extra that is already on its way would show up here.
    rings.extend(json.loads(n.payload) for n in listener.notifies(timeout=0.3))
    return rings


@pytest.mark.django_db(transaction=True)
def test_background_sweep_spans_tenants_without_a_scope(make_endpoint, time_travel):
    """SPEC: Background sweep spans tenants without a scope."""
    scopes = [
        store.Scope.for_endpoint(make_endpoint(f"agent-{owner}", owner=owner))
        for owner in ("alice", "bob", "carol")
    ]
    expired, due, untouched = {}, {}, []
    for scope in scopes:
        # Every endpoint uses the same queue name: it is not a tenant boundary.
        for _ in range(2):
            todo = claimed_then_expired(scope, time_travel, queue="reviews")
            expired[todo.id] = scope.endpoint_id
        todo = failed_then_due(scope, time_travel, queue="reviews")
        due[todo.id] = scope.endpoint_id
        capped = claimed_then_expired(
            scope, time_travel, queue="reviews", max_attempts=1
        )
        expired[capped.id] = scope.endpoint_id
        live, _ = store.create_todo(scope, queue="reviews")
        store.claim_todo(scope, live.id, "busy", lease_seconds=600)
        untouched.append(live.id)

    listener = _listen()
    try:
        result = sweep_once()
        rings = _rings(listener, expected=9)
    finally:
        listener.close()

    assert (result.requeued, result.dead_lettered, result.retried) == (6, 3, 3)
    assert result.endpoints == {scope.endpoint_id for scope in scopes}
    for todo_id in untouched:
        assert store.get_todo_any_endpoint(todo_id).state == "claimed"
    # One wakeup per todo that became claimable; none for the dead letters.
    woken = {
        todo_id: owner
        for todo_id, owner in {**expired, **due}.items()
        if store.get_todo_any_endpoint(todo_id).state == "pending"
    }
    assert len(woken) == 9
    assert sorted(ring["id"] for ring in rings) == sorted(woken)
    for ring in rings:
        assert ring["endpoint_id"] == woken[ring["id"]]
        assert ring["queue"] == "reviews"


@pytest.mark.django_db(transaction=True)
def test_concurrent_sweepers_move_each_todo_once(scope, time_travel):
    """Several sweepers at once move each expired lease exactly once (SKIP LOCKED)."""
    todos = [claimed_then_expired(scope, time_travel) for _ in range(60)]
    results = []
    start = threading.Barrier(3)

    def sweeper():
        try:
            start.wait()
            results.append(sweep_once(batch_size=5))
        finally:
            connection.close()

    threads = [threading.Thread(target=sweeper) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sum(result.requeued for result in results) == 60
    reaped = Counter(
        TodoEvent.objects.filter(actor="system:reaper").values_list(
            "todo_id", flat=True
        )
    )
    assert len(reaped) == 60 and set(reaped.values()) == {1}
    assert {store.get_todo(scope, t.id).state for t in todos} == {"pending"}


@pytest.mark.django_db(transaction=True)
def test_sweeper_stops_within_a_sleep_slice(scope, time_travel):
    """SPEC: Graceful shutdown drains cleanly."""
    todo = claimed_then_expired(scope, time_travel)
    sweeper = Sweeper(interval=30)
    thread = threading.Thread(target=sweeper.run)
    thread.start()
    deadline = time.monotonic() + 5
    while sweeper.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.02)

    stopped_at = time.monotonic()
    sweeper.stop()
    thread.join(timeout=2)

    assert not thread.is_alive()
    assert time.monotonic() - stopped_at < 0.5
    assert sweeper.passes == 1 and sweeper.failures == 0
    assert store.get_todo(scope, todo.id).state == "pending"


@pytest.mark.django_db(transaction=True)
def test_sweeper_reconnects_after_its_connection_is_killed(scope, time_travel):
    """A pass that loses its database connection is logged; the next reconnects."""
    sweeper = Sweeper(interval=1)
    assert sweeper.run_pass() is not None
    backend = connection.connection.info.backend_pid
    killer = _raw_connection()
    try:
        killer.execute("SELECT pg_terminate_backend(%s)", [backend])
    finally:
        killer.close()

    assert sweeper.run_pass() is None
    assert sweeper.failures == 1

    todo = claimed_then_expired(scope, time_travel)
    result = sweeper.run_pass()
    assert result is not None and result.requeued == 1
    assert connection.connection.info.backend_pid != backend
    assert store.get_todo(scope, todo.id).state == "pending"
