"""The Board for owners in a real browser (Debian's headless Chromium).

Two owners (alice, bob), an operator (staff) and a read-only viewer (carol,
in the ``board-viewers`` group) each log in through the login form and see
exactly their scope; a crawl of every Board URL alice's pages link to, made as
bob, answers 404; carol is offered no action and every POST of hers is a 403.
The dead-letter groups retry a whole group; the new pages (dead letters, a
queue, the overview's charts) fit a laptop and a phone.

SWITCHBOARD_SCREENSHOTS=docs/screenshots refreshes the README's pictures.
"""

import os
import random
import re
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from playwright.sync_api import expect

from tests.ui.browser import LAPTOP, PHONE, pytestmark  # noqa: F401
from todos import store
from todos.store import stats
from todos.ui import demo as board_demo
from todos.ui.access import VIEWERS_GROUP

PASSWORD = "switchboard-demo"

# Outage-shaped failures: four causes, each with varying ids and numbers.
CAUSES = {
    ("triage-bot", "reviews"): [
        lambda n: (
            "TimeoutError: GitHub API did not answer within 30s "
            f"(GET /repos/acme/switchboard/pulls/{1400 + n}/files)"
        ),
        lambda n: (
            f"RuntimeError: diff too large for the review model ({300 + n}"
            " files, limit 300)"
        ),
    ],
    ("release-agent", "deploys"): [
        lambda n: (
            "deploy blocked: staging health check failed "
            f"(HTTP 50{n % 4} from 10.0.{n % 9}.{n % 200}:8443/healthz)"
        ),
    ],
    ("nightly-etl", "imports"): [
        lambda n: (
            f"botocore.exceptions.NoSuchKey: 'refunds-2026-11-{n % 28 + 1:02d}"
            ".csv' does not exist"
        ),
    ],
}


@pytest.fixture
def page_for(browser, live_server):
    """Return a factory: page_for(username) opens a logged-in page."""
    contexts = []

    def factory(username, viewport=LAPTOP):
        context = browser.new_context(viewport=viewport, base_url=live_server.url)
        context.set_default_timeout(10_000)
        contexts.append(context)
        page = context.new_page()
        page.goto("/board/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(r"/board/$"))
        return page

    yield factory
    for context in contexts:
        context.close()


def fail_at_cap(endpoint, queue, error):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue=queue, title="t", max_attempts=1)
    store.claim_todo(scope, todo.id, "agent-7")
    return store.fail_todo(scope, todo.id, "agent-7", error=error)


def work_through_the_day(endpoints, rng):
    """Todos created, claimed, done or failed across the last day, rolled up."""
    plan = [
        ("triage-bot", "github", 160),
        ("triage-bot", "reviews", 60),
        ("release-agent", "deploys", 40),
        ("nightly-etl", "imports", 120),
    ]
    for name, queue, count in plan:
        scope = store.Scope.for_endpoint(endpoints[name])
        for n in range(count):
            todo, _ = store.create_todo(scope, queue=queue, title=f"{queue} #{n}")
            fate = rng.random()
            if fate < 0.15:
                continue
            store.claim_todo(scope, todo.id, "agent-1")
            if fate < 0.25:
                continue
            if fate < 0.35:
                store.fail_todo(scope, todo.id, "agent-1", error="flaky upstream")
            else:
                store.complete_todo(scope, todo.id, "agent-1")
    for (name, queue), causes in CAUSES.items():
        for n in range(12 * len(causes) + 5):
            fail_at_cap(endpoints[name], queue, causes[n % len(causes)](n))
    with connection.cursor() as cursor:
        # Each todo's history moves back by its own offset (busier lately).
        cursor.execute(
            """
            WITH offsets AS (
                SELECT id, 86000 * power(random(), 2.2) AS back FROM todos
            )
            UPDATE todo_events e SET at = e.at - make_interval(secs => o.back)
              FROM offsets o WHERE e.todo_id = o.id
            """
        )
    stats.restart_rollup(seconds_back=86400)
    for _ in range(26):
        stats.roll_up_minutes()
    with connection.cursor() as cursor:
        # The depth the sweep loop would have sampled each minute of the day:
        # a backlog that swells and drains, ending near today's.
        cursor.execute(
            """
            INSERT INTO todo_minutes (endpoint_id, queue, minute, pending)
            SELECT q.endpoint_id, q.queue, m,
                   GREATEST(0, round(q.pending * (1 + 0.8 * sin(
                       EXTRACT(EPOCH FROM m) / 2400 + length(q.queue)))
                       + 6 * random()))
              FROM (SELECT endpoint_id, queue, max(pending) AS pending
                      FROM todo_minutes GROUP BY endpoint_id, queue) q
             CROSS JOIN generate_series(
                   date_trunc('minute', now()) - interval '1 day',
                   date_trunc('minute', now()) - interval '1 minute',
                   interval '1 minute') m
            ON CONFLICT (endpoint_id, queue, minute)
            DO UPDATE SET pending = EXCLUDED.pending
            """
        )


@pytest.fixture
def world(db):
    random.seed(7)
    endpoints = board_demo.seed()
    users = get_user_model().objects
    users.create_user("operator", password=PASSWORD, is_staff=True)
    for name in ("alice", "bob", "carol"):
        account = users.get(username=name)
        account.set_password(PASSWORD)
        account.save()
    viewers, _ = Group.objects.get_or_create(name=VIEWERS_GROUP)
    users.get(username="carol").groups.add(viewers)
    work_through_the_day(endpoints, random.Random(7))
    return endpoints


def visible_endpoints(page):
    page.goto("/board/todos/?state=dead_letter")
    return set(page.locator(".todos-table .ep").all_inner_texts())


def test_two_owners_staff_and_a_viewer_each_see_exactly_their_scope(page_for, world):
    expected = {
        "alice": {"triage-bot"},
        "bob": {"release-agent"},
        "carol": {"nightly-etl"},
        "operator": {"triage-bot", "release-agent", "nightly-etl"},
    }
    for username, names in expected.items():
        page = page_for(username)
        headings = set(page.locator(".group-head h2").all_inner_texts())
        assert headings - {"Throughput, last hour"} == names, username
        assert visible_endpoints(page) == names, username
        page.goto("/board/dead-letters/")
        where = " ".join(page.locator(".dl-where").all_inner_texts())
        for name in {"triage-bot", "release-agent", "nightly-etl"}:
            assert (name in where) == (name in names), (username, name)
        page.goto("/board/endpoints/")
        rows = set(page.locator(".endpoints-table th[scope=row] a").all_inner_texts())
        assert rows == names, username


def crawl(page, start="/board/", limit=60):
    """Follow the Board's links from start; return every URL seen and the
    POST forms' actions."""
    base = page.url.split("/board/")[0]
    seen, queue, actions = set(), [start], set()
    while queue and len(seen) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        page.goto(path)
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            url = urlparse(urljoin(base + path, href))
            target = url.path + (f"?{url.query}" if url.query else "")
            board = url.path.startswith("/board/") and "logout" not in url.path
            if board and target not in seen:
                queue.append(target)
        actions.update(
            page.eval_on_selector_all(
                "form[method=post]",
                "els => els.map(e => new URL(e.getAttribute('action') || '',"
                " location.href).pathname)",
            )
        )
    return seen, actions - {"/board/logout/"}


def test_a_crawl_of_every_board_url_as_the_wrong_owner_answers_404(page_for, world):
    alice = page_for("alice")
    urls, actions = crawl(alice)
    mine = str(world["triage-bot"].id)
    todo_ids = {
        str(t.id)
        for t in store.list_todos_any_endpoint(endpoint_id=mine, limit=200).todos
    }

    def names_alices(url):
        return mine in url or any(todo_id in url for todo_id in todo_ids)

    foreign = sorted(url for url in urls if names_alices(url))
    foreign_posts = sorted(url for url in actions if names_alices(url))
    assert len(foreign) > 10 and foreign_posts, "the crawl reached alice's objects"

    bob = page_for("bob")
    token = next(c["value"] for c in bob.context.cookies() if c["name"] == "csrftoken")
    for url in foreign:
        assert bob.request.get(url).status == 404, url
    for url in foreign_posts:
        response = bob.request.post(
            url, headers={"X-CSRFToken": token, "Referer": bob.url}
        )
        assert response.status == 404, url
    for url in {u for u in urls if not names_alices(u)}:
        assert bob.request.get(url).status in (200, 404), url


def test_the_read_only_user_sees_no_action_and_gets_403_on_post(page_for, world):
    carol = page_for("carol")
    urls, actions = crawl(carol)

    assert actions == set(), "a viewer is offered no form that posts"
    for url in urls:
        carol.goto(url)
        assert carol.locator("[hx-post]").count() == 0, url
        for name in ("Retry", "Release", "Pause", "Save settings", "New todo"):
            assert carol.get_by_role("button", name=name).count() == 0, (url, name)
    own = store.list_todos_any_endpoint(
        endpoint_id=str(world["nightly-etl"].id), state="dead_letter", limit=1
    ).todos[0]
    token = next(
        c["value"] for c in carol.context.cookies() if c["name"] == "csrftoken"
    )
    headers = {"X-CSRFToken": token, "Referer": carol.url}
    for url in (
        f"/board/todos/{own.id}/retry/",
        "/board/todos/retry-matching/",
        f"/board/queues/{world['nightly-etl'].id}/imports/",
        "/board/endpoints/new/",
    ):
        assert carol.request.post(url, headers=headers).status == 403, url
    assert store.get_todo_any_endpoint(own.id).state == "failed"


def test_retry_a_dead_letter_group_in_one_click_and_confirm(page_for, world):
    alice = page_for("alice")
    alice.goto("/board/dead-letters/")
    group = alice.locator(".dl-group").filter(has_text="TimeoutError")
    count = int(group.locator(".dl-count").inner_text())

    group.get_by_role("link", name="Retry group…").click()
    alice.get_by_role("button", name=re.compile(rf"Retry {count} todos?")).click()

    expect(alice.locator("#bulk")).to_contain_text(f"Retried {count} todos")
    # Not wait_for_function: the Board's Content-Security-Policy forbids the
    # eval it polls with.
    expect(alice.locator("#dead-letter-groups")).not_to_contain_text("TimeoutError")


def test_new_pages_fit_a_laptop_and_a_phone(page_for, world, tmp_path):
    """Also writes the README's screenshots when SWITCHBOARD_SCREENSHOTS is set."""
    out = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    triage = world["triage-bot"].id
    pages = {
        "charts": "/board/",
        "charts-day": "/board/?range=day",
        "dead-letters": "/board/dead-letters/",
        "queue": f"/board/queues/{triage}/github/",
    }
    for size_name, size in (("laptop", LAPTOP), ("phone", PHONE)):
        page = page_for("operator", viewport=size)
        for name, path in pages.items():
            page.goto(path)
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{name} scrolls sideways on a {size_name}"
            assert page.locator("svg.chart").count() or name == "dead-letters"
            page.screenshot(path=out / f"{name}-{size_name}.png", full_page=True)
