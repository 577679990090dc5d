"""Retries: what is safe to repeat is sent again across a 503, a lost
connection or a restart of the server; what is not is sent once. And what the
front door answers before the API reads a request. Served by gunicorn."""

import asyncio
import signal
import socket
import subprocess
import threading
import time

import pytest
from switchboard_client import (
    APIError,
    AsyncClient,
    Client,
    Retry,
    TransportError,
    Unauthorized,
    Unavailable,
)

from tests.client.calls import CountingRetry, served
from tests.support import database_url, free_port, start_gunicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def outage_url(django_db_setup, django_db_blocker):
    """A gunicorn whose database is a closed port: every call answers 503."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(port=free_port()))
    yield f"http://127.0.0.1:{port}"
    stop(process)


def test_a_read_is_retried_through_503s_then_raises_unavailable(outage_url):
    retry = CountingRetry(attempts=4, deadline=10, base=0.01, cap=0.05)
    with (
        Client(outage_url, "sb_x", retry=retry) as client,
        pytest.raises(Unavailable) as raised,
    ):
        client.queues()
    assert raised.value.error == "unavailable"
    assert retry.tries == [1, 2, 3, 4]


def test_a_claim_is_not_retried_after_a_503(outage_url):
    retry = CountingRetry(attempts=4, deadline=10, base=0.01, cap=0.05)
    with Client(outage_url, "sb_x", retry=retry) as client, pytest.raises(Unavailable):
        client.claim(queue="q")
    assert retry.tries == [1]


def test_a_create_is_retried_only_with_an_idempotency_key(outage_url):
    keyed = CountingRetry(attempts=3, deadline=10, base=0.01, cap=0.05)
    with Client(outage_url, "sb_x", retry=keyed) as client, pytest.raises(Unavailable):
        client.create("q", idempotency_key="k")
    unkeyed = CountingRetry(attempts=3, deadline=10, base=0.01, cap=0.05)
    with (
        Client(outage_url, "sb_x", retry=unkeyed) as client,
        pytest.raises(Unavailable),
    ):
        client.create("q")
    assert keyed.tries == [1, 2, 3] and unkeyed.tries == [1]


def test_a_lease_token_acknowledgement_is_retried_but_a_worker_one_is_not(
    outage_url,
):
    fenced = CountingRetry(attempts=3, deadline=10, base=0.01, cap=0.05)
    with Client(outage_url, "sb_x", retry=fenced) as client, pytest.raises(Unavailable):
        client.complete("some-id", 1, lease_token="t")
    by_name = CountingRetry(attempts=3, deadline=10, base=0.01, cap=0.05)
    with (
        Client(outage_url, "sb_x", retry=by_name) as client,
        pytest.raises(Unavailable),
    ):
        client.complete("some-id", 1)
    assert fenced.tries == [1, 2, 3] and by_name.tries == [1]


def test_calls_go_on_across_a_restart_of_the_server(endpoint):
    """gunicorn stops; while it is down the client's calls are retried with
    backoff, and they succeed once it serves again on the same port."""
    process, port = start_gunicorn(database_url())
    url = f"http://127.0.0.1:{port}"
    retry = Retry(attempts=50, deadline=30, base=0.05, cap=0.5)
    with Client(url, endpoint.token, worker="w1", retry=retry) as client:
        made = client.create("q", idempotency_key="before").todo
        claimed = client.claim(queue="q")
        stop(process, signal.SIGTERM)
        restarted = {}

        def restart():
            time.sleep(1.0)
            restarted["process"], _ = start_gunicorn(database_url(), port=port)

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            # Sent while nothing listens: refused, retried until it serves.
            again = client.create("q", idempotency_key="before")
            done = client.complete(claimed, {"ok": True})
            seen = client.get(made.id)
        finally:
            thread.join()
            stop(restarted["process"])
    assert not again.created and again.todo.id == made.id
    assert done.state == "done" and seen.result == {"ok": True}


def test_a_server_that_never_comes_back_ends_in_a_transport_error(db):
    retry = CountingRetry(attempts=3, deadline=10, base=0.01, cap=0.05)
    with (
        Client(f"http://127.0.0.1:{free_port()}", "sb_x", retry=retry) as client,
        pytest.raises(TransportError),
    ):
        client.queues()
    assert retry.tries == [1, 2, 3]


def test_async_calls_go_on_across_a_restart_of_the_server(endpoint):
    """The same through AsyncClient's own carrier: the connection it kept
    alive dies with the server (found dead before it is used again), and the
    calls go on over a new one once the server is back."""
    process, port = start_gunicorn(database_url())
    url = f"http://127.0.0.1:{port}"
    retry = Retry(attempts=50, deadline=30, base=0.05, cap=0.5)
    restarted = {}

    def restart():
        time.sleep(1.0)
        restarted["process"], _ = start_gunicorn(database_url(), port=port)

    async def run():
        async with AsyncClient(url, endpoint.token, worker="w1", retry=retry) as client:
            made = (await client.create("q", idempotency_key="before")).todo
            claimed = await client.claim(queue="q")
            stop(process, signal.SIGTERM)
            thread = threading.Thread(target=restart)
            thread.start()
            try:
                again = await client.create("q", idempotency_key="before")
                done = await client.complete(claimed, {"ok": True})
                seen = await client.get(made.id)
            finally:
                thread.join()
            return made, again, done, seen

    try:
        made, again, done, seen = asyncio.run(run())
    finally:
        if "process" in restarted:
            stop(restarted["process"])
    assert not again.created and again.todo.id == made.id
    assert done.state == "done" and seen.result == {"ok": True}


@pytest.fixture(scope="module")
def respawning(django_db_setup, django_db_blocker):
    """A gunicorn whose worker the tests kill (SIGKILL) mid-call; its master
    starts another."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url())
    yield process, f"http://127.0.0.1:{port}"
    stop(process)


def kill_worker_soon(master, url, token):
    """Once gunicorn's worker serves (the master accepts connections before
    it has booted one), SIGKILL it a second from now: the call under test is
    in flight by then, as it waits far longer on the server."""
    served("sync", url, token, lambda client: client.queues())

    def kill():
        time.sleep(1.0)
        found = subprocess.run(
            ["pgrep", "-P", str(master.pid)], capture_output=True, text=True
        )
        for pid in found.stdout.split():
            subprocess.run(["kill", "-KILL", pid], check=False)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_claim_whose_connection_is_lost_is_not_sent_again(respawning, endpoint, mode):
    """A long-poll claim in flight when the server dies may have claimed a
    todo: it is not repeated, and ends in a TransportError."""
    master, url = respawning
    retry = CountingRetry(attempts=10, deadline=30)
    killer = kill_worker_soon(master, url, endpoint.token)
    try:
        with pytest.raises(TransportError):
            served(
                mode,
                url,
                endpoint.token,
                lambda client: client.claim(queue="idle", wait_seconds=15),
                retry=retry,
            )
    finally:
        killer.join()
    assert retry.tries == [1]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_read_whose_connection_is_lost_is_sent_again(respawning, endpoint, mode):
    """A result wait in flight when the server dies is sent again (refused
    until the new worker serves) and answers."""
    master, url = respawning
    todo = served(mode, url, endpoint.token, lambda client: client.create("q")).todo
    retry = CountingRetry(attempts=100, deadline=30, base=0.05, cap=0.3)
    killer = kill_worker_soon(master, url, endpoint.token)
    try:
        seen = served(
            mode,
            url,
            endpoint.token,
            lambda client: client.get(todo.id, wait_seconds=3),
            retry=retry,
        )
    finally:
        killer.join()
    assert seen.id == todo.id and seen.state == "pending"
    assert len(retry.tries) >= 2


@pytest.fixture(scope="module")
def small_heads_url(django_db_setup, django_db_blocker):
    """A gunicorn whose front door takes heads of 1 KiB at most."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(
            database_url(), SWITCHBOARD_MAX_HEAD_BYTES="1024"
        )
    yield f"http://127.0.0.1:{port}"
    stop(process)


@pytest.fixture(scope="module")
def one_connection(django_db_setup, django_db_blocker):
    """A gunicorn whose front door takes one connection at a time: its URL
    and port."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(), SWITCHBOARD_MAX_CONNECTIONS="1")
    url = f"http://127.0.0.1:{port}"
    # The master listens before its worker has booted: wait for an answer.
    with pytest.raises(Unauthorized):
        served("sync", url, "sb_x", lambda client: client.queues())
    yield url, port
    stop(process)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_status_outside_the_table_is_a_plain_api_error(small_heads_url, mode):
    """A head over the limit is answered 431 by the front door: no class of
    its own, so an APIError with its status and body, and not retried."""
    url = small_heads_url
    retry = CountingRetry()
    with pytest.raises(APIError) as raised:
        served(mode, url, "sb_" + "x" * 2000, lambda client: client.queues(), retry)
    assert type(raised.value) is APIError
    assert raised.value.status == 431
    assert raised.value.error == "request_header_fields_too_large"
    assert retry.tries == [1]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_read_refused_at_the_connection_cap_is_retried_until_one_frees(
    one_connection, endpoint, mode
):
    """While another connection holds the only place, the front door answers
    503 and closes; the read is retried and answers once that one leaves."""
    url, port = one_connection
    holder = socket.create_connection(("127.0.0.1", port))

    def leave():
        time.sleep(0.5)
        holder.close()

    leaving = threading.Thread(target=leave)
    leaving.start()
    retry = CountingRetry(attempts=100, deadline=20, base=0.02, cap=0.1)
    try:
        queues = served(mode, url, endpoint.token, lambda c: c.queues(), retry)
    finally:
        leaving.join()
    assert isinstance(queues, list)
    assert len(retry.tries) >= 2
