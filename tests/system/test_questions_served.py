"""An agent's question against a served gunicorn, from outside (HTTP and SQL only),
as a user meets it (CONTRACT §16): what the agent writes is text on the Board and
the answer link, under a Content-Security-Policy; an answer schema makes the
server fetch nothing; and checking an answer is bounded in time, so the server
answers everyone else meanwhile.
"""

import html
import http.cookiejar
import http.server
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support import counting_server, serve_gunicorn
from todos.access import endpoints

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "a-long-password"
SCRIPT = '<script>document.title = "owned"</script>'


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


@pytest.fixture
def agent(db, server):
    owner = get_user_model().objects.create_user("alice", password=PASSWORD)
    _, token = endpoints.create("release-agent", owner, ["*"])
    return Agent(server, token)


class Agent:
    """An agent of the JSON API: a bearer token and JSON bodies."""

    def __init__(self, server, token):
        self.server, self.token = server, token

    def post(self, path, body):
        request = urllib.request.Request(
            self.server + path,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def asks(self, title, **question):
        """Create a todo, claim it and ask; return the ask's (status, body) and
        the todo's id."""
        status, created = self.post("/api/v1/todos", {"queue": "q", "title": title})
        assert status == 201, created
        todo_id = created["todo"]["id"]
        status, claimed = self.post(f"/api/v1/todos/{todo_id}/claim", {"worker": "w"})
        assert status == 200, claimed
        question.setdefault("question", "Go ahead?")
        return self.post(f"/api/v1/todos/{todo_id}/ask", {"worker": "w", **question}), (
            todo_id
        )


class Browser:
    """A person's browser: cookies, and the CSRF token of the last form read."""

    def __init__(self, server):
        self.server = server
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path):
        try:
            response = self.opener.open(self.server + path, timeout=30)
        except urllib.error.HTTPError as error:
            response = error
        return response.status, response.headers, response.read().decode()

    def post(self, path, fields):
        data = urllib.parse.urlencode(fields).encode()
        try:
            response = self.opener.open(self.server + path, data=data, timeout=30)
        except urllib.error.HTTPError as error:
            response = error
        return response.status, response.read().decode()

    def log_in(self):
        _, _, page = self.get("/board/login/")
        self.post(
            "/board/login/",
            {
                "username": "alice",
                "password": PASSWORD,
                "csrfmiddlewaretoken": csrf_token(page),
            },
        )


def csrf_token(page):
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


def assert_policy(headers):
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "object-src 'none'" in policy, policy
    assert "unsafe" not in policy


def test_a_script_an_agent_writes_is_text_on_the_board_and_the_answer_link(
    server, agent
):
    schema = {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "title": SCRIPT, "description": SCRIPT}
        },
    }
    (status, _), todo_id = agent.asks(SCRIPT, question=SCRIPT, answer_schema=schema)
    assert status == 200
    person = Browser(server)
    person.log_in()

    escaped = html.escape(SCRIPT)
    for path in ("/board/inbox/", f"/board/todos/{todo_id}/"):
        status, headers, page = person.get(path)
        assert status == 200
        assert_policy(headers)
        assert SCRIPT not in page and escaped in page, path
    link = re.search(r'value="(http://[^"]+/answer/[^"]+)"', page).group(1)
    stranger = Browser(server)
    status, headers, page = stranger.get(urllib.parse.urlsplit(link).path)
    assert status == 200
    assert_policy(headers)
    assert SCRIPT not in page and escaped in page


@pytest.fixture
def listener():
    with counting_server() as server:
        yield server


def test_an_answer_schema_makes_the_server_fetch_nothing(agent, listener):
    (status, body), _ = agent.asks("remote", answer_schema={"$ref": listener.url})
    assert status == 400, body
    assert body["detail"].startswith("answer_schema.$ref: only a local reference")

    # A schema stored before the rule (written here with SQL) fetches nothing
    # either: its answer is refused.
    (status, _), todo_id = agent.asks("stored", answer_schema={"type": "string"})
    assert status == 200
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET question = jsonb_set(question, '{answer_schema}',"
            " jsonb_build_object('$ref', %s::text)) WHERE id = %s",
            [listener.url, todo_id],
        )
    status, body = agent.post(f"/api/v1/todos/{todo_id}/answer", {"answer": "x"})
    assert status == 400, body
    assert listener.hits == 0


def healthz_seconds(server):
    started = time.monotonic()
    with urllib.request.urlopen(server + "/healthz", timeout=30) as response:
        assert response.status == 200
    return time.monotonic() - started


def test_the_server_answers_others_while_a_hostile_answer_is_checked(server, agent):
    """A backtracking pattern, a reference graph that doubles the work at each
    of 40 levels, and uniqueItems over thousands of objects: each answer is
    refused or taken within a second, and /healthz answers as usual meanwhile."""
    refs = {
        f"d{n}": {
            "anyOf": [{"$ref": f"#/$defs/d{n + 1}"}, {"$ref": f"#/$defs/d{n + 1}"}]
        }
        for n in range(40)
    }
    refs["d40"] = {"type": "string"}
    hostile = [
        ({"type": "string", "pattern": "^(a+)+$"}, "a" * 40 + "!", 400),
        ({"$defs": refs, "$ref": "#/$defs/d0"}, 1, 400),
        ({"type": "array", "uniqueItems": True}, [{"n": n} for n in range(5000)], 200),
    ]
    for schema, answer, expected in hostile:
        (status, body), todo_id = agent.asks("hostile", answer_schema=schema)
        assert status == 200, body
        done = {}

        def answer_it(todo_id=todo_id, answer=answer, done=done):
            started = time.monotonic()
            path = f"/api/v1/todos/{todo_id}/answer"
            done["status"], done["body"] = agent.post(path, {"answer": answer})
            done["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=answer_it)
        thread.start()
        latencies = [healthz_seconds(server)]
        while thread.is_alive() and len(latencies) < 50:
            latencies.append(healthz_seconds(server))
        thread.join(timeout=30)

        assert done.get("status") == expected, done
        assert done["seconds"] < 1.5, done
        assert max(latencies) < 0.5, latencies
