"""Store v2 (CONTRACT §10): lease tokens, batches, delayed todos, queue settings.

Real PostgreSQL; time moves by editing timestamps (``time_travel``).
"""

import json
import threading
import time
from collections import Counter

import psycopg
import pytest
from django.db import connection, connections

from tests.conftest import shift
from todos import store

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def row(todo_id):
    return store.get_todo_any_endpoint(todo_id)


def history(todo_id):
    return [
        (event.from_state, event.to_state)
        for event in store.todo_events_any_endpoint(todo_id)
    ]


def _raw_connection():
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


def _rings(listener, expected, timeout=5.0):
    deadline = time.monotonic() + timeout
    rings = []
    while len(rings) < expected and time.monotonic() < deadline:
        remaining = deadline - time.monotonic()
        for notify in listener.notifies(timeout=remaining, stop_after=1):
            rings.append(json.loads(notify.payload))
    rings.extend(json.loads(n.payload) for n in listener.notifies(timeout=0.3))
    return rings


# --- Lease tokens (fencing) -----------------------------------------------------


def test_every_claim_mints_a_fresh_lease_token(scope, time_travel):
    """CONTRACT §10: every claim mints a fresh lease_token."""
    todo = new(scope)
    first = store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-600)
    second = store.claim_next(scope, "w2")

    assert first.lease_token and second.lease_token
    assert first.lease_token != second.lease_token
    assert len(first.lease_token) <= 64 and first.lease_token.isalnum()
    assert second.to_dict()["lease_token"] == second.lease_token


def test_a_stale_lease_token_is_superseded_and_changes_nothing(scope, time_travel):
    """CONTRACT §10: a superseded token → 409 (LeaseSuperseded), lease untouched."""
    todo = new(scope)
    stale = store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-600)
    current = store.claim_next(scope, "w1")  # same worker name, new lease

    for call in (
        lambda: store.complete_todo(
            scope, todo.id, "w1", lease_token=stale.lease_token
        ),
        lambda: store.fail_todo(scope, todo.id, "w1", lease_token=stale.lease_token),
        lambda: store.heartbeat(scope, todo.id, "w1", lease_token=stale.lease_token),
        lambda: store.release_todo(scope, todo.id, "w1", lease_token=stale.lease_token),
    ):
        with pytest.raises(store.LeaseSuperseded) as caught:
            call()
        assert isinstance(caught.value, store.Conflict)
        assert caught.value.todo_id == todo.id

    after = row(todo.id)
    assert after.state == "claimed"
    assert after.lease_token == current.lease_token
    assert after.lease_expires_at == current.lease_expires_at
    assert history(todo.id)[-1] == ("claimed", "claimed")  # the re-claim, no more


def test_a_claim_nobody_received_leaves_the_todo_as_the_claim_found_it(scope):
    """CONTRACT §16: a claim its client never received is handed back pending,
    its attempt not spent, even at the attempt cap, and its history says so."""
    todo = new(scope, max_attempts=1)
    claimed = store.claim_next(scope, "w1")

    handed_back = store.unclaim(scope, claimed)

    assert handed_back.state == "pending" and handed_back.attempt == 0
    assert handed_back.owner is None and handed_back.outcome == "pending"
    assert row(todo.id).state == "pending"
    events = store.todo_events_any_endpoint(todo.id)
    assert [(e.from_state, e.to_state, e.attempt) for e in events[-2:]] == [
        ("pending", "claimed", 1),
        ("claimed", "pending", 0),
    ]
    assert events[-1].error == store.lifecycle.NOT_RECEIVED
    again = store.claim_next(scope, "w2")
    assert again.id == todo.id and again.attempt == 1


def test_a_redelivery_nobody_received_is_pending_with_the_earlier_attempt(
    scope, time_travel
):
    todo = new(scope)
    store.claim_next(scope, "crashed")
    time_travel(todo.id, lease_expires_at=-600)
    redelivered = store.claim_next(scope, "w2")
    assert redelivered.attempt == 2

    handed_back = store.unclaim(scope, redelivered)

    assert (handed_back.state, handed_back.attempt) == ("pending", 1)


def test_an_unclaim_of_a_lease_taken_over_changes_nothing(scope, time_travel):
    todo = new(scope)
    first = store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-600)
    current = store.claim_next(scope, "w1")

    with pytest.raises(store.Conflict):
        store.unclaim(scope, first)

    after = row(todo.id)
    assert after.state == "claimed" and after.attempt == 2
    assert after.lease_token == current.lease_token


def test_an_unclaim_under_a_cancel_request_ends_the_todo_canceled(scope):
    todo = new(scope)
    claimed = store.claim_next(scope, "w1")
    store.cancel_todo(scope, todo.id, reason="not needed")

    handed_back = store.unclaim(scope, claimed)

    assert handed_back.state == "done" and handed_back.outcome == "canceled"
    assert handed_back.attempt == 0


def test_an_unclaim_of_another_endpoints_todo_is_not_found(scope, other_scope):
    new(scope)
    claimed = store.claim_next(scope, "w1")

    with pytest.raises(store.NotFound):
        store.unclaim(other_scope, claimed)
    assert row(claimed.id).state == "claimed"


def test_heartbeat_keeps_the_lease_token(scope):
    """CONTRACT §10: heartbeat extends the lease and keeps its token."""
    new(scope)
    claimed = store.claim_next(scope, "w1", lease_seconds=30)
    beat = store.heartbeat(
        scope, claimed.id, None, lease_token=claimed.lease_token, lease_seconds=600
    )
    assert beat.lease_token == claimed.lease_token
    assert beat.lease_expires_at > claimed.lease_expires_at
    done = store.complete_todo(scope, claimed.id, None, lease_token=claimed.lease_token)
    assert done.state == "done"


def test_heartbeat_of_zero_seconds_is_refused_not_a_release(scope):
    """STORE-V2: heartbeat(lease_seconds=0) is not release (SQS maps 0 to release)."""
    new(scope)
    claimed = store.claim_next(scope, "w1")
    with pytest.raises(ValueError):
        store.heartbeat(
            scope, claimed.id, "w1", lease_token=claimed.lease_token, lease_seconds=0
        )
    assert row(claimed.id).state == "claimed"


def test_a_complete_repeated_with_the_winning_token_returns_the_done_todo(scope):
    """CONTRACT §10: a retried acknowledgement answers 200 with the todo."""
    new(scope)
    claimed = store.claim_next(scope, "w1")
    first = store.complete_todo(
        scope, claimed.id, None, lease_token=claimed.lease_token, result={"n": 1}
    )
    again = store.complete_todo(
        scope, claimed.id, None, lease_token=claimed.lease_token, result={"n": 2}
    )
    assert again == first
    assert again.result == {"n": 1}
    assert history(claimed.id).count(("claimed", "done")) == 1


def test_a_complete_repeated_with_a_stale_token_is_superseded(scope, time_travel):
    """CONTRACT §10: a repeated complete with any other token → 409."""
    todo = new(scope)
    stale = store.claim_next(scope, "w1")
    time_travel(todo.id, lease_expires_at=-600)
    winner = store.claim_next(scope, "w2")
    store.complete_todo(scope, todo.id, None, lease_token=winner.lease_token)

    with pytest.raises(store.LeaseSuperseded):
        store.complete_todo(scope, todo.id, None, lease_token=stale.lease_token)
    with pytest.raises(store.LeaseSuperseded):
        store.complete_todo(scope, todo.id, None, lease_token="not-a-token")


def test_the_lease_token_alone_authorizes_without_a_worker(scope):
    """STORE-V2: with a lease_token, worker may be None (SQS has no worker names)."""
    new(scope)
    claimed = store.claim_next(scope, "w1")
    failed = store.fail_todo(
        scope, claimed.id, None, error="boom", lease_token=claimed.lease_token
    )
    assert failed.state == "failed" and failed.next_retry_at is not None
    # The history names who acted: the worker that holds the lease.
    assert store.todo_events_any_endpoint(claimed.id)[-1].actor == "w1"


@pytest.mark.parametrize("op", ["complete", "release", "heartbeat"])
def test_an_acknowledgement_by_lease_token_alone_records_the_worker_that_held_it(
    scope, op
):
    """A complete (or release, heartbeat) sent with only a lease_token is in
    the history with who did it, not an empty actor; a release below the cap
    clears the owner, and still names the holder."""
    new(scope)
    claimed = store.claim_next(scope, "bot-7")
    moves = {
        "complete": store.complete_todo,
        "release": store.release_todo,
        "heartbeat": store.heartbeat,
    }
    moves[op](scope, claimed.id, None, lease_token=claimed.lease_token)

    assert store.todo_events_any_endpoint(claimed.id)[-1].actor == "bot-7"


def test_without_a_token_the_owner_check_applies(scope):
    """SPEC: Only the lease owner may complete or fail (no token given)."""
    new(scope)
    claimed = store.claim_next(scope, "w1")
    with pytest.raises(store.Conflict) as caught:
        store.complete_todo(scope, claimed.id, "w2")
    assert not isinstance(caught.value, store.LeaseSuperseded)
    with pytest.raises(ValueError):
        store.complete_todo(scope, claimed.id, None)
    assert store.complete_todo(scope, claimed.id, "w1").state == "done"


def test_a_token_on_a_foreign_todo_is_not_found(scope, other_scope):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one."""
    new(other_scope)
    theirs = store.claim_next(other_scope, "w1")
    with pytest.raises(store.NotFound) as foreign:
        store.complete_todo(scope, theirs.id, None, lease_token=theirs.lease_token)
    with pytest.raises(store.NotFound) as never:
        store.complete_todo(scope, NEVER_MINTED, None, lease_token=theirs.lease_token)
    assert foreign.value.detail == never.value.detail
    assert row(theirs.id).state == "claimed"


# --- Batch claim ----------------------------------------------------------------


def test_claim_many_takes_up_to_the_limit_oldest_first(scope):
    """CONTRACT §10: a batch claim of 1–10 in one statement, in claim order."""
    made = [new(scope, title=f"t{n}") for n in range(4)]
    claimed = store.claim_many(scope, "w1", limit=3)
    assert [todo.id for todo in claimed] == [todo.id for todo in made[:3]]
    assert len({todo.lease_token for todo in claimed}) == 3
    assert all(todo.state == "claimed" and todo.owner == "w1" for todo in claimed)
    assert [t.id for t in store.claim_many(scope, "w1", limit=10)] == [made[3].id]
    assert store.claim_many(scope, "w1", limit=10) == []


@pytest.mark.parametrize("limit", [0, 11, -1])
def test_claim_many_refuses_a_limit_outside_1_to_10(scope, limit):
    with pytest.raises(ValueError):
        store.claim_many(scope, "w1", limit=limit)


def test_claim_many_takes_due_redeliveries_first(scope, time_travel):
    """SPEC: Crashed worker's todo is re-claimable (before fresh work)."""
    lapsed = new(scope, title="lapsed")
    store.claim_next(scope, "w0")
    time_travel(lapsed.id, lease_expires_at=-600)
    fresh = [new(scope, title=f"fresh {n}") for n in range(2)]

    claimed = store.claim_many(scope, "w1", limit=10)
    assert [todo.id for todo in claimed] == [lapsed.id, fresh[0].id, fresh[1].id]
    assert claimed[0].attempt == 2


def test_claim_many_respects_assignment_and_queue(scope):
    """SPEC: Direct assignment is respected (in a batch)."""
    mine = new(scope, assignee="w1")
    new(scope, assignee="w2")
    pool = new(scope)
    other_queue = new(scope, queue="other")

    claimed = store.claim_many(scope, "w1", limit=10, queue="q")
    assert {todo.id for todo in claimed} == {mine.id, pool.id}
    assert row(other_queue.id).state == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_batch_claim_under_16_concurrent_claimants_never_hands_a_todo_to_two(
    make_endpoint,
):
    """SPEC: Claimed todo is invisible to other consumers (16 batch claimants).

    The history is the witness: each todo has exactly one pending → claimed
    event, and every todo was claimed.
    """
    scope = store.Scope.for_endpoint(make_endpoint("racers"))
    items = [{"queue": "q", "title": f"t{n}"} for n in range(100)]
    made = [result[0].id for result in store.create_many(scope, items)]
    made += [result[0].id for result in store.create_many(scope, items)]
    claimed, errors, start = [], [], threading.Barrier(16)

    def claimant(index):
        try:
            start.wait()
            while True:
                batch = store.claim_many(scope, f"w{index}", limit=7)
                if not batch:
                    return
                claimed.extend((todo.id, f"w{index}") for todo in batch)
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimant, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert Counter(todo_id for todo_id, _ in claimed) == Counter(made)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT todo_id, count(*) FROM todo_events"
            " WHERE from_state = 'pending' AND to_state = 'claimed'"
            "   AND todo_id = ANY(%s::uuid[]) GROUP BY todo_id",
            [made],
        )
        events = dict(cursor.fetchall())
    assert len(events) == len(made)
    assert set(events.values()) == {1}
    owners = {str(t.id): t.owner for t in map(row, made)}
    assert owners == {todo_id: worker for todo_id, worker in claimed}


# --- Batch acknowledge ----------------------------------------------------------


def test_acknowledge_many_reports_each_outcome_in_order(scope, other_scope):
    """CONTRACT §10: per-action results (200/404/409/400), each action on its own."""
    for n in range(5):
        new(scope, title=f"t{n}")
    done, failed, beat, released, superseded = store.claim_many(scope, "w1", limit=5)
    pending = new(scope, title="never claimed")
    new(other_scope)
    foreign = store.claim_next(other_scope, "w1")

    results = store.acknowledge_many(
        scope,
        [
            store.Ack("complete", done.id, lease_token=done.lease_token, result=[1]),
            store.Ack("fail", failed.id, "w1", error="boom"),
            store.Ack(
                "heartbeat", beat.id, lease_token=beat.lease_token, lease_seconds=900
            ),
            store.Ack("release", released.id, lease_token=released.lease_token),
            store.Ack("complete", superseded.id, lease_token="stale"),
            store.Ack("complete", pending.id, "w1"),
            store.Ack("complete", NEVER_MINTED, "w1"),
            store.Ack("complete", foreign.id, lease_token=foreign.lease_token),
            store.Ack("complete", "not-a-uuid", "w1"),
            store.Ack("explode", done.id, "w1"),
            store.Ack("heartbeat", beat.id, "w1", lease_seconds=0),
        ],
    )

    assert [type(result).__name__ for result in results] == [
        "Todo",
        "Todo",
        "Todo",
        "Todo",
        "LeaseSuperseded",
        "Conflict",
        "NotFound",
        "NotFound",
        "NotFound",
        "ValueError",
        "ValueError",
    ]
    assert results[0].state == "done" and results[0].result == [1]
    assert results[1].state == "failed" and results[1].last_error == "boom"
    assert results[2].lease_expires_at > beat.lease_expires_at
    assert results[3].state == "pending" and results[3].owner is None
    assert results[6].detail == results[7].detail  # foreign ≡ never minted
    assert row(superseded.id).state == "claimed"
    assert row(foreign.id).state == "claimed"
    assert history(done.id)[-1] == ("claimed", "done")
    assert history(failed.id)[-1] == ("claimed", "failed")
    assert history(beat.id)[-1] == ("claimed", "claimed")
    assert history(released.id)[-1] == ("claimed", "pending")
    assert len(history(superseded.id)) == 2  # created, claimed: nothing added


ACTIONS = {
    "complete": {"result": {"answer": 42, "text": "é"}},
    "fail": {"error": "the disk is full"},
    "heartbeat": {
        "lease_seconds": 90,
        "progress": {"message": "three of ten", "fraction": 0.3},
        "checkpoint": [1],
    },
    "release": {"assignee": "w2", "note": "over to you", "checkpoint": {"at": 7}},
}
SHOWN = (
    "state",
    "owner",
    "assignee",
    "result",
    "last_error",
    "progress",
    "checkpoint",
    "note",
    "attempt",
)


@pytest.mark.parametrize("op", ACTIONS)
def test_one_acknowledgement_moves_a_todo_as_a_batch_of_them_does(scope, op):
    """One action runs ONE_ACK_SQL (scalars), more run ACK_SQL (arrays): the
    same statement but for how the actions arrive, so the same outcome."""
    for n in range(3):
        store.create_todo(scope, queue="q", title=f"t{n}")
    alone, *paired = store.claim_many(scope, "w1", limit=3, queue="q")
    extra = ACTIONS[op]

    def ack(todo):
        return store.Ack(op, todo.id, lease_token=todo.lease_token, **extra)

    (one,) = store.acknowledge_many(scope, [ack(alone)])
    batch = store.acknowledge_many(scope, [ack(todo) for todo in paired])
    for moved in (one, *batch):
        assert isinstance(moved, store.Todo), moved
    shown = [{name: getattr(t, name) for name in SHOWN} for t in (one, *batch)]
    assert shown[0] == shown[1] == shown[2]
    if op == "heartbeat":
        leases = [t.lease_expires_at - t.updated_at for t in (one, *batch)]
        assert {round(lease.total_seconds()) for lease in leases} == {90}


def test_acknowledge_many_with_one_todo_twice_moves_it_once(scope):
    new(scope)
    claimed = store.claim_next(scope, "w1")
    ack = store.Ack("complete", claimed.id, lease_token=claimed.lease_token)
    first, second = store.acknowledge_many(scope, [ack, ack])
    assert first.state == second.state == "done"
    assert history(claimed.id).count(("claimed", "done")) == 1


@pytest.mark.parametrize("size", [0, 101])
def test_acknowledge_many_refuses_a_batch_outside_1_to_100(scope, size):
    with pytest.raises(ValueError):
        store.acknowledge_many(scope, [store.Ack("complete", NEVER_MINTED, "w")] * size)


@pytest.mark.django_db(transaction=True)
def test_acknowledge_many_rings_for_each_released_todo(make_endpoint):
    """CONTRACT §10: each action keeps its own doorbell ring."""
    scope = store.Scope.for_endpoint(make_endpoint("ringer"))
    store.create_many(scope, [{"queue": "q"}] * 3)
    claimed = store.claim_many(scope, "w1", limit=3)
    listener = _raw_connection()
    try:
        listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
        store.acknowledge_many(
            scope, [store.Ack("release", t.id, "w1") for t in claimed]
        )
        rings = _rings(listener, 3)
    finally:
        listener.close()
    assert sorted(ring["id"] for ring in rings) == sorted(t.id for t in claimed)


# --- Batch create ---------------------------------------------------------------


def test_create_many_creates_each_item_in_order(scope):
    """CONTRACT §10: batch create, per-item results in order."""
    results = store.create_many(
        scope,
        [{"queue": "q", "title": f"t{n}", "payload": {"n": n}} for n in range(5)],
    )
    assert [created for _, created in results] == [True] * 5
    todos = [todo for todo, _ in results]
    assert [todo.payload for todo in todos] == [{"n": n} for n in range(5)]
    assert [t.id for t in store.claim_many(scope, "w", limit=10)] == [
        t.id for t in todos
    ]
    assert all(history(todo.id)[0] == (None, "pending") for todo in todos)


def test_create_many_collapses_a_duplicate_inside_one_batch(scope):
    """SPEC: Duplicate delivery collapses to one todo (within one batch)."""
    results = store.create_many(
        scope,
        [
            {"queue": "q", "title": "first", "idempotency_key": "k"},
            {"queue": "q", "title": "other"},
            {"queue": "q", "title": "second", "idempotency_key": "k"},
        ],
    )
    (first, made), (_, other_made), (second, second_made) = results
    assert (made, other_made, second_made) == (True, True, False)
    assert second.id == first.id and second.title == "first"


def test_create_many_collapses_onto_a_todo_of_an_earlier_batch(scope):
    """SPEC: Duplicate delivery collapses to one todo (across batches)."""
    [(earlier, _)] = store.create_many(scope, [{"queue": "q", "idempotency_key": "k"}])
    [(again, created), (fresh, fresh_created)] = store.create_many(
        scope,
        [
            {"queue": "q", "idempotency_key": "k"},
            {"queue": "q", "idempotency_key": "j"},
        ],
    )
    assert (again.id, created) == (earlier.id, False)
    assert fresh_created and fresh.id != earlier.id


def test_create_many_reports_bad_items_and_creates_the_rest(make_endpoint):
    scope = store.Scope.for_endpoint(make_endpoint("narrow", queues=["q"]))
    results = store.create_many(
        scope,
        [
            {"queue": "q", "title": "ok"},
            {"queue": "elsewhere"},
            {"queue": "q", "max_attempts": 0},
            {"queue": "q", "delay_seconds": 43_201},
            {"queue": "q", "colour": "red"},
            {"queue": ""},
        ],
    )
    assert results[0][1] is True
    assert isinstance(results[1], store.QueueNotGranted)
    assert all(isinstance(result, ValueError) for result in results[2:])


@pytest.mark.parametrize("size", [0, 101])
def test_create_many_refuses_a_batch_outside_1_to_100(scope, size):
    with pytest.raises(ValueError):
        store.create_many(scope, [{"queue": "q"}] * size)


# --- Idempotency across a narrowed grant (issue #11) ----------------------------


def test_create_after_a_grant_narrowed_answers_key_held_not_the_hidden_todo(
    endpoint, scope
):
    """Issue #11: never return the live duplicate from a queue outside the grant."""
    hidden = new(scope, queue="secret", title="hidden", idempotency_key="k")
    endpoint.queues = ["public"]
    endpoint.save()
    narrowed = store.Scope.for_endpoint(endpoint)

    with pytest.raises(store.KeyHeld) as caught:
        store.create_todo(narrowed, queue="public", title="x", idempotency_key="k")
    assert isinstance(caught.value, store.Conflict)
    assert hidden.id not in caught.value.detail and caught.value.todo_id is None
    [result] = store.create_many(
        narrowed, [{"queue": "public", "idempotency_key": "k"}]
    )
    assert isinstance(result, store.KeyHeld)
    # The same key in scope still collapses as before.
    assert store.create_todo(scope, queue="public", idempotency_key="k") == (
        row(hidden.id),
        False,
    )


def test_retry_of_a_dead_letter_whose_key_is_taken_raises_key_held(scope):
    todo = new(scope, idempotency_key="k", max_attempts=1)
    store.claim_next(scope, "w")
    store.fail_todo(scope, todo.id, "w")
    new(scope, idempotency_key="k")
    with pytest.raises(store.KeyHeld) as caught:
        store.retry_todo(scope, todo.id)
    assert caught.value.detail == store.DUPLICATE_ON_RETRY


# --- Delayed todos --------------------------------------------------------------


def test_available_at_equals_created_at_without_a_delay(scope):
    """CONTRACT §10: available_at == created_at when not delayed."""
    todo = new(scope)
    assert todo.available_at == todo.created_at
    assert todo.to_dict()["available_at"] == todo.to_dict()["created_at"]


def test_a_delayed_todo_is_not_claimable_before_it_is_due(scope):
    """CONTRACT §10: no claim takes a delayed todo before available_at."""
    todo = new(scope, delay_seconds=60)
    assert (todo.available_at - todo.created_at).total_seconds() == 60
    assert store.claim_many(scope, "w", limit=10) == []
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w")
    assert store.pending_doorbell_todos(scope) == []


def test_a_delayed_todo_is_claimable_once_due(scope, time_travel):
    todo = new(scope, delay_seconds=600)
    later = new(scope, title="later but not delayed")
    time_travel(todo.id, available_at=-601)
    assert store.claim_next(scope, "w").id == todo.id
    assert store.claim_next(scope, "w").id == later.id


@pytest.mark.parametrize("delay", [-1, 43_201])
def test_a_delay_out_of_range_is_refused(scope, delay):
    with pytest.raises(ValueError):
        store.create_todo(scope, queue="q", delay_seconds=delay)


@pytest.mark.django_db(transaction=True)
def test_a_delayed_todo_rings_the_doorbell_when_it_becomes_due(make_endpoint):
    """CONTRACT §10: the doorbell rings when a delayed todo becomes due (sweep)."""
    scope = store.Scope.for_endpoint(make_endpoint("sleeper"))
    listener = _raw_connection()
    try:
        listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
        todo = new(scope, delay_seconds=600)
        plain = new(scope)
        assert [ring["id"] for ring in _rings(listener, 1)] == [plain.id]
        rung, since = store.ring_due_delayed()
        assert rung == []
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE todos SET available_at = now(),"
                " created_at = now() - interval '601 seconds' WHERE id = %s",
                [todo.id],
            )
        rung, until = store.ring_due_delayed(since)
        assert [moved.id for moved in rung] == [todo.id]
        assert [ring["id"] for ring in _rings(listener, 1)] == [todo.id]
        assert store.ring_due_delayed(until)[0] == []  # rung once
    finally:
        listener.close()


# --- Queue settings -------------------------------------------------------------


def test_the_first_use_of_a_queue_name_creates_its_queue(scope):
    """CONTRACT §10: a queue row is created on first use of a name."""
    with pytest.raises(store.NotFound):
        store.get_queue(scope, "fresh")
    new(scope, queue="fresh")
    info = store.get_queue(scope, "fresh")
    assert (info.name, info.pending, info.paused) == ("fresh", 1, False)
    assert info.lease_seconds == 300 and info.delay_seconds == 0
    assert [q.name for q in store.list_queues(scope)] == ["fresh"]


def test_create_takes_max_attempts_and_delay_from_the_queue(scope, settings):
    """STORE-V2: None means the queue's setting, else the server's default."""
    settings.SWITCHBOARD_MAX_ATTEMPTS = 7
    assert new(scope, queue="plain").max_attempts == 7
    store.ensure_queue(scope, "tuned", max_attempts=2, delay_seconds=30)
    tuned = new(scope, queue="tuned")
    assert tuned.max_attempts == 2
    assert (tuned.available_at - tuned.created_at).total_seconds() == 30
    explicit = new(scope, queue="tuned", max_attempts=9, delay_seconds=0)
    assert explicit.max_attempts == 9 and explicit.available_at == explicit.created_at


def test_create_for_any_endpoint_uses_the_configured_max_attempts(endpoint, settings):
    """Issue #11: SWITCHBOARD_MAX_ATTEMPTS holds for Board and webhook todos too."""
    settings.SWITCHBOARD_MAX_ATTEMPTS = 3
    todo, _ = store.create_todo_any_endpoint(endpoint.id, queue="hooks")
    assert todo.max_attempts == 3


def test_claim_and_heartbeat_take_the_lease_from_the_queue(scope):
    store.ensure_queue(scope, "slow", lease_seconds=1200)
    new(scope, queue="slow")
    claimed = store.claim_next(scope, "w")
    assert (claimed.lease_expires_at - claimed.claimed_at).total_seconds() == 1200
    short = store.claim_many(scope, "w", limit=1, lease_seconds=10)
    assert short == []
    beat = store.heartbeat(scope, claimed.id, "w")
    assert beat.lease_expires_at >= claimed.lease_expires_at


def test_a_paused_queue_accepts_creates_and_claims_pass_over_it(scope):
    """CONTRACT §10: a paused queue accepts creates; claims pass over it."""
    new(scope, queue="frozen")
    paused = store.pause_queue(scope, "frozen")
    assert paused.paused and paused.paused_at is not None
    held = new(scope, queue="frozen")
    other = new(scope, queue="open")

    assert [t.id for t in store.claim_many(scope, "w", limit=10)] == [other.id]
    assert store.claim_many(scope, "w", limit=10, queue="frozen") == []
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, held.id, "w")

    store.resume_queue(scope, "frozen")
    assert len(store.claim_many(scope, "w", limit=10, queue="frozen")) == 2


def test_a_paused_queue_holds_back_its_redeliveries_too(scope, time_travel):
    todo = new(scope, queue="frozen")
    store.claim_next(scope, "w")
    time_travel(todo.id, lease_expires_at=-600)
    store.pause_queue(scope, "frozen")
    assert store.claim_many(scope, "w", limit=10) == []


@pytest.mark.django_db(transaction=True)
def test_resuming_a_queue_rings_its_doorbell(make_endpoint):
    scope = store.Scope.for_endpoint(make_endpoint("resumer"))
    store.ensure_queue(scope, "frozen")
    store.pause_queue(scope, "frozen")
    waiting, _ = store.create_todo(scope, queue="frozen", title="held while paused")
    listener = _raw_connection()
    try:
        listener.execute(f"LISTEN {store.DOORBELL_CHANNEL}")
        store.resume_queue(scope, "frozen")
        rings = _rings(listener, 1)
    finally:
        listener.close()
    # One ring for each due pending todo of the queue, with its id (a ring
    # without one is dropped by the doorbell as malformed).
    assert [(r["endpoint_id"], r["queue"], r["id"]) for r in rings] == [
        (scope.endpoint_id, "frozen", str(waiting.id))
    ]


def test_ensure_queue_keeps_an_existing_queues_settings(scope):
    info, created = store.ensure_queue(scope, "q1", lease_seconds=45)
    again, created_again = store.ensure_queue(scope, "q1", lease_seconds=99)
    assert (created, created_again) == (True, False)
    assert info.lease_seconds == again.lease_seconds == 45


def test_update_queue_changes_only_the_settings_given(scope):
    store.ensure_queue(scope, "q1", lease_seconds=45, max_attempts=2)
    info = store.update_queue(scope, "q1", delay_seconds=5)
    assert (info.lease_seconds, info.max_attempts, info.delay_seconds) == (45, 2, 5)
    info = store.update_queue(scope, "q1", lease_seconds=None)
    assert info.lease_seconds == 300  # back to the server's default


def test_a_queue_lease_of_zero_makes_a_claim_visible_at_once_not_a_heartbeat(scope):
    """SQS's VisibilityTimeout 0 on a queue: a claim that names no lease is
    claimable again at once; a heartbeat that names none gets the server's."""
    store.ensure_queue(scope, "instant", lease_seconds=0)
    todo = new(scope, queue="instant")
    claimed = store.claim_next(scope, "w1")
    assert claimed.id == todo.id
    assert claimed.lease_expires_at == claimed.claimed_at

    beat = store.heartbeat(scope, todo.id, None, lease_token=claimed.lease_token)

    assert (beat.lease_expires_at - beat.updated_at).total_seconds() == 300


def test_next_due_is_when_a_todo_of_the_scope_turns_claimable_with_no_ring(
    scope, other_scope, time_travel
):
    """What a waiting claim is woken for: the earliest lease to lapse, retry
    window to end or delay to run out, in queues that are not paused, within
    the time the claim still waits."""
    assert store.next_due(scope, within=900) is None
    leased = new(scope)
    store.claim_next(scope, "w1", lease_seconds=600)
    assert 590 < store.next_due(scope, within=900) <= 600
    assert store.next_due(scope, within=20) is None  # beyond the wait
    new(scope, queue="later", delay_seconds=120)
    assert 110 < store.next_due(scope, within=900) <= 120
    only_q = store.Scope(scope.endpoint_id, ("q",))
    assert 590 < store.next_due(only_q, within=900) <= 600
    store.pause_queue(scope, "later")
    assert 590 < store.next_due(scope, within=900) <= 600
    store.fail_todo(scope, leased.id, "w1", error="flaky")
    assert 25 < store.next_due(scope, within=900) <= 30  # the first retry window
    time_travel(leased.id, next_retry_at=-60)
    assert store.next_due(scope, within=900) is None  # due already: the claim's
    assert store.next_due(other_scope, within=900) is None


@pytest.mark.parametrize(
    "settings_",
    [
        {"lease_seconds": -1},
        {"lease_seconds": 43_201},
        {"max_attempts": 0},
        {"delay_seconds": -1},
        {"delay_seconds": "5"},
        {"colour": 1},
    ],
)
def test_update_queue_refuses_bad_settings(scope, settings_):
    store.ensure_queue(scope, "q1")
    with pytest.raises(ValueError):
        store.update_queue(scope, "q1", **settings_)


def test_list_queues_shows_live_figures(scope, time_travel):
    """CONTRACT §10: pending, delayed, claimed, retry_scheduled, dead_letter, age."""
    for _ in range(3):
        new(scope)
    new(scope, delay_seconds=600)
    claimed, failing, dead = store.claim_many(scope, "w", limit=3)
    store.fail_todo(scope, failing.id, "w")
    store.fail_todo(scope, dead.id, "w")
    time_travel(dead.id, next_retry_at=-10_000)
    store.update_queue(scope, "q", max_attempts=1)
    [info] = store.list_queues(scope)
    assert (info.pending, info.delayed, info.claimed) == (0, 1, 1)
    assert info.retry_scheduled == 2
    assert info.oldest_pending_age_seconds is None
    assert info.lapsed == 0
    assert info.to_dict()["name"] == "q"
    time_travel(claimed.id, lease_expires_at=-10_000)
    [info] = store.list_queues(scope)
    assert (info.claimed, info.lapsed) == (1, 1)


def test_queues_outside_the_grant_are_neither_listed_nor_reachable(
    make_endpoint, other_scope
):
    scope = store.Scope.for_endpoint(make_endpoint("narrow", queues=["mine"]))
    new(scope, queue="mine")
    new(other_scope, queue="mine")
    assert [(q.endpoint_id, q.name) for q in store.list_queues(scope)] == [
        (scope.endpoint_id, "mine")
    ]
    with pytest.raises(store.QueueNotGranted):
        store.pause_queue(scope, "theirs")
    with pytest.raises(store.NotFound):
        store.get_queue(other_scope, "never")


def test_operator_twins_reach_any_endpoints_queue(scope, other_scope):
    new(other_scope, queue="theirs")
    paused = store.pause_queue_any_endpoint(other_scope.endpoint_id, "theirs")
    assert paused.paused and paused.endpoint_id == other_scope.endpoint_id
    assert store.get_queue_any_endpoint(other_scope.endpoint_id, "theirs").paused
    store.update_queue_any_endpoint(other_scope.endpoint_id, "theirs", max_attempts=4)
    resumed = store.resume_queue_any_endpoint(other_scope.endpoint_id, "theirs")
    assert not resumed.paused and resumed.max_attempts == 4
    listed = store.list_queues_any_endpoint([other_scope.endpoint_id])
    assert [(q.endpoint_id, q.name) for q in listed] == [
        (other_scope.endpoint_id, "theirs")
    ]
    with pytest.raises(store.NotFound):
        store.pause_queue_any_endpoint(scope.endpoint_id, "theirs")


def test_a_sweep_pass_rings_delayed_todos_that_came_due(scope):
    """CONTRACT §10: the sweep rings the doorbell when a delayed todo becomes due."""
    from todos.management.sweeper import sweep_once

    todo = new(scope, delay_seconds=600)
    first = sweep_once()
    assert first.woken == 0 and first.delayed_until is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET available_at = statement_timestamp(),"
            " created_at = created_at - interval '1 hour' WHERE id = %s",
            [todo.id],
        )
    second = sweep_once(delayed_since=first.delayed_until)
    assert second.woken == 1
    assert sweep_once(delayed_since=second.delayed_until).woken == 0


def test_a_prepared_claim_settles_on_its_generic_plan(scope):
    """Issue #13: a claim is not re-planned on every call (planning costs more
    than the claim); the generic plan is the one test_claim_plan.py checks."""
    store.create_many(scope, [{"queue": "q"}] * 30)
    # psycopg prepares from the 6th run; PostgreSQL plans 5 custom, then decides.
    for number in range(20):
        queue = "q" if number % 2 else None
        todo = store.claim_next(scope, "w", queue=queue)
        store.complete_todo(scope, todo.id, None, lease_token=todo.lease_token)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%WITH RECURSIVE pending_queue%"],
        )
        found = cursor.fetchall()
    if not found:
        pytest.skip("the test database connection does not prepare statements")
    generic, custom = found[0]
    assert generic >= 5 and custom <= 5


def test_claim_many_visible_at_once_leaves_the_todo_claimable_and_its_token_good(
    scope,
):
    made, _ = store.create_todo(scope, queue="q", title="t")
    (first,) = store.claim_many(scope, "w1", limit=1, visible_at_once=True)
    assert first.state == "claimed"
    assert first.lease_expires_at == first.claimed_at
    # The token stays good until a claim takes the todo again...
    beat = store.heartbeat(
        scope, made.id, None, lease_seconds=60, lease_token=first.lease_token
    )
    assert beat.lease_token == first.lease_token
    store.release_todo(scope, made.id, None, lease_token=first.lease_token)
    (second,) = store.claim_many(scope, "w1", limit=1, visible_at_once=True)
    # ...and the next claim may take it at once: its lease ended as it began,
    # before the next transaction's now() (a test's transaction keeps one
    # now(), so the clock is moved the millisecond the next one would be on).
    shift(made.id, lease_expires_at=-0.001)
    (third,) = store.claim_many(scope, "w2", limit=1)
    assert third.id == made.id and third.attempt == second.attempt + 1
    with pytest.raises(store.LeaseSuperseded):
        store.complete_todo(scope, made.id, None, lease_token=second.lease_token)
