"""The Board's todo pages and actions: full pages, htmx fragments, login, CSRF."""

import functools
import html
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support import LOCK_TODO, deadlocked
from todos import store
from todos.ui import views

HTMX = {"HTTP_HX_REQUEST": "true"}


def htmx(target):
    return {**HTMX, "HTTP_HX_TARGET": target}


def dead_letter(scope, title="broken", queue="q", key=None):
    todo, _ = store.create_todo(
        scope, queue=queue, title=title, max_attempts=1, idempotency_key=key
    )
    store.claim_todo(scope, todo.id, "worker-1")
    return store.fail_todo(scope, todo.id, "worker-1", error="TimeoutError: slow API")


def claimed(scope, title="busy"):
    todo, _ = store.create_todo(scope, queue="q", title=title)
    return store.claim_todo(scope, todo.id, "worker-1")


# --- Login ----------------------------------------------------------------------

BOARD_PAGES = [
    "/board/",
    "/board/todos/",
    "/board/todos/new/",
    "/board/endpoints/",
    "/board/endpoints/new/",
    "/board/todos/retry-matching/",
]


@pytest.mark.parametrize("url", BOARD_PAGES)
def test_every_page_requires_a_login(client, db, url):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith("/board/login/?next=")


def test_an_htmx_request_without_a_login_redirects_the_whole_page(client, db):
    response = client.get(
        "/board/todos/",
        headers={
            "HX-Request": "true",
            "HX-Target": "rows",
            "HX-Current-URL": "http://testserver/board/todos/?state=done",
        },
    )

    assert response.status_code == 200
    assert response["HX-Redirect"] == (
        "/board/login/?next=%2Fboard%2Ftodos%2F%3Fstate%3Ddone"
    )


def test_actions_require_a_login(client, scope):
    todo = dead_letter(scope)

    response = client.post(f"/board/todos/{todo.id}/retry/")

    assert response.status_code == 302
    assert store.get_todo(scope, todo.id).is_dead_letter


def test_login_page_logs_a_staff_user_in_and_out(client, operator):
    assert client.get("/board/login/").status_code == 200

    response = client.post(
        "/board/login/",
        {"username": "ops", "password": "a-long-password", "next": "/board/todos/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/board/todos/"
    assert client.get("/board/").status_code == 200

    assert client.post("/board/logout/").status_code == 302
    assert client.get("/board/").status_code == 302


def test_the_login_page_welcomes_owners_and_viewers_not_only_staff(client, db):
    page = client.get("/board/login/").content.decode()

    assert "staff accounts) only" not in page
    assert "endpoint owners" in page and "viewers" in page


def test_login_refuses_a_user_who_is_not_staff_and_owns_no_endpoint(client, db):
    get_user_model().objects.create_user("visitor", password="a-long-password")

    response = client.post(
        "/board/login/", {"username": "visitor", "password": "a-long-password"}
    )

    assert response.status_code == 200
    assert b"not an operator" in response.content
    assert "_auth_user_id" not in client.session


def test_a_logged_in_user_who_is_not_staff_and_owns_nothing_is_forbidden(client, db):
    user = get_user_model().objects.create_user("visitor")
    client.force_login(user)

    response = client.get("/board/")

    assert response.status_code == 403
    assert b"Not a Board account" in response.content


def test_posts_need_the_csrf_token_that_htmx_sends_in_a_header(operator, scope):
    todo = dead_letter(scope)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    page = client.get("/board/todos/")
    token = page.cookies["csrftoken"].value
    assert '"X-CSRFToken": "' in page.content.decode()

    refused = client.post(f"/board/todos/{todo.id}/retry/", **htmx(f"todo-{todo.id}"))
    assert refused.status_code == 403
    assert store.get_todo(scope, todo.id).is_dead_letter

    accepted = client.post(
        f"/board/todos/{todo.id}/retry/",
        HTTP_X_CSRFTOKEN=token,
        **htmx(f"todo-{todo.id}"),
    )
    assert accepted.status_code == 200
    assert store.get_todo(scope, todo.id).state == "pending"


# --- Overview -------------------------------------------------------------------


def test_overview_page_shows_counts_per_endpoint_and_queue(board, scope, endpoint):
    dead_letter(scope, queue="reviews")
    store.create_todo(scope, queue="reviews")

    response = board.get("/board/")

    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html
    assert endpoint.name in html and "reviews" in html
    assert "Dead letter" in html and "Oldest pending" in html
    assert "stop at 10 000" in html


def test_overview_rows_link_each_count_to_its_list_and_escape_the_queue(
    board, scope, endpoint
):
    """The counts rows are made in Python (todos.ui.views.counts_row) for
    speed: they must still escape what an agent named and link each count."""
    queue = "<b>q&a</b>"
    dead_letter(scope, queue=queue)
    store.create_todo(scope, queue=queue)
    claimed(scope)

    html = board.get("/board/").content.decode()

    assert "<b>q&a</b>" not in html
    row = html.split("&lt;b&gt;q&amp;a&lt;/b&gt;</a></th>", 1)[1].split("</tr>")[0]
    link = f"/board/todos/?endpoint={endpoint.id}&amp;queue=%3Cb%3Eq%26a%3C%2Fb%3E"
    assert f'data-label="Pending"><a href="{link}&amp;state=pending">1</a>' in row
    assert f'<a class="bad-text" href="{link}&amp;state=dead_letter">1</a>' in row
    assert 'data-label="Claimed"><span class="zero">0</span>' in row
    assert re.search(r'data-label="Oldest pending">\d+s</td>', row)
    assert html.count(f'<th scope="row"><a href="/board/queues/{endpoint.id}/') == 2


def test_overview_lists_idle_endpoints_escaped_with_their_owners(
    board, operator, make_endpoint
):
    """The endpoints without todos are made in Python too (views.idle_items):
    escaped, each linked to its list, the owner named when it is not you."""
    theirs = make_endpoint("<i>bot</i>", owner="<b>bob</b>")
    mine = make_endpoint("mine", owner=operator)

    html = board.get("/board/").content.decode()

    idle = html.split('<ul class="idle-endpoints">', 1)[1].split("</ul>")[0]
    assert "<i>" not in idle and "<b>" not in idle
    assert (
        f'<li><a href="/board/todos/?endpoint={theirs.id}">&lt;i&gt;bot&lt;/i&gt;</a>'
        ' <span class="muted">(&lt;b&gt;bob&lt;/b&gt;)</span></li>'
    ) in idle
    assert f'<li><a href="/board/todos/?endpoint={mine.id}">mine</a></li>' in idle
    assert "2 endpoints" in html


def test_overview_shows_a_held_todo_as_held_not_as_the_oldest_pending(
    board, scope, time_travel
):
    asked, _ = store.create_todo(scope, queue="q", title="asks")
    store.claim_todo(scope, asked.id, "worker-1")
    store.ask(scope, asked.id, "worker-1", question="Ship it?")
    time_travel(asked.id, created_at=-3 * 86400)

    html = board.get("/board/").content.decode()

    cards = html.split('<div class="cards">', 1)[1].split("</div>", 1)[0]
    assert re.search(r'Pending</span><span class="card-value">0</span></a>', cards)
    assert re.search(r'Held</span><span class="card-value">1</span>', cards)
    assert "oldest" not in cards
    assert 'data-label="Held"><span>1</span>' in html
    assert 'data-label="Oldest pending">\u2014</td>' in html


def test_overview_rows_mark_capped_terminal_counts(scope):
    counts = store.QueueCounts(endpoint_id="e", queue="q", dead_letter=3, done=0)

    row = views.counts_row(counts, "/q/", "/board/todos/", {"dead_letter": True})

    assert '<a class="bad-text" href="/board/todos/?endpoint=e&amp;queue=q' in row
    assert 'state=dead_letter">3+</a>' in row
    assert '<span class="zero">0</span>' in row  # done, not capped
    assert 'data-label="Oldest pending">\u2014</td>' in row


def test_overview_fragment_is_only_the_counts(board, scope):
    store.create_todo(scope, queue="reviews")

    response = board.get("/board/", **htmx("counts"))

    html = response.content.decode()
    assert html.lstrip().startswith('<section id="counts"')
    assert "<html" not in html


def test_endpoints_without_todos_share_one_short_list_on_the_overview(
    board, scope, endpoint, make_endpoint
):
    """Defect: every endpoint got a section and a pair of charts, work or not;
    an operator seeing 416 endpoints waited 1.1 s for the overview (charts
    drawn for all of them), with the endpoints that had work buried."""
    store.create_todo(scope, queue="reviews")
    idle = [make_endpoint(f"idle-{number}") for number in range(3)]

    html = board.get("/board/").content.decode()

    assert f'id="ep-{endpoint.id}"' in html
    listed = html.split('id="idle-endpoints"', 1)[1]
    assert "3 endpoints" in listed
    for other in idle:
        assert f'id="ep-{other.id}"' not in html
        assert f"?endpoint={other.id}" in listed and other.name in listed
    # One pair of charts for the endpoint with work, one for the total.
    assert html.count('class="chart-pair chart-pair-small"') == 1
    assert b"No endpoints yet" not in html.encode()


def test_an_operator_with_only_idle_endpoints_sees_them_listed(board, endpoint):
    html = board.get("/board/").content.decode()

    assert "No todos yet" in html and endpoint.name in html
    assert "No endpoints yet" not in html


def test_overview_without_endpoints_shows_an_empty_state(board):
    response = board.get("/board/")

    assert b"No endpoints yet" in response.content


def test_database_outage_renders_a_503_page(board, monkeypatch):
    def down(**_):
        raise store.Unavailable("board_overview", OSError("connection refused"))

    monkeypatch.setattr(store, "board_overview", down)

    page = board.get("/board/")
    fragment = board.get("/board/", **htmx("counts"))

    assert page.status_code == 503
    assert b"database is unavailable" in page.content
    assert fragment.status_code == 503
    assert b"hx-swap-oob" in fragment.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fragment", [False, True])
def test_an_action_stopped_by_a_deadlock_says_the_database_is_busy(
    board, scope, fragment
):
    """A deadlock is a busy database, not a down one: the 503 page (or, for
    htmx, the notice) says to try again, and nothing was changed."""
    todo = dead_letter(scope)
    headers = htmx(f"todo-{todo.id}") if fragment else {}

    outcome = deadlocked(
        lambda: board.post(f"/board/todos/{todo.id}/retry/", **headers),
        LOCK_TODO,
        [todo.id],
    )

    response = outcome["returned"]
    text = response.content.decode()
    assert response.status_code == 503
    assert "database is busy" in text and "unavailable" not in text
    assert ("hx-swap-oob" in text) == fragment
    assert store.get_todo(scope, todo.id).state == todo.state == "failed"


# --- Todo list ------------------------------------------------------------------


def test_list_filters_to_dead_letters(board, scope):
    dead = dead_letter(scope, title="the dead one")
    store.create_todo(scope, queue="q", title="the live one")

    response = board.get("/board/todos/?state=dead_letter")

    html = response.content.decode()
    assert response.status_code == 200
    assert f'id="todo-{dead.id}"' in html
    assert "the live one" not in html
    assert "TimeoutError: slow API" in html
    assert 'option value="dead_letter" selected' in html


def test_list_filters_by_endpoint_queue_worker_and_text(
    board, scope, other_scope, other_endpoint
):
    busy = claimed(scope, title="Deploy api v2")
    store.create_todo(scope, queue="other", title="Deploy worker")
    theirs, _ = store.create_todo(other_scope, queue="q", title="Deploy api v3")

    by_owner = board.get("/board/todos/?owner=worker-1&q=deploy").content.decode()
    by_endpoint = board.get(
        f"/board/todos/?endpoint={other_endpoint.id}&queue=q"
    ).content.decode()

    assert f"todo-{busy.id}" in by_owner and "Deploy worker" not in by_owner
    assert f"todo-{theirs.id}" in by_endpoint and "Deploy api v2" not in by_endpoint


@pytest.mark.parametrize("term", ["ab", "a-b", "#1", "é"])
def test_a_search_too_short_for_the_index_asks_for_three_letters_or_digits(
    board, scope, term
):
    """Such a term would read every todo (seconds over a million); a term with
    three letters or digits in a row is found from the trigram index."""
    store.create_todo(scope, queue="q", title=f"Fix {term} now")

    refused = board.get("/board/todos/", {"q": term})
    found = board.get("/board/todos/", {"q": f"Fix {term}"})

    assert refused.status_code == 400
    assert "at least three letters or digits in a row" in refused.content.decode()
    assert found.status_code == 200
    assert f"Fix {term} now" in found.content.decode()


def test_list_results_fragment_carries_the_filters_into_its_polling(board, scope):
    dead_letter(scope)

    response = board.get("/board/todos/?state=dead_letter&queue=q", **htmx("results"))

    html = response.content.decode()
    assert html.lstrip().startswith('<section id="results"')
    assert 'hx-get="/board/todos/?state=dead_letter&amp;queue=q"' in html
    assert "<html" not in html


def test_list_rows_fragment_is_only_the_table_body(board, scope):
    todo = dead_letter(scope)

    response = board.get("/board/todos/", **htmx("rows"))

    html = response.content.decode()
    assert html.lstrip().startswith('<tbody id="rows"')
    assert f'id="pick-{todo.id}" hx-preserve' in html
    assert "every 5s" in html


def test_list_pages_with_a_keyset_cursor_that_keeps_the_filters(board, scope):
    for i in range(55):
        store.create_todo(scope, queue="q", title=f"todo {i:02d}")

    first = board.get("/board/todos/?queue=q")
    next_link = first.context["next_query"]
    second = board.get(f"/board/todos/?{next_link}")

    assert "queue=q" in next_link and "after=" in next_link
    assert len(first.context["rows"]) == 50
    titles = [row["todo"].title for row in second.context["rows"]]
    assert titles == [f"todo {i:02d}" for i in range(4, -1, -1)]


def test_list_rejects_a_bad_filter_with_a_400_and_says_why(board, db):
    bad_state = board.get("/board/todos/?state=sleeping")
    bad_cursor = board.get("/board/todos/?after=not-ours")

    assert bad_state.status_code == 400
    assert b"Select a valid choice" in bad_state.content
    assert bad_cursor.status_code == 400
    assert b"page link is not valid" in bad_cursor.content


def test_list_shows_an_empty_state(board, db):
    assert b"No todos yet" in board.get("/board/todos/").content
    assert b"No todo matches" in board.get("/board/todos/?queue=nope").content


# --- Detail ---------------------------------------------------------------------


def test_detail_shows_fields_payload_error_and_history(board, scope):
    todo, _ = store.create_todo(
        scope,
        queue="q",
        title="Review PR 7",
        payload={"pr": 7, "repo": "acme/x"},
        idempotency_key="gh-123",
        max_attempts=1,
    )
    store.claim_todo(scope, todo.id, "claude-1")
    store.fail_todo(scope, todo.id, "claude-1", error="diff too large")

    response = board.get(f"/board/todos/{todo.id}/")

    html = response.content.decode()
    assert response.status_code == 200
    assert "gh-123" in html and "dead letter" in html
    assert "&quot;pr&quot;: 7" in html  # pretty-printed JSON
    assert "diff too large" in html
    assert "pending → claimed" in html and "claimed → failed" in html
    assert "claude-1" in html
    assert "Retry now" in html


def test_detail_shows_the_todos_usage_and_each_reports_attempt_figure(board, scope):
    todo, _ = store.create_todo(scope, queue="q", title="Summarize")
    store.claim_todo(scope, todo.id, "claude-1")
    store.heartbeat(scope, todo.id, "claude-1", usage={"input_tokens": 800})
    store.complete_todo(
        scope, todo.id, "claude-1", usage={"cost_usd": 0.42, "model": "sonnet"}
    )

    html = board.get(f"/board/todos/{todo.id}/").content.decode()

    assert "$0.42 · 800 input / 0 output tokens" in html
    assert "Usage reported: $0 · 800 input" in html
    assert "Usage reported: $0.42 · 800 input / 0 output tokens · sonnet" in html


def test_detail_fragment_is_only_the_detail(board, scope):
    todo = dead_letter(scope)

    html = board.get(f"/board/todos/{todo.id}/", **htmx("detail")).content.decode()

    assert html.lstrip().startswith('<article id="detail"')


@pytest.mark.parametrize("todo_id", ["00000000-0000-0000-0000-000000000000", "nope"])
def test_detail_of_an_unknown_todo_is_a_404_page(board, todo_id):
    response = board.get(f"/board/todos/{todo_id}/")

    assert response.status_code == 404
    assert b"No such todo" in response.content


# --- Actions --------------------------------------------------------------------


def test_retry_from_the_list_re_renders_the_row_and_refreshes_counts(board, scope):
    """SPEC: Terminal states are final (an explicit operator retry re-queues)."""
    todo = dead_letter(scope)

    response = board.post(f"/board/todos/{todo.id}/retry/", **htmx(f"todo-{todo.id}"))

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<tr id="todo-{todo.id}" class="row-pending"')
    assert 'hx-swap-oob="true"' in html and "pending again" in html
    assert "counts-changed" in json.loads(response["HX-Trigger"])
    assert store.get_todo(scope, todo.id).state == "pending"
    assert store.todo_events_any_endpoint(todo.id)[-1].actor == "operator:ops"


def test_retry_from_the_detail_re_renders_the_detail(board, scope):
    todo = dead_letter(scope)

    html = board.post(f"/board/todos/{todo.id}/retry/", **htmx("detail")).content
    assert html.decode().lstrip().startswith('<article id="detail"')


def test_a_conflicting_retry_is_a_notice_not_an_error_page(board, scope):
    todo = dead_letter(scope)
    store.retry_todo(scope, todo.id)  # someone else got there first

    response = board.post(f"/board/todos/{todo.id}/retry/", **htmx(f"todo-{todo.id}"))

    html = response.content.decode()
    assert response.status_code == 200
    assert "notice-warning" in html and "now pending" in html
    assert f'<tr id="todo-{todo.id}" class="row-pending"' in html


def test_a_conflict_without_javascript_redirects_back_with_a_message(board, scope):
    todo = dead_letter(scope)
    store.retry_todo(scope, todo.id)

    response = board.post(
        f"/board/todos/{todo.id}/retry/",
        {"next": "/board/todos/?state=dead_letter"},
        follow=True,
    )

    assert response.redirect_chain == [("/board/todos/?state=dead_letter", 302)]
    assert b"now pending" in response.content


def test_retry_without_javascript_redirects_to_a_safe_next_only(board, scope):
    todo = dead_letter(scope)

    response = board.post(
        f"/board/todos/{todo.id}/retry/", {"next": "https://evil.example/"}
    )

    assert response["Location"] == "/board/todos/"


def test_retry_of_a_vanished_todo_only_shows_a_notice(board, db):
    response = board.post(
        "/board/todos/00000000-0000-0000-0000-000000000000/retry/", **htmx("todo-x")
    )

    assert response["HX-Reswap"] == "none"
    assert b"no longer exists" in response.content


def test_release_hands_a_stuck_claim_back(board, scope):
    todo = claimed(scope)

    response = board.post(f"/board/todos/{todo.id}/release/", **htmx(f"todo-{todo.id}"))

    assert b'class="row-pending"' in response.content
    assert store.get_todo(scope, todo.id).owner is None


def test_release_of_an_unclaimed_todo_is_a_notice(board, scope):
    todo, _ = store.create_todo(scope, queue="q")

    response = board.post(f"/board/todos/{todo.id}/release/", **htmx(f"todo-{todo.id}"))

    assert response.status_code == 200
    assert b"Could not release" in response.content


def test_actions_refuse_get(board, scope):
    todo = dead_letter(scope)

    assert board.get(f"/board/todos/{todo.id}/retry/").status_code == 405


def test_retry_selected_retries_the_ticked_todos(board, scope):
    first, second = dead_letter(scope, "one"), dead_letter(scope, "two")
    pending, _ = store.create_todo(scope, queue="q")

    response = board.post(
        "/board/todos/retry/", {"ids": [first.id, second.id, pending.id]}, **HTMX
    )

    html = response.content.decode()
    assert "Retried 2 of 3" in html and "1 could not be retried" in html
    triggers = json.loads(response["HX-Trigger"])
    assert set(triggers) == {"rows-changed", "counts-changed", "selection-cleared"}
    assert store.get_todo(scope, second.id).state == "pending"


def test_retry_selected_with_nothing_ticked_says_so(board, db):
    response = board.post("/board/todos/retry/", {"next": "/board/todos/"}, follow=True)

    assert b"Tick the todos to retry first" in response.content


def test_retry_matching_previews_the_count_then_retries_on_confirmation(board, scope):
    for i in range(3):
        dead_letter(scope, f"dead {i}", queue="reviews")
    dead_letter(scope, "elsewhere", queue="deploys")

    preview = board.get(
        "/board/todos/retry-matching/?queue=reviews&state=dead_letter", **htmx("bulk")
    )
    assert store.count_retryable_any_endpoint(state="dead_letter") == 4  # untouched

    done = board.post(
        "/board/todos/retry-matching/",
        {"queue": "reviews", "state": "dead_letter"},
        **htmx("bulk"),
    )

    preview_html, done_html = preview.content.decode(), done.content.decode()
    assert preview_html.lstrip().startswith('<section id="bulk"')
    assert "Retry 3 failed todos?" in preview_html
    assert 'name="queue" value="reviews"' in preview_html
    assert "Retried 3 todos" in done_html
    assert store.count_retryable_any_endpoint(state="dead_letter") == 1


def test_retry_matching_page_works_without_javascript(board, scope):
    dead_letter(scope)

    page = board.get("/board/todos/retry-matching/?state=dead_letter")
    done = board.post(
        "/board/todos/retry-matching/", {"state": "dead_letter"}, follow=True
    )

    assert b"<html" in page.content and b"Retry 1 failed todo?" in page.content
    assert done.redirect_chain[-1][0] == "/board/todos/?state=dead_letter"
    assert b"Retried 1 matching todos" in done.content


def test_retry_matching_over_many_matches_says_more_than_its_preview_looked_at(
    board, scope, monkeypatch
):
    monkeypatch.setattr(store, "PREVIEW_LIMIT", 2)
    monkeypatch.setattr(
        store,
        "preview_retry_any_endpoint",
        functools.partial(store.preview_retry_any_endpoint, limit=2),
    )
    for i in range(3):
        dead_letter(scope, f"broken {i}")

    response = board.get(
        "/board/todos/retry-matching/?state=dead_letter", **htmx("bulk")
    )

    panel = response.content.decode()
    assert "Retry more than 2 failed todos?" in panel
    assert ">Retry 2+ todos</button>" in panel


def test_retry_matching_with_no_match_says_nothing_to_retry(board, db):
    response = board.get("/board/todos/retry-matching/?queue=empty", **htmx("bulk"))

    assert b"Nothing to retry" in response.content


def test_the_retry_group_confirmation_names_the_group_it_retries(
    board, scope, endpoint
):
    dead_letter(scope, queue="reviews")
    groups = board.get("/board/dead-letters/").content.decode()
    retry_url = html.unescape(
        re.search(r'hx-get="([^"]*retry-matching[^"]*)"', groups)[1]
    )

    response = board.get(retry_url, **htmx("bulk"))

    panel = response.content.decode()
    assert "Retry 1 failed todo of this group?" in panel
    named = panel.split('<p class="group-filter">', 1)[1].split("</p>", 1)[0]
    assert "TimeoutError" in named
    assert endpoint.name in named and "reviews" in named


def test_retry_matching_says_which_dead_letters_a_live_duplicate_holds_back(
    board, scope
):
    dead_letter(scope, "old delivery", key="delivery-7")
    store.create_todo(scope, queue="q", idempotency_key="delivery-7")
    dead_letter(scope, "movable", key="delivery-8")

    preview = board.get(
        "/board/todos/retry-matching/?state=dead_letter", **htmx("bulk")
    )
    done = board.post(
        "/board/todos/retry-matching/", {"state": "dead_letter"}, **htmx("bulk")
    )

    preview_html, done_html = preview.content.decode(), done.content.decode()
    assert "Retry 1 failed todo?" in preview_html
    assert "1 more dead letter will stay failed" in preview_html
    assert "Retried 1 todo" in done_html
    assert "1 dead letter stayed failed" in done_html
    assert "More failed todos still match" not in done_html


def test_retry_matching_rejects_a_bad_filter(board, db):
    response = board.post("/board/todos/retry-matching/", {"state": "bogus"})

    assert response.status_code == 400
    assert b"Select a valid choice" in response.content


# --- Create by hand -------------------------------------------------------------


def test_create_todo_by_hand_then_see_it(board, endpoint):
    assert board.get("/board/todos/new/").status_code == 200

    response = board.post(
        "/board/todos/new/",
        {
            "endpoint": endpoint.id,
            "queue": "reviews",
            "title": "Check the docs",
            "payload": '{"pr": 12}',
            "idempotency_key": "manual-1",
            "max_attempts": 3,
        },
        follow=True,
    )

    todo = response.context["todo"]
    assert (todo.queue, todo.payload, todo.max_attempts) == ("reviews", {"pr": 12}, 3)
    assert b"Created the todo" in response.content
    assert store.todo_events_any_endpoint(todo.id)[0].actor == "operator:ops"


def test_create_todo_with_a_live_duplicate_key_shows_the_existing_one(
    board, scope, endpoint
):
    existing, _ = store.create_todo(scope, queue="q", idempotency_key="k")

    response = board.post(
        "/board/todos/new/",
        {
            "endpoint": endpoint.id,
            "queue": "q",
            "idempotency_key": "k",
            "max_attempts": 5,
        },
        follow=True,
    )

    assert response.context["todo"].id == existing.id
    assert b"already holds that idempotency key" in response.content


def test_create_todo_explains_bad_fields(board, make_endpoint):
    narrow = make_endpoint("narrow", queues=("reviews",))

    response = board.post(
        "/board/todos/new/",
        {
            "endpoint": narrow.id,
            "queue": "deploys",
            "payload": "{oops",
            "max_attempts": 0,
        },
    )

    html = response.content.decode()
    assert response.status_code == 400
    assert "Not valid JSON" in html
    assert "is not granted" in html
    assert "greater than or equal to 1" in html


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ('{"x": NaN}', "Not valid JSON: NaN is not JSON"),
        ('{"x": 1e999}', "numbers must be finite"),
        ('{"x": "\\u0000"}', "NUL characters"),
        ("[" * 200 + "]" * 200, "must not nest deeper than 100 levels"),
    ],
    ids=["nan", "overflow", "nul", "deep"],
)
def test_the_new_todo_form_refuses_a_payload_postgresql_cannot_store(
    board, endpoint, payload, error
):
    """Defect: the New-todo form answered 500 for NaN, 1e999 and \\u0000 payloads."""
    response = board.post(
        "/board/todos/new/",
        {"endpoint": endpoint.id, "queue": "q", "payload": payload, "max_attempts": 3},
    )

    assert response.status_code == 400
    assert error in response.content.decode()
    assert store.list_todos_any_endpoint().todos == []


def test_the_new_todo_form_defaults_to_switchboard_max_attempts(
    board, endpoint, settings
):
    """Defect: SWITCHBOARD_MAX_ATTEMPTS was ignored for Board-created todos."""
    settings.SWITCHBOARD_MAX_ATTEMPTS = 2
    form = board.get("/board/todos/new/").content.decode()
    assert 'name="max_attempts" value="2"' in form

    response = board.post(
        "/board/todos/new/",
        {"endpoint": endpoint.id, "queue": "q", "max_attempts": ""},
        follow=True,
    )

    assert response.context["todo"].max_attempts == 2


def test_a_todo_created_on_the_board_with_a_max_cost_carries_it(board, endpoint):
    response = board.post(
        "/board/todos/new/",
        {"endpoint": endpoint.id, "queue": "q", "max_attempts": 3, "max_cost": "0.25"},
        follow=True,
    )

    todo = response.context["todo"]
    assert todo.max_cost == 0.25
    assert store.get_todo_any_endpoint(todo.id).max_cost == 0.25
    assert "$0.25" in response.content.decode()


def test_a_todo_created_on_the_board_without_a_max_cost_has_none(board, endpoint):
    response = board.post(
        "/board/todos/new/",
        {"endpoint": endpoint.id, "queue": "q", "max_attempts": 3, "max_cost": ""},
        follow=True,
    )

    assert response.context["todo"].max_cost is None


@pytest.mark.parametrize(
    ("max_cost", "error"),
    [
        ("-1", "greater than or equal to 0"),
        ("lots", "Enter a number"),
        ("NaN", "Enter a number"),
        ("Infinity", "Enter a number"),
        ("1e999", "less than or equal to 1000000000"),
        ("0.0000001", "no more than 6 decimal places"),
    ],
    ids=["negative", "word", "nan", "infinity", "too-big", "too-fine"],
)
def test_the_new_todo_form_refuses_a_bad_max_cost(board, endpoint, max_cost, error):
    response = board.post(
        "/board/todos/new/",
        {"endpoint": endpoint.id, "queue": "q", "max_cost": max_cost},
    )

    assert response.status_code == 400
    assert error in response.content.decode()
    assert store.list_todos_any_endpoint().todos == []


def test_retry_matching_names_a_held_back_dead_letter_once_and_never_newer(
    board, scope
):
    """Defect: bulk retry reported a held-back dead letter twice and called the
    holder "newer" (it may be the older of the two)."""
    dead_letter(scope, "first delivery", key="delivery-9")
    dead_letter(scope, "second delivery", key="delivery-9")

    done = board.post(
        "/board/todos/retry-matching/", {"state": "dead_letter"}, **htmx("bulk")
    )

    html = done.content.decode()
    assert "Retried 1 todo" in html
    held_back = html.count("holds their idempotency key") + html.count(
        "holds the same idempotency key"
    )
    assert held_back == 1
    assert "newer" not in html


@pytest.mark.parametrize("url", [*BOARD_PAGES, "/board/webhooks/"])
def test_every_board_page_varies_on_hx_request(board, url):
    """Defect: Vary: HX-Request was missing on URLs that answer a page or a
    fragment, so a cache could serve a fragment as the page."""
    for response in (board.get(url), board.get(url, **HTMX)):
        vary = {name.strip().lower() for name in response["Vary"].split(",")}
        assert "hx-request" in vary, (url, response["Vary"])
