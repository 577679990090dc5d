"""Races of CONTRACT §14 with real threads on real PostgreSQL: exactly one
side wins, nothing is lost.

- cancel vs claim: each todo is either canceled and never handed out, or
  claimed and carrying the cancel request;
- cancel vs complete: the complete always lands (the worker's result is kept)
  and a cancel either asked first or found the todo done;
- answer vs deadline: each question is either answered or expired, never both,
  and the loser is told so.
"""

import threading
import time

import pytest
from django.db import connection

from todos import store

pytestmark = pytest.mark.django_db(transaction=True)

TODOS = 40


def run_both(first, second):
    start = threading.Barrier(2, timeout=30)
    errors = []

    def wrap(call):
        def body():
            try:
                start.wait()
                call()
            except Exception as exc:  # surfaced below, never swallowed
                errors.append(exc)
            finally:
                connection.close()

        return body

    threads = [threading.Thread(target=wrap(call)) for call in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def make(scope, count):
    return [store.create_todo(scope, queue="q")[0].id for _ in range(count)]


def test_cancel_vs_claim_exactly_one_wins_per_todo(scope):
    ids = make(scope, TODOS)
    claimed, canceled = [], {}

    def claim_all():
        while True:
            try:
                claimed.append(store.claim_next(scope, "w1").id)
            except store.NotFound:
                return

    def cancel_all():
        for todo_id in reversed(ids):
            canceled[todo_id] = store.cancel_todo(scope, todo_id, worker="lead")

    run_both(claim_all, cancel_all)
    assert len(claimed) == len(set(claimed))
    for todo_id in ids:
        todo = store.get_todo(scope, todo_id)
        if todo_id in claimed:
            assert todo.state == "claimed" and todo.cancel_requested
            assert canceled[todo_id].state == "claimed"
        else:
            assert todo.outcome == "canceled"
            assert canceled[todo_id].outcome == "canceled"
    assert set(canceled) == set(ids)


def test_cancel_vs_complete_keeps_the_result_and_never_cancels_finished_work(
    scope,
):
    ids = make(scope, TODOS)
    for todo_id in ids:
        store.claim_todo(scope, todo_id, "w1")
    completed, cancels = [], {}

    def complete_all():
        for todo_id in ids:
            store.complete_todo(scope, todo_id, "w1", result={"n": todo_id})
            completed.append(todo_id)

    def cancel_all():
        for todo_id in reversed(ids):
            try:
                cancels[todo_id] = store.cancel_todo(scope, todo_id, worker="lead")
            except store.Conflict as exc:
                cancels[todo_id] = exc

    run_both(complete_all, cancel_all)
    assert sorted(completed) == sorted(ids)
    for todo_id in ids:
        todo = store.get_todo(scope, todo_id)
        assert todo.outcome == "done" and todo.result == {"n": todo_id}
        outcome = cancels[todo_id]
        if isinstance(outcome, store.Conflict):
            assert outcome.state == "done" and not todo.cancel_requested
        else:
            assert outcome.state == "claimed" and todo.cancel_requested


def test_cancel_vs_release_ends_each_todo_once(scope):
    ids = make(scope, TODOS)
    for todo_id in ids:
        store.claim_todo(scope, todo_id, "w1")
    released, cancels = {}, {}

    def release_all():
        for todo_id in ids:
            released[todo_id] = store.release_todo(scope, todo_id, "w1")

    def cancel_all():
        for todo_id in reversed(ids):
            cancels[todo_id] = store.cancel_todo(scope, todo_id, worker="lead")

    run_both(release_all, cancel_all)
    for todo_id in ids:
        # Released first: the cancel found it pending and canceled it. Asked
        # first: the release ended it canceled. Canceled either way, once.
        assert store.get_todo(scope, todo_id).outcome == "canceled"
        kinds = [e.to_state for e in store.todo_events_any_endpoint(todo_id)]
        assert kinds.count("done") == 1


def test_answer_vs_deadline_exactly_one_wins_per_question(scope):
    ids = make(scope, TODOS)
    for todo_id in ids:
        store.claim_todo(scope, todo_id, "w1")
        store.ask(scope, todo_id, "w1", question="go?", deadline_seconds=60)
    # Every deadline falls within the next half second.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET answer_deadline = clock_timestamp()"
            " + random() * interval '500 milliseconds'"
            " WHERE id = ANY(%s::uuid[])",
            [ids],
        )
        cursor.execute(
            "UPDATE todos SET available_at = answer_deadline"
            " WHERE id = ANY(%s::uuid[])",
            [ids],
        )
    answered, refused, expired = set(), set(), set()

    def answer_all():
        for todo_id in ids:
            try:
                store.answer_todo(scope, todo_id, "yes", worker="lead")
                answered.add(todo_id)
            except store.Conflict:
                refused.add(todo_id)

    def sweep_past_every_deadline():
        stop = time.monotonic() + 1.5
        while time.monotonic() < stop:
            expired.update(moved.id for moved in store.expire_questions())

    run_both(answer_all, sweep_past_every_deadline)
    assert answered.isdisjoint(expired)
    assert answered | refused == set(ids)
    for todo_id in ids:
        todo = store.get_todo(scope, todo_id)
        if todo_id in answered:
            assert todo.question_status == "answered"
            assert todo.answer["value"] == "yes"
        else:
            assert todo.question_status == "expired" and todo.answer is None
            assert todo_id in expired
