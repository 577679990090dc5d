"""The budgets page in a real browser, at laptop and phone width: it fits the
screen, each budget shows its spend and state, the spend chart draws its
lines, and a budget is created and edited from its forms.

Playwright drives Debian's headless Chromium, with the fixtures in
tests/ui/conftest.py. SWITCHBOARD_SCREENSHOTS=<dir> saves the pages.
"""

import os
from pathlib import Path

import pytest

from tests.ui.browser import LAPTOP, PHONE, SIZES, box, log_in, pytestmark  # noqa: F401
from todos import store
from todos.store import spend

NAMES = {LAPTOP["width"]: "laptop", PHONE["width"]: "phone"}


@pytest.fixture
def spending(demo):
    """The demo endpoint's queue reviews has a daily budget of $50 it spent
    $41 of; two more queues spent a little."""
    endpoint = demo["triage-bot"]
    scope = store.Scope.for_endpoint(endpoint)
    budget = store.create_budget(
        scope, scope="queue", queue="reviews", window="day", limit_usd=50
    )
    store.create_budget(
        scope,
        scope="group",
        queue="reviews",
        group="acme/web-frontend-monorepo",
        window="hour",
        time_zone="Europe/Paris",
        limit_tokens=2_000_000,
        action="reject_new",
    )
    for queue, cost, tokens in [("reviews", 41, 180_000), ("github", 3.2, 9_000)]:
        store.report_usage(
            scope,
            queue=queue,
            usage={"cost_usd": cost, "input_tokens": tokens, "model": "m"},
        )
    spend.roll_up_usage()
    return {"endpoint": endpoint, "scope": scope, "budget": budget}


def fits(shown):
    return shown.evaluate("document.documentElement.scrollWidth - innerWidth") <= 0


def shoot(shown, name):
    folder = os.environ.get("SWITCHBOARD_SCREENSHOTS")
    if folder:
        shown.screenshot(path=str(Path(folder) / name), full_page=True)


@pytest.mark.parametrize("size", SIZES)
def test_the_budgets_page_fits_and_shows_spend_and_state(
    page,
    spending,
    size,
):
    page.set_viewport_size(size)
    log_in(page, "/board/budgets/")

    row = page.locator(f"#budget-{spending['budget'].id}")
    assert "$41.00" in row.inner_text() and "$9.00" in row.inner_text()
    assert row.locator(".badge-budget-soft").is_visible()
    assert page.locator("tr.budget-row").count() == 2
    chart = page.locator(".spend-chart svg:visible")
    assert chart.count() == 1
    assert chart.locator("polyline").count() == 2
    assert fits(page)
    shoot(page, f"budgets-{NAMES[size['width']]}.png")


@pytest.mark.parametrize("size", SIZES)
def test_a_budget_is_created_and_edited_from_the_board(
    page,
    spending,
    size,
):
    page.set_viewport_size(size)
    log_in(page, "/board/budgets/")
    page.get_by_label("Endpoint").select_option(label="triage-bot (alice)")
    page.get_by_role("textbox", name="Queue").fill("github")
    page.get_by_label("Limit ($)").fill("5")
    page.get_by_role("button", name="Create budget").click()
    page.get_by_text("Created the daily budget of queue github.").wait_for()
    created = [b for b in store.list_budgets(spending["scope"]) if b.queue == "github"]
    assert [(b.limit_usd, b.action) for b in created] == [(5, "pause")]

    page.locator(f"#budget-{created[0].id}").get_by_role("link", name="Edit").click()
    page.get_by_label("Limit ($)").fill("7.5")
    page.get_by_label("Soft threshold (%)").fill("60")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Saved the daily budget of queue github.").wait_for()

    edited = store.get_budget(spending["scope"], created[0].id)
    assert (edited.limit_usd, edited.soft_percent) == (7.5, 60)
    assert fits(page)


@pytest.fixture
def exhausted(spending):
    """The queue reviews reached its daily budget of $50: its work paused."""
    scope = spending["scope"]
    store.report_usage(scope, queue="reviews", usage={"cost_usd": 9.5})
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w", queue="reviews")
    return spending


@pytest.mark.parametrize(
    "size, decision",
    [
        pytest.param(LAPTOP, "raise", id="laptop-raise"),
        pytest.param(PHONE, "resume", id="phone-resume"),
    ],
)
def test_the_owner_answers_the_budget_card_and_the_work_resumes(
    page,
    exhausted,
    size,
    decision,
):
    page.set_viewport_size(size)
    log_in(page, "/board/inbox/")
    budget = exhausted["budget"]
    card = page.locator(f"#budget-card-{budget.id}")
    assert "Daily budget of $50 reached on queue reviews" in card.inner_text()
    assert page.locator("#inbox-count").inner_text().strip().endswith("1")
    assert fits(page)
    for control in card.locator("input:visible, button").all():
        c_left, _, c_right, _ = box(control)
        left, _, right, _ = box(card)
        assert left <= c_left and c_right <= right
    shoot(page, f"inbox-budget-{NAMES[size['width']]}.png")

    if decision == "raise":
        card.get_by_label("By ($)").fill("20")
        card.get_by_role("button", name="Raise for today").click()
        page.locator("#notices").get_by_text("Raised by $20.00 for today").wait_for()
    else:
        card.get_by_role("button", name="Resume anyway").click()
        page.locator("#notices").get_by_text("Resumed for today").wait_for()

    # The queue's work is claimed again (the demo has more pending reviews).
    claimed = store.claim_next(exhausted["scope"], "w", queue="reviews")
    assert claimed.queue == "reviews"
    page.goto(f"/board/budgets/{budget.id}/")
    history = page.locator(".budget-history").inner_text()
    said = "raised for the window" if decision == "raise" else "resumed anyway"
    assert said in history and "operator:operator" in history
    assert "limit reached" in history
    assert fits(page)
