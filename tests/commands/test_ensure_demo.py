"""python manage.py ensure_demo: the demo login and endpoint, kept across runs."""

import pytest

from tests.support import command_output
from todos.access import auth, endpoints
from todos.management.commands import ensure_demo
from todos.models import Endpoint


@pytest.fixture(autouse=True)
def token_file(tmp_path, monkeypatch):
    path = tmp_path / "demo-token"
    monkeypatch.setattr(ensure_demo, "TOKEN_FILE", path)
    return path


def demo_token(token_file):
    return token_file.read_text().strip()


@pytest.mark.django_db
def test_ensure_demo_keeps_the_demo_endpoint_and_its_token_across_runs(token_file):
    first = command_output("ensure_demo")
    token = demo_token(token_file)
    assert token in first
    command_output("ensure_demo")

    assert demo_token(token_file) == token
    assert auth.endpoint_for_token(token).name == "demo"
    assert Endpoint.objects.filter(name="demo").count() == 1


@pytest.mark.django_db
def test_ensure_demo_never_un_revokes_a_revoked_demo_endpoint(token_file):
    """Defect: ensure_demo silently un-revoked the demo endpoint (issue #11)."""
    command_output("ensure_demo")
    revoked = Endpoint.objects.get(name="demo")
    old_token = demo_token(token_file)
    endpoints.revoke(revoked)
    token_file.write_text("")  # a lost token file: the old code re-keyed and revived

    output = command_output("ensure_demo")

    revoked.refresh_from_db()
    assert revoked.revoked_at is not None
    assert auth.endpoint_for_token(old_token) is None
    fresh = auth.endpoint_for_token(demo_token(token_file))
    assert fresh is not None and fresh.id != revoked.id and fresh.name == "demo"
    assert "revoked" in output
