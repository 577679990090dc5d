"""Every error of the API's table arrives as its typed error, carrying the
server's error body. (503 and lost connections: test_retries.py.)"""

import pytest
from django.db import connection
from switchboard_client import (
    APIError,
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    LeaseSuperseded,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServerError,
    Unauthorized,
)
from switchboard_client._core import Call

from tests.client.calls import CountingRetry, served
from tests.conftest import shift

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_field_that_fails_its_rule_is_a_bad_request_naming_it(client):
    with pytest.raises(BadRequest) as raised:
        client.create("q", max_attempts=0)
    assert raised.value.status == 400
    assert raised.value.body["error"] == "bad_request"
    assert raised.value.detail.startswith("max_attempts")


def test_an_unknown_token_is_unauthorized(asgi_server, db):
    with (
        Client(asgi_server.url, "sb_not-a-token") as client,
        pytest.raises(Unauthorized) as raised,
    ):
        client.queues()
    assert raised.value.error == "unauthorized"


def test_a_queue_outside_the_grant_is_forbidden(asgi_server, make_endpoint):
    narrow = make_endpoint("narrow", queues=("reviews",))
    with (
        Client(asgi_server.url, narrow.token) as client,
        pytest.raises(Forbidden) as raised,
    ):
        client.create("deploys")
    assert raised.value.error == "forbidden"


def test_an_unknown_todo_is_not_found(client):
    with pytest.raises(NotFound) as raised:
        client.get("00000000-0000-0000-0000-000000000000")
    assert raised.value.error == "not_found"


def test_a_wrong_method_is_method_not_allowed(client):
    with pytest.raises(MethodNotAllowed):
        client.send(Call("DELETE", "/api/v1/queues", lambda body: body))


def test_answering_a_todo_that_asks_nothing_is_a_conflict(client):
    todo = client.create("q").todo
    with pytest.raises(Conflict) as raised:
        client.answer(todo, "yes")
    assert raised.value.status == 409
    assert not isinstance(raised.value, LeaseSuperseded)


def test_a_superseded_lease_token_is_lease_superseded(client, other_client):
    client.create("q")
    first = client.claim(queue="q", lease_seconds=30)
    shift(first.id, lease_expires_at=-60)
    second = other_client.claim(queue="q")
    assert second.id == first.id
    with pytest.raises(LeaseSuperseded) as raised:
        client.complete(first, "late")
    assert isinstance(raised.value, Conflict)
    assert "lease superseded" in raised.value.detail
    assert other_client.complete(second, "on time").result == "on time"


def test_a_checkpoint_over_its_limit_is_payload_too_large(client):
    client.create("q")
    todo = client.claim(queue="q")
    with pytest.raises(PayloadTooLarge) as raised:
        client.heartbeat(todo, checkpoint="x" * 70_000)
    assert raised.value.error == "payload_too_large"


def test_every_typed_error_is_an_api_error_with_the_body(client):
    with pytest.raises(APIError) as raised:
        client.get("nope")
    assert raised.value.body == {"error": "not_found", "detail": raised.value.detail}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_body_over_the_api_limit_is_payload_too_large_and_the_client_goes_on(
    asgi_server, endpoint, mode
):
    """The front door refuses a body over 256 KiB before Django reads it; the
    connection stays usable for the next call."""

    async def both(client):
        with pytest.raises(PayloadTooLarge) as raised:
            await client.create("q", payload="x" * 300_000)
        return raised.value, await client.queues()

    def sync_both(client):
        with pytest.raises(PayloadTooLarge) as raised:
            client.create("q", payload="x" * 300_000)
        return raised.value, client.queues()

    op = sync_both if mode == "sync" else both
    error, queues = served(mode, asgi_server.url, endpoint.token, op)
    assert error.status == 413 and error.error == "payload_too_large"
    assert isinstance(queues, list)


@pytest.fixture
def exploding_queue(db):
    """A queue whose creates fail in the database with an error the server
    does not expect (a trigger raises), so the server answers 500."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION client_test_explode() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.queue = 'explode' THEN
                    RAISE EXCEPTION 'this test refuses the row';
                END IF;
                RETURN NEW;
            END $$
            """
        )
        cursor.execute(
            "CREATE TRIGGER client_test_explode BEFORE INSERT ON todos"
            " FOR EACH ROW EXECUTE FUNCTION client_test_explode()"
        )
    yield "explode"
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS client_test_explode ON todos")
        cursor.execute("DROP FUNCTION IF EXISTS client_test_explode()")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failure_inside_the_server_is_a_server_error_sent_once(
    asgi_server, endpoint, exploding_queue, mode
):
    """A 500 is not retried, even for a call safe to repeat (a keyed create):
    only a 503 says that trying again may help."""
    retry = CountingRetry()
    with pytest.raises(ServerError) as raised:
        served(
            mode,
            asgi_server.url,
            endpoint.token,
            lambda client: client.create(exploding_queue, idempotency_key="k"),
            retry=retry,
        )
    assert raised.value.status == 500
    assert raised.value.error == "internal_error"
    assert retry.tries == [1]


def test_a_create_a_budget_refuses_is_budget_exhausted_a_rate_limit(client, endpoint):
    """A reject_new budget at its limit: the 429 budget_exhausted arrives as
    BudgetExhausted (a RateLimited), naming the budget, with Retry-After."""
    from switchboard_client import BudgetExhausted, RateLimited

    from tests.support import exhausted_budget
    from todos import store

    budget = exhausted_budget(store.Scope.for_endpoint(endpoint), "q")
    with pytest.raises(BudgetExhausted) as raised:
        client.create("q")
    assert isinstance(raised.value, RateLimited)
    assert raised.value.status == 429 and raised.value.error == "budget_exhausted"
    assert budget.id in raised.value.detail
    assert 0 < raised.value.retry_after <= 86400
    assert client.create("other").created
