"""Many real claimants (threads and processes) against real PostgreSQL.

These are the project's race detector (CONTRACT §4): every claimant runs on its
own database connection, so the only thing keeping two of them off the same
todo is the store's ``FOR UPDATE SKIP LOCKED`` and its conditional updates.
"""

import multiprocessing
import threading
import time

import psycopg
import pytest
from django.db import connection, connections

from todos import store

CLAIMANTS = 16
TODOS = 600

pytestmark = pytest.mark.django_db(transaction=True)


def seed(endpoint_id, count, queue="pool"):
    """Insert pending todos in one statement, each with its creation event."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH made AS (
                INSERT INTO todos (id, endpoint_id, queue, title, state, created_at)
                SELECT gen_random_uuid(), %(endpoint)s, %(queue)s, 'todo ' || n,
                       'pending', clock_timestamp()
                  FROM generate_series(1, %(count)s) AS n
                RETURNING id, endpoint_id
            )
            INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state,
                                     attempt, actor, error, at)
            SELECT id, endpoint_id, NULL, 'pending', 0, 'seed', '', now() FROM made
            """,
            {"endpoint": str(endpoint_id), "queue": queue, "count": count},
        )


def drain(scope, worker, start):
    """Claim and complete until no work is left; return the ids this worker took."""
    taken = []
    start.wait()
    try:
        while True:
            try:
                todo = store.claim_next(scope, worker, queue="pool")
            except store.NotFound:
                return taken
            store.complete_todo(scope, todo.id, worker, result={"by": worker})
            taken.append(todo.id)
    finally:
        connection.close()


def drain_in_process(database_name, scope, worker, start, results):
    """Run ``drain`` in a freshly spawned interpreter on the test database."""
    import django
    from django.conf import settings

    django.setup()
    settings.DATABASES["default"]["NAME"] = database_name
    results.put((worker, drain(scope, worker, start)))


def state_counts(endpoint_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, count(*) FROM todos WHERE endpoint_id = %s GROUP BY state",
            [str(endpoint_id)],
        )
        return dict(cursor.fetchall())


def claims_per_todo(endpoint_id):
    """Return {todo id: number of claim events} from the history."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT t.id::text, count(e.id) FILTER (WHERE e.to_state = 'claimed')
              FROM todos t LEFT JOIN todo_events e ON e.todo_id = t.id
             WHERE t.endpoint_id = %s
             GROUP BY t.id
            """,
            [str(endpoint_id)],
        )
        return dict(cursor.fetchall())


def histories_that_disagree_with_their_row(endpoint_id):
    """Return the todos whose last history row does not end in their state."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT t.id::text FROM todos t
             WHERE t.endpoint_id = %s
               AND t.state IS DISTINCT FROM (
                   SELECT e.to_state FROM todo_events e
                    WHERE e.todo_id = t.id ORDER BY e.id DESC LIMIT 1)
            """,
            [str(endpoint_id)],
        )
        return [row[0] for row in cursor.fetchall()]


def assert_each_claimed_exactly_once(endpoint_id, taken_by_worker):
    taken = [todo_id for ids in taken_by_worker.values() for todo_id in ids]
    assert len(taken) == TODOS, "every todo claimed"
    assert len(set(taken)) == TODOS, "no todo claimed twice"
    assert state_counts(endpoint_id) == {"done": TODOS}, "none left"
    assert set(claims_per_todo(endpoint_id).values()) == {1}
    assert histories_that_disagree_with_their_row(endpoint_id) == []
    # Claims do not serialize behind a global lock: every claimant got work.
    assert all(taken_by_worker[f"w{n}"] for n in range(CLAIMANTS)), {
        worker: len(ids) for worker, ids in taken_by_worker.items()
    }


def test_threads_claim_every_todo_exactly_once(make_endpoint):
    """SPEC: Concurrent claimants get distinct todos"""
    endpoint = make_endpoint("threads")
    scope = store.Scope.for_endpoint(endpoint)
    seed(endpoint.id, TODOS)
    start = threading.Barrier(CLAIMANTS, timeout=60)
    results = {}

    def run(worker):
        results[worker] = drain(scope, worker, start)

    threads = [threading.Thread(target=run, args=(f"w{n}",)) for n in range(CLAIMANTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert_each_claimed_exactly_once(endpoint.id, results)


def test_processes_claim_every_todo_exactly_once(make_endpoint):
    """SPEC: Concurrent claimants get distinct todos"""
    endpoint = make_endpoint("processes")
    scope = store.Scope.for_endpoint(endpoint)
    seed(endpoint.id, TODOS)
    # Spawned, not forked: forking a process that runs threads (pytest's, the
    # other tests') can deadlock the child. Each child opens its own connection
    # to the test database, whose name only this process knows.
    database_name = connection.settings_dict["NAME"]
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(CLAIMANTS, timeout=60)
    queue = context.Queue()
    workers = [
        context.Process(
            target=drain_in_process,
            args=(database_name, scope, f"w{n}", start, queue),
        )
        for n in range(CLAIMANTS)
    ]
    for worker in workers:
        worker.start()
    results = dict(queue.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    assert [worker.exitcode for worker in workers] == [0] * CLAIMANTS
    assert_each_claimed_exactly_once(endpoint.id, results)


def test_threads_share_lapsed_leases_and_due_retries_without_doubles(
    make_endpoint,
):
    """SPEC: Concurrent claimants get distinct todos

    The claim scan's redelivery branch (lapsed leases, elapsed backoffs) races
    the reaper and the retry scheduler; each todo is still claimed once.
    """
    endpoint = make_endpoint("redelivery")
    scope = store.Scope.for_endpoint(endpoint)
    seed(endpoint.id, TODOS)
    with connection.cursor() as cursor:
        # A third lapsed in a crashed worker's hands, a third parked with an
        # elapsed backoff, the rest fresh.
        cursor.execute(
            """
            WITH numbered AS (
                SELECT id, row_number() OVER (ORDER BY created_at) AS n FROM todos
                 WHERE endpoint_id = %s
            )
            UPDATE todos t SET
                state = CASE WHEN n %% 3 = 0 THEN 'claimed'
                             WHEN n %% 3 = 1 THEN 'failed' ELSE 'pending' END,
                owner = CASE WHEN n %% 3 = 2 THEN NULL ELSE 'crashed' END,
                attempt = CASE WHEN n %% 3 = 2 THEN 0 ELSE 1 END,
                lease_expires_at = CASE WHEN n %% 3 = 0
                                        THEN now() - interval '1 minute' END,
                next_retry_at = CASE WHEN n %% 3 = 1
                                     THEN now() - interval '1 minute' END
              FROM numbered WHERE t.id = numbered.id
            """,
            [str(endpoint.id)],
        )
    start = threading.Barrier(CLAIMANTS + 1, timeout=60)
    results = {}

    def run(worker):
        results[worker] = drain(scope, worker, start)

    def sweep():
        start.wait()
        try:
            for _ in range(20):
                store.reap_expired(limit=25)
                store.requeue_due_retries(limit=25)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"w{n}",)) for n in range(CLAIMANTS)]
    threads.append(threading.Thread(target=sweep))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    taken = [todo_id for ids in results.values() for todo_id in ids]
    assert len(taken) == len(set(taken)) == TODOS
    assert state_counts(endpoint.id) == {"done": TODOS}
    # A pre-set claim (the crashed worker's) is not in the history; the drain's
    # claim is, exactly once per todo.
    assert set(claims_per_todo(endpoint.id).values()) == {1}
    assert histories_that_disagree_with_their_row(endpoint.id) == []


def test_a_lapsed_owner_and_its_rescuers_never_both_win_a_todo(make_endpoint):
    """SPEC: Only the lease owner may complete or fail (under concurrency).

    A slow worker completes todos whose leases lapsed while rescuers claim them
    through the claim scan: each todo goes to exactly one of them.
    """
    endpoint = make_endpoint("rescue")
    scope = store.Scope.for_endpoint(endpoint)
    seed(endpoint.id, TODOS)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE todos SET state = 'claimed', owner = 'slow', attempt = 1,
                             claimed_at = now() - interval '10 minutes',
                             lease_expires_at = now() - interval '1 minute'
             WHERE endpoint_id = %s
            """,
            [str(endpoint.id)],
        )
        cursor.execute(
            "SELECT id::text FROM todos WHERE endpoint_id = %s ORDER BY created_at",
            [str(endpoint.id)],
        )
        todo_ids = [row[0] for row in cursor.fetchall()]
    # Few rescuers, and the slow worker walks from the newest end while the
    # claim scan takes the oldest first: they meet, and race, in the middle.
    rescuers = 3
    start = threading.Barrier(rescuers + 1, timeout=60)
    completed_by_slow, refused_to_slow, lost_by_rescuers, rescued = [], [], [], {}

    def slow():
        start.wait()
        try:
            for todo_id in reversed(todo_ids):
                try:
                    store.complete_todo(scope, todo_id, "slow")
                    completed_by_slow.append(todo_id)
                except store.Conflict:
                    refused_to_slow.append(todo_id)
        finally:
            connection.close()

    def rescuer(worker):
        taken = []
        start.wait()
        try:
            while True:
                try:
                    todo = store.claim_next(scope, worker, queue="pool")
                except store.NotFound:
                    break
                # Work a moment with the lease held: the slow worker's complete
                # must not slip in while the rescuer owns it.
                time.sleep(0.002)
                try:
                    store.complete_todo(scope, todo.id, worker)
                    taken.append(todo.id)
                except store.Conflict:
                    lost_by_rescuers.append(todo.id)
        finally:
            connection.close()
        rescued[worker] = taken

    threads = [threading.Thread(target=slow)] + [
        threading.Thread(target=rescuer, args=(f"r{n}",)) for n in range(rescuers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert lost_by_rescuers == [], "a claimed todo was taken from its owner"
    by_rescuers = [todo_id for ids in rescued.values() for todo_id in ids]
    assert len(by_rescuers) == len(set(by_rescuers))
    assert completed_by_slow and by_rescuers, "both sides won some"
    assert not set(completed_by_slow) & set(by_rescuers), "a todo won twice"
    assert sorted(completed_by_slow + by_rescuers) == sorted(todo_ids)
    assert sorted(refused_to_slow) == sorted(by_rescuers)
    assert state_counts(endpoint.id) == {"done": TODOS}
    assert histories_that_disagree_with_their_row(endpoint.id) == []


def test_a_claim_skips_a_row_locked_by_another_claimant_instead_of_waiting(
    make_endpoint,
):
    """SPEC: Concurrent claimants get distinct todos (claims do not block)."""
    endpoint = make_endpoint("skip-locked")
    scope = store.Scope.for_endpoint(endpoint)
    first, _ = store.create_todo(scope, queue="pool")
    second, _ = store.create_todo(scope, queue="pool")
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params) as other:
        # Another claimant's transaction holds the oldest row, uncommitted.
        other.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE", [first.id])
        started = time.monotonic()
        taken = store.claim_next(scope, "w2", queue="pool")
        waited = time.monotonic() - started
        other.rollback()
    assert taken.id == second.id
    assert waited < 1.0


def test_concurrent_duplicate_deliveries_collapse_to_one_todo(make_endpoint):
    """SPEC: Duplicate delivery collapses to one todo (under concurrency)."""
    endpoint = make_endpoint("dedup")
    scope = store.Scope.for_endpoint(endpoint)
    start = threading.Barrier(CLAIMANTS, timeout=60)
    outcomes = []

    def deliver():
        start.wait()
        try:
            outcomes.append(
                store.create_todo(scope, queue="github", idempotency_key="d-1")
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(CLAIMANTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == CLAIMANTS
    assert sum(created for _, created in outcomes) == 1
    assert len({todo.id for todo, _ in outcomes}) == 1
    assert state_counts(endpoint.id) == {"pending": 1}
