"""Every operation of the JSON API through Client, against a served instance."""

import pytest
from switchboard_client import KEEP, Created, Progress

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_returns_the_new_todo_and_an_idempotent_create_collapses(client):
    first = client.create(
        "reviews", title="PR 1", payload={"n": 1}, idempotency_key="k"
    )
    again = client.create("reviews", title="PR 1", idempotency_key="k")
    assert isinstance(first, Created) and first.created
    assert first.todo.queue == "reviews" and first.todo.payload == {"n": 1}
    assert first.todo.state == "pending" and first.todo.outcome == "pending"
    assert not again.created and again.todo.id == first.todo.id


def test_a_delayed_create_is_not_claimable_until_it_is_available(client):
    todo = client.create("q", delay_seconds=600).todo
    assert todo.available_at > todo.created_at
    assert client.claim(queue="q") is None


def test_replace_cancels_the_pending_duplicate_and_creates_anew(client):
    old = client.create("q", idempotency_key="k", payload=1).todo
    new = client.create("q", idempotency_key="k", payload=2, replace=True)
    assert new.created and new.todo.id != old.id
    assert client.get(old.id).outcome == "canceled"


def test_create_many_answers_one_result_per_item_in_order(asgi_server, make_endpoint):
    from switchboard_client import Client

    granted = make_endpoint("granted", queues=("q",))
    with Client(asgi_server.url, granted.token) as client:
        results = client.create_many(
            [
                {"queue": "q", "title": "a", "idempotency_key": "a"},
                {"queue": "q", "title": "a again", "idempotency_key": "a"},
                {"queue": "elsewhere"},
            ]
        )
    assert [r.status for r in results] == [201, 200, 403]
    assert results[0].created.created and not results[1].created.created
    assert results[1].created.todo.id == results[0].created.todo.id
    assert results[2].created is None and results[2].error.error == "forbidden"


def test_create_many_with_a_bad_field_creates_nothing(client):
    from switchboard_client import BadRequest

    with pytest.raises(BadRequest) as raised:
        client.create_many([{"queue": "q"}, {"queue": "q", "max_attempts": 0}])
    assert raised.value.detail.startswith("todos[1].max_attempts")
    assert client.list_todos(queue="q").todos == []


def test_claim_then_complete_with_the_lease_token(client):
    made = client.create("q", payload={"x": 1}).todo
    todo = client.claim(queue="q", lease_seconds=60)
    assert todo.id == made.id and todo.state == "claimed"
    assert todo.owner == "w1" and todo.lease_token
    done = client.complete(todo, {"ok": True})
    assert done.state == "done" and done.result == {"ok": True}
    # Repeated with the winning token (a lost answer retried): the same 200.
    assert client.complete(todo, {"ok": True}).state == "done"


def test_claim_answers_none_when_nothing_is_claimable(client):
    assert client.claim(queue="empty") is None
    assert client.claim_many(5, queue="empty") == []


def test_claim_many_takes_up_to_max_todos(client):
    for i in range(4):
        client.create("q", payload=i)
    claimed = client.claim_many(3, queue="q")
    assert [t.payload for t in claimed] == [0, 1, 2]
    assert all(t.lease_token for t in claimed)


def test_a_long_poll_claims_a_todo_created_while_it_waits(client, other_client):
    import threading

    later = threading.Timer(0.3, lambda: other_client.create("lp", title="late"))
    later.start()
    todo = client.claim(queue="lp", wait_seconds=5)
    # Its answer may still be on its way when the claim has the todo.
    later.join()
    assert todo is not None and todo.title == "late"


def test_claim_todo_claims_the_named_todo(client):
    client.create("q", title="first")
    second = client.create("q", title="second").todo
    assert client.claim_todo(second.id, lease_seconds=30).title == "second"


def test_heartbeat_carries_progress_and_checkpoint(client):
    client.create("q")
    todo = client.claim(queue="q")
    beat = client.heartbeat(
        todo,
        lease_seconds=600,
        progress=Progress("halfway", 0.5),
        checkpoint={"step": 3},
    )
    assert beat.progress == Progress("halfway", 0.5)
    assert beat.checkpoint == {"step": 3}
    assert beat.lease_expires_at > todo.lease_expires_at
    assert not beat.cancel_requested


def test_fail_records_the_error_and_schedules_a_retry(client):
    client.create("q", max_attempts=2)
    todo = client.claim(queue="q")
    failed = client.fail(todo, "ValueError: bad input")
    assert failed.outcome == "retry_scheduled"
    assert failed.last_error == "ValueError: bad input"
    assert client.retry_todo(failed).state == "pending"


def test_release_hands_off_with_note_and_checkpoint(client, other_client):
    client.create("q")
    todo = client.claim(queue="q")
    given = client.release(todo, assignee="w2", note="yours", checkpoint={"at": 7})
    assert given.state == "pending" and given.assignee == "w2"
    assert client.claim(queue="q") is None
    taken = other_client.claim(queue="q")
    assert taken.note == "yours" and taken.checkpoint == {"at": 7}
    back = other_client.release(taken, assignee=None)
    assert back.assignee is None
    kept = client.release(client.claim(queue="q"), assignee=KEEP)
    assert kept.assignee is None


def test_ask_holds_the_todo_and_the_answer_comes_with_the_next_claim(
    client, other_client
):
    client.create("q")
    todo = client.claim(queue="q")
    held = client.ask(
        todo,
        "Drop the table?",
        choices=["drop", "keep"],
        checkpoint={"step": "drop"},
        deadline_seconds=3600,
    )
    assert held.held and held.question.text == "Drop the table?"
    assert held.question.choices == ["drop", "keep"]
    assert client.claim(queue="q") is None
    answered = other_client.answer(held, "keep")
    assert answered.answer.value == "keep" and answered.answer.worker == "w2"
    assert answered.answer.by.startswith("agent:")
    resumed = client.claim(queue="q")
    assert resumed.id == todo.id
    assert resumed.answer.value == "keep" and resumed.checkpoint == {"step": "drop"}


def test_ask_with_a_schema_checks_the_answer(client):
    from switchboard_client import BadRequest

    client.create("q")
    todo = client.claim(queue="q")
    schema = {
        "type": "object",
        "properties": {"budget": {"type": "integer", "maximum": 100}},
    }
    client.ask(todo, "Budget?", answer_schema=schema)
    with pytest.raises(BadRequest) as raised:
        client.answer(todo, {"budget": 500})
    assert raised.value.detail.startswith("answer.budget")
    assert client.answer(todo, {"budget": 50}).answer.value == {"budget": 50}


def test_cancel_ends_a_pending_todo_and_asks_a_claimed_ones_owner(client):
    pending = client.create("q").todo
    canceled = client.cancel(pending, reason="not needed")
    assert canceled.outcome == "canceled"
    assert canceled.result["canceled"]["reason"] == "not needed"
    client.create("q")
    todo = client.claim(queue="q")
    requested = client.cancel(todo)
    assert requested.state == "claimed" and requested.cancel_requested
    assert client.heartbeat(todo).cancel_requested
    assert client.release(todo).outcome == "canceled"


def test_get_and_wait_return_the_settled_todo(client, other_client):
    import threading

    made = client.create("q").todo
    assert client.get(made.id).id == made.id
    todo = other_client.claim(queue="q")
    later = threading.Timer(0.3, lambda: other_client.complete(todo, 42))
    later.start()
    settled = client.wait(made, timeout=10)
    # Its answer may still be on its way when the wait has the result.
    later.join()
    assert settled.state == "done" and settled.result == 42


def test_wait_returns_the_todo_as_it_is_when_the_timeout_passes(client):
    made = client.create("q").todo
    assert client.wait(made, timeout=0.2).state == "pending"


def test_list_pages_through_every_todo(client):
    ids = [client.create("pages", payload=i).todo.id for i in range(5)]
    page = client.list_todos(queue="pages", limit=2)
    assert len(page.todos) == 2 and page.next_cursor
    assert [t.id for t in client.iter_todos(queue="pages", limit=2)] == ids
    assert client.list_todos(queue="pages", state="done").todos == []


def test_batch_applies_each_action_on_its_own(client):
    for _ in range(3):
        client.create("q")
    a, b, c = client.claim_many(3, queue="q")
    results = client.batch(
        [
            {"op": "complete", "id": a.id, "lease_token": a.lease_token, "result": 1},
            {"op": "fail", "id": b.id, "lease_token": b.lease_token, "error": "x"},
            {"op": "heartbeat", "id": c.id, "lease_token": "stale"},
        ]
    )
    assert [r.status for r in results] == [200, 200, 409]
    assert results[0].todo.state == "done"
    assert results[2].error.error == "conflict"


def test_queues_lists_settings_and_live_figures(client):
    client.create("reviews")
    client.create("reviews", delay_seconds=60)
    (queue,) = [q for q in client.queues() if q.name == "reviews"]
    assert queue.pending == 1 and queue.delayed == 1
    assert queue.lease_seconds > 0 and not queue.paused
