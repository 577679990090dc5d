"""manage.py as a user runs it by hand from the checkout after `make run`: no
SECRET_KEY in the shell (the settings read the key `make` keeps), its help, and
what it says when the database is not where it looked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

from tests.support import ROOT, database_url
from todos.models import Endpoint

PROJECT_COMMANDS = sorted(
    path.stem
    for path in (ROOT / "todos" / "management" / "commands").glob("*.py")
    if not path.stem.startswith("_")
)


@pytest.fixture
def key_file(tmp_path):
    """The .switchboard-secret-key `make run` leaves in the checkout."""
    path = tmp_path / ".switchboard-secret-key"
    path.write_text("a-local-key-make-generated-" * 3)
    path.chmod(0o600)
    return path


def manage(*args, key_file, **env):
    """Run manage.py as a shell would after `make run`: no SECRET_KEY exported."""
    environment = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY"}}
    environment.pop("DJANGO_SETTINGS_MODULE", None)
    environment.update(SWITCHBOARD_SECRET_KEY_FILE=str(key_file), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manage_py_help_lists_the_projects_commands_after_make_run(key_file):
    finished = manage("--help", key_file=key_file)

    assert finished.returncode == 0, finished.stderr
    listed = finished.stdout.split("[todos]", 1)[1].split()
    assert set(PROJECT_COMMANDS) <= set(listed)
    assert "settings are not properly configured" not in finished.stderr


@pytest.mark.parametrize("name", PROJECT_COMMANDS)
def test_each_project_command_says_what_it_does_and_what_each_option_means(name):
    assert get_commands()[name] == "todos"
    command = load_command_class("todos", name)
    parser = command.create_parser("manage.py", name)

    assert len(command.help) > 40
    unexplained = [
        action.dest
        for action in parser._actions
        if not action.help and action.dest != "help"
    ]
    assert unexplained == []


@pytest.mark.django_db(transaction=True)
def test_create_endpoint_run_by_hand_after_make_run_prints_a_token(key_file):
    """The README's `python manage.py create_endpoint …`, from the checkout,
    with the key `make run` keeps and no SECRET_KEY in the shell."""
    finished = manage(
        "create_endpoint",
        "reviewer",
        "--owner",
        "alice",
        "--queues",
        "reviews",
        "--json",
        key_file=key_file,
        DATABASE_URL=database_url(),
    )

    assert finished.returncode == 0, finished.stderr
    printed = json.loads(finished.stdout)
    assert printed["token"].startswith("sb_")
    assert Endpoint.objects.get(pk=printed["endpoint_id"]).name == "reviewer"


def test_a_command_that_cannot_reach_the_database_names_the_host_and_port(key_file):
    finished = manage(
        "create_endpoint",
        "reviewer",
        "--owner",
        "alice",
        "--queues",
        "reviews",
        key_file=key_file,
        # Port 1 refuses connections at once: an outage without stopping anything.
        DATABASE_URL="postgres://postgres@127.0.0.1:1/switchboard",
        SWITCHBOARD_DB_POOL_TIMEOUT="1",
    )

    assert finished.returncode == 1
    last_lines = finished.stderr.strip().splitlines()[-3:]
    assert "cannot reach the database 'switchboard' at 127.0.0.1:1" in "".join(
        last_lines
    )
    assert "SB_PG_PORT" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_the_commands_the_docs_show_run_the_checkouts_python():
    """A fresh clone's `python` has no Django: the docs run manage.py with the
    virtualenv's interpreter, as `make` does."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bare = [
        f"{Path(page).name}: {line.strip()}"
        for page in pages
        for line in page.read_text().splitlines()
        if "python manage.py" in line and ".venv/bin/python manage.py" not in line
    ]
    assert bare == []
