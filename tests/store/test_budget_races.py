"""A budget that runs out pauses its scope within one claim (CONTRACT §18),
with many claimants on real PostgreSQL, each thread on its own connection.

The rule checked: no claim that starts after the commit that crossed the
limit takes the scope's work. Each claimant records when it sent each claim
and when each complete came back. Every complete reports $1 for its own
delivery, so once ``limit`` completes have come back, at least ``limit``
dollars are committed: the crossing commit happened before the
``limit``-th return. A claim sent after that instant that took a todo of the
scope breaks the rule. The checker is tested on a planted violation too.
"""

import threading
import time
from dataclasses import dataclass, field

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
