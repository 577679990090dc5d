"""The store's Board section: overview counts, the bulk-retry preview and pass."""

from todos import store
from todos.store import stats


def failed(scope, *, dead, title="t", key=None, queue="q"):
    """Create a todo and fail it once: dead-lettered or parked for a retry."""
    todo, _ = store.create_todo(
        scope,
        queue=queue,
        title=title,
        idempotency_key=key,
        max_attempts=1 if dead else 5,
    )
    store.claim_todo(scope, todo.id, "w")
    return store.fail_todo(scope, todo.id, "w", error="boom")


def test_overview_counts_each_state_per_endpoint_and_queue(scope, other_scope):
    """SPEC: Cross-endpoint queue collision is isolated (the operator sees both)."""
    store.create_todo(scope, queue="reviews")
    store.create_todo(scope, queue="reviews")
    claimed, _ = store.create_todo(scope, queue="reviews")
    store.claim_todo(scope, claimed.id, "w")
    failed(scope, dead=True, queue="reviews")
    failed(scope, dead=False, queue="reviews")
    done, _ = store.create_todo(other_scope, queue="reviews")
    store.claim_todo(other_scope, done.id, "w")
    store.complete_todo(other_scope, done.id, "w")

    overview = store.board_overview()

    rows = {(row.endpoint_id, row.queue): row for row in overview.rows}
    mine = rows[(scope.endpoint_id, "reviews")]
    assert (mine.pending, mine.claimed, mine.retry_scheduled, mine.dead_letter) == (
        2,
        1,
        1,
        1,
    )
    assert mine.done == 0
    theirs = rows[(other_scope.endpoint_id, "reviews")]
    assert (theirs.pending, theirs.done) == (0, 1)
    assert overview.totals["pending"] == 2
    assert overview.capped == {"dead_letter": False, "done": False}


def test_overview_reports_the_age_of_the_oldest_pending_todo(scope, time_travel):
    old, _ = store.create_todo(scope, queue="q")
    store.create_todo(scope, queue="q")
    time_travel(old.id, created_at=-3600)

    (row,) = store.board_overview().rows

    assert 3595 <= row.oldest_pending_seconds <= 3700


def test_overview_counts_a_held_todo_apart_from_pending_and_its_age(scope, time_travel):
    """A held todo waits for an answer, not for a worker: it is not pending,
    and the oldest pending age is that of the oldest todo a claim may take."""
    asked, _ = store.create_todo(scope, queue="q", title="asks")
    store.claim_todo(scope, asked.id, "w")
    store.ask(scope, asked.id, "w", question="Ship it?")
    waiting, _ = store.create_todo(scope, queue="q", title="waits")
    time_travel(asked.id, created_at=-86400)
    time_travel(waiting.id, created_at=-60)

    overview = store.board_overview()

    (row,) = overview.rows
    assert (row.pending, row.held) == (1, 1)
    assert (overview.totals["pending"], overview.totals["held"]) == (1, 1)
    assert 55 <= row.oldest_pending_seconds <= 120


def test_overview_has_no_oldest_pending_age_when_every_pending_todo_is_held(scope):
    asked, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, asked.id, "w")
    store.ask(scope, asked.id, "w", question="Ship it?")

    (row,) = store.board_overview().rows

    assert (row.pending, row.held, row.oldest_pending_seconds) == (0, 1, None)


def test_overview_counts_lapsed_leases_as_stuck_claims(scope, time_travel):
    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w")
    time_travel(todo.id, lease_expires_at=-3600)

    (row,) = store.board_overview().rows

    assert (row.claimed, row.lapsed) == (1, 1)


def test_overview_stops_counting_terminal_rows_at_the_cap(scope):
    for _ in range(4):
        failed(scope, dead=True)

    overview = store.board_overview(cap=2)

    assert overview.capped["dead_letter"] is True
    assert overview.totals["dead_letter"] == 2
    assert overview.rows[0].dead_letter == 3  # cap + 1 rows read, then stop


def test_retryable_count_previews_failed_todos_matching_the_filter(scope):
    failed(scope, dead=True, queue="a")
    failed(scope, dead=False, queue="a")
    failed(scope, dead=True, queue="b")
    store.create_todo(scope, queue="a")

    assert store.count_retryable_any_endpoint(queue="a") == 2
    assert store.count_retryable_any_endpoint(queue="a", state="dead_letter") == 1
    assert store.count_retryable_any_endpoint(state="pending") == 0
    assert store.count_retryable_any_endpoint(cap=1) == 2  # cap + 1 means "more"
    assert store.count_retryable_any_endpoint(endpoint_id="not-a-uuid") == 0


def test_the_retry_preview_looks_at_a_bounded_number_of_matches(scope):
    """A preview over a million dead letters must not count them all: it looks
    at the first ``limit`` and says that more match."""
    failed(scope, dead=True, key="k-1")
    store.create_todo(scope, queue="q", idempotency_key="k-1")
    for i in range(4):
        failed(scope, dead=True, title=f"t{i}")

    assert store.preview_retry_any_endpoint(limit=10) == store.RetryPreview(
        4, 1, more=False
    )
    assert store.preview_retry_any_endpoint(limit=5).more is False
    bounded = store.preview_retry_any_endpoint(limit=3)
    assert bounded.more is True
    assert bounded.retryable + bounded.key_held == 4  # limit + 1 rows, no more
    assert store.preview_retry_any_endpoint(
        endpoint_id="not-a-uuid"
    ) == store.RetryPreview(0, 0, more=False)


def test_retry_matching_requeues_every_match_in_batches(scope):
    """SPEC: Terminal states are final (only an explicit retry re-queues)."""
    todos = [failed(scope, dead=True, title=f"t{i}") for i in range(7)]
    other = failed(scope, dead=True, queue="elsewhere")

    outcome = store.retry_matching_any_endpoint(queue="q", batch=3, actor="op:ann")

    assert (outcome.retried, outcome.conflicts, outcome.more) == (7, [], False)
    for todo in todos:
        assert store.get_todo(scope, todo.id).state == "pending"
        last = store.todo_events_any_endpoint(todo.id)[-1]
        assert (last.from_state, last.to_state, last.actor) == (
            "failed",
            "pending",
            "op:ann",
        )
    assert store.get_todo(scope, other.id).is_dead_letter


def test_retry_matching_stops_at_its_limit_and_says_more_remain(scope):
    for i in range(5):
        failed(scope, dead=True, title=f"t{i}")

    outcome = store.retry_matching_any_endpoint(limit=3, batch=2)

    assert (outcome.retried, outcome.more) == (3, True)
    assert store.count_retryable_any_endpoint() == 2


def test_retry_matching_leaves_a_dead_letter_whose_key_a_live_todo_holds(scope):
    """SPEC: A terminal todo does not block a new one."""
    dead = failed(scope, dead=True, key="delivery-1")
    newer, created = store.create_todo(scope, queue="q", idempotency_key="delivery-1")
    assert created
    movable = failed(scope, dead=True, key="delivery-2")

    assert store.count_retryable_any_endpoint() == 1
    assert store.preview_retry_any_endpoint() == store.RetryPreview(1, 1, more=False)

    outcome = store.retry_matching_any_endpoint()

    assert (outcome.retried, outcome.key_held, outcome.more) == (1, 1, False)
    assert store.get_todo(scope, dead.id).is_dead_letter
    assert store.get_todo(scope, movable.id).state == "pending"
    assert store.get_todo(scope, newer.id).state == "pending"


def test_retry_matching_settles_two_dead_letters_sharing_a_key(scope):
    first = failed(scope, dead=True, key="k")
    second = failed(scope, dead=True, key="k")

    outcome = store.retry_matching_any_endpoint()

    states = sorted(store.get_todo(scope, t.id).state for t in (first, second))
    assert states == ["failed", "pending"]
    assert outcome.retried == 1
    assert len(outcome.conflicts) == 1


def test_retry_many_sorts_results_into_retried_conflicts_and_missing(scope):
    dead = failed(scope, dead=True)
    pending, _ = store.create_todo(scope, queue="q")

    retried, conflicts, missing = store.retry_many_any_endpoint(
        [dead.id, pending.id, "00000000-0000-0000-0000-000000000000", "junk"]
    )

    assert [t.id for t in retried] == [dead.id]
    assert [c.todo_id for c in conflicts] == [pending.id]
    assert len(missing) == 2


def test_retry_matching_reports_a_dead_letter_held_back_by_its_twin_once(scope):
    """Defect: bulk retry reported a held-back dead letter twice (issue #11)."""
    failed(scope, dead=True, key="k")
    failed(scope, dead=True, key="k")

    outcome = store.retry_matching_any_endpoint()

    assert outcome.retried == 1
    assert len(outcome.conflicts) + outcome.key_held == 1


def test_a_dead_letter_group_filter_leaves_out_its_dismissed_members(scope):
    """Show N and Retry group… act on the group the groups page counts: a
    dismissed dead letter with the same error is no longer in it."""
    for _ in range(2):
        failed(scope, dead=True)
    (group,) = stats.dead_letter_groups()
    group_filter = {
        "endpoint_id": group.endpoint_id,
        "queue": group.queue,
        "state": "dead_letter",
        "fingerprint": group.fingerprint,
    }
    assert store.dismiss_matching_any_endpoint(**group_filter) == 2
    newer = failed(scope, dead=True)

    (regrouped,) = stats.dead_letter_groups()
    listed = store.list_todos_any_endpoint(**group_filter).todos

    assert regrouped.count == 1
    assert [todo.id for todo in listed] == [newer.id]
    assert store.preview_retry_any_endpoint(**group_filter).retryable == 1
