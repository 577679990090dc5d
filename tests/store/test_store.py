"""The todo store against real PostgreSQL: every SPEC-0003 scenario it serves.

Time moves by editing timestamps in the database (``time_travel``), since the
store reads PostgreSQL's clock.
"""

import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from todos import store
from todos.store import sql

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"
MALFORMED_IDS = [
    "nope",
    "",
    "123",
    "'; DROP TABLE todos; --",
    "0000000-0000-4000-8000-00000000000g",
    None,
    42,
]


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def claimed(scope, worker="w1", **fields):
    todo = new(scope, **fields)
    return store.claim_todo(scope, todo.id, worker)


def parked(scope, time_travel, worker="w1", **fields):
    """Return a todo failed once, parked in its retry window."""
    todo = claimed(scope, worker, **fields)
    return store.fail_todo(scope, todo.id, worker, error="boom")


def dead_letter(scope, **fields):
    """Return a todo that failed at its cap (max_attempts=1): no retry window."""
    todo = claimed(scope, max_attempts=1, **fields)
    return store.fail_todo(scope, todo.id, "w1", error="fatal")


def history(todo_id):
    return [
        (event.from_state, event.to_state)
        for event in store.todo_events_any_endpoint(todo_id)
    ]


def set_attempt(todo_id, attempt):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET attempt = %s WHERE id = %s", [attempt, str(todo_id)]
        )


def count_todos(endpoint_id, **where):
    conditions = "".join(f" AND {column} = %s" for column in where)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM todos WHERE endpoint_id = %s{conditions}",
            [str(endpoint_id), *where.values()],
        )
        return cursor.fetchone()[0]


# --- Create ---------------------------------------------------------------------


def test_create_makes_a_pending_todo_with_defaults(scope, endpoint):
    """SPEC: Only defined transitions are honored (create -> pending)."""
    todo, created = store.create_todo(scope, queue="q", title="review PR")
    assert created
    assert todo.state == "pending"
    assert todo.endpoint_id == str(endpoint.id)
    assert (todo.attempt, todo.max_attempts) == (0, 5)
    assert todo.payload == {} and todo.result is None
    assert todo.owner is None and todo.lease_expires_at is None
    assert store.get_todo(scope, todo.id) == todo


def test_create_keeps_payload_assignee_and_max_attempts(scope):
    """SPEC requirement: Bounded Retries via max_attempts (a per-todo cap)."""
    todo = new(scope, payload={"pr": 7, "tags": ["a"]}, assignee="w9", max_attempts=2)
    again = store.get_todo(scope, todo.id)
    assert again.payload == {"pr": 7, "tags": ["a"]}
    assert (again.assignee, again.max_attempts) == ("w9", 2)


def test_create_rejects_max_attempts_below_one(scope):
    """SPEC requirement: Bounded Retries via max_attempts"""
    with pytest.raises(ValueError):
        store.create_todo(scope, queue="q", max_attempts=0)


def test_create_outside_the_queue_grant_is_refused(make_endpoint):
    """SPEC requirement: Endpoint Ownership (Tenant Isolation): the queue grant."""
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("a",)))
    with pytest.raises(store.QueueNotGranted):
        store.create_todo(narrow, queue="b")


@pytest.mark.parametrize("endpoint_id", [NEVER_MINTED, "not-a-uuid", ""])
def test_create_for_an_unknown_endpoint_is_not_found(db, endpoint_id):
    """A never-minted or malformed endpoint owns nothing, even inside a transaction.

    SPEC: A foreign todo id is indistinguishable from a nonexistent one
    """
    with transaction.atomic():
        with pytest.raises(store.NotFound):
            store.create_todo(store.Scope(endpoint_id), queue="q")
        with pytest.raises(store.NotFound):
            store.create_todo_any_endpoint(endpoint_id, queue="q")
    assert not store.list_todos_any_endpoint().todos


# --- Lifecycle and transitions --------------------------------------------------


def test_complete_of_a_pending_todo_conflicts_and_leaves_it_pending(scope):
    """SPEC: Only defined transitions are honored"""
    todo = new(scope)
    with pytest.raises(store.Conflict) as caught:
        store.complete_todo(scope, todo.id, "w1")
    assert caught.value.state == "pending"
    assert store.get_todo(scope, todo.id).state == "pending"
    assert history(todo.id) == [(None, "pending")]


def _to_pending(scope, time_travel):
    return new(scope)


def _to_claimed(scope, time_travel):
    return claimed(scope)


def _to_done(scope, time_travel):
    todo = claimed(scope)
    return store.complete_todo(scope, todo.id, "w1")


def _to_dead_letter(scope, time_travel):
    return dead_letter(scope)


UNDEFINED_TRANSITIONS = [
    (_to_pending, lambda s, t: store.heartbeat(s, t, "w1")),
    (_to_pending, lambda s, t: store.fail_todo(s, t, "w1")),
    (_to_pending, lambda s, t: store.release_todo(s, t, "w1")),
    (_to_pending, lambda s, t: store.retry_todo(s, t)),
    (_to_claimed, lambda s, t: store.retry_todo(s, t)),
    (_to_claimed, lambda s, t: store.claim_todo(s, t, "w1")),
    (_to_done, lambda s, t: store.claim_todo(s, t, "w1")),
    (_to_done, lambda s, t: store.complete_todo(s, t, "w1")),
    (_to_done, lambda s, t: store.fail_todo(s, t, "w1")),
    (_to_done, lambda s, t: store.heartbeat(s, t, "w1")),
    (_to_done, lambda s, t: store.release_todo(s, t, "w1")),
    (_to_done, lambda s, t: store.retry_todo(s, t)),
    (_to_dead_letter, lambda s, t: store.claim_todo(s, t, "w1")),
    (_to_dead_letter, lambda s, t: store.complete_todo(s, t, "w1")),
    (_to_dead_letter, lambda s, t: store.release_todo(s, t, "w1")),
]


@pytest.mark.parametrize("make, attempt", UNDEFINED_TRANSITIONS)
def test_undefined_transitions_are_rejected_with_conflict(
    scope, time_travel, make, attempt
):
    """SPEC: Only defined transitions are honored"""
    todo = make(scope, time_travel)
    before = store.get_todo(scope, todo.id)
    events_before = history(todo.id)
    with pytest.raises(store.Conflict):
        attempt(scope, todo.id)
    assert store.get_todo(scope, todo.id) == before
    assert history(todo.id) == events_before


def test_full_lifecycle_claim_heartbeat_complete(scope):
    """SPEC: Only defined transitions are honored (pending -> claimed -> done)."""
    todo = new(scope)
    taken = store.claim_todo(scope, todo.id, "w1", lease_seconds=60)
    assert (taken.state, taken.owner, taken.attempt) == ("claimed", "w1", 1)
    assert taken.claimed_at is not None
    assert taken.lease_expires_at - taken.claimed_at == timedelta(seconds=60)
    extended = store.heartbeat(scope, todo.id, "w1", lease_seconds=600)
    assert extended.state == "claimed"
    assert extended.lease_expires_at - extended.updated_at == timedelta(seconds=600)
    done = store.complete_todo(scope, todo.id, "w1", result={"ok": True})
    assert (done.state, done.result, done.lease_expires_at) == (
        "done",
        {"ok": True},
        None,
    )


def test_done_todo_is_never_claimed_again(scope):
    """SPEC: Terminal states are final"""
    todo = claimed(scope)
    store.complete_todo(scope, todo.id, "w1")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w2")
    with pytest.raises(store.Conflict):
        store.retry_todo(scope, todo.id)
    assert store.get_todo(scope, todo.id).state == "done"


def test_dead_letter_is_claimed_only_after_an_explicit_retry(scope, time_travel):
    """SPEC: Terminal states are final"""
    todo = dead_letter(scope)
    assert todo.is_dead_letter
    # No window ever elapses for a dead letter, however much time passes.
    time_travel(todo.id, updated_at=-86400, created_at=-86400)
    assert store.requeue_due_retries() == []
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    retried = store.retry_todo(scope, todo.id)
    assert retried.state == "pending"
    assert store.claim_next(scope, "w2").id == todo.id


# --- Claim ----------------------------------------------------------------------


def test_claim_next_takes_the_oldest_pending_todo_first(scope):
    """SPEC requirement: Atomic Claim (ordered by created_at)."""
    first, second, third = new(scope), new(scope), new(scope)
    assert [store.claim_next(scope, "w").id for _ in range(3)] == [
        first.id,
        second.id,
        third.id,
    ]


def test_claim_next_sets_owner_lease_claimed_at_and_increments_attempt(scope):
    """SPEC requirement: Atomic Claim (owner, lease, claimed_at, attempt++)."""
    todo = new(scope)
    taken = store.claim_next(scope, "worker-7", lease_seconds=90)
    assert taken.id == todo.id
    assert (taken.state, taken.owner, taken.attempt) == ("claimed", "worker-7", 1)
    assert taken.lease_expires_at - taken.claimed_at == timedelta(seconds=90)
    assert taken.claimed_at == taken.updated_at


def test_claim_next_with_no_pending_work_is_not_found(scope):
    """SPEC requirement: Atomic Claim (no work -> ErrNotFound)."""
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1")


def test_claim_lease_defaults_to_the_configured_server_value(scope, settings):
    """SPEC requirement: Visibility Window, Lease, and Heartbeat (default TTL)."""
    settings.SWITCHBOARD_LEASE_SECONDS = 123
    new(scope)
    taken = store.claim_next(scope, "w1")
    assert taken.lease_expires_at - taken.claimed_at == timedelta(seconds=123)


@pytest.mark.parametrize("lease", [0, -5, store.MAX_LEASE_SECONDS + 1])
def test_claim_rejects_a_lease_out_of_range(scope, lease):
    """SPEC requirement: Visibility Window, Lease, and Heartbeat (TTL per claim)."""
    todo = new(scope)
    with pytest.raises(ValueError):
        store.claim_next(scope, "w1", lease_seconds=lease)
    with pytest.raises(ValueError):
        store.claim_todo(scope, todo.id, "w1", lease_seconds=lease)


def test_claim_todo_of_a_claimed_todo_conflicts(scope):
    """SPEC: Claimed todo is invisible to other consumers"""
    todo = claimed(scope, "w1")
    with pytest.raises(store.Conflict) as caught:
        store.claim_todo(scope, todo.id, "w2")
    assert caught.value.state == "claimed"


def test_claim_todo_of_a_never_minted_id_is_not_found(scope):
    """SPEC requirement: Atomic Claim (nonexistent -> ErrNotFound)."""
    with pytest.raises(store.NotFound):
        store.claim_todo(scope, NEVER_MINTED, "w1")


def test_assigned_todo_is_claimable_only_by_its_assignee(scope):
    """SPEC: Direct assignment is respected"""
    todo = new(scope, assignee="alice-bot")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "bob-bot")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "bob-bot")
    taken = store.claim_next(scope, "alice-bot")
    assert (taken.id, taken.owner) == (todo.id, "alice-bot")


def test_claim_next_passes_over_others_assignments_to_pool_work(scope):
    """SPEC: Direct assignment is respected"""
    new(scope, assignee="alice-bot")
    pool = new(scope)
    assert store.claim_next(scope, "bob-bot").id == pool.id


def test_claim_respects_the_queue_grant(make_endpoint):
    """SPEC requirement: Atomic Claim (scope covers the queue)."""
    narrow_endpoint = make_endpoint("narrow", queues=("a",))
    narrow = store.Scope.for_endpoint(narrow_endpoint)
    outside, _ = store.create_todo_any_endpoint(narrow_endpoint.id, queue="b")
    with pytest.raises(store.NotFound):
        store.claim_next(narrow, "w1")
    with pytest.raises(store.QueueNotGranted):
        store.claim_next(narrow, "w1", queue="b")
    with pytest.raises(store.NotFound):
        store.claim_todo(narrow, outside.id, "w1")
    inside = new(narrow, queue="a")
    assert store.claim_next(narrow, "w1", queue="a").id == inside.id


def test_claim_next_filters_by_queue(scope):
    """SPEC requirement: Endpoint Ownership (queue is an intra-endpoint filter)."""
    new(scope, queue="a")
    b = new(scope, queue="b")
    assert store.claim_next(scope, "w1", queue="b").id == b.id
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1", queue="b")


# --- Visibility, lease and heartbeat --------------------------------------------


def test_claimed_todo_with_a_live_lease_is_invisible_to_other_consumers(scope):
    """SPEC: Claimed todo is invisible to other consumers"""
    todo = claimed(scope, "w1")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    assert store.pending_doorbell_todos(scope) == []
    store.release_todo(scope, todo.id, "w1")
    assert store.claim_next(scope, "w2").id == todo.id


def test_heartbeat_extends_the_lease_only_for_its_owner(scope):
    """SPEC requirement: Visibility Window, Lease, and Heartbeat (only the owner)."""
    todo = claimed(scope, "w1")
    with pytest.raises(store.Conflict):
        store.heartbeat(scope, todo.id, "w2", lease_seconds=900)
    assert store.get_todo(scope, todo.id).lease_expires_at == todo.lease_expires_at
    extended = store.heartbeat(scope, todo.id, "w1", lease_seconds=900)
    assert extended.lease_expires_at > todo.lease_expires_at
    assert (extended.owner, extended.attempt) == ("w1", 1)


def test_heartbeat_keeps_a_lapsing_lease_out_of_the_claim_scan(scope, time_travel):
    """SPEC requirement: Visibility Window, Lease, and Heartbeat

    The owner may renew a lapsed lease until another claimant takes it (as SQS
    accepts a receipt handle until the message is received again).
    """
    todo = claimed(scope, "w1")
    time_travel(todo.id, lease_expires_at=-1000)
    store.heartbeat(scope, todo.id, "w1", lease_seconds=300)
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")


@pytest.mark.parametrize(
    "transition",
    [
        lambda s, t, w: store.complete_todo(s, t, w, result={"stolen": True}),
        lambda s, t, w: store.fail_todo(s, t, w, error="not mine"),
        lambda s, t, w: store.release_todo(s, t, w),
    ],
    ids=["complete", "fail", "release"],
)
def test_only_the_lease_owner_may_complete_fail_or_release(scope, transition):
    """SPEC: Only the lease owner may complete or fail"""
    todo = claimed(scope, "w1")
    with pytest.raises(store.Conflict) as caught:
        transition(scope, todo.id, "w2")
    assert caught.value.state == "claimed"
    assert store.get_todo(scope, todo.id) == todo


def test_a_lapsed_owner_loses_to_the_next_claimant(scope, time_travel):
    """SPEC: Only the lease owner may complete or fail"""
    todo = claimed(scope, "w1")
    time_travel(todo.id, lease_expires_at=-1000)
    assert store.claim_next(scope, "w2").id == todo.id
    with pytest.raises(store.Conflict):
        store.complete_todo(scope, todo.id, "w1")
    assert store.complete_todo(scope, todo.id, "w2").state == "done"


# --- Lease expiry ----------------------------------------------------------------


def test_claim_scan_takes_a_lapsed_lease_without_the_reaper(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable (no reaper has run yet)."""
    todo = claimed(scope, "crashed")
    time_travel(todo.id, lease_expires_at=-1000)
    taken = store.claim_next(scope, "rescuer")
    assert (taken.id, taken.owner, taken.attempt) == (todo.id, "rescuer", 2)
    assert history(todo.id)[-1] == ("claimed", "claimed")


def test_claim_todo_takes_a_lapsed_lease_without_the_reaper(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable"""
    todo = claimed(scope, "crashed")
    time_travel(todo.id, lease_expires_at=-1000)
    assert store.claim_todo(scope, todo.id, "rescuer").owner == "rescuer"


def test_claim_scan_prefers_redeliveries_over_fresh_work(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable (no work silently dropped)."""
    lapsed = claimed(scope, "crashed")
    new(scope)
    time_travel(lapsed.id, lease_expires_at=-1000)
    assert store.claim_next(scope, "w2").id == lapsed.id


def test_reaper_dead_letters_a_repeatedly_expired_todo_at_the_cap(scope, time_travel):
    """SPEC: Repeated expiry dead-letters at the cap"""
    todo = new(scope, max_attempts=2)
    for attempt in (1, 2):
        taken = store.claim_next(scope, f"w{attempt}")
        assert (taken.id, taken.attempt) == (todo.id, attempt)
        time_travel(todo.id, lease_expires_at=-1000)
        if attempt == 1:
            assert [m.state for m in store.reap_expired()] == ["pending"]
    assert [m.state for m in store.reap_expired()] == ["failed"]
    dead = store.get_todo(scope, todo.id)
    assert dead.is_dead_letter and dead.attempt == 2
    assert dead.last_error == "lease expired at the attempt cap"
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w3")


def test_claim_scan_never_takes_a_lapsed_lease_at_the_cap(scope, time_travel):
    """SPEC: Repeated expiry dead-letters at the cap (left to the reaper)."""
    todo = claimed(scope, "w1", max_attempts=1)
    time_travel(todo.id, lease_expires_at=-1000)
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w2")


# --- Bounded retries and backoff ------------------------------------------------


def test_fail_below_the_cap_parks_the_todo_in_a_retry_window(scope):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters"""
    todo = claimed(scope, "w1")
    failed = store.fail_todo(scope, todo.id, "w1", error="flaky network")
    assert failed.state == "failed" and failed.is_retry_scheduled
    assert failed.lease_expires_at is None
    assert failed.last_error == "flaky network"
    assert failed.next_retry_at - failed.updated_at == timedelta(seconds=30)
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w2")
    assert store.requeue_due_retries() == []


def test_fail_at_the_cap_dead_letters_without_a_window(scope):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters"""
    todo = claimed(scope, "w1", max_attempts=1)
    failed = store.fail_todo(scope, todo.id, "w1", error="fatal")
    assert failed.state == "failed" and failed.next_retry_at is None
    assert failed.is_dead_letter and failed.lease_expires_at is None


@pytest.mark.parametrize(
    "attempt, backoff_seconds",
    [(1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 900), (7, 900), (60, 900)],
)
def test_backoff_doubles_from_30_seconds_and_caps_at_15_minutes(
    scope, attempt, backoff_seconds
):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters"""
    todo = new(scope, max_attempts=100)
    set_attempt(todo.id, attempt - 1)
    taken = store.claim_todo(scope, todo.id, "w1")
    assert taken.attempt == attempt
    failed = store.fail_todo(scope, todo.id, "w1")
    assert failed.next_retry_at - failed.updated_at == timedelta(
        seconds=backoff_seconds
    )


def test_retries_are_bounded_by_max_attempts(scope, time_travel):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters"""
    todo = new(scope, max_attempts=3)
    for attempt in (1, 2, 3):
        taken = store.claim_next(scope, "w1")
        assert (taken.id, taken.attempt) == (todo.id, attempt)
        failed = store.fail_todo(scope, todo.id, "w1", error=f"try {attempt}")
        if failed.next_retry_at is not None:
            time_travel(todo.id, next_retry_at=-3600)
    assert failed.is_dead_letter
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1")


def test_retry_scheduler_requeues_an_elapsed_backoff(scope, time_travel):
    """SPEC: Elapsed backoff re-queues"""
    todo = parked(scope, time_travel)
    time_travel(todo.id, next_retry_at=-31)
    moved = store.requeue_due_retries()
    assert [(m.id, m.endpoint_id, m.state) for m in moved] == [
        (todo.id, todo.endpoint_id, "pending")
    ]
    again = store.get_todo(scope, todo.id)
    assert (again.state, again.owner, again.lease_expires_at, again.next_retry_at) == (
        "pending",
        None,
        None,
        None,
    )
    assert again.attempt == 1
    assert store.claim_next(scope, "w2").attempt == 2


def test_claim_scan_takes_a_due_retry_directly(scope, time_travel):
    """SPEC: Elapsed backoff re-queues (a claim after the window takes it)."""
    todo = parked(scope, time_travel)
    time_travel(todo.id, next_retry_at=-31)
    taken = store.claim_next(scope, "w2")
    assert (taken.id, taken.state, taken.attempt) == (todo.id, "claimed", 2)
    assert taken.next_retry_at is None
    # The elapsed window, then the claim: each its own SPEC transition.
    assert history(todo.id)[-2:] == [("failed", "pending"), ("pending", "claimed")]


def test_claim_todo_takes_a_due_retry_directly(scope, time_travel):
    """SPEC: Elapsed backoff re-queues"""
    todo = parked(scope, time_travel)
    time_travel(todo.id, next_retry_at=-31)
    assert store.claim_todo(scope, todo.id, "w2").state == "claimed"


# --- Release --------------------------------------------------------------------


def test_release_hands_the_lease_back_now(scope):
    """SPEC: Claimed todo is invisible to other consumers (until the owner releases)."""
    todo = claimed(scope, "w1")
    released = store.release_todo(scope, todo.id, "w1")
    assert (released.state, released.owner, released.lease_expires_at) == (
        "pending",
        None,
        None,
    )
    assert released.attempt == 1
    assert store.claim_next(scope, "w2").attempt == 2


def test_release_at_the_cap_dead_letters_like_an_expiry(scope):
    """SPEC: Repeated expiry dead-letters at the cap (release = expiry now)."""
    todo = claimed(scope, "w1", max_attempts=1)
    released = store.release_todo(scope, todo.id, "w1")
    assert released.is_dead_letter


def test_operator_release_frees_anyones_claim(scope):
    """SPEC requirement: Endpoint Ownership (operator twins)."""
    todo = claimed(scope, "stuck")
    released = store.release_todo_any_endpoint(todo.id, actor="ops")
    assert released.state == "pending"
    assert store.todo_events_any_endpoint(todo.id)[-1].actor == "ops"
    with pytest.raises(store.Conflict):
        store.release_todo_any_endpoint(todo.id)


# --- Explicit retry -------------------------------------------------------------


def test_explicit_retry_requeues_a_dead_letter(scope):
    """SPEC: Terminal states are final (only an explicit retry re-queues)."""
    todo = dead_letter(scope)
    retried = store.retry_todo(scope, todo.id, actor="agent-x")
    assert (retried.state, retried.owner, retried.next_retry_at) == (
        "pending",
        None,
        None,
    )
    assert history(todo.id)[-1] == ("failed", "pending")


def test_explicit_retry_overrides_an_open_window(scope, time_travel):
    """SPEC: Fail below cap schedules a backoff retry, at cap dead-letters"""
    todo = parked(scope, time_travel)
    retried = store.retry_todo(scope, todo.id)
    assert retried.state == "pending" and retried.next_retry_at is None
    assert store.claim_next(scope, "w2").id == todo.id


def test_retry_of_a_dead_letter_conflicts_when_a_live_todo_holds_its_key(scope):
    """SPEC: A terminal todo does not block a new one (and the retry cannot collide)."""
    old = dead_letter(scope, idempotency_key="delivery-1")
    fresh = new(scope, idempotency_key="delivery-1")
    with transaction.atomic(), pytest.raises(store.Conflict) as caught:
        store.retry_todo(scope, old.id)
    assert caught.value.detail == store.DUPLICATE_ON_RETRY
    # The caller's transaction is still usable, and nothing moved.
    assert store.get_todo(scope, old.id).is_dead_letter
    assert store.get_todo(scope, fresh.id).state == "pending"
    with pytest.raises(store.Conflict):
        store.retry_todo_any_endpoint(old.id)


def test_operator_retry_requeues_any_endpoints_dead_letter(scope):
    """SPEC requirement: Endpoint Ownership (operator twins)."""
    todo = dead_letter(scope)
    assert store.retry_todo_any_endpoint(todo.id).state == "pending"


# --- Dedup ----------------------------------------------------------------------


def _live_pending(scope, time_travel, key):
    return new(scope, idempotency_key=key)


def _live_claimed(scope, time_travel, key):
    return claimed(scope, idempotency_key=key)


def _live_parked(scope, time_travel, key):
    return parked(scope, time_travel, idempotency_key=key)


@pytest.mark.parametrize(
    "make_live",
    [_live_pending, _live_claimed, _live_parked],
    ids=["pending", "claimed", "parked-retry"],
)
def test_duplicate_delivery_collapses_onto_the_live_todo(scope, time_travel, make_live):
    """SPEC: Duplicate delivery collapses to one todo"""
    live = make_live(scope, time_travel, "gh-delivery-1")
    again, created = store.create_todo(
        scope, queue="q", idempotency_key="gh-delivery-1", title="redelivered"
    )
    assert not created
    assert again.id == live.id
    assert count_todos(scope.endpoint_id) == 1
    assert history(live.id)[0] == (None, "pending")
    assert [e for e in history(live.id) if e == (None, "pending")] == [
        (None, "pending")
    ]


def _terminal_done(scope, key):
    todo = claimed(scope, idempotency_key=key)
    return store.complete_todo(scope, todo.id, "w1")


def _terminal_dead(scope, key):
    return dead_letter(scope, idempotency_key=key)


@pytest.mark.parametrize(
    "make_terminal", [_terminal_done, _terminal_dead], ids=["done", "dead-letter"]
)
def test_a_terminal_todo_does_not_block_a_new_one(scope, make_terminal):
    """SPEC: A terminal todo does not block a new one"""
    old = make_terminal(scope, "gh-delivery-2")
    fresh, created = store.create_todo(
        scope, queue="q", idempotency_key="gh-delivery-2"
    )
    assert created and fresh.id != old.id and fresh.state == "pending"
    again, created = store.create_todo(
        scope, queue="q", idempotency_key="gh-delivery-2"
    )
    assert not created and again.id == fresh.id


@pytest.mark.parametrize("requeue", ["scheduler", "due-claim", "manual-retry"])
def test_redelivery_during_a_backoff_window_collapses_then_requeues(
    scope, time_travel, requeue
):
    """SPEC: Redelivery during a backoff window does not duplicate"""
    live = parked(scope, time_travel, idempotency_key="gh-delivery-3")
    again, created = store.create_todo(
        scope, queue="q", idempotency_key="gh-delivery-3"
    )
    assert not created and again.id == live.id
    assert count_todos(scope.endpoint_id) == 1
    if requeue == "scheduler":
        time_travel(live.id, next_retry_at=-31)
        assert [m.id for m in store.requeue_due_retries()] == [live.id]
    elif requeue == "due-claim":
        time_travel(live.id, next_retry_at=-31)
        assert store.claim_next(scope, "w2").id == live.id
    else:
        assert store.retry_todo(scope, live.id).state in {"pending"}
    assert store.get_todo(scope, live.id).state in {"pending", "claimed"}
    assert count_todos(scope.endpoint_id) == 1
    # Still the one live row for its key.
    assert not store.create_todo(scope, queue="q", idempotency_key="gh-delivery-3")[1]


def test_a_null_idempotency_key_never_dedups(scope):
    """SPEC: Duplicate delivery collapses to one todo (a null key never dedups)."""
    first, created_first = store.create_todo(scope, queue="q", idempotency_key=None)
    second, created_second = store.create_todo(scope, queue="q", idempotency_key=None)
    assert created_first and created_second and first.id != second.id


def test_same_delivery_on_two_endpoints_yields_two_todos(scope, other_scope):
    """SPEC: Same delivery routed to two endpoints yields two todos"""
    mine, created_mine = store.create_todo(scope, queue="github", idempotency_key="d-9")
    theirs, created_theirs = store.create_todo(
        other_scope, queue="github", idempotency_key="d-9"
    )
    assert created_mine and created_theirs and mine.id != theirs.id
    assert (mine.endpoint_id, theirs.endpoint_id) == (
        scope.endpoint_id,
        other_scope.endpoint_id,
    )


def test_redelivery_to_two_targets_dedups_only_within_each(endpoint, other_endpoint):
    """SPEC: Redelivery to one target dedups only within that target"""
    outcomes = [
        store.create_todo_any_endpoint(
            target.id, queue="github", idempotency_key="d-10"
        )
        for _delivery in range(2)
        for target in (endpoint, other_endpoint)
    ]
    assert [created for _, created in outcomes] == [True, True, False, False]
    assert outcomes[2][0].id == outcomes[0][0].id
    assert outcomes[3][0].id == outcomes[1][0].id
    assert count_todos(endpoint.id) == 1 and count_todos(other_endpoint.id) == 1


# --- Tenant isolation ------------------------------------------------------------


def test_cross_endpoint_queue_collision_is_isolated(scope, other_scope):
    """SPEC: Cross-endpoint queue collision is isolated"""
    theirs = new(other_scope, queue="reviews")
    assert store.list_todos(scope, queue="reviews").todos == []
    assert store.list_todos(scope).todos == []
    assert store.pending_doorbell_todos(scope) == []
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1", queue="reviews")
    with pytest.raises(store.NotFound):
        store.claim_todo(scope, theirs.id, "w1")
    assert store.get_todo(other_scope, theirs.id).state == "pending"
    assert [t.id for t in store.pending_doorbell_todos(other_scope)] == [theirs.id]


SCOPED_CALLS = {
    "get_todo": (lambda s, t: store.get_todo(s, t), "pending"),
    "claim_todo": (lambda s, t: store.claim_todo(s, t, "w1"), "pending"),
    "heartbeat": (lambda s, t: store.heartbeat(s, t, "w1"), "claimed"),
    "complete_todo": (lambda s, t: store.complete_todo(s, t, "w1"), "claimed"),
    "fail_todo": (lambda s, t: store.fail_todo(s, t, "w1"), "claimed"),
    "release_todo": (lambda s, t: store.release_todo(s, t, "w1"), "claimed"),
    "retry_todo": (lambda s, t: store.retry_todo(s, t), "failed"),
}


@pytest.mark.parametrize("call_name", SCOPED_CALLS)
@pytest.mark.parametrize("foreign_state", ["pending", "claimed", "failed"])
def test_a_foreign_todo_id_is_indistinguishable_from_a_never_minted_one(
    scope, other_scope, call_name, foreign_state
):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one"""
    call, _ = SCOPED_CALLS[call_name]
    if foreign_state == "pending":
        theirs = new(other_scope)
    elif foreign_state == "claimed":
        theirs = claimed(other_scope, "w1")
    else:
        theirs = dead_letter(other_scope)
    before = store.get_todo(other_scope, theirs.id)
    with pytest.raises(store.NotFound) as foreign:
        call(scope, theirs.id)
    with pytest.raises(store.NotFound) as never_minted:
        call(scope, NEVER_MINTED)
    assert type(foreign.value) is type(never_minted.value)
    assert foreign.value.detail == never_minted.value.detail
    assert str(foreign.value) == str(never_minted.value)
    assert store.get_todo(other_scope, theirs.id) == before


@pytest.mark.parametrize("call_name", SCOPED_CALLS)
def test_the_same_call_in_the_owning_scope_succeeds(scope, call_name):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one

    (control: the foreign-id test above would fail if the call did nothing)
    """
    call, state = SCOPED_CALLS[call_name]
    todo = {"pending": new, "claimed": claimed, "failed": dead_letter}[state](scope)
    assert call(scope, todo.id).id == todo.id


ANY_ENDPOINT_CALLS = [
    lambda t: store.get_todo_any_endpoint(t),
    lambda t: store.claim_todo_any_endpoint(t, "w1"),
    lambda t: store.release_todo_any_endpoint(t),
    lambda t: store.retry_todo_any_endpoint(t),
]


@pytest.mark.parametrize("bad_id", MALFORMED_IDS)
def test_a_malformed_todo_id_is_not_found_never_a_database_error(scope, bad_id):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one"""
    new(scope)
    for call, _ in SCOPED_CALLS.values():
        with pytest.raises(store.NotFound):
            call(scope, bad_id)
    for call in ANY_ENDPOINT_CALLS:
        with pytest.raises(store.NotFound):
            call(bad_id)
    assert store.todo_events_any_endpoint(bad_id) == []
    # The connection is healthy: no statement failed.
    assert store.list_todos(scope).todos


@pytest.mark.parametrize("endpoint_id", ["not-a-uuid", "", None, NEVER_MINTED])
def test_a_malformed_or_unknown_endpoint_scope_owns_nothing(scope, endpoint_id):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one

    An absent or malformed endpoint id is a scope that owns nothing: NotFound on
    single-row and mutation paths, empty lists, never a database type error.
    """
    todo = new(scope)
    nobody = store.Scope(endpoint_id)
    for call, _ in SCOPED_CALLS.values():
        with pytest.raises(store.NotFound):
            call(nobody, todo.id)
    with pytest.raises(store.NotFound):
        store.claim_next(nobody, "w1")
    with pytest.raises(store.NotFound):
        store.create_todo(nobody, queue="q")
    assert store.list_todos(nobody) == store.Page([], None)
    assert store.pending_doorbell_todos(nobody) == []
    assert store.get_todo(scope, todo.id).state == "pending"


def test_operator_twins_see_every_endpoint(scope, other_scope):
    """SPEC requirement: Endpoint Ownership (operator twins see every tenant)."""
    mine, theirs = new(scope), new(other_scope)
    assert store.get_todo_any_endpoint(theirs.id) == theirs
    page = store.list_todos_any_endpoint(newest_first=False)
    assert [t.id for t in page.todos] == [mine.id, theirs.id]
    only_theirs = store.list_todos_any_endpoint(endpoint_id=other_scope.endpoint_id)
    assert [t.id for t in only_theirs.todos] == [theirs.id]
    assert store.claim_todo_any_endpoint(theirs.id, "ops").owner == "ops"


def test_sweeps_span_every_endpoint_and_name_each_owner(
    scope, other_scope, time_travel
):
    """SPEC: Background sweep spans tenants without a scope"""
    lapsed = [claimed(s, "w1") for s in (scope, other_scope)]
    due = [parked(s, time_travel) for s in (scope, other_scope)]
    for todo in lapsed:
        time_travel(todo.id, lease_expires_at=-1000)
    for todo in due:
        time_travel(todo.id, next_retry_at=-31)
    reaped = {(m.id, m.endpoint_id) for m in store.reap_expired()}
    requeued = {(m.id, m.endpoint_id) for m in store.requeue_due_retries()}
    assert reaped == {(t.id, t.endpoint_id) for t in lapsed}
    assert requeued == {(t.id, t.endpoint_id) for t in due}


# --- Zero-row updates -----------------------------------------------------------


def test_a_zero_row_update_is_classified_not_swallowed(scope):
    """SPEC: Zero-row update is classified, not swallowed"""
    todo = new(scope)
    with pytest.raises(store.Conflict) as present:
        store.fail_todo(scope, todo.id, "w1")
    assert (present.value.todo_id, present.value.state) == (todo.id, "pending")
    with pytest.raises(store.NotFound) as absent:
        store.fail_todo(scope, str(uuid.uuid4()), "w1")
    assert absent.value.detail == "no such todo"


# --- History --------------------------------------------------------------------


def test_every_transition_appends_a_history_row(scope, time_travel):
    """SPEC: Only defined transitions are honored (each one is audited)."""
    todo = new(scope, max_attempts=3)
    store.claim_next(scope, "w1")
    store.heartbeat(scope, todo.id, "w1")
    store.fail_todo(scope, todo.id, "w1", error="flaky")
    time_travel(todo.id, next_retry_at=-31)
    store.requeue_due_retries()
    store.claim_next(scope, "w2")
    store.release_todo(scope, todo.id, "w2")
    store.claim_next(scope, "w3")
    time_travel(todo.id, lease_expires_at=-1000)
    store.reap_expired()
    store.retry_todo(scope, todo.id, actor="ops")
    store.claim_todo(scope, todo.id, "w4")
    store.complete_todo(scope, todo.id, "w4", result={"ok": 1})
    events = store.todo_events_any_endpoint(todo.id)
    assert [(e.from_state, e.to_state, e.attempt, e.actor) for e in events] == [
        (None, "pending", 0, ""),
        ("pending", "claimed", 1, "w1"),
        ("claimed", "claimed", 1, "w1"),
        ("claimed", "failed", 1, "w1"),
        ("failed", "pending", 1, "system:retry-scheduler"),
        ("pending", "claimed", 2, "w2"),
        ("claimed", "pending", 2, "w2"),
        ("pending", "claimed", 3, "w3"),
        ("claimed", "failed", 3, "system:reaper"),
        ("failed", "pending", 3, "ops"),
        ("pending", "claimed", 4, "w4"),
        ("claimed", "done", 4, "w4"),
    ]
    assert events[3].error == "flaky"
    assert all(e.endpoint_id == todo.endpoint_id for e in events)


def test_a_rejected_transition_writes_no_history(scope):
    """SPEC: Zero-row update is classified, not swallowed"""
    todo = new(scope)
    with pytest.raises(store.Conflict):
        store.complete_todo(scope, todo.id, "w1")
    assert history(todo.id) == [(None, "pending")]


# --- Listing --------------------------------------------------------------------


def test_list_pages_oldest_first_with_a_keyset_cursor(scope):
    """SPEC requirement: Endpoint Ownership (ListTodos, keyset cursor)."""
    made = [new(scope, title=str(n)) for n in range(5)]
    seen, cursor = [], None
    for _page in range(3):
        page = store.list_todos(scope, limit=2, cursor=cursor)
        seen += [t.id for t in page.todos]
        cursor = page.next_cursor
    assert seen == [t.id for t in made]
    assert cursor is None


def test_list_filters_by_queue_and_state(scope, time_travel):
    """SPEC requirement: Todo Lifecycle State Machine (failed splits in two)."""
    pending = new(scope, queue="a")
    taken = claimed(scope, queue="b")
    waiting = parked(scope, time_travel, queue="b")
    dead = dead_letter(scope, queue="b")

    def ids(**filters):
        return [t.id for t in store.list_todos(scope, **filters).todos]

    assert ids(queue="a") == [pending.id]
    assert ids(state="claimed") == [taken.id]
    assert ids(state="failed") == [waiting.id, dead.id]
    assert ids(state="retry_scheduled") == [waiting.id]
    assert ids(state="dead_letter") == [dead.id]
    assert ids(queue="b", state="pending") == []


@pytest.mark.parametrize(
    "bad",
    [
        {"limit": 0},
        {"limit": 201},
        {"state": "lost"},
        {"cursor": "garbage!"},
        {"cursor": "MjAyNnw="},
    ],
)
def test_list_rejects_bad_arguments_with_value_error(scope, bad):
    """CONTRACT §5: bad list arguments are the caller's error, not the database's."""
    with pytest.raises(ValueError):
        store.list_todos(scope, **bad)


# --- Statement timeout ----------------------------------------------------------


def test_every_store_connection_runs_under_the_statement_timeout(db, settings):
    """SPEC requirement: Database Operation Standards (every call honours a timeout)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"
        )
        (timeout_ms,) = cursor.fetchone()
    assert timeout_ms == settings.STATEMENT_TIMEOUT_MS > 0


@pytest.mark.django_db(transaction=True)
def test_a_store_call_stuck_past_the_timeout_raises_unavailable(make_endpoint):
    """SPEC requirement: Database Operation Standards (context/timeout honoured).

    A statement that waits past the timeout is cancelled, never left hanging.
    """
    import psycopg
    from django.db import connections

    scope = store.Scope.for_endpoint(make_endpoint("timeouts"))
    todo = claimed(scope, "w1")
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params) as locker:
        locker.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE", [todo.id])
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = 200")
            with pytest.raises(store.Unavailable) as raised:
                store.heartbeat(scope, todo.id, "w1")
        finally:
            # The connection goes back to the pool: the next user (the
            # teardown's TRUNCATE) must not inherit 200 ms.
            with connection.cursor() as cursor:
                cursor.execute("RESET statement_timeout")
            connection.close()
        locker.rollback()
    # It says what happened: the row was busy, the database is up.
    assert isinstance(raised.value, store.TimedOut) and raised.value.lock_wait
    assert raised.value.detail.startswith("the todo is busy")
    assert store.heartbeat(scope, todo.id, "w1").owner == "w1"


@pytest.mark.django_db(transaction=True)
def test_a_store_call_stopped_by_a_deadlock_says_the_database_is_busy(
    make_endpoint,
):
    """Database Operation Standards: a busy database is not an outage. A
    statement PostgreSQL stops to break a lock cycle raises Deadlocked, whose
    answer (503, Retry-After) says so, not "database unavailable"."""
    from tests.support import deadlocked_heartbeat
    from todos.api.plumbing import api_error_for

    scope = store.Scope.for_endpoint(make_endpoint("deadlocks"))

    _, raised = deadlocked_heartbeat(scope)

    assert isinstance(raised, store.Deadlocked) and store.is_deadlock(raised)
    answer = api_error_for(raised)
    assert answer.status == 503 and answer.headers["Retry-After"] == "1"
    assert answer.detail.startswith("the database is busy")
    assert "unavailable" not in answer.detail and "unavailable" not in str(raised)


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_no_store_call_mapped_is_answered_busy_too(make_endpoint):
    """An ORM statement stopped by a deadlock raises Django's OperationalError,
    not Deadlocked: the JSON API and SQS still answer that the database is
    busy, not that it is unavailable."""
    from django.db import OperationalError

    from tests.support import LOCK_TODO, deadlocked
    from todos.api.plumbing import api_error_for
    from todos.models import Todo
    from todos.sqs import protocol

    scope = store.Scope.for_endpoint(make_endpoint("orm-deadlocks"))
    todo = claimed(scope, "w1")

    def lock():
        with transaction.atomic():
            return list(Todo.objects.select_for_update().filter(id=todo.id))

    raised = deadlocked(lock, LOCK_TODO, [todo.id])["raised"]

    assert isinstance(raised, OperationalError) and store.is_deadlock(raised)
    answer = api_error_for(raised)
    assert answer.status == 503 and answer.detail.startswith("the database is busy")
    sqs = protocol.error_for(raised)
    assert sqs.shape == "ServiceUnavailable"
    assert sqs.message.startswith("the database is busy")


# --- Schema ---------------------------------------------------------------------


def index_definition(name):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef(%s::regclass)", [name])
        return cursor.fetchone()[0]


def test_dedupe_index_predicate_is_exactly_the_live_row_definition(db):
    """SPEC: Redelivery during a backoff window does not duplicate

    The partial UNIQUE index's predicate is the SPEC's live-row definition.
    """
    assert index_definition("todos_dedupe_idx") == (
        "CREATE UNIQUE INDEX todos_dedupe_idx ON public.todos USING btree"
        " (endpoint_id, idempotency_key) WHERE ((idempotency_key IS NOT NULL)"
        " AND (state <> 'done'::text)"
        " AND ((state <> 'failed'::text) OR (next_retry_at IS NOT NULL)))"
    )


def test_claim_index_holds_only_pending_rows(db):
    """SPEC: Claim never scans terminal rows

    It leads with the lane a claim reads (endpoint, queue, assignee or ''),
    then priority and available_at: a claim never walks another lane's backlog.
    """
    assert index_definition("todos_pending_claim_idx").endswith(
        "(endpoint_id, queue, COALESCE(assignee, ''::text), priority, available_at)"
        " WHERE (state = 'pending'::text)"
    )


def test_live_row_predicate_equals_the_dedupe_index_predicate(db):
    """SPEC: Redelivery during a backoff window does not duplicate

    The store's one LIVE_ROW predicate, as PostgreSQL normalizes it, is the
    dedupe index's predicate (beside its NULL-key clause).
    """
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE live_probe (LIKE todos)")
        cursor.execute(
            "CREATE INDEX live_probe_idx ON live_probe (endpoint_id, idempotency_key)"
            f" WHERE idempotency_key IS NOT NULL AND {sql.LIVE_ROW}"
        )
    probe = index_definition("live_probe_idx").split(" WHERE ", 1)[1]
    dedupe = index_definition("todos_dedupe_idx").split(" WHERE ", 1)[1]
    assert probe == dedupe


@pytest.mark.parametrize("state", ["lost", "PENDING", "retrying"])
def test_the_state_check_rejects_states_outside_the_four(scope, state):
    """SPEC: Only defined transitions are honored (exactly four states)."""
    todo = new(scope)
    with (
        pytest.raises(IntegrityError),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE todos SET state = %s WHERE id = %s", [state, todo.id])
    assert store.get_todo(scope, todo.id).state == "pending"


def test_every_todo_is_pinned_to_an_endpoint(db):
    """SPEC: Cross-endpoint queue collision is isolated (endpoint_id NOT NULL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT is_nullable, data_type FROM information_schema.columns"
            " WHERE table_name = 'todos' AND column_name = 'endpoint_id'"
        )
        assert cursor.fetchone() == ("NO", "uuid")


def test_a_new_todo_was_updated_when_it_was_created(scope):
    todo = new(scope)

    assert todo.updated_at == todo.created_at
