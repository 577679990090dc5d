"""The store's queue functions the SQS surface needs: exists, purge, delete.

PurgeQueue deletes a queue's live todos (pending, delayed, claimed, retry
scheduled) and keeps its record (done todos, dead letters); DeleteQueue deletes
the queue row and every todo of it. Both are scoped like every store call.
"""

import pytest
from django.db import connection, transaction

from todos import store
from todos.store import queues

pytestmark = pytest.mark.django_db


def states_of(scope, queue):
    return sorted(
        todo.display_state for todo in store.list_todos(scope, queue=queue).todos
    )


def history_rows(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todo_events WHERE todo_id = %s", [todo_id])
        return cursor.fetchone()[0]


def a_queue_of_every_state(scope, queue="q"):
    made = {}
    made["pending"], _ = store.create_todo(scope, queue=queue, title="pending")
    made["delayed"], _ = store.create_todo(
        scope, queue=queue, title="delayed", delay_seconds=600
    )
    store.create_todo(scope, queue=queue, title="claimed")
    store.create_todo(scope, queue=queue, title="done")
    store.create_todo(scope, queue=queue, title="retry")
    store.create_todo(scope, queue=queue, title="dead", max_attempts=1)
    claimed = {
        todo.title: todo for todo in store.claim_many(scope, "w", limit=10, queue=queue)
    }
    assert set(claimed) == {"pending", "claimed", "done", "retry", "dead"}
    store.release_todo(scope, claimed["pending"].id, "w")
    store.complete_todo(scope, claimed["done"].id, "w")
    store.fail_todo(scope, claimed["retry"].id, "w", error="again")
    store.fail_todo(scope, claimed["dead"].id, "w", error="dead")
    return claimed


def test_purge_queue_deletes_the_live_todos_and_keeps_the_record(scope):
    a_queue_of_every_state(scope)
    store.create_todo(scope, queue="other", title="untouched")
    assert states_of(scope, "q") == [
        "claimed",
        "dead_letter",
        "done",
        "pending",
        "pending",
        "retry_scheduled",
    ]
    assert store.purge_queue(scope, "q") == 4
    assert states_of(scope, "q") == ["dead_letter", "done"]
    assert states_of(scope, "other") == ["pending"]
    assert store.queue_exists(scope, "q")


def test_purge_queue_takes_the_history_of_what_it_deletes(scope):
    todo, _ = store.create_todo(scope, queue="q", title="t")
    assert history_rows(todo.id) == 1
    store.purge_queue(scope, "q")
    assert history_rows(todo.id) == 0


def test_delete_queue_deletes_the_queue_and_every_todo_of_it(scope):
    claimed = a_queue_of_every_state(scope)
    assert store.delete_queue(scope, "q") == 6
    assert not store.queue_exists(scope, "q")
    assert store.list_todos(scope, queue="q").todos == []
    assert history_rows(claimed["done"].id) == 0
    with pytest.raises(store.NotFound):
        store.get_queue(scope, "q")
    # The name can be used again: a new, empty queue.
    store.create_todo(scope, queue="q", title="fresh")
    assert store.queue_exists(scope, "q")


@pytest.mark.parametrize("call", ["purge_queue", "delete_queue"])
def test_purge_and_delete_of_a_missing_or_foreign_queue_are_not_found(
    scope, other_scope, call
):
    store.create_todo(other_scope, queue="theirs", title="t")
    for name in ("never", "theirs"):
        with pytest.raises(store.NotFound):
            getattr(store, call)(scope, name)
    assert states_of(other_scope, "theirs") == ["pending"]


def test_queue_functions_keep_to_the_grant(make_endpoint):
    endpoint = make_endpoint("narrow", queues=("mine",))
    scope = store.Scope.for_endpoint(endpoint)
    for call in ("purge_queue", "delete_queue", "queue_exists"):
        with pytest.raises(store.QueueNotGranted):
            getattr(store, call)(scope, "elsewhere")


def test_queue_exists_is_false_for_another_endpoints_queue(scope, other_scope):
    store.create_todo(other_scope, queue="theirs", title="t")
    assert store.queue_exists(other_scope, "theirs")
    assert not store.queue_exists(scope, "theirs")


def seed(scope, queue, count, state="pending"):
    """Insert ``count`` todos (and their creation history) in two statements."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Seeding is not what is timed.
        cursor.execute("SET LOCAL statement_timeout = 0")
        cursor.execute(
            "INSERT INTO queues (endpoint_id, name) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING",
            [scope.endpoint_id, queue],
        )
        cursor.execute(
            """
            WITH made AS (
                INSERT INTO todos (id, endpoint_id, queue, title, payload, state,
                                   attempt, max_attempts, last_error, created_at,
                                   updated_at, available_at)
                SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'seeded',
                       '{}'::jsonb, %(state)s, 0, 5, '', now(), now(), now()
                  FROM generate_series(1, %(count)s)
                RETURNING id, endpoint_id, state
            )
            INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state,
                                     attempt, actor, error, at)
            SELECT id, endpoint_id, NULL, state, 0, 'seed', '', now() FROM made
            """,
            {
                "endpoint_id": scope.endpoint_id,
                "queue": queue,
                "state": state,
                "count": count,
            },
        )


@pytest.fixture
def deletes_per_statement():
    """Record how many todos each DELETE statement removes (a statement-level
    trigger on this test's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE deleted_per_statement (n bigint)")
        cursor.execute(
            """
            CREATE FUNCTION record_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO deleted_per_statement SELECT count(*) FROM gone;
                RETURN NULL;
            END $$
            """
        )
        cursor.execute(
            "CREATE TRIGGER record_deleted AFTER DELETE ON todos"
            " REFERENCING OLD TABLE AS gone"
            " FOR EACH STATEMENT EXECUTE FUNCTION record_deleted()"
        )

    def read():
        with connection.cursor() as cursor:
            cursor.execute("SELECT n FROM deleted_per_statement WHERE n > 0")
            return [row[0] for row in cursor.fetchall()]

    return read


@pytest.mark.parametrize("call", ["purge_queue", "delete_queue"])
def test_purge_and_delete_queue_delete_in_bounded_statements(
    scope, monkeypatch, deletes_per_statement, call
):
    """However long the queue, no one statement deletes more than a batch, so
    none meets statement_timeout (a million rows in one DELETE did)."""
    monkeypatch.setattr(queues, "DELETE_BATCH", 100)
    seed(scope, "q", 1050)
    seed(scope, "q", 20, state="done")
    seed(scope, "other", 5)
    deleted = getattr(store, call)(scope, "q")
    assert deleted == (1050 if call == "purge_queue" else 1070)
    per_statement = deletes_per_statement()
    assert max(per_statement) <= 100
    assert sum(per_statement) == deleted
    assert states_of(scope, "other") == ["pending"] * 5


@pytest.mark.django_db(transaction=True)
def test_purge_queue_of_a_long_queue_finishes_under_a_short_statement_timeout(
    scope, monkeypatch
):
    """Each batch is its own statement (autocommit, as served), so a long queue
    is purged under a statement_timeout far shorter than deleting it at once
    takes on a slow machine (how long one DELETE of it takes is the
    machine's; the bounded statements are proven above)."""
    monkeypatch.setattr(queues, "DELETE_BATCH", 1000)
    seed(scope, "q", 60_000)
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '2s'")
    try:
        assert store.purge_queue(scope, "q") == 60_000
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
