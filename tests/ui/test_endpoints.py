"""The Board's endpoint pages: list, create (token once), rotate, revoke, grants."""

import re

import pytest

from todos.access import auth
from todos.models import Endpoint


def shown_token(response):
    return re.search(r'value="(sb_[A-Za-z0-9_-]+)"', response.content.decode()).group(1)


def test_endpoint_list_shows_owner_grants_and_only_a_token_prefix(board, make_endpoint):
    endpoint = make_endpoint("triage-bot", queues=("github", "reviews"), owner="alice")

    html = board.get("/board/endpoints/").content.decode()

    assert "triage-bot" in html and "alice" in html
    assert "github" in html and "reviews" in html
    assert endpoint.token_prefix in html
    assert endpoint.token not in html


def test_create_endpoint_shows_its_token_once(board, operator):
    assert board.get("/board/endpoints/new/").status_code == 200

    response = board.post(
        "/board/endpoints/new/",
        {"name": "release-agent", "owner": operator.pk, "queues": "deploys, reviews"},
    )

    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    token = shown_token(response)
    endpoint = Endpoint.objects.get(name="release-agent")
    assert endpoint.queues == ["deploys", "reviews"]
    assert endpoint.owner == operator
    assert auth.endpoint_for_token(token) == endpoint
    assert token not in board.get("/board/endpoints/").content.decode()
    assert b"data-copy" in response.content


@pytest.mark.parametrize(
    ("queues", "error"),
    [
        ("", "This field is required"),
        ("a b", "is not a queue name"),
        ("*, extra", "already grants every queue"),
    ],
)
def test_create_endpoint_explains_bad_fields(board, operator, queues, error):
    response = board.post(
        "/board/endpoints/new/", {"name": "  ", "owner": operator.pk, "queues": queues}
    )

    assert response.status_code == 400
    assert error in response.content.decode()
    assert "This field is required" in response.content.decode()  # the blank name
    assert not Endpoint.objects.exists()


def test_rotate_replaces_the_token_and_the_old_one_stops_working(board, endpoint):
    response = board.post(f"/board/endpoints/{endpoint.id}/rotate/")

    new_token = shown_token(response)
    assert response.status_code == 200
    assert auth.endpoint_for_token(endpoint.token) is None
    assert auth.endpoint_for_token(new_token) == endpoint
    assert b"previous token no longer works" in response.content


def test_rotate_of_a_revoked_endpoint_is_refused(board, endpoint):
    board.post(f"/board/endpoints/{endpoint.id}/revoke/")

    response = board.post(f"/board/endpoints/{endpoint.id}/rotate/", follow=True)

    assert b"is revoked" in response.content
    assert not Endpoint.objects.get(id=endpoint.id).is_active


def test_revoke_re_renders_the_row_and_kills_the_token(board, endpoint):
    response = board.post(
        f"/board/endpoints/{endpoint.id}/revoke/",
        headers={"HX-Request": "true", "HX-Target": f"endpoint-{endpoint.id}"},
    )

    html = response.content.decode()
    assert html.lstrip().startswith(f'<tr id="endpoint-{endpoint.id}" class="revoked"')
    assert "Revoked agent-a" in html
    assert auth.endpoint_for_token(endpoint.token) is None


def test_revoking_twice_is_a_notice(board, endpoint):
    board.post(f"/board/endpoints/{endpoint.id}/revoke/")

    response = board.post(f"/board/endpoints/{endpoint.id}/revoke/", follow=True)

    assert b"already revoked" in response.content


def test_grants_form_edits_the_queues(board, endpoint):
    page = board.get(f"/board/endpoints/{endpoint.id}/grants/")
    assert 'value="*"' in page.content.decode()

    response = board.post(
        f"/board/endpoints/{endpoint.id}/grants/",
        {"queues": "github,\nreviews"},
        follow=True,
    )

    endpoint.refresh_from_db()
    assert endpoint.queues == ["github", "reviews"]
    assert b"may now use: github, reviews" in response.content


def test_grants_form_rejects_a_bad_queue(board, endpoint):
    response = board.post(f"/board/endpoints/{endpoint.id}/grants/", {"queues": " , "})

    assert response.status_code == 400
    assert b"Name at least one queue" in response.content
    endpoint.refresh_from_db()
    assert endpoint.queues == ["*"]


@pytest.mark.parametrize("action", ["rotate", "revoke", "grants"])
def test_unknown_endpoint_is_a_404_page(board, action):
    url = f"/board/endpoints/00000000-0000-0000-0000-000000000000/{action}/"

    response = board.post(url)

    assert response.status_code == 404
    assert b"No such endpoint" in response.content


def test_endpoint_pages_require_a_staff_login(client, endpoint):
    response = client.post(f"/board/endpoints/{endpoint.id}/revoke/")

    assert response.status_code == 302
    assert Endpoint.objects.get(id=endpoint.id).is_active


def test_an_empty_post_shows_the_required_fields(board, endpoint):
    created = board.post("/board/endpoints/new/")
    grants = board.post(f"/board/endpoints/{endpoint.id}/grants/")
    todo = board.post("/board/todos/new/")

    for response in (created, grants, todo):
        assert response.status_code == 400
        assert b"This field is required" in response.content
