"""scripts/trace_screenshot.py redraws docs/operations.md's trace from a real run:
gunicorn with tracing on, the client's worker, the OTLP receiver, Chromium."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"Debian's chromium is not installed at {CHROMIUM}",
    ),
]


@pytest.fixture
def database_url(django_db_setup, django_db_blocker):
    """A database of the script's own, on the test database's server."""
    from django.db import connection

    given = connection.settings_dict
    host, port = given["HOST"] or "127.0.0.1", given["PORT"] or 5432
    user = given["USER"] or "postgres"
    return f"postgres://{user}@{host}:{port}/switchboard_trace_demo_test"


def test_the_trace_picture_is_drawn_from_the_spans_a_real_run_exported(
    tmp_path, database_url
):
    out, page = tmp_path / "trace.png", tmp_path / "trace.html"
    done = subprocess.run(
        [
            sys.executable,
            "scripts/trace_screenshot.py",
            "--database-url",
            database_url,
            "--out",
            str(out),
            "--html",
            str(page),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "7 spans in 2 traces" in done.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = page.read_text()
    for name in (
        "pipeline #812: request review",
        "send reviews",
        "process reviews",
        "chat claude-sonnet",
        "settle reviews",
        "question asked",
        "answered",
        "linked to process reviews",
    ):
        assert name in drawn, name
