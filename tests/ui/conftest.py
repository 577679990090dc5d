"""The Board's fixtures: a staff operator, and a test client logged in as it;
for the browser tests (tests/ui/browser.py has their plain helpers), Debian's
headless Chromium, a page on the live server, and the demo's data."""

import pytest
from django.contrib.auth import get_user_model

from tests.ui.browser import CHROMIUM, CHROMIUM_ARGS, LAPTOP
from todos.ui import demo as board_demo


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_user(
        "ops", password="a-long-password", is_staff=True
    )


@pytest.fixture
def board(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport=LAPTOP, base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def demo(db):
    get_user_model().objects.create_user(
        "operator", password="switchboard-demo", is_staff=True
    )
    return board_demo.seed()
