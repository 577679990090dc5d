"""How gunicorn's uvicorn workers serve what does not wait (board/serving/asgi.py):
sync Django in the process's bounded, long-lived threads, each request start
to finish in one hop, as a threaded WSGI server would. The browser tests run
the Board on Django's WSGI test server; these run it on the real one.
"""

import re
import signal
from pathlib import Path

import psycopg
import pytest
import requests
from django.contrib.auth import get_user_model
from django.db import connection

from board.serving.pgbackend.base import check_after_idle
from tests.support import database_url, serve_gunicorn, start_gunicorn
from todos.access import endpoints
from todos.db.idle import CHECK_AFTER_IDLE_SECONDS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "a-board-password-for-tests"


APP_NAME = "sb-test-serving"


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(
        django_db_blocker, database_url(application_name=APP_NAME)
    )


@pytest.fixture
def operator(db):
    user = get_user_model().objects.create_user("carol", password=PASSWORD)
    endpoints.create("carols-agent", user, ["*"])
    return user


def csrf_token(html):
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def logged_in(server):
    browser = requests.Session()
    page = browser.get(f"{server}/board/login/", timeout=10)
    assert page.status_code == 200
    answer = browser.post(
        f"{server}/board/login/",
        data={
            "username": "carol",
            "password": PASSWORD,
            "csrfmiddlewaretoken": csrf_token(page.text),
        },
        headers={"Referer": f"{server}/board/login/"},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 302, answer.text[:500]
    return browser


def test_the_board_logs_in_and_acts_over_the_real_server(server, operator):
    browser = logged_in(server)

    overview = browser.get(f"{server}/board/", timeout=10)
    assert overview.status_code == 200
    assert "carols-agent" in overview.text
    assert "HX-Request" in overview.headers["Vary"]

    form = browser.get(f"{server}/board/todos/new/", timeout=10)
    made = browser.post(
        f"{server}/board/todos/new/",
        data={
            "endpoint": re.search(r'<option value="([0-9a-f-]{36})"', form.text)[1],
            "queue": "by-hand",
            "title": "made on the real server",
            "payload": "{}",
            "csrfmiddlewaretoken": csrf_token(form.text),
        },
        headers={"Referer": f"{server}/board/todos/new/"},
        allow_redirects=False,
        timeout=10,
    )
    assert made.status_code == 302, made.text[:500]
    listed = browser.get(f"{server}/board/todos/?queue=by-hand", timeout=10)
    assert "made on the real server" in listed.text


def test_a_board_form_without_its_csrf_token_is_refused(server, operator):
    browser = logged_in(server)

    refused = browser.post(
        f"{server}/board/todos/new/",
        data={"queue": "by-hand", "title": "forged"},
        allow_redirects=False,
        timeout=10,
    )

    assert refused.status_code == 403


def test_a_static_file_is_served_whole(server):
    answer = requests.get(f"{server}/static/board/board.css", timeout=10)

    assert answer.status_code == 200
    assert answer.content == (ROOT / "static/board/board.css").read_bytes()


def test_board_and_health_requests_give_their_connections_back(server, operator):
    browser = logged_in(server)
    for _ in range(20):
        assert requests.get(f"{server}/healthz", timeout=10).status_code == 200
        assert browser.get(f"{server}/board/", timeout=10).status_code == 200

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state <> 'idle'), count(*)"
            " FROM pg_stat_activity WHERE application_name = %s",
            [APP_NAME],
        )
        busy, total = cursor.fetchone()
    # Idle in the pool, none left in a transaction (the LISTEN connection
    # waits idle too); at most the pool's size and the LISTEN connection.
    assert busy == 0
    assert total <= 16 + 1


def test_the_pool_checks_a_connection_only_after_it_sat_idle(db):
    """A round trip on every borrow (psycopg_pool's check) cost each database
    call of an async view one more; a connection borrowed a moment ago is
    now trusted, and one left idle is checked (and replaced when dead)."""
    conn = psycopg.connect(database_url(), autocommit=True)
    try:
        check_after_idle(conn)  # first borrow: checked
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        check_after_idle(conn)  # borrowed a moment ago: trusted, no round trip
        conn._switchboard_borrowed_at -= CHECK_AFTER_IDLE_SECONDS + 1
        with pytest.raises(psycopg.OperationalError):
            check_after_idle(conn)
    finally:
        conn.close()


def test_a_waiting_views_answer_carries_the_skipped_middlewares_headers_once(
    server, operator
):
    """A waiting view skips SecurityMiddleware and XFrameOptionsMiddleware; its
    answer still carries what they add, each once, and its whole length."""
    _, token = endpoints.create("headers-agent", operator, ["*"])
    agent = requests.Session()
    agent.headers["Authorization"] = f"Bearer {token}"
    made = agent.post(f"{server}/api/v1/todos", json={"queue": "h"}, timeout=10)
    assert made.status_code == 201, made.text

    claimed = agent.post(
        f"{server}/api/v1/todos/claim", json={"queue": "h", "worker": "w"}, timeout=10
    )

    assert claimed.status_code == 200, claimed.text
    assert claimed.json()["todo"]["id"] == made.json()["todo"]["id"]
    headers = claimed.headers
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(claimed.content)


def served_log(tmp_path, *paths):
    """Serve with gunicorn (its own log at info), GET ``paths``, stop it with
    SIGTERM as an operator would; return what it logged."""
    log = tmp_path / "gunicorn.log"
    with log.open("w") as sink:
        process, port = start_gunicorn(database_url(), log=sink, log_level="info")
    try:
        for path in paths:
            answer = requests.get(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert answer.status_code == 200, path
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    return log.read_text()


def test_a_served_static_file_is_logged_with_its_path_and_no_warning(tmp_path):
    """Its line said route=None and nothing else; and serving a file (a sync
    stream) made Django warn once per worker that it read the stream whole."""
    log = served_log(tmp_path, "/static/board/board.css", "/static/board/board.css")

    lines = [line for line in log.splitlines() if "switchboard.request" in line]
    assert len(lines) == 2
    assert all("path=/static/board/board.css" in line for line in lines)
    assert "StreamingHttpResponse" not in log
    assert "Warning" not in log


def test_a_clean_stop_logs_no_socket_error(tmp_path):
    log = served_log(tmp_path, "/healthz")

    assert "Shutting down: Master" in log
    assert "Error while closing socket" not in log
    assert "Errno" not in log
