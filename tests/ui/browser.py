"""What the Board's browser tests share besides fixtures (those are in
tests/ui/conftest.py): Debian's Chromium and its flags, the laptop and phone
sizes, the marks that skip without Chromium, logging in as the demo's
operator, and an element's box.

`playwright install` cannot download browsers here, so these tests use the
system Chromium (scripts/system-deps.sh installs it) and skip, saying so, only
when it is absent. Playwright's sync API runs an event loop in this thread,
which Django would otherwise take for async code touching the database.
"""

import os
import re

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SIZES = [pytest.param(LAPTOP, id="laptop"), pytest.param(PHONE, id="phone")]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"Debian's chromium is not installed at {CHROMIUM} "
        "(scripts/system-deps.sh installs it)",
    ),
    pytest.mark.django_db(transaction=True),
]


def log_in(page, next_path="/board/"):
    """Log in as the demo's operator through the form, landing on next_path."""
    page.goto(next_path)
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("switchboard-demo")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(re.escape(next_path) + "$"))


def box(locator):
    """The element's box in CSS pixels: left, top, right, bottom."""
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not rendered"
    return (
        found["x"],
        found["y"],
        found["x"] + found["width"],
        found["y"] + found["height"],
    )
