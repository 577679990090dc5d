"""Every error of the API's table arrives as its typed error, carrying the
server's error body."""

import pytest
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
    Unauthorized,
)
from switchboard_client._core import Call

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
