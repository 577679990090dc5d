"""Settings a deployment must get right: the SECRET_KEY, the installed apps."""

import os
import shutil
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support import ROOT

SETUP = "import django; django.setup(); print('started')"


def start_django(**env):
    """Load board.settings in a fresh interpreter; return the finished process."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"SECRET_KEY", "DEBUG"}
    }
    environment.update(DJANGO_SETTINGS_MODULE="board.settings", **env)
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
