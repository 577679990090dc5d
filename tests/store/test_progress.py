"""Progress, checkpoints and handoffs (CONTRACT §14)."""

import pytest

from tests.conftest import shift
from todos import store


def claimed(scope, worker="w1", **fields):
    todo, _ = store.create_todo(scope, queue="q", **fields)
    return store.claim_todo(scope, todo.id, worker)


def test_heartbeat_stores_progress_and_checkpoint(scope):
    todo = claimed(scope)
    beat = store.heartbeat(
        scope,
        todo.id,
        "w1",
        progress={"message": "indexing", "fraction": 0.4},
        checkpoint={"page": 12},
    )
    assert beat.progress == {"message": "indexing", "fraction": 0.4}
    assert beat.checkpoint == {"page": 12}
    out = beat.to_dict()
    assert out["progress"]["fraction"] == 0.4 and out["checkpoint"] == {"page": 12}
    again = store.heartbeat(scope, todo.id, "w1")
    assert again.progress == beat.progress and again.checkpoint == beat.checkpoint


@pytest.mark.parametrize(
    "progress",
    [
        {"message": "x" * 501},
        {"fraction": 1.5},
        {"fraction": -0.1},
        {"fraction": "half"},
        {"fraction": True},
        {"other": 1},
        "indexing",
    ],
)
def test_heartbeat_refuses_bad_progress_naming_it(scope, progress):
    todo = claimed(scope)
    with pytest.raises(ValueError, match="progress"):
        store.heartbeat(scope, todo.id, "w1", progress=progress)


def test_a_checkpoint_over_64_kib_is_too_large(scope):
    todo = claimed(scope)
    with pytest.raises(store.TooLarge) as caught:
        store.heartbeat(scope, todo.id, "w1", checkpoint={"blob": "x" * 65536})
    assert caught.value.field == "checkpoint"


@pytest.mark.parametrize("redeliver", ["lapse", "reap", "retry", "release"])
def test_every_redelivery_hands_the_checkpoint_to_the_next_claimant(scope, redeliver):
    todo = claimed(scope)
    store.heartbeat(scope, todo.id, "w1", checkpoint={"resume_at": 35})
    if redeliver in ("lapse", "reap"):
        shift(todo.id, lease_expires_at=-600)
        if redeliver == "reap":
            store.reap_expired()
    elif redeliver == "retry":
        store.fail_todo(scope, todo.id, "w1", error="crash")
        store.retry_todo(scope, todo.id)
    else:
        store.release_todo(scope, todo.id, "w1")
    again = store.claim_next(scope, "w2")
    assert again.id == todo.id and again.checkpoint == {"resume_at": 35}


def test_release_hands_off_to_a_named_worker_with_a_note(scope):
    """CONTRACT §14: release takes assignee, note and checkpoint in one transition."""
    todo = claimed(scope)
    handed = store.release_todo(
        scope,
        todo.id,
        "w1",
        assignee="gpu-worker",
        note="needs a GPU",
        checkpoint={"stage": "train"},
    )
    assert handed.state == "pending" and handed.assignee == "gpu-worker"
    assert handed.note == "needs a GPU" and handed.checkpoint == {"stage": "train"}
    events = store.todo_events_any_endpoint(todo.id)
    assert (events[-1].from_state, events[-1].to_state) == ("claimed", "pending")
    assert events[-1].error == "needs a GPU"
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w1")
    assert store.claim_next(scope, "gpu-worker").id == todo.id


def test_release_to_the_pool_clears_the_assignment(scope):
    todo = claimed(scope, assignee="w1")
    released = store.release_todo(scope, todo.id, "w1", assignee=None)
    assert released.assignee is None
    assert store.claim_next(scope, "w9").id == todo.id


def test_release_without_an_assignee_keeps_the_assignment(scope):
    todo = claimed(scope, assignee="w1")
    assert store.release_todo(scope, todo.id, "w1").assignee == "w1"


def test_release_refuses_a_bad_assignee_and_note(scope):
    todo = claimed(scope)
    with pytest.raises(ValueError, match="assignee"):
        store.release_todo(scope, todo.id, "w1", assignee="")
    with pytest.raises(ValueError, match="note"):
        store.release_todo(scope, todo.id, "w1", note="x" * 2001)
    assert store.get_todo(scope, todo.id).state == "claimed"


def test_batch_heartbeat_carries_progress(scope):
    todo = claimed(scope)
    (result,) = store.acknowledge_many(
        scope,
        [store.Ack("heartbeat", todo.id, "w1", progress={"message": "half"})],
    )
    assert result.progress == {"message": "half", "fraction": None}
