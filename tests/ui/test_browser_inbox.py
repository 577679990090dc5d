"""The inbox in a real browser, against the real serving (gunicorn + uvicorn).

An agent claims a todo and asks its owner a question (the store's ask), then
waits in a long-poll claim (``POST /api/v1/todos/claim`` with wait_seconds).
The owner logs in and answers in the inbox, at laptop width with a choice's
button and at phone width (375 px) with a schema's form; the agent's waiting
claim gets the todo with the answer within a second of the click.

SWITCHBOARD_SCREENSHOTS=docs/screenshots refreshes the docs' pictures.
"""

import http.client
import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.contrib.auth import get_user_model

from tests.support import serve_gunicorn
from tests.ui.browser import LAPTOP, pytestmark  # noqa: F401
from todos import store
from todos.access import endpoints

PASSWORD = "a-long-password"
PHONE = {"width": 375, "height": 812}


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    yield from serve_gunicorn(django_db_blocker)


class WaitingClaim(threading.Thread):
    """The agent's long-poll claim, on a thread of its own."""

    def __init__(self, server, token, worker):
        super().__init__(daemon=True)
        self.address = urlparse(server)
        self.token, self.worker = token, worker
        self.status = self.body = self.answered_at = None
        self.start()

    def run(self):
        conn = http.client.HTTPConnection(
            self.address.hostname, self.address.port, timeout=30
        )
        try:
            conn.request(
                "POST",
                "/api/v1/todos/claim",
                json.dumps({"worker": self.worker, "wait_seconds": 15}),
                {
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                },
            )
            response = conn.getresponse()
            self.status, raw = response.status, response.read()
        finally:
            conn.close()
        self.answered_at = time.monotonic()
        self.body = json.loads(raw) if raw else None

    @property
    def todo(self):
        return self.body["todo"]


@pytest.fixture
def owner(db):
    alice = get_user_model().objects.create_user("alice", password=PASSWORD)
    endpoint, token = endpoints.create("release-agent", alice, ["*"])
    return {"endpoint": endpoint, "token": token}


def asked(owner, title, worker, **question):
    scope = store.Scope.for_endpoint(owner["endpoint"])
    # Other work of the queue, in another worker's hands: nothing to claim.
    other, _ = store.create_todo(scope, queue="deploys", title="Roll out web v3.2")
    store.claim_todo(scope, other.id, "canary-bot")
    todo, _ = store.create_todo(scope, queue="deploys", title=title)
    store.claim_todo(scope, todo.id, worker)
    store.heartbeat(
        scope,
        todo.id,
        worker,
        progress={"message": "staging green, 3 of 4 checks", "fraction": 0.75},
    )
    return store.ask(scope, todo.id, worker, **question)


def log_in(page, server):
    page.goto(f"{server}/board/login/?next=/board/inbox/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server}/board/inbox/")


def screenshots(tmp_path):
    out = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def open_page(browser, size):
    context = browser.new_context(viewport=size)
    context.set_default_timeout(10_000)
    return context, context.new_page()


def waiting(server, owner, worker):
    """Start the agent's waiting claim, and let it settle into its wait."""
    claim = WaitingClaim(server, owner["token"], worker)
    time.sleep(0.5)
    assert claim.answered_at is None, claim.body  # held: nothing to claim
    return claim


def fits(page):
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def test_the_owner_answers_with_a_button_and_the_waiting_agent_gets_it(
    browser,
    server,
    owner,
    tmp_path,
):
    todo = asked(
        owner,
        "Deploy api v2.14.0 to production",
        "deploy-bot",
        question=(
            "Staging passed 3 of 4 checks; the canary's p99 latency rose from"
            " 180 ms to 240 ms.\nDeploy to production anyway?"
        ),
        choices=["Deploy", "Wait for the fix", "Roll back staging"],
        deadline_seconds=3600,
        checkpoint={"stage": "staging", "checks": {"passed": 3, "failed": 1}},
    )
    out = screenshots(tmp_path)
    context, page = open_page(browser, LAPTOP)
    try:
        log_in(page, server)
        card = page.locator(f"#card-{todo.id}")
        card.get_by_text("Deploy to production anyway?").wait_for()
        assert page.locator("#inbox-count").inner_text().strip().endswith("1")
        assert fits(page) <= 0
        page.screenshot(path=out / "inbox-laptop.png", full_page=True)
        claim = waiting(server, owner, "deploy-bot")

        card.get_by_role("button", name="Deploy", exact=True).click()
        confirm = card.get_by_role("button", name="Send “Deploy”")
        confirm.wait_for()
        assert store.get_todo_any_endpoint(todo.id).is_held
        page.screenshot(path=out / "inbox-confirm-laptop.png", full_page=True)
        clicked = time.monotonic()
        confirm.click()
        claim.join(timeout=5)

        assert claim.status == 200, claim.body
        assert claim.answered_at - clicked < 1.0
        assert claim.todo["id"] == todo.id
        assert claim.todo["answer"]["value"] == "Deploy"
        assert claim.todo["answer"]["by"] == "operator:alice"
        assert claim.todo["checkpoint"]["stage"] == "staging"
        page.get_by_text("Answered: the todo goes back to work.").wait_for()
        page.locator("#answered").get_by_text("Deploy api v2.14.0").wait_for()
        page.get_by_text("No open questions").wait_for()
        assert page.locator("#inbox-count").inner_text().strip().endswith("0")
        page.screenshot(path=out / "inbox-answered-laptop.png", full_page=True)
        page.goto(f"{server}/board/todos/{todo.id}/")
        page.get_by_text("Checkpoint").click()
        page.get_by_text('"passed": 3').wait_for()
        page.screenshot(path=out / "progress-laptop.png", full_page=True)
    finally:
        context.close()


def test_the_owner_answers_a_schema_form_on_a_phone(
    browser,
    server,
    owner,
    tmp_path,
):
    schema = {
        "type": "object",
        "properties": {
            "amount": {
                "type": "integer",
                "minimum": 1,
                "maximum": 500,
                "title": "Refund (EUR)",
            },
            "note": {"type": "string", "maxLength": 120, "title": "Note to customer"},
        },
        "required": ["amount"],
    }
    todo = asked(
        owner,
        "Refund order #88213",
        "support-bot",
        question="The customer asks for a refund of a damaged item. How much?",
        answer_schema=schema,
    )
    out = screenshots(tmp_path)
    context, page = open_page(browser, PHONE)
    try:
        log_in(page, server)
        card = page.locator(f"#card-{todo.id}")
        card.get_by_label("Refund (EUR)").fill("9000")
        card.get_by_role("button", name="Send answer").click()
        card.get_by_text("9000 is greater than the maximum of 500").wait_for()
        assert fits(page) <= 0
        page.screenshot(path=out / "inbox-phone.png", full_page=True)
        assert store.get_todo_any_endpoint(todo.id).is_held
        claim = waiting(server, owner, "support-bot")

        card.get_by_label("Refund (EUR)").fill("120")
        card.get_by_label("Note to customer").fill("Sorry about that!")
        clicked = time.monotonic()
        card.get_by_role("button", name="Send answer").click()
        claim.join(timeout=5)

        assert claim.status == 200, claim.body
        assert claim.answered_at - clicked < 1.0
        assert claim.todo["id"] == todo.id
        assert claim.todo["answer"]["value"] == {
            "amount": 120,
            "note": "Sorry about that!",
        }
        page.get_by_text("Answered: the todo goes back to work.").wait_for()
        page.locator("#answered").get_by_text("Refund order #88213").wait_for()
        assert fits(page) <= 0
        page.screenshot(path=out / "inbox-answered-phone.png", full_page=True)
    finally:
        context.close()


def dead_letter(scope, title, error):
    todo, _ = store.create_todo(scope, queue="deploys", title=title, max_attempts=1)
    store.claim_todo(scope, todo.id, "deploy-bot")
    return store.fail_todo(scope, todo.id, "deploy-bot", error=error)


def test_cancel_from_the_list_dismiss_a_group_and_answer_through_a_link(
    browser,
    server,
    owner,
    tmp_path,
):
    scope = store.Scope.for_endpoint(owner["endpoint"])
    for shard in range(3):
        store.create_todo(scope, queue="reindex", title=f"Reindex shard {shard}")
    busy, _ = store.create_todo(scope, queue="reindex", title="Reindex shard 3")
    store.claim_todo(scope, busy.id, "indexer")
    store.heartbeat(
        scope,
        busy.id,
        "indexer",
        progress={"message": "41 200 of 90 000 documents", "fraction": 0.46},
    )
    held = asked(
        owner,
        "Rotate the database password",
        "ops-bot",
        question="Rotating now logs out the 12 open admin sessions. Go ahead?",
        choices=["Rotate now", "Tonight at 02:00"],
    )
    for port in (5432, 6432):
        dead_letter(scope, "Migrate", f"connection refused to db:{port}")
    out = screenshots(tmp_path)
    context, page = open_page(browser, LAPTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        log_in(page, server)
        page.goto(f"{server}/board/todos/?queue=reindex")
        page.locator("#rows").get_by_text("41 200 of 90 000 documents").wait_for()
        page.get_by_label("Select Reindex shard 0").check()
        page.get_by_role("button", name="Cancel selected (1)").click()
        page.get_by_text("Canceled 1 of 1.").wait_for()
        page.locator("#rows .badge-canceled").first.wait_for()
        page.get_by_role("link", name="Cancel all matching…").click()
        page.get_by_role("heading", name="Cancel 3 todos?").wait_for()
        assert fits(page) <= 0
        page.screenshot(path=out / "cancel-laptop.png", full_page=True)
        page.get_by_role("button", name="Cancel 3 todos").click()
        page.get_by_role("heading", name="Canceled 2 todos").wait_for()
        page.locator("#rows").get_by_text("cancel requested").wait_for()
        assert store.get_todo_any_endpoint(busy.id).cancel_requested
        assert store.get_todo_any_endpoint(held.id).is_held, "another queue"

        page.goto(f"{server}/board/dead-letters/")
        page.get_by_role("button", name="Dismiss").click()
        page.get_by_text("Dismissed 2 dead letters.").wait_for()
        page.get_by_role("heading", name="No dead letters").wait_for()

        second = asked(
            owner,
            "Archive the 2025 logs",
            "ops-bot",
            question="Archive 2025's logs to cold storage?",
            choices=["Archive", "Keep hot"],
        )
        page.goto(f"{server}/board/todos/{second.id}/")
        page.get_by_role("button", name="Keep hot").click()
        page.get_by_role("button", name="Send “Keep hot”").click()
        # The whole page catches up: the todo is no longer held.
        page.locator("#detail h1 .badge-pending").wait_for()
        assert "waiting for an answer" not in page.locator("#detail").inner_text()

        page.goto(f"{server}/board/todos/{held.id}/")
        page.get_by_role("button", name="Copy answer link").click()
        page.get_by_role("button", name="Copied").wait_for()
        page.screenshot(path=out / "question-laptop.png", full_page=True)
        link = page.get_by_label("Answer link").input_value()
    finally:
        context.close()

    context, page = open_page(browser, PHONE)  # someone without a login
    try:
        page.goto(link)
        page.get_by_text("Go ahead?").wait_for()
        assert fits(page) <= 0
        page.screenshot(path=out / "answer-link-phone.png", full_page=True)
        page.get_by_role("button", name="Tonight at 02:00").click()
        page.get_by_role("button", name="Send “Tonight at 02:00”").click()
        page.get_by_role("heading", name="Thank you: answer sent").wait_for()
        assert store.get_todo_any_endpoint(held.id).answer["value"] == (
            "Tonight at 02:00"
        )
        response = page.goto(link)
        assert response.status == 410
        page.get_by_role("heading", name="This answer link cannot be used").wait_for()
    finally:
        context.close()


HOSTILE = '<img src=x onerror="window.__xss = 1">'
HOSTILE_SCRIPT = "<script>window.__xss = 2</script>"


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_a_hostile_description_is_text_and_no_script_runs_under_the_csp(
    browser,
    server,
    owner,
    size,
):
    """CONTRACT §16: an agent's schema is shown as text; the page's policy
    allows only the Board's own script files, which all keep working."""
    schema = {
        "type": "object",
        "properties": {
            "ticket": {"type": "string", "maxLength": 20, "title": HOSTILE},
            "amount": {
                "type": "integer",
                "minimum": 1,
                "maximum": 500,
                "title": "Amount",
                "description": HOSTILE_SCRIPT,
            },
        },
        "required": ["amount"],
    }
    todo = asked(
        owner,
        f"Refund {HOSTILE}",
        "support-bot",
        question=f"How much? {HOSTILE_SCRIPT}",
        answer_schema=schema,
    )
    context, page = open_page(browser, size)
    violations = []
    page.on(
        "console",
        lambda message: (
            "Content Security Policy" in message.text
            and violations.append(message.text)
        ),
    )
    try:
        log_in(page, server)
        response = page.goto(f"{server}/board/inbox/")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe" not in policy
        card = page.locator(f"#card-{todo.id}")
        card.get_by_text(HOSTILE_SCRIPT).first.wait_for()
        assert card.locator("img, script").count() == 0
        labels = card.locator("label").all_inner_texts()
        assert labels == [HOSTILE, "Amount (required)"]
        assert "1 to 500" in card.inner_text()
        assert fits(page) <= 0

        card.get_by_label("Amount").fill("700")
        card.get_by_role("button", name="Send answer").click()
        card.get_by_text("700 is greater than the maximum of 500").wait_for()
        card.get_by_label("Amount").fill("70")
        card.get_by_role("button", name="Send answer").click()
        page.get_by_text("Answered: the todo goes back to work.").wait_for()

        assert page.evaluate("window.__xss") is None
        assert store.get_todo_any_endpoint(todo.id).answer["value"] == {"amount": 70}
        # The Board's own pages run under the policy without a single refusal.
        for path in (
            "/board/",
            "/board/todos/",
            f"/board/todos/{todo.id}/",
            "/board/dead-letters/",
            "/board/endpoints/",
        ):
            page.goto(f"{server}{path}")
            page.wait_for_load_state("networkidle")
        assert violations == []
    finally:
        context.close()
