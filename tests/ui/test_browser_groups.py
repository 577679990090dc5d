"""A queue's groups view in a real browser, at laptop and phone width: it fits
the screen, each row keeps its override form, an agent-written group renders
as text (no script runs), and a group's limit, weight and pause are saved
from it.

Playwright drives Debian's headless Chromium, with the fixtures in
tests/ui/conftest.py.
"""

import pytest

from tests.ui.browser import SIZES, box, log_in, pytestmark  # noqa: F401
from todos import store
from todos.store import admission

HOSTILE = "<img src=x onerror=\"document.title='owned'\">"


@pytest.fixture
def groups(demo):
    """The demo endpoint's queue "reviews": one group per repository, at most
    one claimed at a time each; one group's name is markup."""
    endpoint = demo["triage-bot"]
    scope = store.Scope.for_endpoint(endpoint)
    admission.set_admission(scope, "reviews", group_concurrency=1)
    for group in ["acme/api", "acme/api", "acme/web-frontend-monorepo", HOSTILE]:
        store.create_todo(scope, queue="reviews", title="Build", group=group)
    store.claim_next(scope, "w", queue="reviews")
    return {"endpoint": endpoint, "scope": scope}


def url(groups):
    return f"/board/queue-groups/{groups['endpoint'].id}/reviews/"


@pytest.mark.parametrize("size", SIZES)
def test_the_groups_view_fits_and_keeps_each_form_in_its_row(
    page,
    groups,
    size,
):
    page.set_viewport_size(size)
    log_in(page, url(groups))

    rows = page.locator("tr.group-row")
    assert rows.count() == 3
    for row in rows.all():
        left, top, right, bottom = box(row)
        for control in row.locator(
            ".group-form input:visible, .group-form button"
        ).all():
            c_left, c_top, c_right, c_bottom = box(control)
            assert left <= c_left and c_right <= right
            assert top <= c_top and c_bottom <= bottom
    # The agent-written group is text on the page, and its markup never ran.
    assert page.get_by_text(HOSTILE).count() == 1
    assert page.title() != "owned"
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0


@pytest.mark.parametrize("size", SIZES)
def test_a_groups_limit_weight_and_pause_are_saved_from_the_board(
    page,
    groups,
    size,
):
    page.set_viewport_size(size)
    log_in(page, url(groups))
    row = page.locator("tr.group-row", has_text="acme/web-frontend-monorepo")
    row.get_by_label("Limit").fill("2")
    row.get_by_label("Weight").fill("3")
    row.get_by_label("Paused").check()
    row.get_by_role("button", name="Save").click()
    page.get_by_text("Saved group acme/web-frontend-monorepo").wait_for()

    group = admission.get_group(
        groups["scope"], "reviews", "acme/web-frontend-monorepo"
    )
    assert (group.concurrency, group.weight, group.paused) == (2, 3, True)
    saved = page.locator("tr.group-row", has_text="acme/web-frontend-monorepo")
    assert saved.locator(".badge-paused").count() == 1
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0


@pytest.mark.parametrize("size", SIZES)
def test_the_queue_pages_admission_settings_are_saved_and_lead_to_its_groups(
    page,
    groups,
    size,
):
    page.set_viewport_size(size)
    log_in(page, f"/board/queues/{groups['endpoint'].id}/reviews/")
    page.get_by_label("Per-group limit").fill("2")
    page.get_by_label("Fair turns").check()
    page.get_by_label("Rate limit: claims").fill("30")
    page.get_by_label("Rate limit: per (s)").fill("60")
    page.get_by_role("button", name="Save admission").click()
    page.get_by_text("Saved the admission of reviews").wait_for()

    settings = admission.get_admission(groups["scope"], "reviews")
    assert settings.group_concurrency == 2 and settings.fair
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0
    page.get_by_role("link", name="Its groups").click()
    assert page.locator("tr.group-row").count() == 3
