"""The Board's schedules page in a real browser, at laptop and phone width:
it fits the screen, its rows keep their buttons, and pause, resume and the
edit form work from it.

Playwright drives Debian's headless Chromium, with the fixtures in
tests/ui/conftest.py.
"""

import pytest
from django.db import connection

from tests.ui.browser import SIZES, box, log_in, pytestmark  # noqa: F401
from todos import store


@pytest.fixture
def schedules(demo):
    """Two schedules of the demo's endpoint; one has run four times."""
    endpoint = demo["triage-bot"]
    scope = store.Scope.for_endpoint(endpoint)
    nightly = store.create_schedule(
        scope,
        name="review-open-prs",
        queue="reviews",
        cron="0 2 * * *",
        time_zone="Europe/Berlin",
        todo={"title": "Review the open PRs"},
    )
    every = store.create_schedule(
        scope,
        name="triage-inbox",
        queue="reviews",
        every_seconds=60,
        missed="all",
        todo={"title": "Triage the inbox"},
    )
    # The slots of the last four minutes came due: the sweep makes their todos.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE schedules SET next_slot_at = next_slot_at - interval '4 minutes'"
            " WHERE id = %s",
            [every.id],
        )
    store.fire_due_schedules()
    return {"nightly": nightly, "every": every}


@pytest.mark.parametrize("size", SIZES)
def test_the_schedules_page_fits_and_keeps_its_buttons_in_their_rows(
    page,
    schedules,
    size,
):
    page.set_viewport_size(size)
    log_in(page, "/board/schedules/")

    rows = page.locator("tr[id^='schedule-']")
    assert rows.count() == 2
    for row in rows.all():
        left, top, right, bottom = box(row)
        for button in row.locator(".actions .button").all():
            b_left, b_top, b_right, b_bottom = box(button)
            assert left <= b_left and b_right <= right, button.inner_text()
            assert top <= b_top and b_bottom <= bottom, button.inner_text()
    assert page.locator("tr", has_text="triage-inbox").locator(".runs a").count() == 4
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0


@pytest.mark.parametrize("size", SIZES)
def test_pause_resume_and_edit_a_schedule_from_the_board(
    page,
    schedules,
    size,
):
    page.set_viewport_size(size)
    log_in(page, "/board/schedules/")
    row = page.locator("tr", has_text="review-open-prs")

    row.get_by_role("button", name="Pause").click()
    page.get_by_text("Paused review-open-prs").wait_for()
    assert store.get_schedule_any_endpoint(schedules["nightly"].id).paused
    page.locator("tr", has_text="review-open-prs").get_by_role(
        "button", name="Resume"
    ).click()
    page.get_by_text("Resumed review-open-prs").wait_for()

    page.locator("tr", has_text="review-open-prs").get_by_role(
        "link", name="Edit"
    ).click()
    page.get_by_label("Cron").fill("30 6 * * 1-5")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Saved review-open-prs").wait_for()
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")

    assert overflow <= 0
    assert store.get_schedule_any_endpoint(schedules["nightly"].id).cron == (
        "30 6 * * 1-5"
    )
