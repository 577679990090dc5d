"""Resilience: a PostgreSQL restart, a statement timeout and a killed backend.

The short version of scripts/resilience.py, run once for the whole module: its
own throwaway PostgreSQL cluster (a free port, a temporary data folder, stopped
and deleted even when a check fails), gunicorn and ``sweep --loop`` on it,
producer and worker threads over HTTP, PostgreSQL stopped and started under
them. It never touches the test database or the team's cluster.
"""

import pytest

from tests.support import load_resilience_script

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report():
    resilience = load_resilience_script("resilience")
    return resilience.run(
        resilience.Options(
            seconds=8,
            outage=2,
            workers=3,
            producers=2,
            crash_rate=0.1,
            drain_timeout=30,
        )
    )


def test_api_answers_503_json_while_postgres_is_down(report):
    assert report.down_answers
    for answer in report.down_answers:
        assert " -> 503 unavailable" in answer, report.down_answers


def test_api_serves_again_within_seconds_after_postgres_restarts(report):
    assert report.recovery_seconds is not None
    assert report.recovery_seconds < 10


def test_no_acknowledged_todo_is_lost_across_the_restart(report):
    """SPEC: Crashed worker's todo is re-claimable."""
    assert report.created > 0
    assert report.lost == 0
    assert report.unfinished == 0
    assert report.completed == report.created + report.duplicate_rows


def test_abandoned_leases_are_redelivered(report):
    """SPEC: Crashed worker's todo is re-claimable."""
    assert report.crashes > 0
    assert report.redelivered > 0


def test_no_todo_is_completed_twice(report):
    """SPEC: Only the lease owner may complete or fail."""
    assert report.completed_twice == 0


def test_sweep_loop_keeps_reaping_after_the_restart_and_stops_on_sigterm(report):
    """SPEC: Graceful shutdown drains cleanly."""
    assert report.sweep_alive_after_restart
    assert report.sweep_reaped_after_restart_seconds is not None
    assert report.sweep_exit_status == 0


def test_statement_timeout_answers_503_and_leaves_the_todo_claimed(report):
    outcome = report.statement_timeout
    assert outcome["status"] == 503 and outcome["error"] == "unavailable"
    assert outcome["state_after"] == ["claimed", "victim"]
    assert outcome["complete_afterwards"] == 200


def test_killed_backend_answers_503_and_the_next_request_reconnects(report):
    outcome = report.killed_backend
    assert outcome["terminated"]
    assert outcome["status"] == 503 and outcome["error"] == "unavailable"
    assert outcome["state_after"] == ["claimed", "victim"]
    assert outcome["complete_afterwards"] == 200


def test_every_answer_was_clean_json_and_every_check_passed(report):
    assert report.bad_responses == []
    assert "500" not in report.statuses
    assert report.failures == []
