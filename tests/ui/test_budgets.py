"""The Board's budgets page (CONTRACT §18): the owner's budgets with their
window, limit, spent, left, soft threshold and state; create, edit and delete
(login, CSRF, the owner's scope: a foreign budget is a 404); the spend charts
from the usage ledger; and a todo's usage per attempt."""

import re

import pytest
from django.test import Client

from tests.ui.test_owners import endpoint_of, user
from todos import store
from todos.store import spend

HOSTILE = '<img src=x onerror="alert(1)">'


@pytest.fixture
def world(db):
    """alice's endpoint has a daily budget of $50 on queue reviews (spent
    $41: past its soft threshold) and bob's a budget of his own."""
    alice, bob = user("alice"), user("bob")
    mine, theirs = endpoint_of(alice, "alice-agent"), endpoint_of(bob, "bob-agent")
    scope = store.Scope.for_endpoint(mine)
    budget = store.create_budget(
        scope, scope="queue", queue="reviews", window="day", limit_usd=50
    )
    store.report_usage(
        scope, queue="reviews", usage={"cost_usd": 41, "input_tokens": 1200}
    )
    store.report_usage(scope, queue="triage", usage={"cost_usd": 2.5})
    foreign = store.create_budget(
        store.Scope.for_endpoint(theirs),
        scope="endpoint",
        window="month",
        limit_tokens=1000,
    )
    return {
        "alice": alice,
        "bob": bob,
        "mine": mine,
        "theirs": theirs,
        "scope": scope,
        "budget": budget,
        "foreign": foreign,
    }


def logged_in(account, **options):
    client = Client(**options)
    client.force_login(account)
    return client


def form(endpoint, **fields):
    data = {
        "endpoint": str(endpoint.id),
        "scope": "queue",
        "queue": "reviews",
        "group": "",
        "window": "day",
        "time_zone": "UTC",
        "limit_usd": "",
        "limit_tokens": "",
        "soft_percent": "80",
        "action": "pause",
    }
    return {**data, **fields}


def test_the_budgets_page_shows_window_limit_spent_left_soft_and_state(world):
    page = logged_in(world["alice"]).get("/board/budgets/")
    html = page.content.decode()

    assert page.status_code == 200
    row = html[html.index(f'id="budget-{world["budget"].id}"') :]
    row = row[: row.index("</tr>")]
    assert 'queue <strong class="queue-name">reviews</strong>' in row
    assert '<td data-label="Window"><span>Daily' in row
    assert "$50.00" in row and "$41.00" in row and "$9.00" in row
    assert '<td data-label="Soft at"><span>80%' in row
    assert 'class="badge badge-budget-soft">soft<' in row
    assert 'value="82"' in row  # the meter: 41 of 50


def test_the_owner_sees_only_the_budgets_of_their_endpoints(world):
    html = logged_in(world["alice"]).get("/board/budgets/").content.decode()

    assert f"budget-{world['budget'].id}" in html
    assert f"budget-{world['foreign'].id}" not in html
    assert "bob-agent" not in html


def test_a_foreign_or_missing_budget_is_not_found(world):
    client = logged_in(world["alice"])
    foreign = world["foreign"].id

    assert client.get(f"/board/budgets/{foreign}/").status_code == 404
    assert (
        client.post(f"/board/budgets/{foreign}/", form(world["mine"])).status_code
        == 404
    )
    assert client.post(f"/board/budgets/{foreign}/delete/").status_code == 404
    missing = "00000000-0000-4000-8000-000000000000"
    assert client.get(f"/board/budgets/{missing}/").status_code == 404
    assert client.get("/board/budgets/not-a-uuid/").status_code == 404
    assert store.get_budget(store.Scope.for_endpoint(world["theirs"]), foreign)


def test_the_budgets_page_needs_a_login(world):
    response = Client().get("/board/budgets/")

    assert response.status_code == 302
    assert response["Location"].startswith("/board/login/")


def test_creating_a_budget_needs_the_csrf_token(world):
    client = logged_in(world["alice"], enforce_csrf_checks=True)

    response = client.post("/board/budgets/", form(world["mine"], limit_usd="10"))

    assert response.status_code == 403
    assert len(store.list_budgets(world["scope"])) == 1


def test_an_owner_creates_a_group_budget_from_the_board(world):
    client = logged_in(world["alice"])

    response = client.post(
        "/board/budgets/",
        form(
            world["mine"],
            scope="group",
            group="acme/api",
            window="hour",
            time_zone="Europe/Paris",
            limit_tokens="5000",
            soft_percent="50",
            action="reject_new",
        ),
        follow=True,
    )

    assert response.status_code == 200
    assert "Created the hourly budget of group acme/api in reviews." in (
        response.content.decode()
    )
    made = [b for b in store.list_budgets(world["scope"]) if b.scope == "group"]
    assert [
        (b.group, b.window, b.time_zone, b.limit_tokens, b.action) for b in made
    ] == [("acme/api", "hour", "Europe/Paris", 5000, "reject_new")]


def test_a_budget_without_a_limit_or_with_a_bad_zone_is_refused_in_the_form(world):
    client = logged_in(world["alice"])

    no_limit = client.post("/board/budgets/", form(world["mine"]))
    bad_zone = client.post(
        "/board/budgets/", form(world["mine"], limit_usd="5", time_zone="Mars/Olympus")
    )

    assert no_limit.status_code == 400
    assert "give limit_usd, limit_tokens or both" in no_limit.content.decode()
    assert bad_zone.status_code == 400
    assert "unknown IANA time zone" in bad_zone.content.decode()
    assert len(store.list_budgets(world["scope"])) == 1


def test_an_owner_cannot_create_a_budget_on_a_foreign_endpoint(world):
    response = logged_in(world["alice"]).post(
        "/board/budgets/", form(world["theirs"], limit_usd="5")
    )

    assert response.status_code == 404
    assert len(store.list_budgets(store.Scope.for_endpoint(world["theirs"]))) == 1


def test_an_owner_edits_and_deletes_a_budget(world):
    client = logged_in(world["alice"])
    url = f"/board/budgets/{world['budget'].id}/"
    page = client.get(url).content.decode()
    assert 'name="limit_usd" value="50"' in page

    saved = client.post(url, form(world["mine"], limit_usd="100", soft_percent="90"))
    budget = store.get_budget(world["scope"], world["budget"].id)
    assert saved.status_code == 302
    assert (budget.limit_usd, budget.soft_percent) == (100, 90)

    deleted = client.post(f"{url}delete/")
    assert deleted.status_code == 302
    assert store.list_budgets(world["scope"]) == []


def test_a_read_only_viewer_sees_budgets_but_cannot_change_them(world):
    viewer = user("vera", viewer=True)
    world["mine"].owner = viewer
    world["mine"].save()
    client = logged_in(viewer)

    page = client.get("/board/budgets/").content.decode()

    assert "New budget" not in page and ">Edit<" not in page
    assert (
        client.post("/board/budgets/", form(world["mine"], limit_usd="1")).status_code
        == 403
    )


def test_an_agent_written_queue_name_renders_as_text(world):
    store.create_budget(
        world["scope"], scope="queue", queue=HOSTILE, window="day", limit_usd=1
    )

    html = logged_in(world["alice"]).get("/board/budgets/").content.decode()

    assert HOSTILE not in html
    assert "&lt;img src=x" in html


def test_the_spend_chart_draws_a_line_per_queue_with_its_total(world):
    spend.roll_up_usage()
    html = logged_in(world["alice"]).get("/board/budgets/?by=queue").content.decode()

    legend = re.findall(
        r'<span class="spend-name">([^<]*)</span> '
        r'<strong class="series-total">([^<]*)<',
        html,
    )
    assert legend == [("reviews", "$41.00"), ("triage", "$2.50")]
    assert html.count('class="series spend-line spend-0"') == 2  # wide and phone


def test_the_spend_chart_counts_tokens_per_endpoint_in_scope(world):
    store.report_usage(
        store.Scope.for_endpoint(world["theirs"]), queue="x", usage={"input_tokens": 7}
    )
    spend.roll_up_usage()

    html = (
        logged_in(world["alice"])
        .get("/board/budgets/?by=endpoint&measure=tokens&range=day")
        .content.decode()
    )

    legend = re.findall(r'<strong class="series-total">([^<]*)<', html)
    assert legend == ["1 200 tokens"]


def test_a_todo_shows_its_attempts_usage(world):
    scope = world["scope"]
    todo, _ = store.create_todo(scope, queue="reviews", max_attempts=3)
    store.claim_todo(scope, todo.id, "w1")
    store.fail_todo(
        scope,
        todo.id,
        "w1",
        error="rate limited",
        usage={
            "input_tokens": 900,
            "output_tokens": 10,
            "cost_usd": 0.12,
            "model": "m-1",
        },
    )
    store.retry_todo_any_endpoint(todo.id, actor="test")
    store.claim_todo(scope, todo.id, "w2")
    store.complete_todo(
        scope,
        todo.id,
        "w2",
        usage={"input_tokens": 300, "cost_usd": 0.04, "model": "m2"},
    )

    html = logged_in(world["alice"]).get(f"/board/todos/{todo.id}/").content.decode()

    table = html[html.index('class="grid usage-table"') :]
    rows = re.findall(r"<tr class=\"usage-row\">(.*?)</tr>", table, re.S)
    assert len(rows) == 2
    expected = [(">1<", "900", "$0.12", "m-1"), (">2<", "300", "$0.04", "m2")]
    for row, figures in zip(rows, expected, strict=True):
        assert all(figure in row for figure in figures), row


# --- The inbox's budget cards ---------------------------------------------------


@pytest.fixture
def exhausted(world):
    """alice's queue reviews reached its daily budget of $50: paused."""
    store.report_usage(world["scope"], queue="reviews", usage={"cost_usd": 9})
    return world


def card_of(html, budget):
    start = html.index(f'id="budget-card-{budget.id}"')
    return html[start : html.index("</article>", start)]


def test_the_inbox_asks_the_owner_about_a_budget_at_its_limit(exhausted):
    html = logged_in(exhausted["alice"]).get("/board/inbox/").content.decode()

    card = card_of(html, exhausted["budget"])
    assert "Daily budget of $50 reached on queue reviews" in card
    assert "Its work is paused" in card
    for decision in ("raise", "resume", "keep_paused"):
        assert f'name="decision" value="{decision}"' in card
    assert re.search(r'id="inbox-count"[^>]*>.*?</span>1</span>', html)


def test_another_owners_budget_card_is_not_shown_or_answered(exhausted):
    bob = logged_in(exhausted["bob"])
    budget = exhausted["budget"]

    assert f"budget-card-{budget.id}" not in bob.get("/board/inbox/").content.decode()
    refused = bob.post(f"/board/budgets/{budget.id}/decision/", {"decision": "resume"})
    assert refused.status_code == 404
    assert store.get_budget(exhausted["scope"], budget.id).state == "exhausted"


def test_raising_a_budget_from_its_card_lifts_the_pause_and_is_recorded(exhausted):
    scope, budget = exhausted["scope"], exhausted["budget"]
    todo, _ = store.create_todo(scope, queue="reviews")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w", queue="reviews")

    response = logged_in(exhausted["alice"]).post(
        f"/board/budgets/{budget.id}/decision/",
        {"decision": "raise", "amount_usd": "10"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"budget-card-{budget.id}",
    )

    assert response.status_code == 200
    card = card_of(response.content.decode(), budget)
    assert "Raised by $10.00 for today: its work goes on." in card
    assert 'name="decision"' not in card  # answered: nothing more to ask
    assert store.get_budget(scope, budget.id).left_usd == 10
    page = logged_in(exhausted["alice"]).get("/board/budgets/").content.decode()
    assert "raised by $10.00 for this window" in page
    assert store.claim_next(scope, "w", queue="reviews").id == todo.id
    [decision] = [
        e
        for e in store.budget_history(scope, budget.id)
        if e.event == "budget.decision"
    ]
    assert decision.actor == "operator:alice"
    assert decision.detail["decision"] == "raise"


def test_resuming_from_the_card_lets_claims_take_the_work(exhausted):
    scope, budget = exhausted["scope"], exhausted["budget"]
    todo, _ = store.create_todo(scope, queue="reviews")

    response = logged_in(exhausted["alice"]).post(
        f"/board/budgets/{budget.id}/decision/", {"decision": "resume"}
    )

    assert response.status_code == 302
    assert store.get_budget(scope, budget.id).state == "resumed"
    assert store.claim_next(scope, "w", queue="reviews").id == todo.id
    page = logged_in(exhausted["alice"]).get(f"/board/budgets/{budget.id}/")
    assert "resumed anyway</strong>" in page.content.decode()


def test_keeping_a_budget_paused_is_recorded_and_keeps_its_card(exhausted):
    client = logged_in(exhausted["alice"])
    budget = exhausted["budget"]

    response = client.post(
        f"/board/budgets/{budget.id}/decision/",
        {"decision": "keep_paused"},
        follow=True,
    )

    assert "Kept paused until the window ends." in response.content.decode()
    # Still at its limit: the card goes on asking.
    card = card_of(response.content.decode(), budget)
    assert 'name="decision" value="raise"' in card
    history = store.budget_history(exhausted["scope"], budget.id)
    assert history[0].detail["decision"] == "keep_paused"


def test_a_raise_without_an_amount_is_refused_in_the_card(exhausted):
    budget = exhausted["budget"]

    response = logged_in(exhausted["alice"]).post(
        f"/board/budgets/{budget.id}/decision/",
        {"decision": "raise", "amount_usd": ""},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"budget-card-{budget.id}",
    )

    assert response.status_code == 200
    assert "Give the amount to raise it by." in response.content.decode()
    assert store.get_budget(exhausted["scope"], budget.id).state == "exhausted"


def test_a_read_only_viewer_cannot_answer_a_budget_card(exhausted):
    viewer = user("vera", viewer=True)
    exhausted["mine"].owner = viewer
    exhausted["mine"].save()
    client = logged_in(viewer)
    budget = exhausted["budget"]

    card = card_of(client.get("/board/inbox/").content.decode(), budget)

    assert "Read-only" in card and 'name="decision"' not in card
    refused = client.post(
        f"/board/budgets/{budget.id}/decision/", {"decision": "resume"}
    )
    assert refused.status_code == 403


# --- The soft threshold's banner ------------------------------------------------


def test_a_budget_past_its_soft_threshold_is_a_banner_on_the_overview_and_queue(
    world,
):
    for queue in ("reviews", "triage"):
        store.create_todo(world["scope"], queue=queue)
    client = logged_in(world["alice"])
    said = "Queue reviews spent 82% of its daily budget of $50 (soft threshold 80%)."

    overview = client.get("/board/").content.decode()
    queue = client.get(f"/board/queues/{world['mine'].id}/reviews/").content.decode()
    other = client.get(f"/board/queues/{world['mine'].id}/triage/").content.decode()

    assert said in overview and said in queue
    assert "budget-banner" not in other
    assert (
        "budget-banner" not in logged_in(world["bob"]).get("/board/").content.decode()
    )


def test_a_budget_at_its_limit_is_a_banner_pointing_to_the_inbox(exhausted):
    store.create_todo(exhausted["scope"], queue="reviews")
    page = logged_in(exhausted["alice"]).get(
        f"/board/queues/{exhausted['mine'].id}/reviews/"
    )

    html = page.content.decode()
    assert (
        "The daily budget of $50 is reached on queue reviews: its work is paused "
        "until you decide in the inbox or the window ends."
    ) in html
    assert 'class="notice notice-error budget-banner"' in html


def test_the_budgets_page_and_its_charts_never_read_the_ledger(world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    spend.roll_up_usage()
    client = logged_in(world["alice"])

    with CaptureQueriesContext(connection) as ran:
        for by in ("endpoint", "queue", "group"):
            assert client.get(f"/board/budgets/?by={by}&range=day").status_code == 200

    assert not [q for q in ran.captured_queries if "usage_ledger" in q["sql"]]
