"""The Board's SQS section: an endpoint's key id and account, issue and rotate."""

import re

from django.contrib.auth import get_user_model
from django.utils import timezone

from todos import store
from todos.access import auth
from todos.sqs import credentials, messages


def shown_secret(response):
    match = re.search(
        r'id="sqs-secret" class="token" type="text" value="([^"]+)"',
        response.content.decode(),
    )
    return match.group(1) if match else None


def test_board_issues_sqs_credentials_and_shows_the_secret_once(board, endpoint):
    page = board.get(f"/board/endpoints/{endpoint.id}/sqs/")
    assert page.status_code == 200 and "Issue SQS credentials" in page.content.decode()

    issued = board.post(f"/board/endpoints/{endpoint.id}/sqs/")
    secret = shown_secret(issued)
    assert secret and issued["Cache-Control"] == "no-store"
    key = credentials.shown(endpoint)
    assert key.secret_access_key == secret

    again = board.get(f"/board/endpoints/{endpoint.id}/sqs/").content.decode()
    assert key.access_key_id in again and key.account_id in again
    assert secret not in again and "Rotate SQS key" in again


def test_board_rotating_the_sqs_key_stops_the_old_one(board, endpoint):
    first = credentials.issue(endpoint)
    response = board.post(f"/board/endpoints/{endpoint.id}/sqs/")
    assert shown_secret(response) not in (None, first.secret_access_key)
    assert auth.endpoint_for_access_key(first.access_key_id) is None
    assert credentials.shown(endpoint).account_id == first.account_id


def test_board_issues_nothing_for_a_revoked_endpoint(board, endpoint):
    endpoint.revoked_at = timezone.now()
    endpoint.save()
    response = board.post(f"/board/endpoints/{endpoint.id}/sqs/")
    assert shown_secret(response) is None and credentials.shown(endpoint) is None


def test_board_sqs_page_of_an_unknown_endpoint_is_404(board):
    url = "/board/endpoints/00000000-0000-0000-0000-000000000000/sqs/"
    assert board.get(url).status_code == 404


def test_board_sqs_page_needs_staff(client, endpoint, db):
    client.force_login(get_user_model().objects.create_user("user"))
    assert client.post(f"/board/endpoints/{endpoint.id}/sqs/").status_code == 403
    assert credentials.shown(endpoint) is None


def test_board_shows_an_sqs_message_body_pretty_printed(board, scope):
    body = '{"task": "resize", "sizes": [1, 2]}'
    todo, _ = store.create_todo(
        scope, queue="q", title="t", payload=messages.payload_of(body, {})
    )
    html = board.get(f"/board/todos/{todo.id}/").content.decode()
    assert "SQS message body" in html
    assert "&quot;task&quot;: &quot;resize&quot;,\n" in html


def test_board_shows_no_sqs_section_for_an_api_todo(board, scope):
    todo, _ = store.create_todo(scope, queue="q", title="t", payload={"body": "x"})
    assert (
        "SQS message body" not in board.get(f"/board/todos/{todo.id}/").content.decode()
    )
