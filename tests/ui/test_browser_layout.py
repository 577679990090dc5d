"""The Board's layout in a real browser, at laptop and phone width: the
navigation, the endpoint cards, form checkboxes and the overview's held count.

Playwright drives Debian's headless Chromium, with the fixtures in
tests/ui/conftest.py.
"""

import pytest

from tests.ui.browser import SIZES, box, log_in, pytestmark  # noqa: F401
from todos import store


@pytest.mark.parametrize("size", SIZES)
def test_every_navigation_link_is_in_sight(page, demo, size):
    """On a phone the nav scrolled sideways with no hint, hiding Endpoints
    and Webhooks past the screen's edge."""
    page.set_viewport_size(size)
    log_in(page)

    links = page.locator("nav.nav a")
    names = [name.split()[0] for name in links.all_inner_texts()]
    assert names == [
        "Overview",
        "Inbox",
        "Todos",
        "Dead",
        "Schedules",
        "Budgets",
        "Endpoints",
        "Webhooks",
    ]
    for link in links.all():
        left, _, right, _ = box(link)
        assert left >= 0 and right <= size["width"], link.inner_text()
    hidden = page.evaluate(
        "(nav => nav.scrollWidth - nav.clientWidth)(document.querySelector('.nav'))"
    )
    assert hidden <= 0

    page.get_by_role("link", name="Webhooks").click()
    page.get_by_role("heading", name="Webhooks").wait_for()


@pytest.mark.parametrize("size", SIZES)
def test_an_endpoints_buttons_stay_inside_its_card(page, demo, size):
    page.set_viewport_size(size)
    log_in(page, "/board/endpoints/")

    rows = page.locator("tr[id^='endpoint-']")
    assert rows.count() == 3
    for row in rows.all():
        left, top, right, bottom = box(row)
        buttons = row.locator(".actions .button")
        assert buttons.count() == 4  # queues, SQS, rotate, revoke
        for button in buttons.all():
            b_left, b_top, b_right, b_bottom = box(button)
            assert left <= b_left and b_right <= right, button.inner_text()
            assert top <= b_top and b_bottom <= bottom, button.inner_text()
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0


@pytest.mark.parametrize("size", SIZES)
def test_a_checkbox_lines_up_with_its_label(page, demo, size):
    """A form's checkbox stood centred under its left-aligned label."""
    endpoint = demo["triage-bot"]
    page.set_viewport_size(size)
    log_in(page, f"/board/queues/{endpoint.id}/github/")

    checkbox = page.get_by_label("No attempt cap")
    label_left = box(page.locator("label", has_text="No attempt cap"))[0]
    left, _, right, _ = box(checkbox)

    # Its box, not only its glyph: a stretched box draws the glyph centred.
    assert abs(left - label_left) <= 4 and right - left <= 24


@pytest.mark.parametrize("size", SIZES)
def test_the_overview_counts_a_held_todo_as_held(page, demo, size):
    endpoint = demo["triage-bot"]
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="github", title="Merge the fix?")
    store.claim_todo(scope, todo.id, "triage-1")
    store.ask(scope, todo.id, "triage-1", question="Merge it now?")
    pending = store.board_overview().totals["pending"]
    page.set_viewport_size(size)
    log_in(page)

    held = page.locator("#counts .card", has_text="Held")
    assert held.locator(".card-value").inner_text() == "1"
    assert "waiting for an answer" in held.inner_text()
    pending_card = page.locator("#counts .card", has_text="Pending").first
    assert pending_card.locator(".card-value").inner_text() == str(pending)
    left, _, right, _ = box(held)
    assert left >= 0 and right <= size["width"]

    held.click()
    page.get_by_text("Merge it now?").wait_for()


@pytest.mark.parametrize("size", SIZES)
def test_the_new_todo_form_fits_and_names_a_bad_max_cost(page, demo, size):
    endpoint = demo["triage-bot"]
    page.set_viewport_size(size)
    log_in(page, f"/board/todos/new/?endpoint={endpoint.id}")

    page.get_by_label("Queue").fill("github")
    page.get_by_label("Max cost ($)").fill("-1")
    page.get_by_role("button", name="Create todo").click()

    error = page.get_by_text("greater than or equal to 0")
    error.wait_for()
    for element in (page.get_by_label("Max cost ($)"), error):
        left, _, right, _ = box(element)
        assert left >= 0 and right <= size["width"]
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0

    page.get_by_label("Max cost ($)").fill("0.5")
    page.get_by_role("button", name="Create todo").click()
    page.get_by_text("Created the todo").wait_for()
    page.get_by_text("$0.5").wait_for()
