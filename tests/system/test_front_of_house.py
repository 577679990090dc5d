"""The answer and cancel paths as a user meets them, from outside: a served
gunicorn, driven over HTTP and read back with SQL. Who acted is recorded as
who acted, and an answer link's token never reaches a log line (CONTRACT §16);
a todo held past the statement timeout says it was busy; concurrent replaces
of one key each create their own todo.
"""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support import (
    database_url,
    start_gunicorn,
    stop,
)
from todos.access import endpoints

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "front-of-house-pw"


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, tmp_path_factory):
    """A gunicorn on the test database with its access log on, every line it
    and Django write kept in one file; yields (url, log path)."""
    log_path = tmp_path_factory.mktemp("served") / "gunicorn.log"
    with django_db_blocker.unblock(), log_path.open("w") as log:
        process, port = start_gunicorn(
            database_url(),
            log=log,
            log_level="info",
            access_log=True,
            LOG_LEVEL="INFO",
        )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, log_path
    finally:
        stop(process)


@pytest.fixture
def agent(served):
    """An httpx client of a new endpoint (owner alice, a staff user)."""
    url, _ = served
    user = get_user_model().objects.create_user(
        "alice", password=PASSWORD, is_staff=True
    )
    endpoint, token = endpoints.create("reviewer", user.username, ["*"])
    with httpx.Client(
        base_url=f"{url}/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ) as client:
        client.endpoint = endpoint
        yield client


def held_todo(agent, worker="bot-1"):
    """A todo that bot-1 claimed and asked about: held for an answer."""
    created = agent.post("/todos", json={"queue": "reviews", "title": "Drop it?"})
    assert created.status_code == 201, created.text
    todo_id = created.json()["todo"]["id"]
    claim = agent.post(f"/todos/{todo_id}/claim", json={"worker": worker})
    lease = claim.json()["todo"]["lease_token"]
    asked = agent.post(
        f"/todos/{todo_id}/ask",
        json={"lease_token": lease, "question": "Drop?", "choices": ["yes", "no"]},
    )
    assert asked.status_code == 200, asked.text
    return todo_id


def history(todo_id):
    """The todo's history as SQL reads it: (from, to, actor, note) per row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT from_state, to_state, actor, error FROM todo_events"
            " WHERE todo_id = %s ORDER BY id",
            [todo_id],
        )
        return cursor.fetchall()


def answer_of(todo_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT answer FROM todos WHERE id = %s", [todo_id])
        (answer,) = cursor.fetchone()
    # Django's raw cursors hand jsonb over as text.
    return json.loads(answer)


def board_session(url):
    """An httpx client logged in to the Board as alice."""
    client = httpx.Client(base_url=url, timeout=30, follow_redirects=True)
    page = client.get("/board/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    logged_in = client.post(
        "/board/login/",
        data={
            "username": "alice",
            "password": PASSWORD,
            "csrfmiddlewaretoken": token.group(1),
        },
    )
    assert logged_in.url.path == "/board/", logged_in.text[:500]
    return client


def answer_link(board, todo_id):
    page = board.get(f"/board/todos/{todo_id}/")
    found = re.search(r'value="(https?://[^"]+/answer/[^"]+)"', page.text)
    assert found, "the owner's todo page shows no answer link"
    return found.group(1)


def confirmed(field):
    """A choice's form field, sent with its confirmation (the card's second step)."""
    return {field.removesuffix("-answer") + "-confirm": "true"}


def test_an_agent_that_signs_its_answer_as_an_operator_is_recorded_as_the_agent(
    agent,
):
    todo_id = held_todo(agent)

    answered = agent.post(
        f"/todos/{todo_id}/answer",
        json={"answer": "yes", "worker": "operator:alice"},
    )

    assert answered.status_code == 200, answered.text
    stored = answer_of(todo_id)
    assert (stored["by"], stored["worker"]) == ("agent:reviewer", "operator:alice")
    assert history(todo_id)[-1] == (
        "pending",
        "pending",
        "agent:reviewer (worker operator:alice)",
        "answered",
    )


def test_an_agent_that_signs_its_cancel_as_the_answer_link_is_recorded_as_the_agent(
    agent,
):
    created = agent.post("/todos", json={"queue": "reviews", "title": "Stop"})
    todo_id = created.json()["todo"]["id"]

    canceled = agent.post(f"/todos/{todo_id}/cancel", json={"worker": "link"})

    assert canceled.status_code == 200, canceled.text
    request = canceled.json()["todo"]["result"]["canceled"]
    assert (request["by"], request["worker"]) == ("agent:reviewer", "link")
    actors = {actor for _, _, actor, _ in history(todo_id)[1:]}
    assert actors == {"agent:reviewer (worker link)"}


def test_a_complete_sent_with_only_its_lease_token_records_the_worker_that_held_it(
    agent,
):
    created = agent.post("/todos", json={"queue": "reviews", "title": "Do it"})
    todo_id = created.json()["todo"]["id"]
    lease = agent.post(f"/todos/{todo_id}/claim", json={"worker": "bot-7"})
    token = lease.json()["todo"]["lease_token"]

    done = agent.post(f"/todos/{todo_id}/complete", json={"lease_token": token})

    assert done.status_code == 200, done.text
    assert history(todo_id)[-1][:3] == ("claimed", "done", "bot-7")


def test_the_board_and_the_answer_link_record_the_operator_and_the_link(agent, served):
    url, _ = served
    by_board, by_link = held_todo(agent), held_todo(agent, worker="bot-2")
    board = board_session(url)
    page = board.get(f"/board/todos/{by_board}/")
    field = re.search(r'name="([\w-]+-answer)"', page.text).group(1)
    csrf = board.cookies["csrftoken"]

    answered = board.post(
        f"/board/todos/{by_board}/answer/",
        data={field: "no", **confirmed(field), "csrfmiddlewaretoken": csrf},
    )
    link = answer_link(board, by_link)
    with httpx.Client(timeout=30) as stranger:
        form = stranger.get(link)
        field = re.search(r'name="([\w-]+-answer)"', form.text).group(1)
        stranger.post(
            link,
            data={
                field: "yes",
                **confirmed(field),
                "csrfmiddlewaretoken": stranger.cookies["csrftoken"],
            },
        )

    assert answered.status_code == 200
    assert answer_of(by_board)["by"] == "operator:alice"
    assert answer_of(by_link)["by"] == "link"
    assert history(by_link)[-1][2:] == ("link", "answered")
    # The todo's History on the Board has the answer's row, with who gave it.
    timeline = board.get(f"/board/todos/{by_board}/").text.split('id="history"')[1]
    row = re.search(r'<li class="event[^"]*">(?:(?!</li>).)*answered', timeline, re.S)
    assert row and "operator:alice" in row.group(0)


def test_an_answer_links_token_never_reaches_a_log_line(agent, served):
    """Django's CSRF warning, the access log, a refused and a used link: the
    token is in none of the lines the server wrote."""
    url, log_path = served
    todo_id = held_todo(agent)
    board = board_session(url)
    link = answer_link(board, todo_id)
    token = link.rsplit("/answer/", 1)[1]

    with httpx.Client(timeout=30) as stranger:
        shown = stranger.get(link)
        forged = stranger.post(link, data={"x": "1"})  # no CSRF token: refused
        wrong = stranger.get(link + "tampered")
        field = re.search(r'name="([\w-]+-answer)"', shown.text).group(1)
        used = stranger.post(
            link,
            data={
                field: "yes",
                **confirmed(field),
                "csrfmiddlewaretoken": stranger.cookies["csrftoken"],
            },
        )

    assert (shown.status_code, forged.status_code) == (200, 403)
    assert (wrong.status_code, used.status_code) == (404, 200)
    written = settle(log_path)
    assert "Forbidden (CSRF" in written, "the CSRF warning was not logged"
    assert '"GET /answer/[redacted] HTTP/1.1" 200' in written, "no access log line"
    assert '"POST /answer/[redacted] HTTP/1.1" 403' in written
    assert token not in written
    assert token[:20] not in written


def settle(log_path: Path) -> str:
    """The log once the server has written its lines for the last requests."""
    deadline = time.monotonic() + 5
    written = log_path.read_text()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = log_path.read_text()
        if again == written and "Forbidden (CSRF" in again:
            return again
        written = again
    return written


# --- What a busy todo and a crowd of replacers answer ---------------------------


@pytest.fixture
def impatient(django_db_blocker):
    """A second gunicorn whose statements time out after one second."""
    with django_db_blocker.unblock():
        # board.settings: the suite's own settings wait 30 s for a statement.
        process, port = start_gunicorn(
            database_url(),
            DJANGO_SETTINGS_MODULE="board.settings",
            SWITCHBOARD_STATEMENT_TIMEOUT_MS="1000",
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@pytest.fixture
def row_lock():
    """Hold a todo's row in a transaction of another connection (plain SQL)."""
    held = []

    def hold(todo_id):
        conn = psycopg.connect(database_url(), autocommit=False)
        conn.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE", [todo_id])
        held.append(conn)

    yield hold
    for conn in held:
        conn.rollback()
        conn.close()


@pytest.mark.parametrize("verb", ["heartbeat", "cancel"])
def test_a_todo_another_transaction_holds_answers_503_saying_it_is_busy(
    agent, impatient, row_lock, verb
):
    """Not "database unavailable": the database is up, the todo was busy."""
    created = agent.post("/todos", json={"queue": "reviews", "title": "Busy"})
    todo_id = created.json()["todo"]["id"]
    agent.post(f"/todos/{todo_id}/claim", json={"worker": "bot-1"})
    row_lock(todo_id)

    with httpx.Client(base_url=f"{impatient}/api/v1", timeout=30) as client:
        answered = client.post(
            f"/todos/{todo_id}/{verb}",
            json={"worker": "bot-1"},
            headers=dict(agent.headers),
        )

    assert answered.status_code == 503, answered.text
    assert answered.json()["error"] == "unavailable"
    assert answered.json()["detail"].startswith("the todo is busy")
    assert "statement timeout" in answered.json()["detail"]
    assert answered.headers["Retry-After"] == "1"


def test_concurrent_replaces_of_one_key_each_create_their_todo_and_the_last_stays_live(
    agent,
):
    """Replacers of one key take turns: each answers 201 with its own todo,
    the ones before it end canceled as replaced, one todo holds the key."""
    replacers = 12
    start = threading.Barrier(replacers)

    def replace(n):
        start.wait()
        return agent.post(
            "/todos",
            json={
                "queue": "deploys",
                "title": f"deploy {n}",
                "idempotency_key": "deploy-main",
                "replace": True,
            },
        )

    with ThreadPoolExecutor(replacers) as pool:
        answers = list(pool.map(replace, range(replacers)))

    assert [a.status_code for a in answers] == [201] * replacers, [
        a.text for a in answers if a.status_code != 201
    ]
    ids = {a.json()["todo"]["id"] for a in answers}
    assert len(ids) == replacers and all(a.json()["created"] for a in answers)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, canceled_at IS NOT NULL, result->'canceled'->>'reason'"
            " FROM todos WHERE idempotency_key = 'deploy-main'"
        )
        rows = cursor.fetchall()
    assert sorted(rows) == sorted(
        [("pending", False, None)] + [("done", True, "replaced")] * (replacers - 1)
    )
