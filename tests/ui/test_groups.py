"""The Board's admission pages (CONTRACT §17): a queue's groups with their
overrides, a queue's admission settings, a todo's priority and group, and the
owner's scope (CONTRACT §13)."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from tests.ui.test_owners import endpoint_of, user
from todos import store
from todos.store import admission
from todos.ui.access import VIEWERS_GROUP

HOSTILE = '<img src=x onerror="alert(1)">'


@pytest.fixture
def world(db):
    """alice's queue "builds" has three groups (one named by markup); bob
    has a queue of his own; ops is staff."""
    alice, bob, ops = user("alice"), user("bob"), user("ops", staff=True)
    mine, theirs = endpoint_of(alice, "alice-agent"), endpoint_of(bob, "bob-agent")
    scope = store.Scope.for_endpoint(mine)
    admission.set_admission(scope, "builds", group_concurrency=1)
    todos = [
        store.create_todo(scope, queue="builds", title=f"t{n}", group=group)[0]
        for n, group in enumerate(["acme/api", "acme/api", "acme/web", HOSTILE])
    ]
    store.claim_next(scope, "w", queue="builds")
    store.create_todo(store.Scope.for_endpoint(theirs), queue="inbox", group="secret")
    return {
        "alice": alice,
        "bob": bob,
        "ops": ops,
        "mine": mine,
        "theirs": theirs,
        "scope": scope,
        "todos": todos,
    }


def logged_in(account):
    client = Client()
    client.force_login(account)
    return client


def groups_url(endpoint, queue):
    return f"/board/queue-groups/{endpoint.id}/{queue}/"


def test_the_groups_view_shows_in_flight_pending_limit_and_weight(world):
    page = logged_in(world["alice"]).get(groups_url(world["mine"], "builds"))
    html = page.content.decode()

    assert page.status_code == 200
    assert html.count('class="group-row') == 3
    api = html[html.index("acme/api") :]
    row = api[: api.index("</tr>")]
    assert '<td data-label="In flight">1 <span class="muted">at limit' in row
    assert '<td data-label="Pending">1</td>' in row
    assert '<td data-label="Limit">1' in row
    assert '<td data-label="Weight">1</td>' in row


def test_an_agent_written_group_renders_as_text(world):
    html = (
        logged_in(world["alice"])
        .get(groups_url(world["mine"], "builds"))
        .content.decode()
    )
    assert HOSTILE not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    todo = world["todos"][3]
    detail = logged_in(world["alice"]).get(f"/board/todos/{todo.id}/").content.decode()
    assert HOSTILE not in detail and "&lt;img src=x" in detail


def test_a_group_override_is_set_from_the_board(world):
    client = logged_in(world["alice"])
    answer = client.post(
        groups_url(world["mine"], "builds"),
        {"group": "acme/web", "concurrency": "3", "weight": "4", "paused": "on"},
        follow=True,
    )
    assert "Saved group acme/web" in answer.content.decode()
    group = admission.get_group(world["scope"], "builds", "acme/web")
    assert (group.concurrency, group.weight, group.paused, group.limit) == (
        3,
        4,
        True,
        3,
    )
    client.post(
        groups_url(world["mine"], "builds"),
        {"group": "acme/web", "concurrency": "", "weight": "1"},
    )
    group = admission.get_group(world["scope"], "builds", "acme/web")
    assert (group.concurrency, group.paused, group.limit) == (None, False, 1)


def test_a_bad_group_override_is_a_400_that_changes_nothing(world):
    answer = logged_in(world["alice"]).post(
        groups_url(world["mine"], "builds"),
        {"group": "acme/web", "concurrency": "-1", "weight": "0"},
    )
    assert answer.status_code == 400
    assert admission.get_group(world["scope"], "builds", "acme/web").weight == 1


def test_the_groups_view_is_paginated_by_name(world):
    scope = world["scope"]
    for n in range(55):
        admission.set_group(scope, "builds", f"zz-{n:02d}", weight=2)
    client = logged_in(world["alice"])
    first = client.get(groups_url(world["mine"], "builds")).content.decode()
    assert first.count('class="group-row') == 50
    assert "?after=zz-46" in first
    second = client.get(groups_url(world["mine"], "builds") + "?after=zz-46")
    html = second.content.decode()
    assert html.count('class="group-row') == 8
    assert "zz-47" in html and "zz-46</span>" not in html


def test_another_owners_queue_groups_are_a_404(world):
    client = logged_in(world["alice"])
    assert client.get(groups_url(world["theirs"], "inbox")).status_code == 404
    answer = client.post(
        groups_url(world["theirs"], "inbox"), {"group": "secret", "weight": "9"}
    )
    assert answer.status_code == 404
    theirs = store.Scope.for_endpoint(world["theirs"])
    assert admission.get_group(theirs, "inbox", "secret").weight == 1
    # Staff see every endpoint's groups.
    staff = logged_in(world["ops"]).get(groups_url(world["theirs"], "inbox"))
    assert staff.status_code == 200 and "secret" in staff.content.decode()


def test_a_viewer_sees_the_groups_and_may_change_nothing(world):
    viewer = user("vera")
    viewer.groups.add(Group.objects.get_or_create(name=VIEWERS_GROUP)[0])
    viewer.is_staff = True
    viewer.save()
    client = logged_in(viewer)
    page = client.get(groups_url(world["mine"], "builds")).content.decode()
    assert "acme/api" in page and 'class="group-form"' not in page
    answer = client.post(
        groups_url(world["mine"], "builds"), {"group": "acme/api", "weight": "5"}
    )
    assert answer.status_code == 403


def test_the_queue_page_shows_and_saves_its_admission_settings(world):
    client = logged_in(world["alice"])
    url = f"/board/queues/{world['mine'].id}/builds/"
    page = client.get(url).content.decode()
    assert 'name="group_concurrency"' in page and 'value="1"' in page
    assert f'href="/board/queue-groups/{world["mine"].id}/builds/"' in page
    answer = client.post(
        url,
        {
            "op": "admission",
            "group_concurrency": "2",
            "fair": "on",
            "rate_count": "10",
            "rate_per_seconds": "60",
            "priority_aging_seconds": "30",
        },
        follow=True,
    )
    assert "Saved the admission of builds" in answer.content.decode()
    settings = admission.get_admission(world["scope"], "builds")
    assert settings.group_concurrency == 2 and settings.fair
    assert settings.rate_limit == {"count": 10, "per_seconds": 60, "burst": 10}
    assert settings.group_rate_limit is None
    assert settings.priority_aging_seconds == 30


def test_a_bad_admission_setting_is_a_400(world):
    url = f"/board/queues/{world['mine'].id}/builds/"
    answer = logged_in(world["alice"]).post(
        url, {"op": "admission", "group_concurrency": "-3"}
    )
    assert answer.status_code == 400
    assert admission.get_admission(world["scope"], "builds").group_concurrency == 1


def test_another_owners_queue_admission_cannot_be_set(world):
    url = f"/board/queues/{world['theirs'].id}/inbox/"
    answer = logged_in(world["alice"]).post(
        url, {"op": "admission", "group_concurrency": "0"}
    )
    assert answer.status_code == 404
    theirs = store.Scope.for_endpoint(world["theirs"])
    assert admission.get_admission(theirs, "inbox").group_concurrency is None


def test_a_todo_shows_its_priority_and_group(world):
    todo = world["todos"][2]
    page = logged_in(world["alice"]).get(f"/board/todos/{todo.id}/").content.decode()
    assert "<dt>Priority</dt><dd>3" in page
    assert '<span class="group-name">acme/web</span>' in page
    assert 'action="/board/todos/' + todo.id + '/priority/"' in page


def test_a_pending_todo_is_reprioritized_from_the_board(world):
    todo = world["todos"][2]
    client = logged_in(world["alice"])
    answer = client.post(
        f"/board/todos/{todo.id}/priority/", {"priority": "1"}, follow=True
    )
    assert "Priority 1" in answer.content.decode()
    assert store.get_todo(world["scope"], todo.id).priority == 1


def test_a_claimed_todo_keeps_its_priority(world):
    claimed = next(
        t
        for t in world["todos"]
        if store.get_todo(world["scope"], t.id).state == "claimed"
    )
    answer = logged_in(world["alice"]).post(
        f"/board/todos/{claimed.id}/priority/", {"priority": "1"}, follow=True
    )
    assert "only a pending todo" in answer.content.decode()
    assert store.get_todo(world["scope"], claimed.id).priority == 3


def test_another_owners_todo_cannot_be_reprioritized(world):
    theirs = store.Scope.for_endpoint(world["theirs"])
    todo = store.create_todo(theirs, queue="inbox", title="x")[0]
    answer = logged_in(world["alice"]).post(
        f"/board/todos/{todo.id}/priority/", {"priority": "1"}
    )
    assert answer.status_code == 404
    assert store.get_todo(theirs, todo.id).priority == 3


def test_the_priority_form_needs_the_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["alice"])
    todo = world["todos"][2]
    answer = client.post(f"/board/todos/{todo.id}/priority/", {"priority": "1"})
    assert answer.status_code == 403
    assert store.get_todo(world["scope"], todo.id).priority == 3
