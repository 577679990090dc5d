"""The Board's inbox of agents' questions and the answer-link page (CONTRACT §14
Board, §13 access): owner scoping, read-only viewers, answers validated by the
question's schema, the first answer wins, single-use links that expire."""

import html
import re
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from tests.ui.test_owners import endpoint_of, logged_in, user
from todos import store
from todos.access import endpoints


def asking(endpoint, title, worker="agent-1", **question):
    """A todo of this endpoint, claimed by worker, which asks a question."""
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="jobs", title=title)
    store.claim_todo(scope, todo.id, worker)
    question.setdefault("question", f"What about {title}?")
    return store.ask(scope, todo.id, worker, **question)


def age(todo, interval):
    """Move a question's asking back in time (one test transaction has one now)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET asked_at = asked_at - %s::interval WHERE id = %s",
            [interval, todo.id],
        )


@pytest.fixture
def people(db):
    alice, bob = user("alice"), user("bob")
    vera = user("vera", viewer=True)
    return {
        "alice": alice,
        "bob": bob,
        "vera": vera,
        "ops": user("ops", staff=True),
        "mine": endpoint_of(alice, "alice-agent"),
        "theirs": endpoint_of(bob, "bob-agent"),
        "viewed": endpoint_of(vera, "vera-agent"),
    }


def answer_field(todo, name="answer"):
    return f"q{todo.id.split('-')[0]}-{name}"


def confirmed(todo, choice):
    """The post of a choice's confirmation step (the card's "Send …" button)."""
    return {answer_field(todo): choice, answer_field(todo, "confirm"): "yes"}


def nav_count(html):
    found = re.search(r'id="inbox-count"[^>]*>.*?</span>(\d+)</span>', html)
    return int(found.group(1))


# --- The inbox --------------------------------------------------------------------


def test_the_inbox_lists_only_the_owners_open_questions_oldest_first(people):
    first = asking(people["mine"], "Deploy to prod", choices=["yes", "no"])
    second = asking(people["mine"], "Pick a region")
    asking(people["theirs"], "Bob's secret question")
    age(first, "1 hour")

    html = logged_in(people["alice"]).get("/board/inbox/").content.decode()

    assert html.index("Deploy to prod") < html.index("Pick a region")
    assert "Bob&#x27;s secret question" not in html and "Bob's secret" not in html
    assert "What about Deploy to prod?" in html
    assert 'value="yes"' in html and f'name="{answer_field(first)}"' in html
    assert nav_count(html) == 2
    assert second.id in html


def test_the_inbox_orders_by_nearest_deadline_on_request(people):
    oldest = asking(people["mine"], "No deadline")
    asking(people["mine"], "Far deadline", deadline_seconds=86400)
    asking(people["mine"], "Near deadline", deadline_seconds=600)
    age(oldest, "1 hour")
    client = logged_in(people["alice"])

    html = client.get("/board/inbox/?order=deadline").content.decode()

    assert (
        html.index("Near deadline")
        < html.index("Far deadline")
        < html.index("No deadline")
    )
    by_age = client.get("/board/inbox/").content.decode()
    assert by_age.index("No deadline") < by_age.index("Near deadline")


def test_the_navigation_counts_open_questions_on_every_board_page(people):
    asking(people["mine"], "One")
    asking(people["mine"], "Two")
    asking(people["theirs"], "Not alice's")
    client = logged_in(people["alice"])

    for url in [
        "/board/",
        "/board/todos/",
        "/board/dead-letters/",
        "/board/endpoints/",
    ]:
        assert nav_count(client.get(url).content.decode()) == 2, url
    fragment = client.get("/board/inbox/count/", headers={"HX-Request": "true"})
    assert nav_count(fragment.content.decode()) == 2
    staff = logged_in(people["ops"]).get("/board/").content.decode()
    assert nav_count(staff) == 3


def test_answering_a_choice_ends_the_hold_and_keeps_who_answered(people):
    todo = asking(people["mine"], "Deploy to prod", choices=["yes", "no"])
    client = logged_in(people["alice"])

    response = client.post(
        f"/board/todos/{todo.id}/answer/",
        confirmed(todo, "yes"),
        headers={"HX-Request": "true", "HX-Target": f"card-{todo.id}"},
    )

    assert response.status_code == 200
    answered = store.get_todo_any_endpoint(todo.id)
    assert not answered.is_held
    assert answered.answer["value"] == "yes"
    assert answered.answer["by"] == "operator:alice"
    assert "Answered: the todo goes back to work." in response.content.decode()
    inbox = client.get("/board/inbox/").content.decode()
    assert "No open questions" in inbox
    recent = inbox[inbox.index("Recent answers") :]
    assert "Deploy to prod" in recent and "operator:alice" in recent


def test_a_choice_that_is_not_offered_is_a_field_error(people):
    todo = asking(people["mine"], "Deploy", choices=["yes", "no"])

    response = logged_in(people["alice"]).post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo): "maybe"}
    )

    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert store.get_todo_any_endpoint(todo.id).is_held


SCHEMA = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer", "minimum": 1, "maximum": 500},
        "reason": {"type": "string", "maxLength": 40},
        "region": {"enum": ["eu", "us"]},
        "urgent": {"type": "boolean"},
    },
    "required": ["amount", "region"],
}


def test_a_schema_answer_failing_the_schema_shows_field_errors_not_a_500(people):
    todo = asking(people["mine"], "Refund", answer_schema=SCHEMA)
    client = logged_in(people["alice"])

    page = client.get("/board/inbox/").content.decode()
    assert f'name="{answer_field(todo, "amount")}"' in page
    assert f'name="{answer_field(todo, "region")}"' in page

    response = client.post(
        f"/board/todos/{todo.id}/answer/",
        {
            answer_field(todo, "amount"): "9000",
            answer_field(todo, "reason"): "x" * 41,
            answer_field(todo, "region"): '"eu"',
        },
        headers={"HX-Request": "true", "HX-Target": f"card-{todo.id}"},
    )

    html = response.content.decode()
    assert response.status_code == 200  # htmx swaps the card with its errors
    assert "9000 is greater than the maximum of 500" in html
    assert "is too long" in html
    assert html.count('class="field has-error"') == 2
    assert store.get_todo_any_endpoint(todo.id).is_held
    plain = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo, "amount"): "nope"}
    )
    assert plain.status_code == 400
    assert "Enter a whole number" in plain.content.decode()


def test_a_valid_schema_answer_is_stored_as_json(people):
    todo = asking(people["mine"], "Refund", answer_schema=SCHEMA)

    logged_in(people["alice"]).post(
        f"/board/todos/{todo.id}/answer/",
        {
            answer_field(todo, "amount"): "120",
            answer_field(todo, "region"): '"us"',
            answer_field(todo, "urgent"): "on",
        },
    )

    value = store.get_todo_any_endpoint(todo.id).answer["value"]
    assert value == {"amount": 120, "region": "us", "urgent": True}


def test_a_free_json_answer_that_is_not_json_is_a_field_error(people):
    schema = {"type": "array", "items": {"type": "string"}}
    todo = asking(people["mine"], "List the hosts", answer_schema=schema)
    client = logged_in(people["alice"])

    bad = client.post(f"/board/todos/{todo.id}/answer/", {answer_field(todo): "[1,"})
    wrong = client.post(f"/board/todos/{todo.id}/answer/", {answer_field(todo): "[1]"})
    nul = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo): '["a\\u0000"]'}
    )
    good = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo): '["a", "b"]'}
    )

    assert nul.status_code == 400 and "cannot be stored" in nul.content.decode()
    assert bad.status_code == 400 and "Not valid JSON" in bad.content.decode()
    assert wrong.status_code == 400
    assert "1 is not of type" in wrong.content.decode()
    assert good.status_code == 302
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == ["a", "b"]


def test_a_question_without_choices_or_schema_takes_free_text(people):
    todo = asking(people["mine"], "Name the release")
    client = logged_in(people["alice"])

    nul = client.post(f"/board/todos/{todo.id}/answer/", {answer_field(todo): "a\x00b"})
    good = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo): "  Cedar 2.0\n"}
    )

    assert nul.status_code == 400
    assert "Null characters are not allowed" in nul.content.decode()
    assert good.status_code == 302
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "  Cedar 2.0\n"


def test_the_inbox_says_when_it_shows_only_the_first_questions(people, monkeypatch):
    from todos.ui import inbox

    monkeypatch.setattr(inbox, "INBOX_SIZE", 2)
    for n in range(3):
        asking(people["mine"], f"Question {n}")

    html = logged_in(people["alice"]).get("/board/inbox/").content.decode()

    assert "3 open questions · the first 2 shown" in html


def test_answering_twice_shows_a_conflict_notice_and_the_first_answer_stays(people):
    todo = asking(people["mine"], "Deploy", choices=["yes", "no"])
    client = logged_in(people["alice"])
    client.post(f"/board/todos/{todo.id}/answer/", confirmed(todo, "no"))

    response = client.post(
        f"/board/todos/{todo.id}/answer/",
        confirmed(todo, "yes"),
        headers={"HX-Request": "true", "HX-Target": f"card-{todo.id}"},
    )

    assert response.status_code == 200
    assert "Already answered by operator:alice" in response.content.decode()
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "no"


def test_a_race_lost_in_the_store_is_a_notice_too(people, monkeypatch):
    """The card was open while someone else answered: the store's Conflict."""
    todo = asking(people["mine"], "Deploy", choices=["yes", "no"])
    scope = store.Scope.for_endpoint(people["mine"])
    real = store.answer_todo_any_endpoint

    def answered_meanwhile(todo_id, answer, *, by):
        store.answer_todo(scope, todo_id, "no", worker="orchestrator")
        return real(todo_id, answer, by=by)

    monkeypatch.setattr(store, "answer_todo_any_endpoint", answered_meanwhile)
    response = logged_in(people["alice"]).post(
        f"/board/todos/{todo.id}/answer/",
        confirmed(todo, "yes"),
        headers={"HX-Request": "true", "HX-Target": f"card-{todo.id}"},
    )

    assert "Already answered by agent:alice-agent" in response.content.decode()
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "no"


def test_another_owners_question_answers_404_everywhere(people):
    todo = asking(people["theirs"], "Bob's", choices=["yes"])
    client = logged_in(people["alice"])

    assert client.get(f"/board/todos/{todo.id}/").status_code == 404
    answered = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo): "yes"}
    )
    assert answered.status_code == 404
    assert client.post(f"/board/todos/{todo.id}/cancel/").status_code == 404
    assert store.get_todo_any_endpoint(todo.id).is_held


def test_a_viewer_sees_questions_but_is_offered_no_answer_and_posts_403(people):
    todo = asking(people["viewed"], "Vera's agent asks", choices=["yes", "no"])
    client = logged_in(people["vera"])

    html = client.get("/board/inbox/").content.decode()
    detail = client.get(f"/board/todos/{todo.id}/").content.decode()

    assert "Vera&#x27;s agent asks" in html
    assert "Read-only: you can see this question" in html
    assert "<form" not in html.split('id="questions"')[1].split("</section>")[0]
    assert "Copy answer link" not in detail and "/answer/" not in detail
    assert "Cancel todo" not in detail
    for url in [
        f"/board/todos/{todo.id}/answer/",
        f"/board/todos/{todo.id}/cancel/",
        "/board/todos/cancel/",
        "/board/todos/cancel-matching/",
        "/board/dead-letters/dismiss/",
    ]:
        response = client.post(url, {answer_field(todo): "yes", "ids": [todo.id]})
        assert response.status_code == 403, url
    assert client.get("/board/todos/cancel-matching/").status_code == 403
    assert store.get_todo_any_endpoint(todo.id).is_held


def test_someone_without_a_board_login_is_sent_to_log_in(people):
    todo = asking(people["mine"], "Deploy", choices=["yes"])

    assert Client().get("/board/inbox/").status_code == 302
    response = Client().post(f"/board/todos/{todo.id}/answer/", {})
    assert response.status_code == 302
    assert store.get_todo_any_endpoint(todo.id).is_held


# --- The answer link --------------------------------------------------------------


def link_of(client, todo):
    html = client.get(f"/board/todos/{todo.id}/").content.decode()
    return re.search(r'value="http://testserver(/answer/[^"]+)"', html).group(1)


def test_the_todo_page_offers_the_owner_a_link_that_answers_once(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship", "hold"])
    path = link_of(logged_in(people["alice"]), todo)
    stranger = Client(enforce_csrf_checks=True)

    page = stranger.get(path)
    assert page.status_code == 200
    html = page.content.decode()
    assert "What about Ship it??" in html and 'value="ship"' in html
    assert page["Cache-Control"] == "no-store"
    assert page["Referrer-Policy"] == "same-origin"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)

    answered = stranger.post(
        path, {**confirmed(todo, "hold"), "csrfmiddlewaretoken": token}
    )
    assert answered.status_code == 200
    assert "answer sent" in answered.content.decode()
    stored = store.get_todo_any_endpoint(todo.id)
    assert stored.answer["value"] == "hold" and not stored.is_held

    again = stranger.post(
        path, {**confirmed(todo, "ship"), "csrfmiddlewaretoken": token}
    )
    assert again.status_code == 410
    assert "cannot be used" in again.content.decode()
    assert stranger.get(path).status_code == 410
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "hold"


def test_the_answer_link_form_needs_its_csrf_token(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship", "hold"])
    path = link_of(logged_in(people["alice"]), todo)
    stranger = Client(enforce_csrf_checks=True)
    stranger.get(path)

    assert stranger.post(path, {answer_field(todo): "ship"}).status_code == 403
    assert store.get_todo_any_endpoint(todo.id).is_held


def test_an_expired_answer_link_is_refused(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    path = link_of(logged_in(people["alice"]), todo)
    # The link expires seven days after a question without a deadline.
    age(todo, "8 days")
    path = link_of(logged_in(people["alice"]), store.get_todo_any_endpoint(todo.id))

    response = Client().get(path)

    assert response.status_code == 410
    assert "expired" in response.content.decode()
    refused = Client().post(path, {answer_field(todo): "ship"})
    assert refused.status_code in (403, 410)
    assert store.get_todo_any_endpoint(todo.id).is_held


def test_a_forged_or_mangled_answer_link_is_a_404_page(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    path = link_of(logged_in(people["alice"]), todo)

    for bad in [path[:-3] + "abc", "/answer/not-a-token", "/answer/" + "x" * 500]:
        response = Client().get(bad)
        assert response.status_code == 404, bad
        assert "not valid" in response.content.decode()


def test_an_answer_link_validates_the_answer_against_the_schema(people):
    todo = asking(people["mine"], "Refund", answer_schema=SCHEMA)
    path = link_of(logged_in(people["alice"]), todo)

    response = Client().post(
        path, {answer_field(todo, "amount"): "0", answer_field(todo, "region"): '"eu"'}
    )

    assert response.status_code == 400
    assert "0 is less than the minimum of 1" in response.content.decode()
    assert store.get_todo_any_endpoint(todo.id).is_held


def test_a_replaced_question_refuses_the_old_link(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    old = link_of(logged_in(people["alice"]), todo)
    scope = store.Scope.for_endpoint(people["mine"])
    store.answer_todo(scope, todo.id, "ship", worker="orchestrator")
    store.claim_todo(scope, todo.id, "agent-1")
    store.ask(scope, todo.id, "agent-1", question="And now?", choices=["ok"])

    assert Client().get(old).status_code == 410


# --- Cancel -----------------------------------------------------------------------


def pending(endpoint, title, queue="jobs"):
    scope = store.Scope.for_endpoint(endpoint)
    return store.create_todo(scope, queue=queue, title=title)[0]


def test_cancel_one_todo_from_its_row(people):
    todo = pending(people["mine"], "Pointless now")

    response = logged_in(people["alice"]).post(
        f"/board/todos/{todo.id}/cancel/",
        headers={"HX-Request": "true", "HX-Target": f"todo-{todo.id}"},
    )

    html = response.content.decode()
    assert "Canceled: the todo will not run." in html
    assert "badge-canceled" in html
    canceled = store.get_todo_any_endpoint(todo.id)
    assert (
        canceled.is_canceled and canceled.result["canceled"]["by"] == "operator:alice"
    )


def test_a_claimed_todo_shows_cancel_requested(people):
    scope = store.Scope.for_endpoint(people["mine"])
    todo = pending(people["mine"], "Long run")
    store.claim_todo(scope, todo.id, "agent-1")
    client = logged_in(people["alice"])

    response = client.post(
        f"/board/todos/{todo.id}/cancel/",
        headers={"HX-Request": "true", "HX-Target": "detail"},
    )

    assert "Cancel requested: the worker is told to stop" in response.content.decode()
    listed = client.get("/board/todos/").content.decode()
    assert "cancel requested" in listed
    row = listed[listed.index(f'id="todo-{todo.id}"') :].split("</tr>")[0]
    assert "/cancel/" not in row, "no second cancel is offered"
    assert store.get_todo_any_endpoint(todo.id).state == "claimed"


def test_cancel_a_terminal_todo_is_a_notice(people):
    scope = store.Scope.for_endpoint(people["mine"])
    todo = pending(people["mine"], "Finished")
    store.claim_todo(scope, todo.id, "w")
    store.complete_todo(scope, todo.id, "w")

    response = logged_in(people["alice"]).post(
        f"/board/todos/{todo.id}/cancel/",
        headers={"HX-Request": "true", "HX-Target": "detail"},
    )

    assert response.status_code == 200
    assert "Could not cancel" in response.content.decode()


def test_cancel_the_ticked_todos(people):
    mine = [pending(people["mine"], f"mine {n}") for n in range(3)]
    bobs = pending(people["theirs"], "bob's")

    response = logged_in(people["alice"]).post(
        "/board/todos/cancel/",
        {"ids": [mine[0].id, mine[1].id, bobs.id]},
        headers={"HX-Request": "true"},
    )

    html = response.content.decode()
    assert "Canceled 2 of 3." in html and "1 no longer exist" in html
    assert response["HX-Trigger"].count("selection-cleared") == 1
    assert [store.get_todo_any_endpoint(t.id).is_canceled for t in mine] == [
        True,
        True,
        False,
    ]
    assert not store.get_todo_any_endpoint(bobs.id).is_canceled


def test_bulk_cancel_previews_then_cancels_everything_matching(people):
    for n in range(3):
        pending(people["mine"], f"reindex {n}", queue="reindex")
    busy = pending(people["mine"], "reindex busy", queue="reindex")
    store.claim_todo(store.Scope.for_endpoint(people["mine"]), busy.id, "w")
    keep = pending(people["mine"], "other queue", queue="mail")
    bobs = pending(people["theirs"], "bob reindex", queue="reindex")
    client = logged_in(people["alice"])

    preview = client.get(
        "/board/todos/cancel-matching/?queue=reindex",
        headers={"HX-Request": "true", "HX-Target": "bulk"},
    )
    html = preview.content.decode()
    assert "Cancel 4 todos?" in html
    assert "3 not being worked on" in html and "1 claimed get a cancel request" in html
    assert store.list_todos_any_endpoint(queue="reindex", state="done").todos == []

    done = client.post(
        "/board/todos/cancel-matching/",
        {"queue": "reindex"},
        headers={"HX-Request": "true", "HX-Target": "bulk"},
    )

    assert "Canceled 3 todos" in done.content.decode()
    assert len(store.list_todos_any_endpoint(queue="reindex", state="done").todos) == 3
    assert store.get_todo_any_endpoint(busy.id).cancel_requested
    assert store.get_todo_any_endpoint(keep.id).state == "pending"
    assert store.get_todo_any_endpoint(bobs.id).state == "pending"
    again = client.get("/board/todos/cancel-matching/?queue=reindex")
    assert "Nothing to cancel" in again.content.decode()


def test_bulk_cancel_with_a_bad_filter_is_a_400(people):
    client = logged_in(people["alice"])

    response = client.get("/board/todos/cancel-matching/?state=sideways")

    assert response.status_code == 400
    assert "This filter is not valid" in response.content.decode()


# --- Dismissing dead letters ------------------------------------------------------


def dead(endpoint, title, error):
    scope = store.Scope.for_endpoint(endpoint)
    todo, _ = store.create_todo(scope, queue="jobs", title=title, max_attempts=1)
    store.claim_todo(scope, todo.id, "w")
    return store.fail_todo(scope, todo.id, "w", error=error)


def test_dismissing_a_group_takes_it_off_the_groups_page(people):
    first = dead(people["mine"], "a", "timeout after 30s")
    dead(people["mine"], "b", "timeout after 31s")
    other = dead(people["mine"], "c", "disk full")
    client = logged_in(people["alice"])
    page = client.get("/board/dead-letters/").content.decode()
    assert "Dismiss" in page
    fingerprint = html.unescape(
        re.search(r'name="fingerprint" value="([^"]*timeout[^"]*)"', page).group(1)
    )

    response = client.post(
        "/board/dead-letters/dismiss/",
        {"endpoint": people["mine"].id, "queue": "jobs", "fingerprint": fingerprint},
        headers={"HX-Request": "true"},
    )

    assert "Dismissed 2 dead letters." in response.content.decode()
    page = client.get("/board/dead-letters/").content.decode()
    assert "timeout" not in page and "disk full" in page
    assert store.get_todo_any_endpoint(first.id).is_dead_letter, "still failed"
    assert store.get_todo_any_endpoint(other.id).dismissed_at is None
    detail = client.get(f"/board/todos/{first.id}/").content.decode()
    assert "dismissed from its group" in detail


def test_an_owner_cannot_dismiss_another_owners_group(people):
    bobs = dead(people["theirs"], "b", "boom")
    client = logged_in(people["alice"])

    response = client.post(
        "/board/dead-letters/dismiss/",
        {"endpoint": people["theirs"].id, "queue": "jobs", "fingerprint": "boom"},
    )

    assert response.status_code == 404
    assert store.get_todo_any_endpoint(bobs.id).dismissed_at is None


def test_dismissing_without_naming_a_group_is_a_400(people):
    response = logged_in(people["alice"]).post(
        "/board/dead-letters/dismiss/",
        {"endpoint": "not-a-uuid", "queue": ""},
        headers={"HX-Request": "true"},
    )

    assert response.status_code == 400


# --- Progress and checkpoints -----------------------------------------------------


def test_progress_and_checkpoint_show_on_the_todo_page_and_the_claimed_list(people):
    scope = store.Scope.for_endpoint(people["mine"])
    todo = pending(people["mine"], "Crawl the site")
    store.claim_todo(scope, todo.id, "agent-1")
    store.heartbeat(
        scope,
        todo.id,
        "agent-1",
        progress={"message": "page 35 of 100", "fraction": 0.35},
        checkpoint={"next_page": 36, "seen": ["a", "b"]},
    )
    client = logged_in(people["alice"])

    detail = client.get(f"/board/todos/{todo.id}/").content.decode()
    live = client.get(
        f"/board/todos/{todo.id}/", headers={"HX-Request": "true", "HX-Target": "live"}
    ).content.decode()
    listed = client.get("/board/todos/?state=claimed").content.decode()

    assert '<progress max="100" value="35"' in detail and "page 35 of 100" in detail
    assert (
        '<details id="checkpoint-' in detail and "&quot;next_page&quot;: 36" in detail
    )
    assert live.lstrip().startswith('<section id="live"')
    assert "page 35 of 100" in live and "<html" not in live
    assert "page 35 of 100" in listed and 'value="35"' in listed


# --- An agent's text is text (CONTRACT §16) -----------------------------------------

SCRIPT = '<script>alert("xss")</script>'
IMAGE = '<img src=x onerror=alert("xss")>'
HOSTILE_SCHEMA = {
    "type": "object",
    "title": SCRIPT,
    "properties": {
        "amount": {"type": "integer", "title": IMAGE, "description": SCRIPT},
        "region": {"enum": [SCRIPT, "eu"], "description": IMAGE},
        "notes": {"type": "array", "description": SCRIPT},
    },
    "required": ["amount"],
}


def assert_text_only(html):
    """No agent string became markup: each shows escaped, none raw."""
    for hostile in (SCRIPT, IMAGE):
        assert hostile not in html
    assert "&lt;script&gt;alert(&quot;xss&quot;)&lt;/script&gt;" in html


def test_a_script_in_an_answer_schema_description_is_shown_as_text(people):
    todo = asking(
        people["mine"],
        SCRIPT,
        question=f"Approve {IMAGE}?",
        answer_schema=HOSTILE_SCHEMA,
    )
    scope = store.Scope.for_endpoint(people["mine"])
    choice = asking(people["mine"], "Choose", choices=[SCRIPT, IMAGE])
    client = logged_in(people["alice"])

    inbox = client.get("/board/inbox/").content.decode()
    detail = client.get(f"/board/todos/{todo.id}/").content.decode()
    link = Client().get(link_of(client, todo)).content.decode()
    choices = client.get(f"/board/todos/{choice.id}/").content.decode()
    confirming = client.post(
        f"/board/todos/{choice.id}/answer/", {answer_field(choice): SCRIPT}
    ).content.decode()
    invalid = client.post(
        f"/board/todos/{todo.id}/answer/", {answer_field(todo, "region"): "nope"}
    ).content.decode()

    for page in (inbox, detail, link, choices, confirming, invalid):
        assert_text_only(page)
    assert 'class="helptext"' in detail and "&lt;img src=x" in detail
    assert store.get_todo(scope, todo.id).is_held


def test_every_board_page_and_the_answer_link_send_a_content_security_policy(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    client = logged_in(people["alice"])
    pages = [
        client.get("/board/"),
        client.get("/board/inbox/"),
        client.get(f"/board/todos/{todo.id}/"),
        client.get("/board/todos/00000000-0000-4000-8000-000000000000/"),
        Client().get("/board/login/"),
        Client().get(link_of(client, todo)),
        Client().get("/answer/not-a-token"),
    ]
    for response in pages:
        policy = response["Content-Security-Policy"]
        directives = dict(
            (part.split(" ", 1) + [""])[:2] for part in policy.split("; ")
        )
        assert directives["script-src"] == "'self'", policy
        assert directives["default-src"] == "'self'"
        assert directives["object-src"] == "'none'"
        assert directives["base-uri"] == "'none'"
        assert directives["frame-ancestors"] == "'none'"
        assert directives["form-action"] == "'self'"
        assert "unsafe" not in policy


def test_no_board_template_runs_script_inline():
    """Every script of the Board is a file (CONTRACT §16): no inline <script>,
    no on… handler, no style attribute, no hx-on, no script filter in a trigger."""
    templates = sorted((Path(__file__).parents[2] / "templates").rglob("*.html"))
    assert templates
    for template in templates:
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\ssrc=)", text), template
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert not re.search(r"\sstyle\s*=", text), template
        assert "hx-on" not in text and "js:" not in text, template
        assert not re.search(r'hx-trigger="[^"]*\[', text), template


# --- Choices are equals, and confirmed -----------------------------------------------


def test_a_choice_is_confirmed_before_it_is_sent(people):
    todo = asking(people["mine"], "Drop the staging database", choices=["keep", "drop"])
    client = logged_in(people["alice"])
    page = client.get("/board/inbox/").content.decode()
    buttons = re.findall(r'<button type="submit" class="([^"]+)" name="q', page)
    assert buttons == ["button secondary", "button secondary"]

    asked_to_confirm = client.post(
        f"/board/todos/{todo.id}/answer/",
        {answer_field(todo): "drop", "next": "/board/inbox/"},
        headers={"HX-Request": "true", "HX-Target": f"card-{todo.id}"},
    )

    html = asked_to_confirm.content.decode()
    assert asked_to_confirm.status_code == 200
    assert "Send “drop”" in html and 'href="/board/inbox/"' in html
    assert store.get_todo_any_endpoint(todo.id).is_held
    sent = client.post(f"/board/todos/{todo.id}/answer/", confirmed(todo, "drop"))
    assert sent.status_code == 302
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "drop"


def test_an_answer_link_confirms_a_choice_before_sending_it(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship", "hold"])
    path = link_of(logged_in(people["alice"]), todo)

    first = Client().post(path, {answer_field(todo): "ship"})

    assert first.status_code == 200
    assert "Send “ship”" in first.content.decode()
    assert store.get_todo_any_endpoint(todo.id).is_held
    assert Client().post(path, confirmed(todo, "ship")).status_code == 200
    assert store.get_todo_any_endpoint(todo.id).answer["value"] == "ship"


def test_the_answer_form_keeps_the_schema_order_and_shows_required_and_bounds(people):
    schema = {
        "type": "object",
        "properties": {
            "zone": {"type": "string", "minLength": 2, "maxLength": 12},
            "amount": {"type": "integer", "minimum": 1, "maximum": 500},
            "region": {"enum": ["eu", "us"], "description": "Where it ships"},
            "tags": {"type": "array", "maxItems": 3},
        },
        "required": ["amount"],
    }
    todo = asking(people["mine"], "Refund", answer_schema=schema)

    html = logged_in(people["alice"]).get(f"/board/todos/{todo.id}/").content.decode()

    names = re.findall(rf'name="{answer_field(todo, "")}(\w+)"', html)
    assert names == ["zone", "amount", "region", "tags"]
    assert re.search(r"Amount\s*\(required\)</label>", html)
    assert not re.search(r"Zone\s*\(required\)", html)
    assert "2 to 12 characters" in html
    assert "1 to 500" in html
    assert "Where it ships · one of: eu, us" in html
    assert "at most 3 items" in html
    assert store.get_todo_any_endpoint(todo.id).to_dict()["question"].keys() == {
        "text",
        "choices",
        "answer_schema",
        "return_to",
        "asked_by",
        "asked_at",
        "deadline",
        "expired",
    }


# --- A passed deadline, a revoked endpoint -------------------------------------------


def test_an_answer_link_past_its_deadline_is_refused_before_the_sweep(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"], deadline_seconds=600)
    path = link_of(logged_in(people["alice"]), todo)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET answer_deadline = now() - interval '1 second'"
            " WHERE id = %s",
            [todo.id],
        )

    page = Client().get(path)

    assert page.status_code == 410
    assert '<form class="q-form"' not in page.content.decode()
    detail = logged_in(people["alice"]).get(f"/board/todos/{todo.id}/").content.decode()
    assert "The deadline passed with no answer" in detail


def test_a_revoked_endpoints_answer_link_is_refused_as_unknown(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    path = link_of(logged_in(people["alice"]), todo)
    endpoints.revoke(people["mine"])

    page = Client().get(path)
    posted = Client().post(path, confirmed(todo, "ship"))

    assert page.status_code == 404 and posted.status_code == 404
    assert "not valid" in page.content.decode()
    assert store.get_todo_any_endpoint(todo.id).answer is None


def test_what_an_agent_writes_is_text_on_every_board_page(people):
    """Every field an agent fills (queue, title, key, payload, worker names,
    progress, note, checkpoint, error, result, cancel reason, question) holds
    markup; every Board page shows it as text."""
    scope = store.Scope.for_endpoint(people["mine"])
    queue = f"q{SCRIPT}"

    def made(title=SCRIPT, **fields):
        todo, _ = store.create_todo(
            scope, queue=queue, title=title, payload={"x": SCRIPT}, **fields
        )
        return todo

    worker = f"w{IMAGE}"
    running = made(idempotency_key=SCRIPT)
    store.claim_todo(scope, running.id, worker)
    store.heartbeat(
        scope,
        running.id,
        worker,
        progress={"message": SCRIPT, "fraction": 0.5},
        checkpoint={"at": SCRIPT},
    )
    store.cancel_todo(scope, running.id, reason=SCRIPT, worker=worker)
    handed = made()
    store.claim_todo(scope, handed.id, worker)
    store.release_todo(scope, handed.id, worker, assignee=worker, note=SCRIPT)
    dead = made(max_attempts=1)
    store.claim_todo(scope, dead.id, worker)
    store.fail_todo(scope, dead.id, worker, error=SCRIPT)
    done = made()
    store.claim_todo(scope, done.id, worker)
    store.complete_todo(scope, done.id, worker, result={"r": SCRIPT})
    asked = made()
    store.claim_todo(scope, asked.id, worker)
    store.ask(scope, asked.id, worker, question=SCRIPT, choices=[SCRIPT, IMAGE])
    client = logged_in(people["alice"])

    endpoint = people["mine"].id
    pages = [
        "/board/",
        "/board/inbox/",
        f"/board/todos/?queue={queue}",
        f"/board/todos/?q={SCRIPT}",
        "/board/dead-letters/",
        f"/board/queues/{endpoint}/{queue}/",
        "/board/endpoints/",
        *(f"/board/todos/{todo.id}/" for todo in (running, handed, dead, done, asked)),
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, path
        text = response.content.decode()
        for hostile in (SCRIPT, IMAGE):
            assert hostile not in text, path


def test_a_refused_form_is_a_board_page_that_needs_no_inline_style(people):
    todo = asking(people["mine"], "Ship it?", choices=["ship"])
    path = link_of(logged_in(people["alice"]), todo)

    refused = Client(enforce_csrf_checks=True).post(path, confirmed(todo, "ship"))

    assert refused.status_code == 403
    page = refused.content.decode()
    assert "This form was refused" in page and "<style" not in page
    assert "script-src 'self'" in refused["Content-Security-Policy"]
