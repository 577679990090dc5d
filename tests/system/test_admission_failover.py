"""The randomized admission run (bench/admission_run.py --ha), short, on a
throwaway Patroni pair whose primary is killed mid-run: the processes live
through the outage (a call that meets no primary is tried again) and the
checker, replaying the new primary's events, finds no limit exceeded.

Marked long (about a minute): make test-long and CI run it, make test does not.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_a_randomized_run_never_exceeds_a_limit_with_the_primary_killed(tmp_path):
    """CONTRACT §17 Exactness, across a failover: the run kills the primary a
    few seconds in, Patroni promotes the standby, and the run exits 0 only
    when a new primary took over and the checker found no violation."""
    missing = [tool for tool in ("patroni", "etcd") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not installed (scripts/system-deps.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the failover runs: {reason}")
        pytest.skip(reason)
    done = subprocess.run(
        [
            sys.executable,
            "bench/admission_run.py",
            "--quick",
            "--ha",
            "--operations",
            "12000",
            "--kill-after",
            "2",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, tail
    assert re.search(r"\bviolations\s+0\n", done.stdout), tail
    assert re.search(r"\bprimary_killed\s+pg[12]\n", done.stdout), tail
    assert re.search(r"\bnew_primary_after_seconds\s+[0-9.]+\n", done.stdout), tail
    assert re.search(r"\berrors\s+0\n", done.stdout), tail
    assert (tmp_path / "admission_run_ha.json").exists()
