"""A budget that runs out pauses its scope within one claim (CONTRACT §18),
with many claimants on real PostgreSQL, each thread on its own connection.

The rule checked: no claim that starts after the commit that crossed the
limit takes the scope's work. Each claimant records when it sent each claim
and when each complete came back. Every complete reports $1 for its own
delivery, so once ``limit`` completes have come back, at least ``limit``
dollars are committed: the crossing commit happened before the
``limit``-th return. A claim sent after that instant that took a todo of the
scope breaks the rule. The checker is tested on a planted violation too.

With max_cost reservations, spend never exceeds the limit by more than the
reservations in flight: a reader samples the budget while the claimants
work, and every sample, and the end, holds the rule.
"""

import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from django.db import connection

from todos import store

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 12
TODOS = 60
CLAIMANTS = 8


@dataclass
class History:
    """What the claimants saw: (sent at, todo id or None) per claim, and
    the return time of every complete."""

    claims: list[tuple[float, str | None]] = field(default_factory=list)
    completes: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def late_claims(history: History, limit: int) -> list[tuple[float, str]]:
    """The claims sent after the ``limit``-th complete came back that took a
    todo: each one took work after the limit was committed."""
    returned = sorted(history.completes)
    if len(returned) < limit:
        return []
    crossed = returned[limit - 1]
    return [
        (sent, todo_id)
        for sent, todo_id in history.claims
        if todo_id is not None and sent > crossed
    ]


def test_the_checker_finds_a_planted_late_claim():
    history = History(
        claims=[(1.0, "a"), (2.0, "b"), (3.5, None), (4.0, "late")],
        completes=[1.5, 2.5, 3.0],
    )
    assert late_claims(history, 2) == [(4.0, "late")]
    assert late_claims(history, 3) == [(4.0, "late")]
    history.claims.pop()
    assert late_claims(history, 2) == []


def claimant(scope, name: str, history: History, start: threading.Barrier) -> None:
    try:
        start.wait()
        misses = 0
        while misses < 5:
            sent = time.monotonic()
            try:
                todo = store.claim_next(scope, name, queue="q")
            except store.NotFound:
                with history.lock:
                    history.claims.append((sent, None))
                misses += 1
                continue
            misses = 0
            with history.lock:
                history.claims.append((sent, todo.id))
            store.complete_todo(scope, todo.id, name, usage={"cost_usd": 1})
            returned = time.monotonic()
            with history.lock:
                history.completes.append(returned)
    finally:
        connection.close()


def test_no_claim_that_starts_after_the_crossing_commit_takes_the_scopes_work(scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=LIMIT
    )
    for _ in range(TODOS):
        store.create_todo(scope, queue="q")
    history = History()
    start = threading.Barrier(CLAIMANTS, timeout=30)
    threads = [
        threading.Thread(target=claimant, args=(scope, f"w{n}", history, start))
        for n in range(CLAIMANTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)

    taken = [todo_id for _, todo_id in history.claims if todo_id is not None]
    assert LIMIT <= len(taken) < TODOS, "the limit stopped the claims"
    # Claims already under way when the limit was crossed may finish: at most
    # one per claimant.
    assert len(taken) <= LIMIT + CLAIMANTS
    assert late_claims(history, LIMIT) == []
    read = store.get_budget(scope, budget.id)
    assert read.state == "exhausted"
    assert read.spent_usd == len(taken)
    assert [e.event for e in store.budget_history(scope, budget.id)].count(
        "budget.exhausted"
    ) == 1


# --- max_cost reservations ---------------------------------------------------

RESERVED_LIMIT = Decimal(10)
MAX_COST = 2
RESERVING_TODOS = 40


@dataclass(frozen=True)
class Sample:
    """One reading of a budget, in one statement: what it spent, its limit
    (with this window's raise) and the reservations in flight against it."""

    spent: Decimal
    limit: Decimal
    in_flight: Decimal


def overshoots(samples: list[Sample]) -> list[Sample]:
    """The readings where spend passed the limit by more than the
    reservations in flight."""
    return [s for s in samples if s.spent - s.limit > s.in_flight]


def test_the_checker_finds_a_planted_overshoot():
    fine = [
        Sample(Decimal(9), Decimal(10), Decimal(0)),
        Sample(*map(Decimal, (11, 10, 2))),
    ]
    assert overshoots(fine) == []
    planted = Sample(Decimal("12.5"), Decimal(10), Decimal(2))
    assert overshoots([*fine, planted]) == [planted]


SAMPLE_SQL = """
SELECT b.spent_usd, b.limit_usd + b.raised_usd,
       (SELECT coalesce(sum(r.usd), 0) FROM budget_reservations r
          JOIN todos t ON t.id = r.todo_id AND t.state = 'claimed'
                      AND t.attempt = r.attempt
         WHERE r.budget_id = b.id)
  FROM budgets b WHERE b.id = %s
"""


def sample(budget_id: str) -> Sample:
    with connection.cursor() as cursor:
        cursor.execute(SAMPLE_SQL, [budget_id])
        return Sample(*cursor.fetchone())


def reserving_claimant(
    scope,
    name: str,
    seed: int,
    spent: list[Decimal],
    lock: threading.Lock,
    start: threading.Barrier,
) -> None:
    """Claim max_cost todos until five claims in a row find none; report a
    part of the attempt's spend by heartbeat, then its final figure (at most
    its max_cost) on complete, fail or release."""
    chance = random.Random(seed)
    try:
        start.wait()
        misses = 0
        while misses < 5:
            try:
                todo = store.claim_next(scope, name, queue="q")
            except store.NotFound:
                misses += 1
                time.sleep(0.01)
                continue
            misses = 0
            final = Decimal(chance.randint(0, MAX_COST * 100)) / 100
            store.heartbeat(scope, todo.id, name, usage={"cost_usd": float(final / 2)})
            end = chance.choice(("complete", "complete", "fail", "release"))
            usage = {"cost_usd": float(final)}
            if end == "complete":
                store.complete_todo(scope, todo.id, name, usage=usage)
            elif end == "fail":
                store.fail_todo(scope, todo.id, name, error="x", usage=usage)
            else:
                store.heartbeat(scope, todo.id, name, usage=usage)
                store.release_todo(scope, todo.id, name)
            with lock:
                spent.append(final)
    finally:
        connection.close()


def sampler(budget_id: str, samples: list[Sample], done: threading.Event) -> None:
    try:
        while not done.is_set():
            samples.append(sample(budget_id))
    finally:
        connection.close()


def test_spend_never_exceeds_the_limit_by_more_than_the_reservations_in_flight(scope):
    budget = store.create_budget(
        scope, scope="queue", queue="q", window="day", limit_usd=int(RESERVED_LIMIT)
    )
    for _ in range(RESERVING_TODOS):
        store.create_todo(scope, queue="q", max_cost=MAX_COST, max_attempts=1)
    spent: list[Decimal] = []
    samples: list[Sample] = []
    lock = threading.Lock()
    done = threading.Event()
    start = threading.Barrier(CLAIMANTS, timeout=30)
    threads = [
        threading.Thread(
            target=reserving_claimant,
            args=(scope, f"w{n}", n, spent, lock, start),
        )
        for n in range(CLAIMANTS)
    ]
    watcher = threading.Thread(target=sampler, args=(budget.id, samples, done))
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    done.set()
    watcher.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)

    final = sample(budget.id)
    assert len(samples) > 10
    assert overshoots([*samples, final]) == []
    assert final.in_flight == 0, "every attempt's end released its reservation"
    assert final.spent == sum(spent)
    # Every claim fit: what was spent stays within the limit.
    assert final.spent <= RESERVED_LIMIT
    assert len(spent) >= RESERVED_LIMIT / MAX_COST, "the claims went on to the limit"
