"""The Board in a real browser: Playwright driving Debian's headless Chromium.

`playwright install` cannot download browsers here, so these tests use the
system Chromium and skip, saying so, only when it is absent (tests/ui/browser.py
has what the browser tests share; their fixtures are in tests/ui/conftest.py).

Set SWITCHBOARD_SCREENSHOTS=docs/screenshots to refresh the README's pictures.
"""

import os
import re
from pathlib import Path

from django.db import connection
from playwright.sync_api import expect

from tests.ui.browser import LAPTOP, PHONE, log_in, pytestmark  # noqa: F401
from todos import store

# Spread the demo over the last hours, as if agents had worked through the
# night: each todo and its history move back together, one minute per event.
AGE_TODO_SQL = """
UPDATE todos SET created_at = created_at + make_interval(secs => %(base)s),
                 claimed_at = claimed_at + make_interval(secs => %(last)s),
                 updated_at = updated_at + make_interval(secs => %(last)s)
 WHERE id = %(id)s
"""
AGE_EVENTS_SQL = """
UPDATE todo_events e SET at = e.at + make_interval(secs => %(base)s + 60 * (r.n - 1))
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
          FROM todo_events WHERE todo_id = %(id)s) r
 WHERE e.id = r.id
"""


def age_demo():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.id, count(e.id) FROM todos t JOIN todo_events e"
            " ON e.todo_id = t.id GROUP BY t.id, t.created_at"
            " ORDER BY t.created_at"
        )
        todos = cursor.fetchall()
        for position, (todo_id, events) in enumerate(todos):
            base = -(len(todos) - position) * 2300
            params = {"id": todo_id, "base": base, "last": base + 60 * (events - 1)}
            cursor.execute(AGE_TODO_SQL, params)
            cursor.execute(AGE_EVENTS_SQL, params)


def mark_page(page):
    """Tag the document, so a full reload (which loses the tag) is detectable."""
    page.evaluate("window.__sameDocument = true")


def still_same_document(page):
    return page.evaluate("window.__sameDocument === true")


def test_log_in_filter_to_dead_letters_and_retry_a_row_in_place(page, demo):
    log_in(page)
    page.get_by_role("link", name="Todos").click()
    mark_page(page)

    page.get_by_label("State").select_option("dead_letter")
    page.wait_for_url(re.compile(r"state=dead_letter"))
    rows = page.locator("#rows tr")
    rows.first.locator(".badge-dead_letter").wait_for()
    assert rows.count() == 3
    row = page.locator("#rows tr", has_text="Deploy api v2.14.0 to production")
    row.get_by_role("button", name="Retry").click()

    row.locator(".badge-pending").wait_for()
    assert page.locator("#notices").inner_text().strip() == (
        "Retried: the todo is pending again."
    )
    assert still_same_document(page)
    (todo,) = store.list_todos_any_endpoint(text="to production").todos
    assert todo.state == "pending"


def test_bulk_retry_everything_matching_a_filter(page, demo):
    log_in(page, "/board/todos/?state=dead_letter")
    mark_page(page)

    page.get_by_role("link", name="Retry all matching…").click()
    page.get_by_role("heading", name="Retry 3 failed todos?").wait_for()
    page.get_by_role("button", name="Retry 3 todos").click()

    page.get_by_role("heading", name="Retried 3 todos").wait_for()
    page.get_by_text("No todo matches these filters").wait_for()
    assert still_same_document(page)
    assert store.count_retryable_any_endpoint(state="dead_letter") == 0


def test_retry_the_ticked_rows_then_the_selection_clears(page, demo):
    log_in(page, "/board/todos/?state=failed")

    page.get_by_label("Select Rebuild the revenue dashboard").check()
    page.get_by_label("Select Import refunds for 2026-11-29").check()
    page.get_by_role("button", name="Retry selected (2)").click()

    page.get_by_text("Retried 2 of 2.").wait_for()
    page.get_by_role("button", name="Retry selected", exact=True).wait_for()
    assert store.count_retryable_any_endpoint(state="failed") == 3


def test_polling_refresh_keeps_filter_scroll_and_selection(page, demo):
    page.set_viewport_size({"width": 1280, "height": 400})
    log_in(page, "/board/todos/?queue=reviews")
    mark_page(page)
    page.get_by_label("Select Review PR #1440: add retention command").check()
    page.mouse.wheel(0, 200)
    # Not wait_for_function: the Board's Content-Security-Policy forbids the
    # eval it polls with.
    expect(page.locator("html")).not_to_have_js_property("scrollTop", 0)
    scrolled = page.evaluate("window.scrollY")
    endpoint = demo["triage-bot"]
    store.create_todo_any_endpoint(endpoint.id, queue="reviews", title="Fresh review")
    store.create_todo_any_endpoint(endpoint.id, queue="deploys", title="Not this queue")

    # The same request the 5-second poll makes, without waiting for it.
    page.evaluate("htmx.trigger(document.body, 'rows-changed')")

    page.get_by_text("Fresh review").wait_for()
    assert page.get_by_text("Not this queue").count() == 0
    picked = page.get_by_label("Select Review PR #1440: add retention command")
    assert picked.is_checked()
    assert page.evaluate("window.scrollY") == scrolled
    assert still_same_document(page)
    assert "queue=reviews" in page.url


def test_create_an_endpoint_and_see_its_token_once(page, demo):
    log_in(page, "/board/endpoints/")
    page.get_by_role("link", name="New endpoint").click()
    page.get_by_label("Name").fill("pager-agent")
    page.get_by_label("Queues").fill("incidents, pages")
    page.get_by_role("button", name="Create endpoint").click()

    token = page.get_by_label("Endpoint token").input_value()
    page.get_by_role("button", name="Copy").click()
    page.get_by_role("button", name="Copied").wait_for()
    page.get_by_role("link", name="Done, back to endpoints").click()

    assert token.startswith("sb_")
    assert page.get_by_text("pager-agent").count() == 1
    assert token not in page.content()
    assert token[:9] in page.content()  # the prefix tells tokens apart


def test_pages_fit_a_laptop_and_a_phone(page, demo, tmp_path):
    """Also writes the README's screenshots when SWITCHBOARD_SCREENSHOTS is set."""
    out = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    age_demo()
    (detail,) = store.list_todos_any_endpoint(text="lease renewal").todos
    log_in(page)
    pages = {
        "overview": "/board/",
        "list": "/board/todos/?state=failed",
        "detail": f"/board/todos/{detail.id}/",
        "endpoints": "/board/endpoints/",
    }
    for size_name, size in (("laptop", LAPTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        for name, path in pages.items():
            page.goto(path)
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{name} scrolls sideways on a {size_name}"
            page.screenshot(path=out / f"{name}-{size_name}.png", full_page=True)


def test_a_refused_action_says_so_instead_of_failing_silently(page, demo):
    log_in(page, "/board/todos/?state=dead_letter")
    page.context.clear_cookies(name="csrftoken")

    row = page.locator("#rows tr", has_text="Deploy api v2.14.0 to production")
    row.get_by_role("button", name="Retry").click()

    page.get_by_text("The Board refused that (HTTP 403)").wait_for()
    assert row.locator(".badge-dead_letter").count() == 1
    (todo,) = store.list_todos_any_endpoint(text="to production").todos
    assert todo.is_dead_letter
