"""The doorbell listener itself: filtering, prompt wakeups, its own connection."""

import asyncio
import threading
import time

import pytest
from django.db import connection

from todos import store
from todos.doorbell import Doorbell, hub

pytestmark = pytest.mark.django_db(transaction=True)


def create_later(scope, seconds=0.2, count=1, queue="q"):
    def create():
        # Bypasses the grant check, so a todo can land in an ungranted queue.
        for _ in range(count):
            store.create_todo_any_endpoint(scope.endpoint_id, queue=queue)
        connection.close()

    timer = threading.Timer(seconds, create)
    timer.start()
    return timer


def test_wait_returns_at_the_first_ring_with_those_already_delivered(scope):
    with Doorbell(scope) as bell:
        started = time.monotonic()
        create_later(scope, count=3).join()
        rings = bell.wait(5, stop_after=10)
        assert time.monotonic() - started < 1.5
        assert 1 <= len(rings) <= 3
        time.sleep(0.2)
        rest = bell.wait(1, stop_after=10)
    assert len(rings) + len(rest) == 3


def test_wait_drops_rings_of_other_endpoints_and_of_ungranted_queues(
    scope, other_scope, make_endpoint
):
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("a",)))
    with Doorbell(narrow) as bell:
        create_later(other_scope, queue="a").join()
        create_later(narrow, queue="b").join()
        assert bell.wait(0.8) == []
        create_later(narrow, queue="a").join()
        assert [ring["queue"] for ring in bell.wait(2)] == ["a"]


def test_the_doorbell_may_listen_through_a_connection_string_of_its_own(
    scope, settings
):
    params = connection.get_connection_params()
    settings.SWITCHBOARD_LISTEN_DATABASE_URL = (
        f"postgresql://{params['user']}@{params['host']}:{params['port']}"
        f"/{params['dbname']}?application_name=switchboard-doorbell-own-url"
    )
    # The hub connects on first use: restart it to take the setting.
    hub.stop()
    try:
        with Doorbell(scope) as bell:
            assert bell.conn.info.parameter_status("application_name") == (
                "switchboard-doorbell-own-url"
            )
            create_later(scope).join()
            assert len(bell.wait(2)) == 1
    finally:
        hub.stop()


def test_the_periodic_recheck_spreads_the_scopes_over_its_period():
    """Defect: every recheck period each process asked one claim waiter of
    every waiting scope to try again in the same instant: 50 scopes were 50
    claim tries at once every 5 s, a burst each probe's p99 ran into. Each
    tick now asks one part of the scopes; over a period, each scope once."""
    from uuid import uuid4

    from todos.doorbell import RECHECK, Hub

    quiet = Hub()
    scopes = [store.Scope(uuid4(), None) for _ in range(40)]
    waiters = []
    for scope in scopes:
        for _ in range(2):
            waiter = quiet.subscribe(scope, "claim")
            waiters.append(waiter)
    quiet.stop()  # no LISTEN thread: the test drives the ticks
    for waiter in waiters:
        waiter._take()  # the RECHECK of its first LISTEN
    parts = 10
    asked_per_tick = []
    for part in range(parts):
        with quiet.lock:
            quiet._recheck_claims(part, parts)
        asked = [w for w in waiters if RECHECK in w.notices]
        asked_per_tick.append(len(asked))
        for waiter in asked:
            waiter._take()
            waiter.asked = getattr(waiter, "asked", 0) + 1
    assert sum(asked_per_tick) == len(scopes)  # each scope once a period
    assert max(asked_per_tick) < len(scopes) // 2  # not all at once
    for scope in scopes:
        asked = [getattr(w, "asked", 0) for w in waiters if w.scope == scope]
        assert sorted(asked) == [0, 1]  # one waiter of the scope, not both


def quiet_streams(count):
    """A hub with no LISTEN thread and ``count`` stream waiters of one scope."""
    from uuid import uuid4

    from todos.doorbell import Hub

    quiet = Hub()
    scope = store.Scope(uuid4(), None)
    waiters = [quiet.subscribe(scope, "stream") for _ in range(count)]
    quiet.stop()
    for waiter in waiters:
        waiter._take()  # the RECHECK of its first LISTEN
    return quiet, scope, waiters


def ring(scope, number):
    return {"endpoint_id": str(scope.endpoint_id), "queue": "q", "id": f"t{number}"}


def test_streams_take_the_rings_of_one_moment_in_one_wake(settings):
    """Each ring woke each open stream for a write of its own, and the loop
    served that fan-out before the answer of the create that rang. Rings now
    reach a loop's streams together, SWITCHBOARD_STREAM_BATCH_MS later."""
    settings.SWITCHBOARD_STREAM_BATCH_MS = 50
    quiet, scope, waiters = quiet_streams(3)

    async def main():
        waits = [asyncio.ensure_future(w.wait(5)) for w in waiters]
        await asyncio.sleep(0)  # every stream waiting
        for number in (1, 2):
            with quiet.lock:
                quiet._dispatch_ring(ring(scope, number))
            await asyncio.sleep(0.005)
        return await asyncio.gather(*waits)

    taken = asyncio.run(main())

    for rings, notices in taken:
        assert [r["id"] for r in rings] == ["t1", "t2"] and not notices
    assert not quiet._batches


def wait_through(quiet, waiter, deliver):
    """``waiter``'s next wait, with ``deliver()`` run under the hub's lock once
    it waits; it must end within 0.5 s (well before any batch of 1 s)."""

    async def main():
        wait = asyncio.ensure_future(waiter.wait(5))
        await asyncio.sleep(0)
        with quiet.lock:
            deliver()
        return await asyncio.wait_for(wait, 0.5)

    return asyncio.run(main())


def test_a_notice_wakes_a_stream_at_once_even_with_rings_in_a_batch(settings):
    from todos.doorbell import ENDPOINT

    settings.SWITCHBOARD_STREAM_BATCH_MS = 1000
    quiet, scope, (waiter,) = quiet_streams(1)

    def deliver():
        quiet._dispatch_ring(ring(scope, 1))
        quiet._dispatch_control(
            {"endpoint_id": str(scope.endpoint_id), "kind": "endpoint"}
        )

    rings, notices = wait_through(quiet, waiter, deliver)

    assert [r["id"] for r in rings] == ["t1"] and notices == {ENDPOINT}


def test_stream_batching_off_wakes_each_ring_at_once(settings):
    settings.SWITCHBOARD_STREAM_BATCH_MS = 0
    quiet, scope, (waiter,) = quiet_streams(1)

    rings, _ = wait_through(quiet, waiter, lambda: quiet._dispatch_ring(ring(scope, 1)))

    assert [r["id"] for r in rings] == ["t1"] and not quiet._batches


def test_streams_keep_alive_out_of_step_with_each_other():
    """Defect: streams opened together sent their keep-alives together for
    good, 1 350 writes of one process in one burst every 15 s. Each wait's
    silence is now drawn between 3/4 of the setting and all of it."""
    from todos.doorbell import keepalive_wait

    waits = [keepalive_wait(15) for _ in range(200)]

    assert all(11.25 <= wait <= 15 for wait in waits)
    assert max(waits) - min(waits) > 2  # spread, not one instant
