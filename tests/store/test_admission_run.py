"""The randomized admission run (bench/admission_run.py), short: real worker
processes through two served app servers (and one on the store), a running
reaper and limits moving, then the checker.

Marked long (about a minute): make test-long and CI run it, make test does not.
"""

import re
import subprocess
import sys

import pytest

from tests.support import ROOT, database_url

pytestmark = [pytest.mark.long, pytest.mark.django_db(transaction=True)]


def test_a_randomized_run_of_real_processes_never_exceeds_a_limit(tmp_path):
    """CONTRACT §17 Exactness: processes claiming (single, batch and by id)
    over two app servers' JSON API and on the store, completing, failing,
    releasing, asking, cancelling, leases lapsing under a running reaper,
    limits lowered and raised: the checker finds no group over its limit and
    no rate window over its bucket (the run exits 0 only then)."""
    url = database_url().rsplit("/", 1)[0] + "/switchboard_admission_run"
    done = subprocess.run(
        [
            sys.executable,
            "bench/admission_run.py",
            "--quick",
            "--database-url",
            url,
            "--results-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\bviolations\s+0\n", done.stdout), done.stdout[-3000:]
    assert re.search(r"\bapp_servers\s+2\n", done.stdout), done.stdout[-3000:]
    assert re.search(r"\berrors\s+0\n", done.stdout), done.stdout[-3000:]
    assert (tmp_path / "admission_run.json").exists()
