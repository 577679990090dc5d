"""python manage.py create_webhook SLUG --secret S --route ENDPOINT_ID:QUEUE …"""

import json
from functools import partial

import pytest
from django.core.management import CommandError

from tests.support import command_output
from todos import store
from todos.models import WebhookRoute, WebhookSource
from todos.webhooks import signatures, sources

create_webhook = partial(command_output, "create_webhook")


def test_create_webhook_prints_the_source_and_its_routes_as_json(
    endpoint, other_endpoint
):
    out = create_webhook(
        "acme-app",
        "--secret",
        "s3cret-value",
        "--route",
        f"{endpoint.id}:github",
        "--route",
        f"{other_endpoint.id}:github",
        "--json",
    )

    described = json.loads(out)
    assert described["slug"] == "acme-app"
    assert described["path"] == "/hooks/acme-app"
    assert described["scheme"] == "github"
    assert described["signature_header"] == "X-Hub-Signature-256"
    assert described["delivery_header"] == "X-GitHub-Delivery"
    assert [(r["endpoint_id"], r["queue"]) for r in described["routes"]] == [
        (str(endpoint.id), "github"),
        (str(other_endpoint.id), "github"),
    ]
    assert "s3cret-value" not in out
    assert WebhookSource.objects.get(slug="acme-app").secret == "s3cret-value"


def test_a_created_webhook_accepts_a_signed_delivery(client, endpoint, other_endpoint):
    """SPEC: Same delivery routed to two endpoints yields two todos."""
    create_webhook(
        "acme-app",
        "--secret",
        "s3cret-value",
        "--route",
        f"{endpoint.id}:github",
        "--route",
        f"{other_endpoint.id}:github",
    )
    body = b'{"action": "opened", "number": 3}'

    response = client.post(
        "/hooks/acme-app",
        data=body,
        content_type="application/json",
        headers={
            "X-Hub-Signature-256": signatures.sign("s3cret-value", body),
            "X-GitHub-Delivery": "d-1",
            "X-GitHub-Event": "issues",
        },
    )

    assert response.status_code == 202
    for owner in (endpoint, other_endpoint):
        [todo] = store.list_todos(store.Scope.for_endpoint(owner)).todos
        assert todo.idempotency_key == "d-1"


def test_create_webhook_prints_the_delivery_path_in_text(endpoint):
    out = create_webhook(
        "acme-app",
        "--secret",
        "s3cret-value",
        "--route",
        f"{endpoint.id}:github",
        "--assignee",
        "bot",
    )

    assert "POST /hooks/acme-app" in out
    assert f"({endpoint.id}) → queue github, assigned to bot" in out
    assert WebhookRoute.objects.get().assignee == "bot"


def test_create_webhook_takes_the_generic_scheme_and_its_headers(endpoint):
    out = create_webhook(
        "billing",
        "--secret",
        "s3cret-value",
        "--scheme",
        "hmac-sha256",
        "--delivery-header",
        "X-Billing-Id",
        "--route",
        f"{endpoint.id}:invoices",
        "--json",
    )

    described = json.loads(out)
    assert described["scheme"] == "hmac-sha256"
    assert described["delivery_header"] == "X-Billing-Id"
    assert described["signature_header"] == "X-Signature-256"


@pytest.mark.parametrize(
    ("slug", "route", "extra", "message"),
    [
        ("acme", "not-a-route", [], "is not ENDPOINT_ID:QUEUE"),
        ("acme", "not-a-uuid:github", [], "is not an endpoint id"),
        ("acme", "00000000-0000-0000-0000-000000000000:github", [], "no endpoint"),
        ("acme", "{narrow}:github", [], "is not granted queue 'github'"),
        ("acme", "{revoked}:github", [], "is revoked"),
        ("no spaces", "{wide}:github", [], "slug"),
        ("acme", "{wide}:github", ["--title", "cost $5"], r"stray '\$'"),
        ("acme", "{wide}:github", ["--title", "$nope"], "unknown fields nope"),
        ("acme", "{wide}:github", ["--delivery-header", "X Bad"], "header name"),
    ],
    ids=[
        "malformed-route",
        "malformed-endpoint",
        "unknown-endpoint",
        "ungranted-queue",
        "revoked-endpoint",
        "bad-slug",
        "bad-template",
        "unknown-template-field",
        "bad-header",
    ],
)
def test_create_webhook_rejects_bad_input_and_creates_nothing(
    make_endpoint, slug, route, extra, message
):
    narrow = make_endpoint("narrow", queues=("deploys",))
    revoked = make_endpoint("revoked")
    revoked.revoked_at = revoked.created_at
    revoked.save()
    wide = make_endpoint("wide")
    route = route.format(narrow=narrow.id, revoked=revoked.id, wide=wide.id)

    with pytest.raises(CommandError, match=message):
        create_webhook(slug, "--secret", "s3cret-value", "--route", route, *extra)

    assert WebhookSource.objects.count() == 0
    assert WebhookRoute.objects.count() == 0


def test_create_webhook_refuses_a_taken_slug(endpoint):
    create_webhook("acme", "--secret", "one", "--route", f"{endpoint.id}:github")

    with pytest.raises(CommandError, match="already exists"):
        create_webhook("acme", "--secret", "two", "--route", f"{endpoint.id}:other")

    assert WebhookSource.objects.get().secret == "one"


def test_create_webhook_refuses_two_routes_to_one_target(endpoint):
    with pytest.raises(CommandError, match="same endpoint and queue"):
        create_webhook(
            "acme",
            "--secret",
            "s",
            "--route",
            f"{endpoint.id}:github",
            "--route",
            f"{endpoint.id}:github",
        )


def test_create_webhook_needs_a_secret_and_a_route(endpoint, db):
    with pytest.raises(CommandError, match="--secret"):
        create_webhook("acme", "--route", f"{endpoint.id}:github")
    with pytest.raises(CommandError, match="--route"):
        create_webhook("acme", "--secret", "s")


@pytest.mark.parametrize(
    ("scheme", "secret", "signature_header"),
    [
        ("stripe", "whsec_from-the-stripe-dashboard", "Stripe-Signature"),
        (
            "standard-webhooks",
            sources.new_secret("standard-webhooks"),
            "webhook-signature",
        ),
    ],
)
def test_create_webhook_offers_the_timestamped_schemes(
    endpoint, scheme, secret, signature_header
):
    """Defect: only GitHub's untimestamped scheme (no replay protection) existed."""
    out = create_webhook(
        "timed",
        "--secret",
        secret,
        "--scheme",
        scheme,
        "--route",
        f"{endpoint.id}:q",
        "--json",
    )

    described = json.loads(out)
    assert (described["scheme"], described["timestamped"]) == (scheme, True)
    assert described["signature_header"] == signature_header
    assert WebhookSource.objects.get().secret == secret


def test_create_webhook_refuses_a_standard_webhooks_secret_that_is_not_whsec_base64(
    endpoint,
):
    with pytest.raises(CommandError, match="whsec_"):
        create_webhook(
            "timed",
            "--secret",
            "plain words",
            "--scheme",
            "standard-webhooks",
            "--route",
            f"{endpoint.id}:q",
        )
    assert WebhookSource.objects.count() == 0


def test_create_webhook_text_says_where_stripe_keeps_the_event_id(endpoint):
    out = create_webhook(
        "billing",
        "--secret",
        "whsec_x",
        "--scheme",
        "stripe",
        "--route",
        f"{endpoint.id}:q",
    )

    assert "delivery id the body's 'id', event the body's 'type'" in out


def test_create_webhook_takes_a_priority_and_a_group_template(endpoint):
    out = create_webhook(
        "pushes",
        "--secret",
        "s3cret-value",
        "--route",
        f"{endpoint.id}:repos",
        "--priority",
        "2",
        "--group",
        "{repository.full_name}",
        "--json",
    )

    [route] = json.loads(out)["routes"]
    assert (route["priority"], route["group_template"]) == (
        2,
        "{repository.full_name}",
    )
    text = create_webhook(
        "pushes-2", "--secret", "s", "--route", f"{endpoint.id}:repos", "--group", "{x}"
    )
    assert "group {x}" in text


def test_create_webhook_refuses_a_bad_group_template(endpoint):
    with pytest.raises(CommandError, match="group_template"):
        create_webhook(
            "pushes", "--secret", "s", "--route", f"{endpoint.id}:q", "--group", "{"
        )
    assert not WebhookSource.objects.filter(slug="pushes").exists()
