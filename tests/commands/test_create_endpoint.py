"""python manage.py create_endpoint (CONTRACT §6)."""

import json
from functools import partial

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError
from django.db import connection

from tests.support import command_output
from todos.access import auth, tokens
from todos.models import Endpoint

run = partial(command_output, "create_endpoint")


@pytest.mark.django_db
def test_create_endpoint_prints_a_working_token_once_as_json():
    output = json.loads(
        run("reviewer", "--owner", "alice", "--queues", "reviews,deploys", "--json")
    )
    endpoint = Endpoint.objects.get(id=output["endpoint_id"])
    assert output["token"].startswith(tokens.TOKEN_PREFIX)
    assert output["queues"] == ["reviews", "deploys"] == endpoint.queues
    assert output["owner"] == "alice" and output["owner_created"] is True
    assert auth.endpoint_for_token(output["token"]) == endpoint


@pytest.mark.django_db
def test_create_endpoint_stores_only_the_tokens_hash():
    token = json.loads(run("a", "--owner", "alice", "--queues", "*", "--json"))["token"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(e)::text FROM endpoints e")
        stored = " ".join(row[0] for row in cursor.fetchall())
    assert tokens.hash_token(token) in stored
    assert token not in stored and token.removeprefix("sb_") not in stored


@pytest.mark.django_db
def test_create_endpoint_reuses_an_existing_owner_and_grants_every_queue():
    user = get_user_model().objects.create(username="bob")
    output = json.loads(run("ops", "--owner", "bob", "--queues", "*", "--json"))
    endpoint = Endpoint.objects.get(id=output["endpoint_id"])
    assert endpoint.owner == user and output["owner_created"] is False
    assert endpoint.grants_every_queue and endpoint.grants("anything")


@pytest.mark.django_db
def test_create_endpoint_prints_the_token_in_text_form():
    output = run("plain", "--owner", "carol", "--queues", "q")
    token = next(line.split()[-1] for line in output.splitlines() if "token:" in line)
    assert auth.endpoint_for_token(token).name == "plain"
    assert "shown only now" in output


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ("x", "--owner", "alice", "--queues", " , "),
        ("", "--owner", "alice", "--queues", "q"),
        ("x", "--owner", " ", "--queues", "q"),
        ("x", "--owner", "alice", "--queues", "q" * 201),
    ],
)
def test_create_endpoint_rejects_bad_arguments(args):
    with pytest.raises(CommandError):
        run(*args)
    assert not Endpoint.objects.exists()


@pytest.mark.django_db
def test_a_revoked_endpoints_token_stops_working():
    token = json.loads(run("gone", "--owner", "alice", "--queues", "q", "--json"))[
        "token"
    ]
    endpoint = auth.endpoint_for_token(token)
    endpoint.revoked_at = endpoint.created_at
    endpoint.save()
    assert auth.endpoint_for_token(token) is None
