"""POST /hooks/<slug>: real signed HTTP deliveries, fanned out to real todos."""

import json
import threading

import pytest
from django.db import connection
from django.test import Client

from tests.support import deadlocked, free_port
from todos import store
from todos.models import Todo, WebhookDelivery, WebhookRoute, WebhookSource
from todos.webhooks import deliveries, signatures, sources

SECRET = "it's-a-secret-to-everybody"

PULL_REQUEST = {
    "action": "opened",
    "number": 12,
    "pull_request": {"number": 12, "title": "Fix the login redirect"},
    "repository": {"full_name": "acme/app"},
}


@pytest.fixture
def source(endpoint, other_endpoint):
    """A GitHub source routed to endpoints A and B, both on queue "github"."""
    source = WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    WebhookRoute.objects.create(source=source, endpoint=other_endpoint, queue="github")
    return source


def deliver(
    client,
    slug="acme-app",
    payload=PULL_REQUEST,
    *,
    delivery="d-1",
    event="pull_request",
    secret=SECRET,
    body=None,
    headers=None,
    content_type="application/json",
):
    """POST a delivery signed the way GitHub signs it."""
    body = json.dumps(payload).encode() if body is None else body
    signed = {
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
        "X-Hub-Signature-256": signatures.sign(secret, body),
    }
    signed.update(headers or {})
    signed = {name: value for name, value in signed.items() if value is not None}
    return client.post(
        f"/hooks/{slug}", data=body, content_type=content_type, headers=signed
    )


def todos_of(endpoint):
    return store.list_todos(store.Scope.for_endpoint(endpoint)).todos


def test_same_delivery_routed_to_two_endpoints_yields_two_todos(
    client, source, endpoint, other_endpoint
):
    """SPEC: Same delivery routed to two endpoints yields two todos."""
    response = deliver(client)

    assert response.status_code == 202
    answer = response.json()
    assert answer["status"] == "created"
    assert {t["endpoint_id"] for t in answer["targets"]} == {
        str(endpoint.id),
        str(other_endpoint.id),
    }
    assert all(t["created"] and t["queue"] == "github" for t in answer["targets"])
    [todo_a], [todo_b] = todos_of(endpoint), todos_of(other_endpoint)
    assert todo_a.id != todo_b.id
    for todo in (todo_a, todo_b):
        assert todo.idempotency_key == "d-1"
        assert todo.payload == PULL_REQUEST
        assert todo.title == "pull_request opened acme/app#12: Fix the login redirect"
    assert {t["todo_id"] for t in answer["targets"]} == {todo_a.id, todo_b.id}


def test_redelivery_dedups_only_within_each_target(
    client, source, endpoint, other_endpoint
):
    """SPEC: Redelivery to one target dedups only within that target."""
    first = deliver(client).json()
    again = deliver(client)

    assert again.status_code == 202
    assert again.json()["status"] == "duplicate"
    assert [t["created"] for t in again.json()["targets"]] == [False, False]
    assert [t["todo_id"] for t in again.json()["targets"]] == [
        t["todo_id"] for t in first["targets"]
    ]
    assert len(todos_of(endpoint)) == 1
    assert len(todos_of(other_endpoint)) == 1
    assert Todo.objects.count() == 2


def test_redelivery_during_a_retry_window_collapses_onto_the_parked_retry(
    client, source, endpoint, time_travel
):
    """SPEC: Redelivery during a backoff window does not duplicate."""
    deliver(client)
    scope = store.Scope.for_endpoint(endpoint)
    claimed = store.claim_next(scope, "worker-1")
    parked = store.fail_todo(scope, claimed.id, "worker-1", error="flaky")
    assert parked.is_retry_scheduled

    again = deliver(client).json()

    target_a = next(t for t in again["targets"] if t["endpoint_id"] == str(endpoint.id))
    assert target_a == {
        "endpoint_id": str(endpoint.id),
        "queue": "github",
        "todo_id": parked.id,
        "created": False,
    }
    assert len(todos_of(endpoint)) == 1
    # The parked retry's re-queue must not collide with a duplicate.
    time_travel(parked.id, next_retry_at=-3600)
    assert [moved.id for moved in store.requeue_due_retries()] == [parked.id]
    assert store.get_todo(scope, parked.id).state == "pending"


def test_redelivery_after_the_todo_is_done_creates_a_new_one(client, source, endpoint):
    """SPEC: A terminal todo does not block a new one."""
    deliver(client)
    scope = store.Scope.for_endpoint(endpoint)
    claimed = store.claim_next(scope, "worker-1")
    store.complete_todo(scope, claimed.id, "worker-1")

    again = deliver(client).json()

    assert again["status"] == "created"
    created = {t["endpoint_id"]: t["created"] for t in again["targets"]}
    assert created[str(endpoint.id)] is True
    assert len(todos_of(endpoint)) == 2


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Hub-Signature-256": None},
        {"X-Hub-Signature-256": ""},
        {"X-Hub-Signature-256": signatures.sign("wrong secret", b"{}")},
        # GitHub always sends the prefix; a bare digest is not its signature.
        {"X-Hub-Signature-256": signatures.sign(SECRET, b"{}").removeprefix("sha256=")},
        {"X-Hub-Signature-256": "sha256=ünïcode"},
    ],
    ids=["missing", "empty", "wrong-secret", "no-prefix", "non-ascii"],
)
def test_a_bad_signature_is_401_and_creates_nothing(client, source, headers):
    response = deliver(client, body=b"{}", headers=headers)

    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert Todo.objects.count() == 0
    assert WebhookDelivery.objects.count() == 0


def test_a_tampered_body_is_401_and_creates_nothing(client, source):
    signature = signatures.sign(SECRET, json.dumps(PULL_REQUEST).encode())
    tampered = json.dumps({**PULL_REQUEST, "number": 13}).encode()

    response = deliver(
        client, body=tampered, headers={"X-Hub-Signature-256": signature}
    )

    assert response.status_code == 401
    assert Todo.objects.count() == 0


def test_an_unknown_slug_is_404(client, source):
    response = deliver(client, slug="no-such-source")

    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert Todo.objects.count() == 0


def test_a_body_over_256_kib_is_413_and_creates_nothing(client, source):
    body = json.dumps({"blob": "x" * (256 * 1024)}).encode()

    response = deliver(client, body=body)

    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert Todo.objects.count() == 0


def test_a_signed_body_that_is_not_json_is_400(client, source):
    response = deliver(client, body=b"{not json")

    assert response.status_code == 400
    assert response.json() == {
        "error": "bad_request",
        "detail": "the body is not valid JSON",
    }
    assert Todo.objects.count() == 0


def test_a_delivery_without_its_delivery_id_is_400(client, source):
    response = deliver(client, headers={"X-GitHub-Delivery": None})

    assert response.status_code == 400
    assert "X-GitHub-Delivery" in response.json()["detail"]
    assert Todo.objects.count() == 0


def test_hooks_answer_405_to_anything_but_post(client, source):
    response = client.get("/hooks/acme-app")

    assert response.status_code == 405
    assert response["Allow"] == "POST"


def test_github_form_encoded_deliveries_are_accepted(client, source, endpoint):
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(PULL_REQUEST)}).encode()

    response = deliver(
        client, body=body, content_type="application/x-www-form-urlencoded"
    )

    assert response.status_code == 202
    assert todos_of(endpoint)[0].payload == PULL_REQUEST


def test_github_ping_is_logged_and_creates_no_todo(client, source):
    ping = {"zen": "Keep it logically awesome.", "hook_id": 1}

    response = deliver(client, payload=ping, event="ping")

    assert response.status_code == 202
    assert response.json()["status"] == "ping"
    assert response.json()["targets"] == []
    assert Todo.objects.count() == 0
    assert WebhookDelivery.objects.get().status == "ping"


def test_the_generic_hmac_scheme_reads_its_own_headers(client, endpoint):
    source = WebhookSource.objects.create(
        slug="billing",
        secret="generic",
        scheme="hmac-sha256",
        signature_header="X-Billing-Signature",
        delivery_header="X-Billing-Id",
    )
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="invoices")
    body = b'{"invoice": 7}'
    bare_digest = signatures.sign("generic", body).removeprefix("sha256=")

    response = client.post(
        "/hooks/billing",
        data=body,
        content_type="application/json",
        headers={
            "X-Billing-Signature": bare_digest,
            "X-Billing-Id": "inv-7",
            "X-Event": "invoice.paid",
        },
    )

    assert response.status_code == 202
    [todo] = todos_of(endpoint)
    assert (todo.queue, todo.idempotency_key) == ("invoices", "inv-7")
    assert todo.title == "invoice.paid from billing"


def test_a_route_title_template_and_assignee_shape_the_todo(client, endpoint):
    source = WebhookSource.objects.create(slug="reviews", secret=SECRET)
    WebhookRoute.objects.create(
        source=source,
        endpoint=endpoint,
        queue="reviews",
        assignee="reviewer-bot",
        title_template="Review $repository#$number ($action) [$delivery]",
    )

    deliver(client, "reviews", delivery="d-77")

    [todo] = todos_of(endpoint)
    assert todo.title == "Review acme/app#12 (opened) [d-77]"
    assert todo.assignee == "reviewer-bot"


def test_revoked_endpoints_and_ungranted_queues_are_skipped_not_failed(
    client, source, endpoint, other_endpoint, make_endpoint
):
    other_endpoint.revoked_at = other_endpoint.created_at
    other_endpoint.save()
    narrow = make_endpoint("narrow", queues=("deploys",))
    WebhookRoute.objects.create(source=source, endpoint=narrow, queue="github")

    answer = deliver(client).json()

    skipped = {t["endpoint_id"]: t.get("skipped") for t in answer["targets"]}
    assert skipped == {
        str(endpoint.id): None,
        str(other_endpoint.id): "endpoint revoked",
        str(narrow.id): "queue not granted",
    }
    assert Todo.objects.count() == 1


def test_a_redelivery_whose_todo_left_the_grant_is_skipped_not_handed_over(
    client, make_endpoint
):
    """The route moved to a granted queue, the grant dropped the old one: the
    live todo holding the delivery id is outside the grant, so it is neither
    returned nor duplicated."""
    moving = make_endpoint("moving", queues=("old", "new"))
    source = WebhookSource.objects.create(slug="moving", secret=SECRET)
    route = WebhookRoute.objects.create(source=source, endpoint=moving, queue="old")
    deliver(client, "moving", delivery="d-9")
    route.queue = "new"
    route.save()
    moving.queues = ["new"]
    moving.save()

    again = deliver(client, "moving", delivery="d-9")

    assert again.status_code == 202
    [target] = again.json()["targets"]
    assert (target["todo_id"], target.get("skipped")) == (None, "queue not granted")
    assert Todo.objects.count() == 1


def test_a_delivery_is_never_half_applied(client, source):
    # A real database failure on the second target's insert, raised by a
    # trigger, after the first target's todo was written in the same transaction.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION pg_temp.refuse() RETURNS trigger AS $$
            BEGIN
              IF EXISTS (SELECT 1 FROM todos) THEN RAISE EXCEPTION 'refused'; END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER refuse_second BEFORE INSERT ON todos FOR EACH ROW
              EXECUTE FUNCTION pg_temp.refuse();
            """
        )

    response = deliver(Client(raise_request_exception=False))

    # Not an outage (issue #11: only connection loss and timeouts are): a JSON
    # 500, which a sender redelivers like any 5xx.
    assert response.status_code == 500
    assert response.json()["error"] == "internal_error"
    assert Todo.objects.count() == 0
    assert WebhookDelivery.objects.count() == 0


def test_the_deliveries_log_records_each_targets_outcome(client, source, endpoint):
    deliver(client, delivery="d-1")
    deliver(client, delivery="d-1")

    newest, oldest = WebhookDelivery.objects.filter(source=source)
    assert (oldest.status, newest.status) == ("created", "duplicate")
    assert (newest.delivery_id, newest.event) == ("d-1", "pull_request")
    assert [t["created"] for t in oldest.outcome] == [True, True]
    assert [t["todo_id"] for t in newest.outcome] == [
        t["todo_id"] for t in oldest.outcome
    ]


def test_the_deliveries_log_keeps_only_the_latest_per_source(
    client, source, monkeypatch
):
    monkeypatch.setattr(deliveries, "DELIVERY_LOG_KEEP", 3)
    for number in range(5):
        deliver(client, delivery=f"d-{number}")

    kept = WebhookDelivery.objects.filter(source=source)
    assert [d.delivery_id for d in kept] == ["d-4", "d-3", "d-2"]


@pytest.mark.django_db(transaction=True)
def test_a_delivery_while_the_database_is_down_is_503(client):
    WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    saved_port = connection.settings_dict["PORT"]
    connection.close()
    # The connection pool was made with the old port: a new one takes the new.
    connection.close_pool()
    connection.settings_dict["PORT"] = str(free_port())
    try:
        response = deliver(client)
    finally:
        connection.close()
        connection.close_pool()
        connection.settings_dict["PORT"] = saved_port

    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"


@pytest.mark.django_db(transaction=True)
def test_a_delivery_stopped_by_a_deadlock_is_a_busy_503_to_redeliver(
    source, endpoint, other_endpoint
):
    """A deadlock is a busy database, not a down one: 503 with Retry-After,
    which senders redeliver; nothing of the delivery was applied."""
    # The delivery creates A's todo, then waits for B's endpoint row.
    outcome = deadlocked(
        lambda: deliver(Client()),
        "SELECT 1 FROM endpoints WHERE id = %s FOR UPDATE",
        [other_endpoint.id],
    )

    response = outcome["returned"]
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.json()["error"] == "unavailable"
    detail = response.json()["detail"]
    assert detail.startswith("the database is busy") and "redeliver" in detail
    assert "unavailable" not in detail
    assert todos_of(endpoint) == [] and not WebhookDelivery.objects.exists()
    assert deliver(Client()).status_code == 202


def test_a_slug_that_could_never_exist_is_a_json_404(client, db):
    response = client.post(
        "/hooks/not.a.slug", data=b"{}", content_type="application/json"
    )

    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"n": NaN}', "not valid JSON"),
        (b'{"n": 1e999}', "numbers must be finite"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b'{"message": "nul \\u0000 inside"}', "NUL characters"),
        (b'{"message": "lone \\ud800"}', "lone surrogates"),
        (b"\xff\xfe", "not UTF-8"),
    ],
    ids=["nan", "overflow", "deep-nesting", "nul", "lone-surrogate", "not-utf8"],
)
def test_a_signed_body_postgresql_cannot_store_is_400_not_500(
    client, source, body, detail
):
    response = deliver(client, body=body)

    assert response.status_code == 400
    assert detail in response.json()["detail"]
    assert Todo.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_redeliveries_leave_one_todo_per_target(endpoint, other_endpoint):
    """SPEC: Redelivery to one target dedups only within that target."""
    source = WebhookSource.objects.create(slug="acme-app", secret=SECRET)
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="github")
    WebhookRoute.objects.create(source=source, endpoint=other_endpoint, queue="github")
    start = threading.Barrier(6)
    answers = []

    def redeliver():
        start.wait()
        try:
            answers.append(deliver(Client()))
        finally:
            connection.close()

    threads = [threading.Thread(target=redeliver) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [answer.status_code for answer in answers] == [202] * 6
    created = [t for a in answers for t in a.json()["targets"] if t["created"]]
    assert sorted(t["endpoint_id"] for t in created) == sorted(
        [str(endpoint.id), str(other_endpoint.id)]
    )
    assert len(todos_of(endpoint)) == 1
    assert len(todos_of(other_endpoint)) == 1


# --- One queue per endpoint (issue #11) -----------------------------------------


def test_a_source_routed_to_two_queues_of_one_endpoint_is_refused(db, endpoint):
    """Defect: two queues of one endpoint made one todo and reported two targets.

    The delivery id is the idempotency key and the dedupe slot is per endpoint,
    so the second route could never hold a todo of its own: it is refused.
    """
    routes = [
        sources.RouteSpec(str(endpoint.id), "github"),
        sources.RouteSpec(str(endpoint.id), "triage"),
    ]
    with pytest.raises(sources.InvalidSource, match="one queue per endpoint"):
        sources.create_source("acme-app", SECRET, routes)
    assert not WebhookSource.objects.exists()


def test_adding_a_second_queue_of_a_routed_endpoint_is_refused(source, endpoint):
    """Defect: two queues of one endpoint made one todo and reported two targets."""
    with pytest.raises(sources.InvalidSource, match="one queue per endpoint"):
        sources.add_route(source, sources.RouteSpec(str(endpoint.id), "triage"))
    assert source.routes.filter(endpoint=endpoint).count() == 1


def test_an_older_second_route_of_one_endpoint_is_reported_not_collapsed(
    client, source, endpoint
):
    """Defect: two queues of one endpoint made one todo and reported two targets."""
    WebhookRoute.objects.create(source=source, endpoint=endpoint, queue="triage")

    answer = deliver(client).json()

    mine = [t for t in answer["targets"] if t["endpoint_id"] == str(endpoint.id)]
    assert [(t["queue"], t["created"], t.get("skipped")) for t in mine] == [
        ("github", True, None),
        ("triage", False, "endpoint already routed by this source"),
    ]
    assert len(todos_of(endpoint)) == 1


def test_a_webhook_todo_gets_switchboard_max_attempts(client, source, settings):
    """Defect: SWITCHBOARD_MAX_ATTEMPTS was ignored for webhook todos."""
    settings.SWITCHBOARD_MAX_ATTEMPTS = 2

    deliver(client)

    assert {todo.max_attempts for todo in Todo.objects.all()} == {2}


def test_a_slug_with_a_nul_is_a_json_404_not_an_outage(client, db):
    """Defect: /hooks/%00 answered 503 "redeliver": every DatabaseError was taken
    for an outage (only connection loss and timeouts are)."""
    response = client.post("/hooks/%00", data=b"{}", content_type="application/json")

    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_an_unexpected_failure_is_a_json_500_never_the_html_page(source, monkeypatch):
    """Defect: /hooks/ could answer Django's HTML 500 page."""

    def broken(source, delivery):
        raise RuntimeError("a bug")

    monkeypatch.setattr(deliveries, "ingest", broken)
    response = deliver(Client(raise_request_exception=False))

    assert response.status_code == 500
    assert response.json()["error"] == "internal_error"


def test_a_source_whose_secret_does_not_decrypt_answers_a_json_503_and_logs_why(
    source, settings, caplog
):
    """Defect: a lost key answered an opaque 500, which senders are not told to
    redeliver; the log did not say which key was missing."""
    settings.SWITCHBOARD_ENCRYPTION_KEY = ""
    settings.SECRET_KEY_FALLBACKS = []
    settings.SECRET_KEY = "a-secret-key-the-secrets-were-not-encrypted-under-0123456789"

    response = deliver(Client(raise_request_exception=False))

    assert response.status_code == 503
    assert response.json()["error"] == "secret_unreadable"
    assert "redeliver" in response.json()["detail"]
    assert Todo.objects.count() == 0
    [record] = [r for r in caplog.records if r.name == "switchboard.webhooks"]
    assert record.levelname == "ERROR"
    assert "SECRET_KEY_FALLBACKS" in record.getMessage()
