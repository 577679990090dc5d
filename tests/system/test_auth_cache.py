"""The per-process cache of agent credentials (todos/access/auth.py): a token or SQS
key found once is not read again while the process's doorbell hub listens, and
what revokes, re-keys or narrows an endpoint (CONTRACT §5, §12) still stops it
in every process: at once in the process that made the change, on the control
notice in the others, and on every (re)connect of the hub's LISTEN. With no hub
listening, every request reads the database.

In this process, a hub of the test's own listens; a real gunicorn serves the
cases where another process holds the cache. "Unheard" changes are made with
the control triggers off, so only the absence of a lookup can explain a token
that still works.
"""

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time

import pytest
from botocore.exceptions import ClientError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.sqs.conftest import client_for
from tests.support import database_url, free_port, start_gunicorn, stop
from todos.access import auth, endpoints, tokens
from todos.sqs import credentials
from todos.waiting.doorbell import Hub

pytestmark = pytest.mark.django_db(transaction=True)

APP_NAME = "sb-auth-cache-test-server"


@contextlib.contextmanager
def unheard(*tables):
    """Changes made inside send no control notice (the triggers are off)."""
    triggers = {
        "endpoints": "endpoints_control",
        "sqs_credentials": "sqs_credentials_control",
    }
    with transaction.atomic(), connection.cursor() as cursor:
        for table in tables or ("endpoints",):
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER {triggers[table]}")
        yield
        for table in tables or ("endpoints",):
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER {triggers[table]}")


def revoke_unheard(endpoint):
    with unheard(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE endpoints SET revoked_at = now() WHERE id = %s", [endpoint.id]
        )


def endpoint_reads(captured):
    return [q for q in captured.captured_queries if "FROM endpoints" in q["sql"]]


def eventually(check, seconds=2.0):
    """Poll ``check()`` until it is true, for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- In this process, with a hub of the test's own ---------------------------------


@pytest.fixture
def listening(monkeypatch):
    """A doorbell hub listening in an event loop of its own, as a server's does.

    The cache is a fresh one that only this hub feeds: a hub an earlier test
    left listening in this process would otherwise keep rows cached after this
    one stops."""
    monkeypatch.setattr(auth, "cache", auth.CredentialCache())
    hub = Hub()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        hub.start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    assert eventually(lambda: hub.connected, 5), "the hub never listened"
    yield hub
    asyncio.run_coroutine_threadsafe(hub.stop(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_a_second_request_with_the_same_token_reads_no_endpoint(
    listening, endpoint, client
):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {endpoint.token}"}
    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/v1/todos", **headers).status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/v1/todos", **headers).status_code == 200
    assert len(endpoint_reads(first)) == 1
    assert endpoint_reads(second) == []


def test_a_second_lookup_of_an_sqs_key_reads_no_endpoint(listening, endpoint):
    issued = credentials.issue(endpoint)
    with CaptureQueriesContext(connection) as first:
        found = auth.endpoint_for_access_key(issued.access_key_id)
    with CaptureQueriesContext(connection) as second:
        again = auth.endpoint_for_access_key(issued.access_key_id)
    assert len(first) == 1 and len(second) == 0
    assert found[0] == again[0] == endpoint and found[1:] == again[1:]


def test_unknown_tokens_are_read_every_time_and_tokens_kept_by_hash(
    listening, endpoint
):
    for _ in range(2):
        with CaptureQueriesContext(connection) as captured:
            assert auth.endpoint_for_token("sb_never-minted") is None
        assert len(captured) == 1
    auth.endpoint_for_token(endpoint.token)
    assert auth.cache.get(("token", tokens.hash_token(endpoint.token))) is not None
    assert auth.cache.get(("token", endpoint.token)) is None


def test_a_change_made_in_this_process_is_forgotten_at_once(listening, make_endpoint):
    """No control notice is sent: this process forgets in the change's own path."""
    revoked, rotated, narrowed = (make_endpoint(n) for n in ("r", "k", "n"))
    for endpoint in (revoked, rotated, narrowed):
        assert auth.endpoint_for_token(endpoint.token) == endpoint
    with unheard():
        endpoints.revoke(revoked)
        new_token = endpoints.rotate_token(rotated)
        endpoints.set_grant(narrowed, "a")
    assert auth.endpoint_for_token(revoked.token) is None
    assert auth.endpoint_for_token(rotated.token) is None
    assert auth.endpoint_for_token(new_token) == rotated
    assert auth.endpoint_for_token(narrowed.token).queues == ["a"]


def test_a_rotated_sqs_key_is_forgotten_at_once_in_this_process(listening, endpoint):
    first = credentials.issue(endpoint)
    assert auth.endpoint_for_access_key(first.access_key_id) is not None
    with unheard("sqs_credentials"):
        second = credentials.issue(endpoint)
    assert auth.endpoint_for_access_key(first.access_key_id) is None
    assert auth.endpoint_for_access_key(second.access_key_id)[0] == endpoint


def test_a_lookup_that_straddles_a_change_keeps_nothing(listening, endpoint):
    """The lookup reads the row before the endpoint's notice and returns after
    it: what it read may be stale, so it is not kept."""
    found = []
    lookup = threading.Thread(
        target=lambda: found.append(auth.endpoint_for_token(endpoint.token))
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOCK TABLE endpoints IN ACCESS EXCLUSIVE MODE")
        lookup.start()

        def blocked():
            # A transaction sees one snapshot of the statistics unless told.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%%FROM endpoints%%'"
            )
            return cursor.fetchone()[0] == 1

        assert eventually(blocked)
        auth.cache.forget(endpoint.id)  # as the hub does on the notice
    lookup.join(5)
    assert found == [endpoint]
    with CaptureQueriesContext(connection) as captured:
        assert auth.endpoint_for_token(endpoint.token) == endpoint
    assert len(captured) == 1


def test_nothing_is_kept_once_the_hub_stops_listening(listening, endpoint):
    auth.endpoint_for_token(endpoint.token)
    asyncio.run_coroutine_threadsafe(listening.stop(), listening.loop).result(5)
    for _ in range(2):
        with CaptureQueriesContext(connection) as captured:
            assert auth.endpoint_for_token(endpoint.token) == endpoint
        assert len(captured) == 1


def test_the_cache_keeps_the_most_recently_used_rows():
    cache = auth.CredentialCache(size=2)
    cache.listening(object(), True)
    for key in ("a", "b"):
        cache.put(key, "e", (key,), cache.generation())
    cache.get("a")
    cache.put("c", "e", ("c",), cache.generation())
    assert [cache.get(key) for key in "abc"] == [("a",), None, ("c",)]


# --- In a server process ------------------------------------------------------------


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """A gunicorn (one worker) whose hub listens; yields its port."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(application_name=APP_NAME))
    yield port
    stop(process)


@pytest.fixture(scope="module")
def deaf_server(django_db_setup, django_db_blocker):
    """A gunicorn whose hub cannot listen (its LISTEN database is down)."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(
            database_url(),
            SWITCHBOARD_LISTEN_DATABASE_URL=database_url(port=free_port()),
        )
    yield port
    stop(process)


def status(port, token, method="GET", path="/api/v1/todos", body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body, headers)
        return conn.getresponse().status
    finally:
        conn.close()


def listener_pid():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE '%%LISTEN %%'",
            [APP_NAME],
        )
        row = cursor.fetchone()
    return row and row[0]


@pytest.fixture
def served(server):
    """The server's port, once its hub listens."""
    assert eventually(listener_pid, 10), "the server's hub never listened"
    return server


def test_a_server_does_not_read_a_token_it_found_before(served, endpoint):
    assert status(served, endpoint.token) == 200
    revoke_unheard(endpoint)
    assert status(served, endpoint.token) == 200


@pytest.mark.parametrize("change", ["revoke", "rotate", "narrow"])
def test_a_change_in_another_process_stops_a_cached_token(served, endpoint, change):
    create = ("POST", "/api/v1/todos", '{"queue": "b", "title": "t"}')
    assert status(served, endpoint.token) == 200
    assert status(served, endpoint.token, *create) == 201
    if change == "revoke":
        endpoints.revoke(endpoint)
        assert eventually(lambda: status(served, endpoint.token) == 401)
    elif change == "rotate":
        new_token = endpoints.rotate_token(endpoint)
        assert eventually(lambda: status(served, endpoint.token) == 401)
        assert status(served, new_token) == 200
    else:
        endpoints.set_grant(endpoint, "a")
        assert eventually(lambda: status(served, endpoint.token, *create) == 403)


def test_a_rotated_sqs_key_stops_in_the_server(served, endpoint):
    url = f"http://127.0.0.1:{served}"
    old = credentials.issue(endpoint)
    client = client_for(url, old.access_key_id, old.secret_access_key)
    client.list_queues()
    client.list_queues()
    new = credentials.issue(endpoint)

    def refused():
        try:
            client.list_queues()
        except ClientError as exc:
            return exc.response["Error"]["Code"] == "InvalidClientTokenId"
        return False

    assert eventually(refused)
    client_for(url, new.access_key_id, new.secret_access_key).list_queues()


def test_a_listen_reconnect_forgets_every_cached_token(served, endpoint):
    assert status(served, endpoint.token) == 200
    revoke_unheard(endpoint)
    assert status(served, endpoint.token) == 200
    old = listener_pid()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old])
    assert eventually(lambda: listener_pid() not in (None, old), 5)
    assert status(served, endpoint.token) == 401


def test_a_server_whose_hub_does_not_listen_reads_every_token(deaf_server, endpoint):
    assert status(deaf_server, endpoint.token) == 200
    revoke_unheard(endpoint)
    assert status(deaf_server, endpoint.token) == 401


# --- Under a backlog of rings ---------------------------------------------------

BURST = 100_000


@pytest.fixture(scope="module")
def two_workers(django_db_setup, django_db_blocker):
    """A gunicorn of two workers whose hubs listen; yields its port."""
    name = f"{APP_NAME}-2"
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(application_name=name), workers=2)

        def both_listen():
            return rings_heard(name, "%LISTEN %") == 2

        try:
            assert eventually(both_listen, 20), "the workers' hubs never listened"
        except BaseException:
            stop(process)
            raise
    yield port, name
    stop(process)


def rings_heard(name, statement="LISTEN switchboard_todo_ready%"):
    """How many rings connections of the processes called ``name`` ran a
    statement like ``statement`` last: by default, those that hear the rings."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE %s",
            [name, statement],
        )
        return cursor.fetchone()[0]


def waiting_claims(port, name, token, workers=2):
    """Open waiting claims until each of ``workers`` processes hears the rings
    (a process listens to them only while it has a waiting claim or a
    stream; gunicorn's workers take turns accepting): their sockets."""
    body = json.dumps({"worker": "w", "queue": "never", "wait_seconds": 20})
    request = (
        "POST /api/v1/todos/claim HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    sockets = []
    deadline = time.monotonic() + 20
    while rings_heard(name) < workers:
        assert time.monotonic() < deadline, "a worker never heard the rings"
        sockets.append(socket.create_connection(("127.0.0.1", port)))
        sockets[-1].sendall(request)
        time.sleep(0.05)
    return sockets


def statuses(port, token, seconds, threads=4):
    """Ask with ``token`` from ``threads`` threads for ``seconds``, a new
    connection each time (gunicorn's workers take turns accepting): each
    answer's status with the time its request was sent."""
    answers = []

    def ask():
        deadline = time.monotonic() + seconds
        while (sent := time.monotonic()) < deadline:
            answers.append((sent, status(port, token)))

    askers = [threading.Thread(target=ask) for _ in range(threads)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    return answers


@pytest.mark.slow
def test_a_revoke_is_refused_by_every_worker_within_200_ms_after_a_burst_of_rings(
    two_workers, endpoint, other_endpoint
):
    """CONTRACT §16: a revoked credential is refused by every process within
    200 ms of the commit, whatever the doorbell's backlog. Both workers have
    the token cached and hear the rings (each has a claim waiting); 100,000
    rings are queued just before the revoke."""
    port, name = two_workers
    waiting = waiting_claims(port, name, other_endpoint.token)
    assert all(code == 200 for _, code in statuses(port, endpoint.token, 1))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_notify('switchboard_todo_ready', json_build_object("
            "'id', gen_random_uuid(), 'endpoint_id', %s::text, 'queue', 'q')::text))"
            " FROM generate_series(1, %s::int)",
            [str(other_endpoint.id), BURST],
        )
    endpoints.revoke(endpoint)
    committed = time.monotonic()
    answers = statuses(port, endpoint.token, 1.5)
    for sock in waiting:
        sock.close()
    late = [
        round(sent - committed, 3)
        for sent, code in answers
        if code != 401 and sent > committed + 0.2
    ]
    assert len(answers) > 20 and late == []
