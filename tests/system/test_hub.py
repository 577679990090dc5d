"""The doorbell hub itself (todos/waiting/doorbell.py): filtering, prompt
wakeups, its own connection, its re-checks and batches, and that it outlives
its failures.

Each test runs a hub of its own in an event loop of its own, as a worker does.
"""

import asyncio
import time
from uuid import uuid4

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

import todos.waiting.doorbell as hub_module
from todos import store
from todos.waiting import results
from todos.waiting.doorbell import LOST, REVALIDATE, TRY, Hub, keepalive_wait

pytestmark = pytest.mark.django_db(transaction=True)


def create(scope, count=1, queue="q"):
    # Bypasses the grant check, so a todo can land in an ungranted queue.
    for _ in range(count):
        store.create_todo_any_endpoint(scope.endpoint_id, queue=queue)
    connection.close()


def with_hub(test, hearing=True):
    """Run ``await test(hub)`` with a listening hub in a loop of its own; with
    ``hearing``, one that hears the rings and the events already, as a stream
    makes it (else it hears them once a waiter subscribes)."""

    async def main():
        hub = Hub()
        hub.start()
        deadline = time.monotonic() + 5
        while not hub.connected:
            assert time.monotonic() < deadline, "the hub never listened"
            await asyncio.sleep(0.02)
        if hearing:
            await hub.hearing_rings_and_events()
        try:
            return await test(hub)
        finally:
            await hub.stop()

    return asyncio.run(main())


async def rings_within(waiter, seconds):
    """The rings that reach ``waiter`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    rings = []
    while (remaining := deadline - time.monotonic()) > 0:
        more, _ = await waiter.wait(remaining)
        rings += more
    return rings


def test_a_wait_returns_at_the_first_ring(scope):
    async def test(hub):
        waiter = hub.subscribe(scope, "stream")
        await asyncio.to_thread(create, scope, 3)
        rings, _ = await waiter.wait(5)
        rest = await rings_within(waiter, 0.5)
        return rings, rest

    rings, rest = with_hub(test)
    assert 1 <= len(rings) <= 3 and len(rings) + len(rest) == 3


def test_rings_of_other_endpoints_and_of_ungranted_queues_are_dropped(
    scope, other_scope, make_endpoint
):
    """SPEC: Doorbell never crosses endpoints (nor the queue grant)."""
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("a",)))

    async def test(hub):
        waiter = hub.subscribe(narrow, "stream")
        await asyncio.to_thread(create, other_scope, 1, "a")
        await asyncio.to_thread(create, narrow, 1, "b")
        foreign = await rings_within(waiter, 0.5)
        await asyncio.to_thread(create, narrow, 1, "a")
        own, _ = await waiter.wait(2)
        return foreign, own

    foreign, own = with_hub(test)
    assert foreign == [] and [ring["queue"] for ring in own] == ["a"]


def test_the_hub_may_listen_through_a_connection_string_of_its_own(scope, settings):
    params = connection.get_connection_params()
    settings.SWITCHBOARD_LISTEN_DATABASE_URL = (
        f"postgresql://{params['user']}@{params['host']}:{params['port']}"
        f"/{params['dbname']}?application_name=switchboard-doorbell-own-url"
    )

    def listeners():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'switchboard-doorbell-own-url'"
            )
            count = cursor.fetchone()[0]
        connection.close()
        return count

    async def test(hub):
        waiter = hub.subscribe(scope, "stream")
        await asyncio.to_thread(create, scope)
        rings, _ = await waiter.wait(2)
        return len(rings), await asyncio.to_thread(listeners)

    assert with_hub(test) == (1, 1)


def test_the_hub_restarts_after_an_unexpected_error(scope, monkeypatch):
    """Defect: the hub's thread died for good on any exception that was not a
    psycopg.Error; the process then heard no ring until restarted. Now the
    hub logs it, reconnects, and its waiters re-validate and look again."""

    async def test(hub):
        waiter = hub.subscribe(scope, "claim")
        heard = hub._heard
        failures = []

        def fail_once(notify):
            if not failures:
                failures.append(notify)
                raise RuntimeError("unexpected")
            heard(notify)

        monkeypatch.setattr(hub, "_heard", fail_once)
        await waiter.wait(0)  # the notices of its first LISTEN
        await asyncio.to_thread(create, scope)
        notices = set()
        deadline = time.monotonic() + 5
        while not {LOST, REVALIDATE, TRY} <= notices:
            assert time.monotonic() < deadline, notices
            notices |= (await waiter.wait(1))[1]
        await asyncio.to_thread(create, scope)
        rings, _ = await waiter.wait(2)
        return failures, rings

    failures, rings = with_hub(test)
    assert len(failures) == 1 and len(rings) == 1


def test_a_payload_the_hub_cannot_read_is_dropped(scope):
    async def test(hub):
        waiter = hub.subscribe(scope, "stream")

        def poison():
            with connection.cursor() as cursor:
                # Deeper than json can decode, and not a dict, and no fields.
                cursor.execute(
                    "SELECT pg_notify(%s, repeat('[', 7000)),"
                    " pg_notify(%s, '[1]'), pg_notify(%s, '{}')",
                    [store.DOORBELL_CHANNEL] * 3,
                )
            connection.close()

        await asyncio.to_thread(poison)
        await asyncio.to_thread(create, scope)
        rings, _ = await waiter.wait(2)
        return rings, hub.connected

    rings, connected = with_hub(test)
    assert len(rings) == 1 and connected


def finish(scope, queue="q"):
    """Create, claim and complete a todo: its completion sends an event."""
    store.create_todo_any_endpoint(scope.endpoint_id, queue=queue)
    claimed = store.claim_next(scope, "w", queue=queue)
    store.complete_todo(scope, claimed.id, "w", lease_token=claimed.lease_token)
    connection.close()


def heard_on(channel, hub, monkeypatch):
    """The notices of ``channel`` that ``hub`` hears from now on."""
    heard, hear = [], hub._heard

    def counting(notify):
        if notify.channel == channel:
            heard.append(notify.payload)
        hear(notify)

    monkeypatch.setattr(hub, "_heard", counting)
    return heard


async def until(condition, seconds=5):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "it never happened"
        await asyncio.sleep(0.02)


def test_a_process_hears_todos_events_only_while_a_stream_or_result_wait_may(
    scope, monkeypatch
):
    """Every completion in the cluster woke every server process with its
    event notice, which a process without a stream or a result wait only
    dropped (40 µs each, in each process). The event channel is now heard
    from before such a waiter subscribes until a while after the last left."""
    monkeypatch.setattr(hub_module, "LINGER_SECONDS", 0.3)

    async def test(hub):
        heard = heard_on(store.TODO_EVENT_CHANNEL, hub, monkeypatch)
        await asyncio.to_thread(finish, scope)
        await asyncio.sleep(0.3)
        before = (hub.events.heard, len(heard))
        await hub.hearing_rings_and_events()
        listened = hub.events.heard
        waiter = hub.subscribe(scope, "stream")
        await asyncio.to_thread(finish, scope)
        await until(lambda: heard)
        rings = await rings_within(waiter, 0.3)
        waiter.close()
        await until(lambda: not hub.events.heard)
        heard.clear()
        await asyncio.to_thread(finish, scope)
        await asyncio.sleep(0.3)
        return before, listened, rings, len(heard)

    before, listened, rings, after = with_hub(test, hearing=False)
    assert before == (False, 0) and listened and after == 0
    assert "todo.done" in [ring.get("event") for ring in rings]


def test_a_process_hears_rings_only_while_a_claim_waiter_or_stream_may(
    scope, monkeypatch
):
    """Every create (and every end of a grouped todo) in the cluster woke
    every server process with its ring, which a process without a waiting
    claim or a stream only dropped (40 µs each, in each process). The rings
    are now heard from when such a waiter subscribes until a while after the
    last left; one that subscribed before the LISTEN looks again (a todo
    made ready in between rang unheard)."""
    monkeypatch.setattr(hub_module, "LINGER_SECONDS", 0.3)

    async def test(hub):
        heard = heard_on(store.DOORBELL_CHANNEL, hub, monkeypatch)
        await asyncio.to_thread(create, scope)
        await asyncio.sleep(0.3)
        before = (hub.rings.heard, len(heard))
        waiter = hub.subscribe(scope, "claim")
        _, notices = await waiter.wait(2)
        listened = hub.rings.heard
        await asyncio.to_thread(create, scope)
        rings, _ = await waiter.wait(2)
        waiter.close()
        await until(lambda: not hub.rings.heard)
        heard.clear()
        await asyncio.to_thread(create, scope)
        await asyncio.sleep(0.3)
        return before, notices, listened, len(rings), len(heard)

    before, notices, listened, rings, after = with_hub(test, hearing=False)
    assert before == (False, 0)
    assert notices == {TRY} and listened and rings == 1
    assert after == 0


def test_a_result_wait_that_subscribed_before_the_events_were_heard_looks_again(
    scope,
):
    """Its todo may have ended before the LISTEN: it is told to read it again."""

    async def test(hub):
        assert not hub.events.heard
        waiter = hub.subscribe(scope, "todo", todo_id=str(uuid4()))
        _, notices = await waiter.wait(2)
        waiter.close()
        return notices, hub.events.heard

    notices, hearing = with_hub(test, hearing=False)
    assert TRY in notices and hearing


def test_a_read_of_a_todo_that_does_not_wait_does_not_make_a_process_hear_events(
    scope, monkeypatch
):
    """Only a wait needs the events: a plain read of a todo LISTENs to nothing."""

    class ReadNow(results.ResultWait):
        async def start(self):
            self.wait = 0
            return scope

    def created():
        todo, _ = store.create_todo_any_endpoint(scope.endpoint_id, queue="q")
        connection.close()
        return str(todo.id)

    async def test(hub):
        monkeypatch.setattr(results, "hub", hub)
        todo = await results.wait(ReadNow(None, await asyncio.to_thread(created)))
        # Its read ran in the test's database thread (conftest): closed there.
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        await asyncio.sleep(0.2)
        return todo.state, hub.events.heard

    assert with_hub(test, hearing=False) == ("pending", False)


# --- Without a LISTEN: the hub's fan-out, driven by the test ----------------------


def quiet_hub():
    """A hub bound to the running loop that does not listen."""
    hub = Hub()
    hub.loop = asyncio.get_running_loop()
    return hub


def test_the_periodic_recheck_spreads_the_scopes_over_its_period():
    """Defect: every recheck period each process asked one claim waiter of
    every waiting scope to try again in the same instant: 50 scopes were 50
    claim tries at once every 5 s, a burst each probe's p99 ran into. Each
    tick now asks one part of the scopes; over a period, each scope once."""
    quiet = Hub()
    scopes = [store.Scope(uuid4(), None) for _ in range(40)]
    waiters = [quiet.subscribe(scope, "claim") for scope in scopes for _ in "ab"]
    parts = 10
    asked_per_tick = []
    for part in range(parts):
        quiet._recheck_claims(part, parts)
        asked = [w for w in waiters if TRY in w.notices]
        asked_per_tick.append(len(asked))
        for waiter in asked:
            waiter._take()
            waiter.asked = getattr(waiter, "asked", 0) + 1
    assert sum(asked_per_tick) == len(scopes)  # each scope once a period
    assert max(asked_per_tick) < len(scopes) // 2  # not all at once
    for scope in scopes:
        asked = [getattr(w, "asked", 0) for w in waiters if w.scope == scope]
        assert sorted(asked) == [0, 1]  # one waiter of the scope, not both


def test_a_due_recheck_asks_one_waiter_of_its_scope_at_that_instant(scope, settings):
    """What wakes a claim when a lease lapses with no ring: the hub's timer
    for the scope's earliest due instant asks one idle claim waiter to look."""
    settings.SWITCHBOARD_LONG_POLL_RECHECK_SECONDS = 600
    other = store.Scope(scope.endpoint_id, ("elsewhere",))

    async def test(hub):
        first, second = hub.subscribe(scope, "claim"), hub.subscribe(scope, "claim")
        bystander = hub.subscribe(other, "claim")
        started = time.monotonic()
        hub.due(scope, 0.3)
        hub.due(scope, 5)  # a later instant keeps the earlier timer
        _, notices = await first.wait(2)
        woken_after = time.monotonic() - started
        return notices, woken_after, second._take()[1], bystander._take()[1]

    notices, woken_after, second, bystander = with_hub(test)
    assert notices == {TRY} and 0.3 <= woken_after < 0.8
    assert second == set() and bystander == set()


def ring(scope, number):
    return {"endpoint_id": str(scope.endpoint_id), "queue": "q", "id": f"t{number}"}


def test_streams_take_the_rings_of_one_moment_in_one_wake(settings):
    """Each ring woke each open stream for a write of its own, and the loop
    served that fan-out before the answer of the create that rang. Rings now
    reach a loop's streams together, SWITCHBOARD_STREAM_BATCH_MS later."""
    settings.SWITCHBOARD_STREAM_BATCH_MS = 50
    scope = store.Scope(str(uuid4()), None)

    async def main():
        quiet = quiet_hub()
        waiters = [quiet.subscribe(scope, "stream") for _ in range(3)]
        waits = [asyncio.ensure_future(w.wait(5)) for w in waiters]
        await asyncio.sleep(0)  # every stream waiting
        for number in (1, 2):
            quiet._dispatch_ring(ring(scope, number))
            await asyncio.sleep(0.005)
        return await asyncio.gather(*waits), quiet

    taken, quiet = asyncio.run(main())

    for rings, notices in taken:
        assert [r["id"] for r in rings] == ["t1", "t2"] and not notices
    assert not quiet._batch


def wait_through(deliver):
    """A stream's next wait, with ``deliver(hub, scope)`` run once it waits;
    it must end within 0.5 s (before any batch of 1 s)."""
    scope = store.Scope(str(uuid4()), None)

    async def main():
        quiet = quiet_hub()
        waiter = quiet.subscribe(scope, "stream")
        wait = asyncio.ensure_future(waiter.wait(5))
        await asyncio.sleep(0)
        deliver(quiet, scope)
        return await asyncio.wait_for(wait, 0.5)

    return asyncio.run(main())


def test_a_notice_wakes_a_stream_at_once_even_with_rings_in_a_batch(settings):
    settings.SWITCHBOARD_STREAM_BATCH_MS = 1000

    def deliver(quiet, scope):
        quiet._dispatch_ring(ring(scope, 1))
        quiet._dispatch_control(
            {"endpoint_id": str(scope.endpoint_id), "kind": "endpoint"}
        )

    rings, notices = wait_through(deliver)

    assert [r["id"] for r in rings] == ["t1"] and notices == {REVALIDATE}


def test_stream_batching_off_wakes_each_ring_at_once(settings):
    settings.SWITCHBOARD_STREAM_BATCH_MS = 0

    rings, _ = wait_through(lambda quiet, scope: quiet._dispatch_ring(ring(scope, 1)))

    assert [r["id"] for r in rings] == ["t1"]


def test_streams_keep_alive_out_of_step_with_each_other():
    """Defect: streams opened together sent their keep-alives together for
    good, 1 350 writes of one process in one burst every 15 s. Each wait's
    silence is now drawn between 3/4 of the setting and all of it."""
    waits = [keepalive_wait(15) for _ in range(200)]

    assert all(11.25 <= wait <= 15 for wait in waits)
    assert max(waits) - min(waits) > 2  # spread, not one instant
