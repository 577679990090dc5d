"""Timestamped webhook schemes: Stripe's and Standard Webhooks', which refuse a
stale delivery and a replayed one (the signatures seen live in PostgreSQL)."""

import base64
import json
import threading
import time

import pytest
from django.db import connection
from django.test import Client

from todos.models import Todo, WebhookRoute, WebhookSignatureSeen, WebhookSource
from todos.webhooks import signatures, sources

STRIPE_SECRET = "whsec_stripe-test-secret"
STANDARD_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
INVOICE = {"id": "evt_1", "type": "invoice.paid", "data": {"object": {"id": "in_7"}}}


@pytest.fixture
def stripe(endpoint):
    source = WebhookSource.objects.create(
        slug="billing", secret=STRIPE_SECRET, scheme="stripe"
    )
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="billing")
    return source


@pytest.fixture
def standard(endpoint):
    source = WebhookSource.objects.create(
        slug="events", secret=STANDARD_SECRET, scheme="standard-webhooks"
    )
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="events")
    return source


def post(client, slug, body, headers):
    return client.post(
        f"/hooks/{slug}", data=body, content_type="application/json", headers=headers
    )


def stripe_delivery(client, payload=INVOICE, *, at=None, secret=STRIPE_SECRET):
    body = json.dumps(payload).encode()
    timestamp = int(time.time()) if at is None else at
    signature = signatures.sign_stripe(secret, body, timestamp)
    return post(client, "billing", body, {"Stripe-Signature": signature})


def standard_headers(body, *, delivery="msg_1", at=None, secret=STANDARD_SECRET):
    timestamp = int(time.time()) if at is None else at
    return {
        "webhook-id": delivery,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures.sign_standard(
            secret, delivery, timestamp, body
        ),
    }


def standard_delivery(client, payload=INVOICE, **signing):
    body = json.dumps(payload).encode()
    return post(client, "events", body, standard_headers(body, **signing))


# --- Stripe ---------------------------------------------------------------------


def test_a_stripe_delivery_becomes_a_todo_keyed_by_its_event_id(client, stripe):
    response = stripe_delivery(client)

    assert response.status_code == 202
    assert response.json()["delivery_id"] == "evt_1"
    assert response.json()["event"] == "invoice.paid"
    todo = Todo.objects.get()
    assert (todo.idempotency_key, todo.title) == ("evt_1", "invoice.paid from billing")


def test_a_stale_stripe_delivery_is_refused(client, stripe):
    """Defect: a captured delivery could be replayed at any later time."""
    response = stripe_delivery(client, at=int(time.time()) - 301)

    assert response.status_code == 401
    assert "outside the 300 s tolerance" in response.json()["detail"]
    assert Todo.objects.count() == 0


def test_a_stripe_delivery_signed_too_far_ahead_is_refused(client, stripe):
    response = stripe_delivery(client, at=int(time.time()) + 301)

    assert response.status_code == 401
    assert "ahead of this server" in response.json()["detail"]


def test_the_tolerance_is_a_setting(client, stripe, settings):
    settings.SWITCHBOARD_WEBHOOK_TOLERANCE_SECONDS = 30

    assert stripe_delivery(client, at=int(time.time()) - 60).status_code == 401
    assert stripe_delivery(client, at=int(time.time()) - 20).status_code == 202


def test_a_replayed_stripe_delivery_is_refused_and_applies_nothing(client, stripe):
    """Defect: a replay inside the window created a todo again once the first was
    done (the dedupe slot frees when a todo is terminal)."""
    body = json.dumps(INVOICE).encode()
    signed = {
        "Stripe-Signature": signatures.sign_stripe(
            STRIPE_SECRET, body, int(time.time())
        )
    }
    assert post(client, "billing", body, signed).status_code == 202
    Todo.objects.update(state="done")

    replay = post(Client(), "billing", body, signed)

    assert replay.status_code == 409
    assert replay.json()["error"] == "replayed"
    assert Todo.objects.count() == 1
    assert stripe.deliveries.count() == 1


def test_a_stripe_retry_with_a_fresh_signature_collapses_onto_the_live_todo(
    client, stripe
):
    now = int(time.time())
    first = stripe_delivery(client, at=now - 10)
    retry = stripe_delivery(client, at=now)

    assert (first.status_code, retry.status_code) == (202, 202)
    assert retry.json()["status"] == "duplicate"
    assert Todo.objects.count() == 1


@pytest.mark.parametrize(
    "header",
    [
        "",
        "v1=abc",
        "t=123",
        "t=abc,v1=00",
        "t=1,t=2,v1=00",
    ],
    ids=["empty", "no-timestamp", "no-v1", "bad-timestamp", "two-timestamps"],
)
def test_a_malformed_stripe_signature_is_401(client, stripe, header):
    response = post(client, "billing", b"{}", {"Stripe-Signature": header})

    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"


def test_a_stripe_signature_with_the_wrong_secret_is_401(client, stripe):
    assert stripe_delivery(client, secret="whsec_other").status_code == 401


def test_stripe_rolling_a_secret_sends_two_v1_and_one_matching_is_enough(
    client, stripe
):
    body = json.dumps(INVOICE).encode()
    now = int(time.time())
    good = signatures.sign_stripe(STRIPE_SECRET, body, now).split("v1=")[1]
    header = f"t={now},v1={'0' * 64},v1={good},v0=ignored"

    assert (
        post(client, "billing", body, {"Stripe-Signature": header}).status_code == 202
    )


def test_a_stripe_body_without_an_event_id_is_400(client, stripe):
    response = stripe_delivery(client, payload={"type": "invoice.paid"})

    assert response.status_code == 400
    assert "'id'" in response.json()["detail"]


# --- Standard Webhooks ------------------------------------------------------------


def test_a_standard_webhooks_delivery_becomes_a_todo_keyed_by_its_message_id(
    client, standard
):
    response = standard_delivery(client, delivery="msg_2Lh9")

    assert response.status_code == 202
    todo = Todo.objects.get()
    assert (todo.idempotency_key, response.json()["event"]) == (
        "msg_2Lh9",
        "invoice.paid",
    )


def test_a_stale_standard_webhooks_delivery_is_refused(client, standard):
    """Defect: a captured delivery could be replayed at any later time."""
    response = standard_delivery(client, at=int(time.time()) - 301)

    assert response.status_code == 401
    assert "tolerance" in response.json()["detail"]
    assert Todo.objects.count() == 0


def test_a_replayed_standard_webhooks_delivery_is_refused(client, standard):
    body = json.dumps(INVOICE).encode()
    headers = standard_headers(body)
    assert post(client, "events", body, headers).status_code == 202

    replay = post(client, "events", body, headers)

    assert replay.status_code == 409
    assert replay.json()["error"] == "replayed"


def test_a_standard_webhooks_id_is_part_of_what_is_signed(client, standard):
    body = json.dumps(INVOICE).encode()
    headers = {**standard_headers(body, delivery="msg_1"), "webhook-id": "msg_2"}

    assert post(client, "events", body, headers).status_code == 401


def test_a_standard_webhooks_signature_list_needs_one_v1_match(client, standard):
    body = json.dumps(INVOICE).encode()
    headers = standard_headers(body)
    wrong = "v1," + base64.b64encode(b"x" * 32).decode()
    headers["webhook-signature"] = f"v1a,ignored {wrong} {headers['webhook-signature']}"

    assert post(client, "events", body, headers).status_code == 202


@pytest.mark.parametrize(
    "missing", ["webhook-id", "webhook-timestamp", "webhook-signature"]
)
def test_a_standard_webhooks_delivery_missing_a_header_is_401(
    client, standard, missing
):
    body = json.dumps(INVOICE).encode()
    headers = {**standard_headers(body), missing: None}
    headers = {name: value for name, value in headers.items() if value is not None}

    response = post(client, "events", body, headers)

    assert response.status_code == 401
    assert "webhook-id" in response.json()["detail"]


def test_a_standard_webhooks_secret_must_be_whsec_base64(db, endpoint):
    route = [sources.RouteSpec(str(endpoint.id), "events")]

    with pytest.raises(sources.InvalidSource, match="whsec_"):
        sources.create_source(
            "events", "not base64!", route, scheme="standard-webhooks"
        )
    generated = sources.new_secret("standard-webhooks")
    assert generated.startswith("whsec_")
    assert len(signatures.standard_key(generated)) == 32
    sources.create_source("events", generated, route, scheme="standard-webhooks")


# --- The replay guard ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_are_applied_once(endpoint):
    """Every process agrees: the guard is a unique row in PostgreSQL."""
    source = WebhookSource.objects.create(
        slug="billing", secret=STRIPE_SECRET, scheme="stripe"
    )
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="billing")
    body = json.dumps(INVOICE).encode()
    signed = {
        "Stripe-Signature": signatures.sign_stripe(
            STRIPE_SECRET, body, int(time.time())
        )
    }
    start = threading.Barrier(6)
    answers = []

    def replay():
        start.wait()
        try:
            answers.append(post(Client(), "billing", body, signed).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=replay) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(answers) == [202] + [409] * 5
    assert WebhookSignatureSeen.objects.count() == 1


def test_signatures_are_forgotten_once_a_replay_of_them_is_stale(client, stripe):
    stripe_delivery(client, payload={**INVOICE, "id": "evt_old"})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_signatures_seen"
            " SET signed_at = signed_at - interval '301 seconds'"
        )

    stripe_delivery(client, payload={**INVOICE, "id": "evt_new"})

    assert WebhookSignatureSeen.objects.count() == 1


def test_a_refused_delivery_is_not_remembered(client, stripe):
    body = b"{not json"
    signed = {
        "Stripe-Signature": signatures.sign_stripe(
            STRIPE_SECRET, body, int(time.time())
        )
    }

    assert post(client, "billing", body, signed).status_code == 400
    assert WebhookSignatureSeen.objects.count() == 0


def test_a_github_delivery_remembers_no_signature(client, endpoint):
    source = WebhookSource.objects.create(slug="gh", secret="s")
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    body = b'{"action": "opened"}'
    headers = {
        "X-Hub-Signature-256": signatures.sign("s", body),
        "X-GitHub-Delivery": "d-1",
        "X-GitHub-Event": "issues",
    }

    assert post(client, "gh", body, headers).status_code == 202
    assert WebhookSignatureSeen.objects.count() == 0
