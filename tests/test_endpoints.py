"""todos.access.endpoints: the one place an endpoint is created, re-keyed, revoked and
granted queues, with one grant syntax for the CLI and the Board."""

import pytest
from django.core.management import CommandError

from tests.support import command_output
from todos.access import auth, endpoints
from todos.models import Endpoint


@pytest.mark.parametrize(
    ("raw", "queues"),
    [
        ("*", ["*"]),
        ("a, b", ["a", "b"]),
        ("a,\nb, a", ["a", "b"]),
        (" github ", ["github"]),
    ],
)
def test_a_grant_is_queue_names_or_every_queue(raw, queues):
    assert endpoints.parse_grant(raw) == queues
    assert endpoints.parse_grant(endpoints.format_grant(queues)) == queues


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (" , ", "at least one queue"),
        ("*, extra", "already grants every queue"),
        ("a b", "is not a queue name"),
        ("q" * 201, "is not a queue name"),
    ],
)
def test_a_bad_grant_names_its_problem(raw, problem):
    with pytest.raises(endpoints.EndpointError, match=problem):
        endpoints.parse_grant(raw)


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["*, extra", "a b"])
def test_the_cli_and_the_board_refuse_the_same_grants(raw, client, django_user_model):
    """One grant syntax everywhere: what the Board refuses, the CLI refuses."""
    with pytest.raises(CommandError):
        command_output("create_endpoint", "x", "--owner", "alice", "--queues", raw)
    operator = django_user_model.objects.create_user("ops", is_staff=True)
    client.force_login(operator)
    response = client.post(
        "/board/endpoints/new/", {"name": "x", "owner": operator.pk, "queues": raw}
    )
    assert response.status_code == 400
    assert not Endpoint.objects.exists()


@pytest.mark.django_db
def test_create_rotate_revoke_and_regrant():
    endpoint, token = endpoints.create("bot", "alice", "github, reviews")
    assert endpoint.owner_created and endpoint.queues == ["github", "reviews"]
    assert auth.endpoint_for_token(token) == endpoint

    rotated = endpoints.rotate_token(endpoint)
    assert auth.endpoint_for_token(token) is None
    assert auth.endpoint_for_token(rotated) == endpoint

    endpoints.set_grant(endpoint, "*")
    assert Endpoint.objects.get(id=endpoint.id).queues == ["*"]

    assert endpoints.revoke(endpoint) is True
    assert endpoint.revoked_at is not None
    assert auth.endpoint_for_token(rotated) is None
    assert endpoints.revoke(endpoint) is False
