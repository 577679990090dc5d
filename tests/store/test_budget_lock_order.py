"""A late usage report and the redelivery of its todo share locks without a
cycle (CONTRACT §18), on real PostgreSQL, each party on its own connection.

The usage of a max_cost todo whose lease lapsed can arrive (a heartbeat or a
complete with ``usage``) while a claim redelivers the todo, or the reaper
requeues it. Both paths take the todo's row first, then the budgets' rows in
id order:

- the acknowledgement updates the todo (``moved``), writes its ledger row,
  and only then counts the row against its budgets
  (``switchboard_budget_spend``: one UPDATE each, in id order);
- the claim locks its candidates (FOR UPDATE SKIP LOCKED: it passes over a
  todo another holds, it never waits for one), then ``switchboard_reserve``
  locks the USD budgets of their queues in id order before it deletes the
  ended attempts' reservations and reserves;
- the reaper locks only the todos it requeues: an attempt's reservation
  ends with the attempt (it is read live from the todo) and is deleted by
  the next reservation under the budget's lock.

The interleavings are made by transactions that hold a budget row or run a
statement without committing, and each step waits until PostgreSQL reports
the expected waiter (``pg_blocking_pids``), never for a time. Were either
path to take the budgets in another order, the first test's last step would
close a cycle and PostgreSQL would stop one party ("deadlock detected",
``store.Deadlocked``).
"""

import threading
import time
from decimal import Decimal
from functools import partial

import psycopg
import pytest
from django.db import connection, connections

from todos import store
from todos.store import sweeps

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_BUDGET = "SELECT 1 FROM budgets WHERE id = %s FOR UPDATE"


def raw_connection():
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


def holding(*budget_ids):
    """A connection whose open transaction holds these budgets' rows."""
    holder = raw_connection()
    holder.execute("BEGIN")
    for budget_id in budget_ids:
        holder.execute(LOCK_BUDGET, [budget_id])
    return holder


def waiting(watch):
    """Each backend waiting for a lock, with the backends it waits for."""
    rows = watch.execute(
        "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchall()
    return {pid: set(blockers) for pid, blockers in rows}


def waiters(watch, *holders):
    """The backends waiting for a lock (of any holder: those of ``holders``,
    connections)."""
    pids = {holder.info.backend_pid for holder in holders}
    return {
        pid
        for pid, blockers in waiting(watch).items()
        if blockers and (not pids or pids & blockers)
    }


def wait_until(check, what):
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def start(outcome, name, call):
    """Run ``call`` on a thread of its own (its own Django connection); its
    result or exception lands in ``outcome[name]``."""

    def run():
        try:
            outcome[name] = call()
        except Exception as exc:  # noqa: BLE001 - asserted by the test
            outcome[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def budgets_in_id_order(scope):
    """A queue budget and an endpoint budget of queue q, neither binding:
    their ids, lowest first (PostgreSQL's uuid order)."""
    for given in ({"scope": "queue", "queue": "q"}, {"scope": "endpoint"}):
        store.create_budget(scope, window="day", limit_usd=100, **given)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id::text FROM budgets ORDER BY id")
        return [budget_id for (budget_id,) in cursor.fetchall()]


def lapsed_todo(scope):
    """A max_cost todo claimed by w1 (reserving $1 against both budgets),
    its lease run out (moved into the past in the database)."""
    todo, _ = store.create_todo(scope, queue="q", max_cost=1)
    assert store.claim_next(scope, "w1", queue="q").id == todo.id
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '10 minutes'"
            " WHERE id = %s",
            [todo.id],
        )
    return todo


def spent(scope, budget_ids):
    return [store.get_budget(scope, b).spent_usd for b in budget_ids]


def reservations(todo_id):
    """The (attempt, budget) reservations of a todo whose attempt runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.attempt, r.budget_id::text FROM budget_reservations r"
            " JOIN todos t ON t.id = r.todo_id AND t.state = 'claimed'"
            " AND t.attempt = r.attempt WHERE r.todo_id = %s ORDER BY r.budget_id",
            [todo_id],
        )
        return cursor.fetchall()


def test_a_late_report_and_a_claim_take_the_budgets_in_one_order(scope):
    """A late report holds its todo and counts against both budgets while a
    claim reserves another todo's max_cost against the same two. One holder
    keeps each budget; the report waits first, then the claim; the lower
    budget is let go, then the higher. In one order both finish: the report
    counted once, the claim's reservation made."""
    low, high = budgets_in_id_order(scope)
    late = lapsed_todo(scope)
    other, _ = store.create_todo(scope, queue="q", max_cost=1)
    outcome = {}
    watch = raw_connection()
    first, second = holding(low), holding(high)
    try:
        report = start(
            outcome,
            "report",
            lambda: store.heartbeat(scope, late.id, "w1", usage={"cost_usd": 0.4}),
        )
        wait_until(lambda: len(waiters(watch, first, second)) == 1, "report waits")
        claim = start(
            outcome, "claim", partial(store.claim_next, scope, "w2", queue="q")
        )
        wait_until(lambda: len(waiters(watch)) == 2, "claim waits too")

        first.execute("COMMIT")
        wait_until(
            lambda: (
                len(waiters(watch)) == 2
                and not waiters(watch, first)
                and waiters(watch, second)
            ),
            "both wait again: none for the lower budget's holder, one for the higher's",
        )
        second.execute("COMMIT")
        report.join(timeout=10)
        claim.join(timeout=10)
    finally:
        for held in (first, second, watch):
            held.close()

    assert not isinstance(outcome["report"], Exception), outcome["report"]
    assert not isinstance(outcome["claim"], Exception), outcome["claim"]
    assert outcome["report"].lease_expires_at is not None
    # The lapsed todo was the report's (locked): the claim passed over it.
    assert outcome["claim"].id == other.id
    assert spent(scope, (low, high)) == [Decimal("0.4")] * 2
    assert reservations(other.id) == [(1, low), (1, high)]
    assert reservations(late.id) == [(1, low), (1, high)]


def test_a_late_report_waits_for_the_redelivery_of_its_todo_and_counts_nothing(
    scope,
):
    """The redelivery holds the todo and the lower budget while the higher
    one is held; the late report waits for the todo's row, holding no
    budget, so the claim finishes; the report then finds the todo claimed
    by another and is refused, its usage not counted."""
    low, high = budgets_in_id_order(scope)
    late = lapsed_todo(scope)
    outcome = {}
    watch = raw_connection()
    holder = holding(high)
    try:
        claim = start(
            outcome, "claim", partial(store.claim_next, scope, "w2", queue="q")
        )
        wait_until(lambda: len(waiters(watch, holder)) == 1, "claim waits")
        (claim_pid,) = waiters(watch, holder)
        report = start(
            outcome,
            "report",
            lambda: store.complete_todo(scope, late.id, "w1", usage={"cost_usd": 0.4}),
        )
        wait_until(lambda: len(waiters(watch)) == 2, "report waits")
        blocked_by_claim = watch.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE %s = ANY(pg_blocking_pids(pid))",
            [claim_pid],
        ).fetchone()[0]
        assert blocked_by_claim == 1, "the report waits for the claim's todo row"

        holder.execute("COMMIT")
        claim.join(timeout=10)
        report.join(timeout=10)
    finally:
        holder.close()
        watch.close()

    redelivered = outcome["claim"]
    assert (redelivered.id, redelivered.owner, redelivered.attempt) == (
        late.id,
        "w2",
        2,
    )
    assert isinstance(outcome["report"], store.Conflict)
    assert spent(scope, (low, high)) == [Decimal(0)] * 2
    assert reservations(late.id) == [(2, low), (2, high)]


def test_the_reaper_requeues_a_lapsed_attempt_without_taking_its_budgets(scope):
    """The reaper, its transaction open, holds the lapsed todo; the late
    report waits for that row, and a claim of another max_cost todo reserves
    against both budgets meanwhile (neither holds a budget). The reaper's
    commit ends the attempt: the report is refused and counts nothing, and
    the ended attempt's reservation no longer counts."""
    low, high = budgets_in_id_order(scope)
    late = lapsed_todo(scope)
    other, _ = store.create_todo(scope, queue="q", max_cost=1)
    outcome = {}
    watch = raw_connection()
    reaper = raw_connection()
    try:
        reaper.execute("BEGIN")
        reaped = reaper.execute(
            sweeps.REAP_EXPIRED_SQL,
            {"limit": 10, "actor": "system:reaper", "event_error": "lease expired"},
        ).fetchall()
        assert [str(row[0]) for row in reaped] == [late.id]
        report = start(
            outcome,
            "report",
            lambda: store.heartbeat(scope, late.id, "w1", usage={"cost_usd": 0.4}),
        )
        wait_until(lambda: len(waiters(watch, reaper)) == 1, "report waits")

        claimed = store.claim_next(scope, "w2", queue="q")
        assert claimed.id == other.id
        assert reservations(other.id) == [(1, low), (1, high)]

        reaper.execute("COMMIT")
        report.join(timeout=10)
    finally:
        reaper.close()
        watch.close()

    assert isinstance(outcome["report"], store.Conflict)
    assert spent(scope, (low, high)) == [Decimal(0)] * 2
    assert reservations(late.id) == []
    assert store.get_todo(scope, late.id).state == "pending"
