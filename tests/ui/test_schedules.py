"""The Board's schedules page: next slots, last runs with their todos'
outcomes, pause and resume, editing, and the owner's scope (CONTRACT §13)."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from tests.support import DatabaseClock
from tests.ui.test_owners import endpoint_of, user
from todos import store
from todos.ui.access import VIEWERS_GROUP


@pytest.fixture
def clock(db):
    return DatabaseClock().install("2026-03-27T00:00:00Z").use()


@pytest.fixture
def world(clock):
    """alice and bob own an endpoint and a schedule each; ops is staff."""
    alice, bob, ops = user("alice"), user("bob"), user("ops", staff=True)
    mine, theirs = endpoint_of(alice, "alice-agent"), endpoint_of(bob, "bob-agent")
    nightly = store.create_schedule(
        store.Scope.for_endpoint(mine),
        name="nightly",
        queue="reviews",
        cron="0 2 * * *",
        time_zone="Europe/Berlin",
        todo={"title": "Review the open PRs", "max_attempts": 2},
        missed="all",
    )
    hourly = store.create_schedule(
        store.Scope.for_endpoint(theirs), name="hourly", queue="inbox", cron="@hourly"
    )
    return {
        "alice": alice,
        "bob": bob,
        "ops": ops,
        "mine": mine,
        "nightly": nightly,
        "hourly": hourly,
    }


def logged_in(account):
    client = Client()
    client.force_login(account)
    return client


def test_the_list_shows_next_slots_and_last_runs_with_their_outcomes(world, clock):
    scope = store.Scope.for_endpoint(world["mine"])
    clock.advance(days=2)
    made = store.fire_due_schedules().todos
    first, second = [todo for todo in made if todo.queue == "reviews"]
    store.claim_todo(scope, first.id, "w")
    store.complete_todo(scope, first.id, "w")

    page = logged_in(world["ops"]).get("/board/schedules/").content.decode()

    assert "nightly" in page and "hourly" in page
    assert "<code>0 2 * * *</code>" in page and "Europe/Berlin" in page
    assert f'href="/board/todos/{first.id}/"' in page
    assert 'class="badge badge-done"' in page and 'class="badge badge-pending"' in page
    assert "2026-03-29 00:00" in page  # the next slot, 02:00 CEST


def test_pause_and_resume_from_the_list(world):
    client = logged_in(world["alice"])
    schedule = world["nightly"]

    paused = client.post(
        "/board/schedules/", {"op": "pause", "schedule": schedule.id}, follow=True
    )
    assert "Paused nightly" in paused.content.decode()
    assert store.get_schedule_any_endpoint(schedule.id).paused
    client.post("/board/schedules/", {"op": "resume", "schedule": schedule.id})
    assert not store.get_schedule_any_endpoint(schedule.id).paused


def form(schedule, **changes):
    return {
        "op": "edit",
        "name": schedule.name,
        "queue": schedule.queue,
        "cron": schedule.cron or "",
        "every_seconds": "",
        "time_zone": schedule.time_zone,
        "title": "Review the open PRs",
        "payload": '{"repo": "acme/app"}',
        "overlap": schedule.overlap,
        "missed": schedule.missed,
        **changes,
    }


def test_the_edit_form_changes_the_schedule_and_keeps_the_templates_other_fields(
    world,
):
    client = logged_in(world["alice"])
    schedule = world["nightly"]

    response = client.post(
        f"/board/schedules/{schedule.id}/",
        form(schedule, cron="30 6 * * 1-5", overlap="skip"),
    )

    assert response.status_code == 302
    changed = store.get_schedule_any_endpoint(schedule.id)
    assert (changed.cron, changed.overlap) == ("30 6 * * 1-5", "skip")
    assert changed.todo == {
        "title": "Review the open PRs",
        "payload": {"repo": "acme/app"},
        "max_attempts": 2,
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cron": "61 * * * *"}, "not a valid expression"),
        ({"time_zone": "Mars/Olympus"}, "unknown IANA time zone"),
        ({"cron": "", "every_seconds": ""}, "Give either a cron or an interval"),
        ({"payload": "{not json"}, "Not valid JSON"),
        ({"queue": "deploys"}, "Outside the endpoint"),
    ],
)
def test_a_bad_edit_answers_400_with_the_field_explained(world, changes, message):
    world["mine"].queues = ["reviews"]
    world["mine"].save()
    client = logged_in(world["alice"])
    schedule = world["nightly"]

    response = client.post(
        f"/board/schedules/{schedule.id}/", form(schedule, **changes)
    )

    assert response.status_code == 400
    assert message in response.content.decode()
    assert store.get_schedule_any_endpoint(schedule.id).cron == "0 2 * * *"


def test_an_owner_sees_only_their_schedules_and_another_owners_answer_404(world):
    client = logged_in(world["alice"])
    theirs = world["hourly"]

    page = client.get("/board/schedules/").content.decode()

    assert "nightly" in page and "hourly" not in page
    assert client.get(f"/board/schedules/{theirs.id}/").status_code == 404
    assert client.get("/board/schedules/not-a-uuid/").status_code == 404
    refused = client.post("/board/schedules/", {"op": "pause", "schedule": theirs.id})
    assert refused.status_code == 404
    assert not store.get_schedule_any_endpoint(theirs.id).paused


def test_a_board_viewer_is_offered_no_action_and_every_post_is_403(world):
    vera = user("vera", viewer=True)
    vera.groups.add(Group.objects.get_or_create(name=VIEWERS_GROUP)[0])
    client = logged_in(world["ops"])
    world["ops"].groups.add(Group.objects.get_or_create(name=VIEWERS_GROUP)[0])
    schedule = world["nightly"]

    page = client.get(f"/board/schedules/{schedule.id}/").content.decode()

    assert "Pause" not in page and "Save" not in page
    for url in ("/board/schedules/", f"/board/schedules/{schedule.id}/"):
        response = client.post(url, {"op": "pause", "schedule": schedule.id})
        assert response.status_code == 403, url
    assert not store.get_schedule_any_endpoint(schedule.id).paused
