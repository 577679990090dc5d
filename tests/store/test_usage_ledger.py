"""The usage ledger under concurrency, checked by replay (CONTRACT §18).

Real processes, each on its own connection, claim and report through the
store: heartbeats, completes and fails carrying the attempt's running total,
requests repeated as a client that lost the answer repeats them, leases left
to lapse (and reported on after, accepted or superseded), todos failed and
retried, questions asked and answered (which give the attempt back). Each
process keeps the reports the store accepted; the checker
(``todos.store.usage_check``) replays them and compares the ledger to the
cent. A planted double count must make it fail.
"""

import contextlib
import multiprocessing
import random
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection

from todos import store
from todos.store import usage_check
from todos.store.usage_check import Accepted

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES = 4
TODOS = 60
STEPS = 120


def lapse(todo_id):
    """Make a lease lapse ten minutes ago (time moves in the database)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '10 minutes'"
            " WHERE id = %s AND state = 'claimed'",
            [todo_id],
        )


def report(rng, running):
    """The attempt's running total grown by a random step, some fields only."""
    running["input_tokens"] = running.get("input_tokens", 0) + rng.randint(0, 900)
    running["output_tokens"] = running.get("output_tokens", 0) + rng.randint(0, 300)
    running["cost_usd"] = round(
        running.get("cost_usd", 0) + rng.randint(0, 250) / 100, 2
    )
    running["model"] = rng.choice(["small", "large"])
    names = rng.sample(sorted(running), rng.randint(1, len(running)))
    return {name: running[name] for name in names}


def work(scope, worker, seed):
    """One agent: claim, report, end or abandon; return the accepted reports
    and how many requests were repeated and refused."""
    rng = random.Random(seed)
    accepted = []
    seen = Counter()
    # Each delivery's running total: a report is never smaller than the last.
    running = {}

    def send(move, todo, usage, **fields):
        """One request, repeated one time in four (a retry after a lost
        answer: same token, same report); keep it when accepted."""
        ok = False
        sends = 2 if rng.random() < 0.25 else 1
        seen["repeated"] += sends - 1
        for _ in range(sends):
            try:
                answer = move(
                    scope,
                    todo.id,
                    None,
                    lease_token=todo.lease_token,
                    usage=usage,
                    **fields,
                )
            except (store.Conflict, store.NotFound):
                seen["refused"] += 1
                return ok
            accepted.append((answer.id, answer.deliveries, usage))
            ok = True
        return ok

    try:
        for _ in range(STEPS):
            try:
                todo = store.claim_next(scope, worker, queue="spend")
            except store.NotFound:
                # Failed todos wait out a retry window: requeue one now.
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT id FROM todos WHERE endpoint_id = %s"
                        " AND state = 'failed' LIMIT 1",
                        [scope.endpoint_id],
                    )
                    row = cursor.fetchone()
                if row is None:
                    break
                with contextlib.suppress(store.Conflict, store.NotFound):
                    store.retry_todo(scope, str(row[0]))
                continue
            totals = running.setdefault((todo.id, todo.deliveries), {})
            for _ in range(rng.randint(0, 3)):
                if not send(store.heartbeat, todo, report(rng, totals)):
                    break
            roll = rng.random()
            if roll < 0.45:
                send(store.complete_todo, todo, report(rng, totals), result={})
            elif roll < 0.7:
                send(store.fail_todo, todo, report(rng, totals), error="boom")
            elif roll < 0.85:
                # Abandoned: the lease lapses; a late report is accepted only
                # while no other claim took the todo.
                lapse(todo.id)
                send(store.heartbeat, todo, report(rng, totals))
            else:
                store.ask(
                    scope,
                    todo.id,
                    None,
                    lease_token=todo.lease_token,
                    question="go on?",
                    return_to="pool",
                )
                store.answer_todo(scope, todo.id, "yes")
    finally:
        connection.close()
    return accepted, seen


def work_in_process(database_name, scope, worker, seed, start, results):
    """Run ``work`` in a freshly spawned interpreter on the test database."""
    import django
    from django.conf import settings

    django.setup()
    settings.DATABASES["default"]["NAME"] = database_name
    start.wait()
    results.put(work(scope, worker, seed))


def seed_todos(scope, count):
    for n in range(count):
        store.create_todo(scope, queue="spend", title=f"t{n}", max_attempts=50)


def run_processes(scope, seed):
    """Run the agents in spawned processes; return every accepted report and
    the requests' counts."""
    database_name = connection.settings_dict["NAME"]
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES, timeout=60)
    results = context.Queue()
    workers = [
        context.Process(
            target=work_in_process,
            args=(database_name, scope, f"w{n}", seed * 100 + n, start, results),
        )
        for n in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    accepted = []
    seen = Counter()
    for _ in workers:
        reports, counts = results.get(timeout=300)
        accepted.extend(reports)
        seen.update(counts)
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    return [Accepted(str(todo), turn, usage) for todo, turn, usage in accepted], seen


@pytest.mark.parametrize("seed", [1, 2])
def test_the_ledger_equals_the_replay_of_accepted_reports_to_the_cent(
    make_endpoint, seed
):
    scope = store.Scope.for_endpoint(make_endpoint(f"spenders-{seed}"))
    seed_todos(scope, TODOS)
    accepted, seen = run_processes(scope, seed)
    found = usage_check.check(scope.endpoint_id, accepted)
    assert found.mismatches == []
    assert found.reports > 100
    # The run did repeat requests and have late reports refused.
    assert seen["repeated"] > 10 and seen["refused"] > 0
    assert found.ledger_usd == found.replayed_usd > 0


def sequential_reports(scope):
    """A few reports made in order, each kept as accepted."""
    accepted = []
    for n in range(3):
        todo, _ = store.create_todo(scope, queue="spend", title=f"t{n}")
        todo = store.claim_todo(scope, todo.id, "w")
        for usage in ({"cost_usd": 0.5, "input_tokens": 10}, {"cost_usd": 1.25}):
            moved = store.heartbeat(scope, todo.id, "w", usage=usage)
            accepted.append(Accepted(todo.id, moved.deliveries, usage))
        store.complete_todo(scope, todo.id, "w")
    return accepted


def test_the_checker_passes_a_clean_ledger(make_endpoint):
    scope = store.Scope.for_endpoint(make_endpoint("clean"))
    found = usage_check.check(scope.endpoint_id, sequential_reports(scope))
    assert found.mismatches == []
    assert found.ledger_usd == Decimal("3.75")


@pytest.mark.parametrize(
    "plant",
    [
        # A report added to the attempt's figure instead of replacing it.
        "UPDATE usage_ledger SET cost_usd = cost_usd * 2"
        " WHERE id = (SELECT min(id) FROM usage_ledger WHERE endpoint_id = %s)",
        # A repeated request written as a second row.
        "INSERT INTO usage_ledger (endpoint_id, queue, todo_id, cost_usd)"
        " SELECT endpoint_id, queue, todo_id, cost_usd FROM usage_ledger"
        " WHERE id = (SELECT min(id) FROM usage_ledger WHERE endpoint_id = %s)",
    ],
    ids=["added-not-replaced", "counted-twice"],
)
def test_the_checker_fails_on_a_planted_double_count(make_endpoint, plant):
    scope = store.Scope.for_endpoint(make_endpoint("planted"))
    accepted = sequential_reports(scope)
    with connection.cursor() as cursor:
        cursor.execute(plant, [scope.endpoint_id])
    found = usage_check.check(scope.endpoint_id, accepted)
    assert found.mismatches != []
    assert found.ledger_usd == Decimal("5.00")
