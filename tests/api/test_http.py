"""The agent API behind a real gunicorn: keep-alive after a 413, a database
outage answered with 503, and an event stream that is not buffered.
"""

import http.client
import json
import socket
import time

import pytest

from board.serving import frontdoor
from tests.support import database_url, free_port, start_gunicorn, stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gunicorn_port(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url())
    yield port
    stop(process)


@pytest.fixture(scope="module")
def outage_port(django_db_setup, django_db_blocker):
    """A gunicorn whose database is a closed port: an outage from the start."""
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(port=free_port()))
    yield port
    stop(process)


def request(conn, method, path, token=None, body=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body, headers)
    response = conn.getresponse()
    return response, response.read()


def test_a_keep_alive_client_can_go_on_after_a_413(gunicorn_port, endpoint):
    conn = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=10)
    response, _ = request(conn, "GET", "/api/v1/todos", endpoint.token)
    assert response.status == 200
    sock = conn.sock
    for size in (300 * 1024, 2 * 1024 * 1024):
        big = json.dumps({"queue": "q", "payload": "x" * size})
        response, body = request(conn, "POST", "/api/v1/todos", endpoint.token, big)
        assert response.status == 413
        assert json.loads(body)["error"] == "payload_too_large"
        assert response.getheader("Connection", "").lower() != "close"
        # The same socket serves the next request: the body was drained.
        response, body = request(
            conn, "POST", "/api/v1/todos", endpoint.token, json.dumps({"queue": "q"})
        )
        assert response.status == 201, body
        assert conn.sock is sock
    conn.close()


def test_a_chunked_body_is_read_and_bounded_too(gunicorn_port, endpoint):
    conn = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=10)
    headers = {
        "Authorization": f"Bearer {endpoint.token}",
        "Content-Type": "application/json",
    }
    body = json.dumps({"queue": "q", "title": "chunked"}).encode()
    conn.request(
        "POST",
        "/api/v1/todos",
        iter([body[:5], body[5:]]),
        headers,
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 201
    assert json.loads(response.read())["todo"]["title"] == "chunked"
    sock = conn.sock
    big = json.dumps({"queue": "q", "payload": "x" * (300 * 1024)}).encode()
    chunks = (big[i : i + 8192] for i in range(0, len(big), 8192))
    conn.request("POST", "/api/v1/todos", chunks, headers, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"] == "payload_too_large"
    response, _ = request(conn, "GET", "/api/v1/todos", endpoint.token)
    assert response.status == 200 and conn.sock is sock
    conn.close()


def test_a_chunked_body_whose_last_piece_passes_the_limit_is_not_drained(
    gunicorn_port, endpoint
):
    """Defect: when the piece that passed the limit was the body's last, the 413
    went on waiting for more body until the drain's deadline (DRAIN_SECONDS),
    so the connection's next request waited that long too. The whole body,
    its last chunk included, arrives here in one write."""
    big = json.dumps({"queue": "q", "payload": "x" * (300 * 1024)}).encode()
    head = (
        "POST /api/v1/todos HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {endpoint.token}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunked = b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n"
    follow_up = (
        f"GET /api/v1/todos HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {endpoint.token}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gunicorn_port)) as sock:
        # Well before the drain's own deadline, both answers are in.
        sock.settimeout(frontdoor.DRAIN_SECONDS / 2)
        sock.sendall(head + chunked)
        answers = http.client.HTTPResponse(sock)
        answers.begin()
        assert answers.status == 413
        answers.read()
        sock.sendall(follow_up)
        second = http.client.HTTPResponse(sock)
        second.begin()
        assert second.status == 200


def test_the_api_answers_503_json_when_the_database_is_down(outage_port):
    conn = http.client.HTTPConnection("127.0.0.1", outage_port, timeout=15)
    token = "sb_" + "a" * 43
    for method, path, body in [
        ("GET", "/api/v1/todos", None),
        ("POST", "/api/v1/todos", json.dumps({"queue": "q"})),
        ("POST", "/api/v1/todos/claim", json.dumps({"worker": "w", "wait_seconds": 1})),
        ("GET", "/api/v1/events", None),
    ]:
        response, raw = request(conn, method, path, token, body)
        assert response.status == 503, (path, raw)
        assert response.getheader("Content-Type") == "application/json"
        assert json.loads(raw)["error"] == "unavailable"
    response, raw = request(conn, "GET", "/healthz")
    assert response.status == 503
    response, raw = request(conn, "GET", "/api/v1/openapi.json")
    assert response.status == 200 and json.loads(raw)["openapi"].startswith("3.")
    conn.close()


def test_the_event_stream_is_not_buffered_by_the_server(gunicorn_port, endpoint):
    conn = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=5)
    started = time.monotonic()
    conn.request(
        "GET",
        "/api/v1/events",
        headers={
            "Authorization": f"Bearer {endpoint.token}",
            "Accept-Encoding": "gzip",
        },
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Encoding") is None
    assert response.readline() == b": connected\n"
    assert time.monotonic() - started < 1.0
    assert response.readline() == b"retry: 3000\n"
    assert response.readline() == b"\n"
    assert response.readline() == b": keep-alive\n"
    conn.close()


def test_a_connection_idle_across_a_backend_kill_is_replaced_before_use(
    django_db_blocker,
):
    """The per-request health check is skipped only for a connection used a
    moment ago (board/serving/pgbackend): one left idle is still checked, so a backend
    killed meanwhile (a PostgreSQL restart) costs no request."""
    from django.db import connection

    name = "sb-idle-check"
    with django_db_blocker.unblock():
        process, port = start_gunicorn(database_url(application_name=name))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(5):
            response, _ = request(conn, "GET", "/api/v1/openapi.json")
            response, _ = request(conn, "GET", "/healthz")
            assert response.status == 200
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                [name],
            )
            assert cursor.fetchone()[0] >= 1
        time.sleep(1.5)
        statuses = [request(conn, "GET", "/healthz")[0].status for _ in range(10)]
        assert statuses == [200] * 10
    finally:
        stop(process)
