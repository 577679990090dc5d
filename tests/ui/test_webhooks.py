"""The Board's Webhooks pages: sources, routes, last deliveries, set-up."""

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from todos.models import Todo, WebhookDelivery, WebhookRoute, WebhookSource
from todos.webhooks import signatures

SECRET = "board-secret"


@pytest.fixture
def source(endpoint, other_endpoint):
    source = WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    WebhookRoute.objects.create(
        source=source, endpoint=other_endpoint, queue="github", assignee="reviewer-bot"
    )
    return source


def deliver(client, delivery_id, event="issues"):
    body = json.dumps({"action": "opened", "number": 5}).encode()
    return client.post(
        "/hooks/acme-app",
        data=body,
        content_type="application/json",
        headers={
            "X-Hub-Signature-256": signatures.sign(SECRET, body),
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Event": event,
        },
    )


def route_data(*routes):
    data = {
        "routes-TOTAL_FORMS": "3",
        "routes-INITIAL_FORMS": "0",
        "routes-MIN_NUM_FORMS": "0",
        "routes-MAX_NUM_FORMS": "10",
    }
    for index, (endpoint_id, queue) in enumerate(routes):
        data[f"routes-{index}-endpoint"] = str(endpoint_id)
        data[f"routes-{index}-queue"] = queue
    return data


def test_webhooks_page_needs_a_login(client, db):
    response = client.get("/board/webhooks/")

    assert response.status_code == 302
    assert response["Location"].startswith("/board/login/")


def test_webhooks_page_refuses_a_user_who_is_not_staff(client, db):
    client.force_login(get_user_model().objects.create_user("visitor"))

    assert client.get("/board/webhooks/").status_code == 403
    assert client.post("/board/webhooks/new/", {"slug": "x"}).status_code == 403
    assert WebhookSource.objects.count() == 0


def test_webhooks_page_lists_routes_and_each_deliverys_outcome_per_target(
    board, source, endpoint, other_endpoint
):
    deliver(board, "d-first")
    deliver(board, "d-first")
    first, again = WebhookDelivery.objects.order_by("id")
    todo_ids = [target["todo_id"] for target in first.outcome]

    page = board.get("/board/webhooks/").content.decode()

    assert "acme-app" in page and "POST /hooks/acme-app" in page
    assert "reviewer-bot" in page
    assert page.count("d-first") == 2
    assert "issues" in page
    assert page.count("new todo") == 2
    assert page.count("duplicate of a live todo") == 2
    for todo_id in todo_ids:
        assert f"/board/todos/{todo_id}/" in page
    assert endpoint.name in page and other_endpoint.name in page
    assert SECRET not in page


def test_webhooks_page_answers_htmx_with_only_the_sources_fragment(board, source):
    response = board.get(
        "/board/webhooks/", headers={"HX-Request": "true", "HX-Target": "sources"}
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="sources"')
    assert "<html" not in html


def test_creating_a_source_from_the_board_shows_a_generated_secret_once(
    board, endpoint, other_endpoint
):
    form = {
        "slug": "from-board",
        "scheme": "github",
        "secret": "",
        **route_data((endpoint.id, "github"), (other_endpoint.id, "github")),
    }

    response = board.post("/board/webhooks/new/", form)

    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    source = WebhookSource.objects.get(slug="from-board")
    assert len(source.secret) == 64
    assert source.secret in response.content.decode()
    assert [(r.endpoint_id, r.queue) for r in source.routes.order_by("id")] == [
        (endpoint.id, "github"),
        (other_endpoint.id, "github"),
    ]
    assert source.secret not in board.get("/board/webhooks/").content.decode()


def test_creating_a_source_with_a_chosen_secret_never_echoes_it(board, endpoint):
    form = {
        "slug": "chosen",
        "scheme": "hmac-sha256",
        "secret": "my-own-secret",
        "delivery_header": "X-Billing-Id",
        **route_data((endpoint.id, "bills")),
    }

    response = board.post("/board/webhooks/new/", form, follow=True)

    assert response.status_code == 200
    assert "Created webhook source chosen" in response.content.decode()
    assert "my-own-secret" not in response.content.decode()
    source = WebhookSource.objects.get(slug="chosen")
    assert (source.scheme, source.delivery_header) == ("hmac-sha256", "X-Billing-Id")


@pytest.mark.parametrize(
    ("overrides", "routes", "message"),
    [
        ({}, [], "Add at least one route."),
        (
            {"slug": "no spaces"},
            [("{wide}", "github")],
            "consisting of letters, numbers",
        ),
        ({}, [("{narrow}", "github")], "is not granted queue"),
        ({}, [("{wide}", "has space")], "A queue name has no spaces."),
        (
            {"routes-0-title_template": "$bogus"},
            [("{wide}", "github")],
            "unknown fields bogus",
        ),
    ],
    ids=["no-route", "bad-slug", "ungranted", "queue-space", "bad-template"],
)
def test_creating_a_bad_source_is_400_and_creates_nothing(
    board, make_endpoint, overrides, routes, message
):
    wide, narrow = make_endpoint("wide"), make_endpoint("narrow", queues=("deploys",))
    ids = {"wide": wide.id, "narrow": narrow.id}
    form = {
        "slug": "acme",
        "scheme": "github",
        "secret": "s",
        **route_data(*[(e.format(**ids), q) for e, q in routes]),
        **overrides,
    }

    response = board.post("/board/webhooks/new/", form)

    assert response.status_code == 400
    assert message in response.content.decode()
    assert WebhookSource.objects.count() == 0


def test_the_create_form_needs_a_csrf_token(operator, endpoint):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    form = {
        "slug": "acme",
        "scheme": "github",
        "secret": "s",
        **route_data((endpoint.id, "github")),
    }

    response = strict.post("/board/webhooks/new/", form)

    assert response.status_code == 403
    assert WebhookSource.objects.count() == 0


def test_deleting_a_source_makes_its_hook_404_and_keeps_its_todos(board, source):
    deliver(board, "d-1")

    response = board.post(f"/board/webhooks/{source.id}/delete/")

    assert response.status_code == 302
    assert WebhookSource.objects.count() == 0
    assert deliver(board, "d-2").status_code == 404
    assert Todo.objects.count() == 2


def test_adding_a_route_from_the_board_fans_later_deliveries_out_to_it(
    board, source, make_endpoint
):
    third = make_endpoint("agent-c", owner="carol")

    response = board.post(
        f"/board/webhooks/{source.id}/routes/new/",
        {"endpoint": str(third.id), "queue": "triage", "assignee": ""},
    )

    assert response.status_code == 302
    answer = deliver(board, "d-after").json()
    assert (str(third.id), "triage") in {
        (t["endpoint_id"], t["queue"]) for t in answer["targets"]
    }
    assert len(answer["targets"]) == 3
    assert Todo.objects.filter(endpoint=third, queue="triage").count() == 1


def test_adding_a_route_twice_is_400(board, source, endpoint):
    response = board.post(
        f"/board/webhooks/{source.id}/routes/new/",
        {"endpoint": str(endpoint.id), "queue": "github"},
    )

    assert response.status_code == 400
    assert "already routes to" in response.content.decode()
    assert source.routes.count() == 2


def test_removing_a_route_stops_deliveries_reaching_it(
    board, source, endpoint, other_endpoint
):
    route = source.routes.get(endpoint=other_endpoint)

    response = board.post(f"/board/webhooks/routes/{route.id}/delete/")

    assert response.status_code == 302
    answer = deliver(board, "d-after").json()
    assert [t["endpoint_id"] for t in answer["targets"]] == [str(endpoint.id)]


def test_rotating_a_secret_shows_the_new_one_once_and_retires_the_old(board, source):
    response = board.post(f"/board/webhooks/{source.id}/rotate/")

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    source.refresh_from_db()
    assert source.secret != SECRET
    assert source.secret in response.content.decode()
    assert deliver(board, "d-old-secret").status_code == 401


def test_board_actions_on_a_missing_source_are_404(board, db):
    missing = "00000000-0000-0000-0000-000000000000"

    assert board.post(f"/board/webhooks/{missing}/rotate/").status_code == 404
    assert board.get(f"/board/webhooks/{missing}/routes/new/").status_code == 404


def test_adding_a_route_to_another_queue_of_a_routed_endpoint_is_400(
    board, source, endpoint
):
    """Defect: two queues of one endpoint made one todo and reported two targets."""
    response = board.post(
        f"/board/webhooks/{source.id}/routes/new/",
        {"endpoint": str(endpoint.id), "queue": "triage"},
    )

    assert response.status_code == 400
    assert "one queue per endpoint" in response.content.decode()
    assert source.routes.count() == 2


# --- Timestamped schemes on the Board ---------------------------------------------


def test_the_create_form_offers_the_timestamped_schemes(board, endpoint):
    page = board.get("/board/webhooks/new/").content.decode()

    assert 'value="stripe"' in page and 'value="standard-webhooks"' in page


def test_a_standard_webhooks_source_gets_a_whsec_secret_from_the_board(board, endpoint):
    form = {
        "slug": "events",
        "scheme": "standard-webhooks",
        "secret": "",
        **route_data((endpoint.id, "events")),
    }

    response = board.post("/board/webhooks/new/", form)

    assert response.status_code == 201
    source = WebhookSource.objects.get(slug="events")
    assert source.secret.startswith("whsec_")
    assert len(signatures.standard_key(source.secret)) == 32
    page = board.get("/board/webhooks/").content.decode()
    assert "timestamped" in page and "webhook-signature" in page


# --- Owners (CONTRACT §13) ----------------------------------------------------------


def owner(name):
    return get_user_model().objects.create_user(name, password="a-long-password")


def test_an_owners_webhook_page_hides_old_outcomes_naming_another_owners_endpoint(
    board, source, endpoint, other_endpoint
):
    """Defect: once a shared source routed only to alice's endpoint, alice saw
    its old deliveries' targets at bob's endpoint, with bob's todo ids."""
    deliver(board, "d-shared")
    bobs_todo = Todo.objects.get(endpoint=other_endpoint)
    alices_todo = Todo.objects.get(endpoint=endpoint)
    source.routes.filter(endpoint=other_endpoint).delete()
    alice = Client()
    alice.force_login(endpoint.owner)

    page = alice.get("/board/webhooks/").content.decode()

    assert "acme-app" in page and "d-shared" in page
    assert f"/board/todos/{alices_todo.id}/" in page
    assert str(bobs_todo.id) not in page
    assert str(other_endpoint.id) not in page
    assert "gone" not in page


def test_naming_a_source_tells_an_owner_nothing_of_another_owners_sources(
    db, make_endpoint
):
    """Defect: "a source named 'bob-hooks' already exists" told alice that bob had
    one: an owner's source address now ends in a random suffix."""
    bobs = make_endpoint("bob-agent", owner="bob")
    WebhookSource.objects.create(slug="payments", secret="s")
    WebhookRoute.objects.create(
        source=WebhookSource.objects.get(), endpoint=bobs, queue="jobs"
    )
    alices = make_endpoint("alice-agent", owner="alice")
    alice = Client()
    alice.force_login(alices.owner)
    form = {
        "slug": "payments",
        "scheme": "github",
        "secret": "alice-secret",
        **route_data((alices.id, "jobs")),
    }

    response = alice.post("/board/webhooks/new/", form, follow=True)

    page = response.content.decode()
    assert response.status_code == 200
    assert "already exists" not in page
    mine = WebhookSource.objects.get(routes__endpoint=alices)
    assert re.fullmatch(r"payments-[0-9a-f]{8}", mine.slug)
    assert f"Created webhook source {mine.slug}" in page
    # bob's address is unchanged, and still his.
    assert WebhookSource.objects.filter(slug="payments", routes__endpoint=bobs).exists()


def test_an_owner_creating_the_same_name_twice_gets_two_addresses(db, make_endpoint):
    alices = make_endpoint("alice-agent", owner="alice")
    alice = Client()
    alice.force_login(alices.owner)
    form = {
        "slug": "ci",
        "scheme": "github",
        "secret": "s",
        **route_data((alices.id, "jobs")),
    }

    for _ in range(2):
        assert alice.post("/board/webhooks/new/", form).status_code == 302

    slugs = list(WebhookSource.objects.values_list("slug", flat=True))
    assert len(set(slugs)) == 2 and all(s.startswith("ci-") for s in slugs)


def test_a_staff_operator_still_names_the_exact_address(board, endpoint):
    form = {
        "slug": "exact",
        "scheme": "github",
        "secret": "s",
        **route_data((endpoint.id, "q")),
    }

    board.post("/board/webhooks/new/", form)

    assert WebhookSource.objects.filter(slug="exact").exists()


def test_a_route_added_on_the_board_takes_a_priority_and_a_group_template(
    board, source, make_endpoint
):
    """CONTRACT §17: a route sets its todos' priority and derives their group."""
    third = make_endpoint("agent-c", owner="carol")

    response = board.post(
        f"/board/webhooks/{source.id}/routes/new/",
        {
            "endpoint": str(third.id),
            "queue": "triage",
            "priority": "1",
            "group_template": "{action}",
        },
    )

    assert response.status_code == 302
    route = WebhookRoute.objects.get(endpoint=third)
    assert (route.priority, route.group_template) == (1, "{action}")
    page = board.get("/board/webhooks/").content.decode()
    assert "<code>{action}</code>" in page
    deliver(board, "d-grouped")
    todo = Todo.objects.get(endpoint=third)
    assert (todo.priority, todo.group) == (1, "opened")


def test_a_bad_group_template_on_the_board_is_400(board, source, make_endpoint):
    third = make_endpoint("agent-c", owner="carol")

    response = board.post(
        f"/board/webhooks/{source.id}/routes/new/",
        {"endpoint": str(third.id), "queue": "triage", "group_template": "{a"},
    )

    assert response.status_code == 400
    assert "stray brace" in response.content.decode()
    assert not WebhookRoute.objects.filter(endpoint=third).exists()
