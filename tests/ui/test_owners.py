"""The Board for owners (CONTRACT §13): each owner sees and acts on only their
endpoints, every URL of someone else's answers 404, a board-viewer is
read-only, staff see everything. Enforced once, in ``operator_view``."""

import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from todos import store
from todos.access import endpoints
from todos.models import Endpoint, WebhookRoute, WebhookSource
from todos.ui.access import VIEWERS_GROUP


def user(name, *, staff=False, viewer=False):
    account = get_user_model().objects.create_user(
        name, password="a-long-password", is_staff=staff
    )
    if viewer:
        account.groups.add(Group.objects.get_or_create(name=VIEWERS_GROUP)[0])
    return account


def endpoint_of(owner, name):
    return endpoints.create(name, owner, ["*"])[0]


def dead_letter(endpoint, title, queue="jobs", error="boom 1"):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue=queue, title=title, max_attempts=1)
    store.claim_todo(scope, todo.id, "w")
    return store.fail_todo(scope, todo.id, "w", error=error)


def claimed(endpoint, title, queue="jobs"):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue=queue, title=title)
    return store.claim_todo(scope, todo.id, "w")


@pytest.fixture
def world(db):
    """alice and bob own an endpoint each; vera views alice's; ops is staff."""
    alice, bob = user("alice"), user("bob")
    vera = user("vera", viewer=True)
    ops = user("ops", staff=True)
    mine, theirs = endpoint_of(alice, "alice-agent"), endpoint_of(bob, "bob-agent")
    viewed = endpoint_of(vera, "vera-agent")
    todos = {
        "alice_dead": dead_letter(mine, "alice dead letter"),
        "alice_claimed": claimed(mine, "alice busy"),
        "bob_dead": dead_letter(theirs, "bob dead letter"),
        "bob_claimed": claimed(theirs, "bob busy"),
        "vera_dead": dead_letter(viewed, "vera dead letter"),
    }
    source = WebhookSource.objects.create(slug="bob-hooks", secret="s" * 32)
    WebhookRoute.objects.create(source=source, endpoint=theirs, queue="jobs")
    return {
        "alice": alice,
        "bob": bob,
        "vera": vera,
        "ops": ops,
        "mine": mine,
        "theirs": theirs,
        "viewed": viewed,
        "todos": todos,
        "bob_source": source,
        "bob_route": source.routes.get(),
    }


def logged_in(account):
    client = Client()
    client.force_login(account)
    return client


def test_an_owner_logs_in_with_the_login_form(world):
    client = Client()

    response = client.post(
        "/board/login/", {"username": "alice", "password": "a-long-password"}
    )

    assert response.status_code == 302
    assert client.get("/board/").status_code == 200


def test_an_owner_sees_only_their_endpoints_everywhere(world):
    """SPEC: Cross-endpoint queue collision is isolated (both use queue jobs)."""
    client = logged_in(world["alice"])

    for url in [
        "/board/",
        "/board/todos/",
        "/board/endpoints/",
        "/board/dead-letters/",
    ]:
        page = client.get(url).content.decode()
        assert "alice-agent" in page, url
        assert "bob-agent" not in page and "bob dead letter" not in page, url
        assert "vera-agent" not in page, url
    webhooks = client.get("/board/webhooks/").content.decode()
    assert "bob-hooks" not in webhooks


def test_staff_see_every_endpoint(world):
    client = logged_in(world["ops"])

    page = client.get("/board/todos/").content.decode()

    assert "alice dead letter" in page and "bob dead letter" in page
    assert "bob-hooks" in client.get("/board/webhooks/").content.decode()


def foreign_urls(world):
    """Every Board URL naming one of bob's objects (GET and POST)."""
    theirs, todo = world["theirs"], world["todos"]["bob_dead"]
    busy = world["todos"]["bob_claimed"]
    source, route = world["bob_source"], world["bob_route"]
    return [
        ("get", f"/board/todos/{todo.id}/"),
        ("post", f"/board/todos/{todo.id}/retry/"),
        ("post", f"/board/todos/{busy.id}/release/"),
        ("get", f"/board/todos/?endpoint={theirs.id}"),
        ("get", f"/board/todos/?endpoint={theirs.id}&state=dead_letter"),
        ("get", f"/board/todos/retry-matching/?endpoint={theirs.id}"),
        ("post", f"/board/todos/retry-matching/?endpoint={theirs.id}"),
        ("get", f"/board/todos/new/?endpoint={theirs.id}"),
        ("get", f"/board/queues/{theirs.id}/jobs/"),
        ("post", f"/board/queues/{theirs.id}/jobs/"),
        ("post", f"/board/endpoints/{theirs.id}/rotate/"),
        ("post", f"/board/endpoints/{theirs.id}/revoke/"),
        ("get", f"/board/endpoints/{theirs.id}/grants/"),
        ("get", f"/board/endpoints/{theirs.id}/sqs/"),
        ("post", f"/board/endpoints/{theirs.id}/sqs/"),
        ("post", f"/board/endpoints/{theirs.id}/grants/"),
        ("post", f"/board/webhooks/{source.id}/delete/"),
        ("post", f"/board/webhooks/{source.id}/rotate/"),
        ("get", f"/board/webhooks/{source.id}/routes/new/"),
        ("post", f"/board/webhooks/routes/{route.id}/delete/"),
    ]


def test_every_url_of_another_owners_objects_answers_404(world):
    client = logged_in(world["alice"])

    for method, url in foreign_urls(world):
        data = {"endpoint": str(world["theirs"].id)} if method == "post" else None
        response = getattr(client, method)(url, data)
        assert response.status_code == 404, (method, url)

    bob = world["todos"]["bob_dead"]
    assert store.get_todo_any_endpoint(bob.id).state == "failed"
    assert Endpoint.objects.get(id=world["theirs"].id).revoked_at is None
    assert WebhookSource.objects.filter(id=world["bob_source"].id).exists()


def test_a_foreign_todo_answers_like_a_missing_one(world):
    """SPEC: A foreign todo id is indistinguishable from a nonexistent one."""
    client = logged_in(world["alice"])
    foreign = client.get(f"/board/todos/{world['todos']['bob_dead'].id}/")
    missing = client.get("/board/todos/00000000-0000-0000-0000-000000000000/")

    assert foreign.status_code == missing.status_code == 404

    def page(response):  # The CSRF token is masked afresh on every render.
        html = re.sub(r'"X-CSRFToken": "\w+"', "", response.content.decode())
        return re.sub(r'name="csrfmiddlewaretoken" value="\w+"', "", html)

    assert page(foreign) == page(missing)


def test_an_owners_bulk_retries_touch_only_their_todos(world):
    client = logged_in(world["alice"])
    mine, theirs = world["todos"]["alice_dead"], world["todos"]["bob_dead"]

    client.post("/board/todos/retry/", {"ids": [str(mine.id), str(theirs.id)]})
    client.post("/board/todos/retry-matching/", {"state": "dead_letter"})

    assert store.get_todo_any_endpoint(mine.id).state == "pending"
    assert store.get_todo_any_endpoint(theirs.id).state == "failed"
    assert store.get_todo_any_endpoint(world["todos"]["vera_dead"].id).state == "failed"


def test_an_owner_may_create_endpoints_only_for_themselves(world):
    client = logged_in(world["alice"])

    refused = client.post(
        "/board/endpoints/new/",
        {"name": "sneaky", "owner": world["bob"].pk, "queues": "*"},
    )
    created = client.post(
        "/board/endpoints/new/",
        {"name": "second", "owner": world["alice"].pk, "queues": "*"},
    )

    assert refused.status_code == 400
    assert created.status_code == 201
    assert Endpoint.objects.get(name="second").owner == world["alice"]
    assert not Endpoint.objects.filter(name="sneaky").exists()


def test_an_owner_creates_todos_only_on_their_endpoints(world):
    client = logged_in(world["alice"])
    form = {"queue": "jobs", "title": "by hand", "payload": "", "max_attempts": 3}

    theirs = client.post(
        "/board/todos/new/", {**form, "endpoint": str(world["theirs"].id)}
    )
    mine = client.post("/board/todos/new/", {**form, "endpoint": str(world["mine"].id)})

    assert theirs.status_code == 404
    assert mine.status_code == 302


def action_markers(html):
    """What offers an action: any form posting to the Board except logout."""
    posts = re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', html)
    hx = re.findall(r'hx-post="([^"]+)"', html)
    return [url for url in posts + hx if not url.endswith("/logout/")]


def test_a_board_viewer_sees_their_scope_with_no_action_offered(world):
    client = logged_in(world["vera"])
    todo = world["todos"]["vera_dead"]
    pages = [
        "/board/",
        "/board/todos/",
        f"/board/todos/{todo.id}/",
        "/board/dead-letters/",
        "/board/endpoints/",
        "/board/webhooks/",
        f"/board/queues/{world['viewed'].id}/jobs/",
        f"/board/endpoints/{world['viewed'].id}/sqs/",
    ]

    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert action_markers(html) == [], url
        assert "Retry" not in html.replace("Retry scheduled", ""), url
        assert "New todo" not in html and "New endpoint" not in html, url
    assert "vera dead letter" in client.get("/board/todos/").content.decode()
    assert "alice dead letter" not in client.get("/board/todos/").content.decode()


def test_every_board_post_of_a_viewer_answers_403(world):
    client = logged_in(world["vera"])
    todo = world["todos"]["vera_dead"]
    viewed = world["viewed"]
    posts = [
        f"/board/todos/{todo.id}/retry/",
        f"/board/todos/{todo.id}/release/",
        "/board/todos/retry/",
        "/board/todos/retry-matching/",
        "/board/todos/new/",
        f"/board/queues/{viewed.id}/jobs/",
        "/board/endpoints/new/",
        f"/board/endpoints/{viewed.id}/rotate/",
        f"/board/endpoints/{viewed.id}/revoke/",
        f"/board/endpoints/{viewed.id}/grants/",
        f"/board/endpoints/{viewed.id}/sqs/",
        "/board/webhooks/new/",
    ]

    for url in posts:
        assert client.post(url, {"ids": [str(todo.id)]}).status_code == 403, url
    for url in ["/board/todos/new/", "/board/endpoints/new/", "/board/webhooks/new/"]:
        assert client.get(url).status_code == 403, url
    assert store.get_todo_any_endpoint(todo.id).state == "failed"
    assert client.post("/board/logout/").status_code == 302, "logging out still works"


def test_a_staff_viewer_sees_everything_and_changes_nothing(world):
    world["ops"].groups.add(Group.objects.get_or_create(name=VIEWERS_GROUP)[0])
    client = logged_in(world["ops"])
    bob = world["todos"]["bob_dead"]

    assert "bob dead letter" in client.get("/board/todos/").content.decode()
    assert client.post(f"/board/todos/{bob.id}/retry/").status_code == 403


FORBIDDEN = (
    r"store\.\w+_any_endpoint|board_overview|store_stats"
    r"|dead_letter_groups\(endpoint|chart_series|metrics_figures"
)


def test_board_views_reach_the_store_only_through_the_access_scope():
    """The scope is enforced in one place: no Board view calls an operator twin."""
    ui = Path(__file__).resolve().parents[2] / "todos" / "ui"
    for module in ui.glob("*.py"):
        if module.name == "access.py":
            continue
        source = module.read_text()
        assert not re.search(FORBIDDEN, source), module.name


# --- The queue page ---------------------------------------------------------------


def test_the_queue_page_edits_settings_and_pauses_and_resumes_claims(world):
    """CONTRACT §10 queue settings: default lease, attempt cap, delay, pause."""
    client = logged_in(world["alice"])
    url = f"/board/queues/{world['mine'].id}/jobs/"
    page = client.get(url).content.decode()
    assert "Save settings" in page and "Pause claims" in page

    saved = client.post(
        url,
        {
            "op": "settings",
            "lease_seconds": "90",
            "max_attempts": "3",
            "delay_seconds": "15",
        },
    )
    paused = client.post(url, {"op": "pause"})

    assert saved.status_code == paused.status_code == 302
    queue = store.get_queue_any_endpoint(world["mine"].id, "jobs")
    assert (queue.lease_seconds, queue.max_attempts, queue.delay_seconds) == (90, 3, 15)
    assert queue.paused
    assert "Resume claims" in client.get(url).content.decode()
    client.post(url, {"op": "resume"})
    assert not store.get_queue_any_endpoint(world["mine"].id, "jobs").paused


def test_a_queue_without_an_attempt_cap_shows_no_cap_and_keeps_it_when_saved(world):
    """A queue that redelivers without limit (an SQS queue without a
    RedrivePolicy) offers a form the browser can submit: its cap is shown as
    "no cap", not as a number past the field's bound, and saving its other
    settings keeps it uncapped."""
    client = logged_in(world["alice"])
    scope = store.Scope.for_endpoint(world["mine"])
    store.ensure_queue(scope, "forever", max_attempts=store.UNLIMITED_ATTEMPTS)
    url = f"/board/queues/{world['mine'].id}/forever/"

    page = client.get(url).content.decode()
    assert str(store.UNLIMITED_ATTEMPTS) not in page
    assert re.search(r'name="unlimited_attempts"[^>]*checked', page)

    saved = client.post(
        url,
        {"op": "settings", "lease_seconds": "90", "unlimited_attempts": "on"},
    )
    assert saved.status_code == 302
    queue = store.get_queue_any_endpoint(world["mine"].id, "forever")
    assert (queue.lease_seconds, queue.max_attempts) == (90, store.UNLIMITED_ATTEMPTS)

    client.post(url, {"op": "settings", "max_attempts": "4"})
    assert store.get_queue_any_endpoint(world["mine"].id, "forever").max_attempts == 4


def test_queue_settings_out_of_range_answer_400_with_the_field_named(world):
    client = logged_in(world["alice"])
    url = f"/board/queues/{world['mine'].id}/jobs/"

    response = client.post(url, {"op": "settings", "lease_seconds": "0"})

    assert response.status_code == 400
    assert b"Ensure this value is greater than or equal to 1" in response.content


def test_an_unknown_queue_answers_404(world):
    client = logged_in(world["alice"])

    assert client.get(f"/board/queues/{world['mine'].id}/nope/").status_code == 404
