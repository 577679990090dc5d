"""Settings a deployment must get right: the SECRET_KEY, the installed apps."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.support import ROOT, free_port

SETUP = "import django; django.setup(); print('started')"


def start_django(**env):
    """Load board.settings in a fresh interpreter; return the finished process."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"SECRET_KEY", "DEBUG"}
    }
    environment.update(
        DJANGO_SETTINGS_MODULE="board.settings",
        # Not the checkout's own key file, which `make run` may have made.
        SWITCHBOARD_SECRET_KEY_FILE=str(ROOT / "no-such-key-file"),
    )
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", SETUP],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_a_secret_key_and_debug_off_the_server_refuses_to_start():
    """Defect: production ran on the repo's published development SECRET_KEY."""
    finished = start_django()

    assert finished.returncode != 0
    assert "ImproperlyConfigured" in finished.stderr
    assert "SECRET_KEY is not set" in finished.stderr


KEY_OF = "from django.conf import settings; print(settings.SECRET_KEY)"


def test_without_secret_key_the_settings_read_the_key_file_make_keeps(tmp_path):
    """A command run by hand after `make run` (``manage.py create_endpoint``)
    signs with the key `make` generated into .switchboard-secret-key."""
    key_file = tmp_path / ".switchboard-secret-key"
    key_file.write_text("k3y" * 20)
    finished = subprocess.run(
        [sys.executable, "-c", f"{SETUP}; {KEY_OF}"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}},
            "DJANGO_SETTINGS_MODULE": "board.settings",
            "SWITCHBOARD_SECRET_KEY_FILE": str(key_file),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.stdout.split() == ["started", "k3y" * 20], finished.stderr


def test_the_key_file_the_settings_read_by_default_is_the_one_make_writes():
    makefile = (ROOT / "Makefile").read_text()
    from board import settings as project

    written = re.search(r"^SECRET_KEY_FILE := (\S+)$", makefile, re.M).group(1)
    assert Path(project.SECRET_KEY_FILE) == ROOT / written


def test_the_database_port_the_settings_default_to_is_the_one_devdb_starts():
    """`make` starts the project-local cluster with scripts/devdb.sh; a command
    run by hand without SB_PG_PORT looks for it on the same port."""
    devdb = (ROOT / "scripts" / "devdb.sh").read_text()
    started_on = re.search(r"^port=\$\{SB_PG_PORT:-(\d+)\}$", devdb, re.M).group(1)
    settings_source = (ROOT / "board" / "settings.py").read_text()
    default = re.search(r'env_int\("SB_PG_PORT", (\d+)', settings_source).group(1)
    assert default == started_on


def test_debug_on_starts_with_a_throwaway_key():
    assert start_django(DEBUG="1").stdout.strip() == "started"


def test_a_set_secret_key_starts_with_debug_off():
    assert start_django(SECRET_KEY="k" * 50).stdout.strip() == "started"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_generates_a_local_secret_key_once_and_git_ignores_it(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    environment = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}

    def make_help():
        subprocess.run(
            ["make", "-s", "help"],
            cwd=tmp_path,
            env=environment,
            check=True,
            capture_output=True,
        )
        return (tmp_path / ".switchboard-secret-key").read_text()

    key = make_help()
    assert len(key) >= 40
    assert (tmp_path / ".switchboard-secret-key").stat().st_mode & 0o077 == 0
    assert make_help() == key
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".switchboard-secret-key"], cwd=ROOT
    )
    assert ignored.returncode == 0


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_help_says_where_make_run_serves():
    environment = {**os.environ, "SECRET_KEY": "k" * 50}
    shown = subprocess.run(
        ["make", "-s", "help", "HOST=0.0.0.0", "PORT=8080"],
        cwd=ROOT,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    ).stdout

    [run] = [line for line in shown.splitlines() if line.split()[0] == "run"]
    assert run.rstrip(".").endswith("on 0.0.0.0:8080")
    assert "$(" not in shown


def test_the_unused_admin_and_postgres_apps_are_not_installed():
    assert "django.contrib.admin" not in settings.INSTALLED_APPS
    assert "django.contrib.postgres" not in settings.INSTALLED_APPS


@pytest.mark.parametrize("value", ["10000,5", "a,b,c", "10000,-1,100", "fast"])
def test_bad_gc_thresholds_refuse_to_start(value):
    finished = start_django(DEBUG="1", SWITCHBOARD_GC_THRESHOLDS=value)

    assert finished.returncode != 0
    assert "SWITCHBOARD_GC_THRESHOLDS must be three integers" in finished.stderr


def test_gc_thresholds_default_and_python_and_three_integers(monkeypatch):
    from board.settings import env_gc_thresholds

    assert settings.SWITCHBOARD_GC_THRESHOLDS == (10_000, 5, 100)
    monkeypatch.setenv("SB_TEST_GC", "python")
    assert env_gc_thresholds("SB_TEST_GC", (1, 2, 3)) is None
    monkeypatch.setenv("SB_TEST_GC", " 20000,10,50 ")
    assert env_gc_thresholds("SB_TEST_GC", (1, 2, 3)) == (20_000, 10, 50)
    monkeypatch.delenv("SB_TEST_GC")
    assert env_gc_thresholds("SB_TEST_GC", (1, 2, 3)) == (1, 2, 3)


def test_a_database_url_with_several_hosts_passes_host_and_port_lists():
    from board.settings import database_from_url

    db = database_from_url(
        "postgres://app:s%40cret@db1:5432,db2:5433,[::1]:5434/queue"
        "?target_session_attrs=read-write"
    )

    assert db["HOST"] == "db1,db2,::1"
    assert db["PORT"] == "5432,5433,5434"
    assert (db["USER"], db["PASSWORD"], db["NAME"]) == ("app", "s@cret", "queue")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write"}


def test_a_host_without_a_port_in_a_host_list_gets_postgresql_s_default():
    from board.settings import database_from_url

    db = database_from_url("postgres://db1,db2:6432/queue")

    assert (db["HOST"], db["PORT"]) == ("db1,db2", "5432,6432")


@pytest.mark.parametrize(
    "url",
    ["postgres://db1:5432,db2:99999/q", "postgres://db:port/q", "postgres://[::1/q"],
)
def test_a_database_url_with_a_bad_host_or_port_refuses_to_start(url):
    finished = start_django(DEBUG="1", DATABASE_URL=url)

    assert finished.returncode != 0
    assert "ImproperlyConfigured" in finished.stderr
    assert "DATABASE_URL" in finished.stderr


@pytest.mark.django_db
def test_the_app_connects_to_the_writable_server_of_a_host_list():
    """With the first host down, the request pool and the hub's LISTEN connection
    both reach the next one (libpq's multi-host failover, read-write)."""
    db = settings.DATABASES["default"]
    url = (
        f"postgres://{db['USER']}@127.0.0.1:{free_port()},"
        f"{db['HOST']}:{db['PORT']}/{db['NAME']}?target_session_attrs=read-write"
    )
    probe = (
        "import asyncio; from django.db import connection; "
        "from todos.waiting import doorbell; "
        "connection.ensure_connection(); "
        "print(connection.connection.info.port, "
        "asyncio.run(doorbell._connect()).info.port)"
    )
    finished = subprocess.run(
        [sys.executable, "-c", f"{SETUP}; {probe}"],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "1", "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.stdout.split() == ["started", db["PORT"], db["PORT"]], finished
