"""Retries: what is safe to repeat is sent again across a 503 or a restart of
the server; what is not is sent once. Served by gunicorn."""

import signal
import threading
import time
from dataclasses import dataclass, field

import pytest
from switchboard_client import Client, Retry, TransportError, Unavailable

from tests.support import database_url, free_port, start_gunicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@dataclass(frozen=True)
class CountingRetry(Retry):
    """The default policy, counting the tries it is asked about."""

    tries: list[int] = field(default_factory=list)

    def again(self, call, failure, tries, spent):
        self.tries.append(tries)
        return super().again(call, failure, tries, spent)


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
