"""The scripts run by hand: devdb.sh and resilience.py."""

import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support import ROOT

DEVDB = str(ROOT / "scripts" / "devdb.sh")


def devdb(action, port):
    environment = {**os.environ, "SB_PG_PORT": str(port)}
    return subprocess.run(
        [DEVDB, action], capture_output=True, text=True, env=environment, timeout=60
    )


@pytest.fixture
def suite_port():
    """The port of the project-local cluster the suite runs on (else skip)."""
    port = settings.DATABASES["default"]["PORT"]
    status = devdb("status", port or 0).stdout
    if (
        not port
        or not status.startswith("running")
        or not status.strip().endswith(f":{port}")
    ):
        pytest.skip("the suite does not run on this checkout's project-local cluster")
    return int(port)


@pytest.mark.parametrize("action", ["stop", "start"])
def test_devdb_refuses_a_cluster_running_on_another_port_than_asked(suite_port, action):
    """Asked for port N, devdb.sh neither stops nor reuses the checkout's cluster
    that runs on port M: it says so, exits 1, and the cluster runs on."""
    asked = suite_port + 1
    answer = devdb(action, asked)

    assert answer.returncode == 1
    assert f"runs on port {suite_port}, not {asked}" in answer.stderr
    assert devdb("status", suite_port).stdout.startswith("running")


def test_resilience_without_a_secret_key_says_what_to_set():
    """Run by hand without SECRET_KEY, resilience.py says what to set and exits
    2, instead of a traceback from the first manage.py it starts."""
    environment = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    answer = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "resilience.py"), "--seconds", "1"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )

    assert answer.returncode == 2
    assert "SECRET_KEY is not set" in answer.stderr
    assert "Traceback" not in answer.stderr
