"""PgBouncer for real: the resilience run through Debian's pgbouncer.

scripts/resilience.py with ``pgbouncer=True``: a throwaway PostgreSQL cluster,
PgBouncer in transaction mode in front of it, two app servers (gunicorn with
uvicorn workers) whose request connections go through PgBouncer and whose
doorbell LISTEN goes around it, the sweep loop, producers and long-polling
workers over HTTP; PostgreSQL restarted under them. Nothing is lost, nothing
is completed twice, and after the restart each server's doorbell hub has
reconnected its LISTEN: a waiting claim wakes within two seconds of a create.
"""

import pytest

from tests.support import load_resilience_script

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report():
    resilience = load_resilience_script("resilience_pgbouncer")
    if resilience.pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (scripts/system-deps.sh installs it)")
    return resilience.run(
        resilience.Options(
            seconds=8,
            outage=2,
            workers=3,
            producers=2,
            crash_rate=0.1,
            drain_timeout=30,
            pgbouncer=True,
        )
    )


def test_the_run_went_through_pgbouncer_to_two_app_servers(report):
    assert report.through_pgbouncer and report.servers == 2


def test_no_todo_is_lost_or_completed_twice_through_pgbouncer(report):
    assert report.created > 0
    assert report.lost == 0
    assert report.completed_twice == 0
    assert report.duplicate_rows == 0
    assert report.unfinished == 0


def test_the_api_answers_503_json_while_postgres_is_down_behind_pgbouncer(report):
    assert report.down_answers
    for answer in report.down_answers:
        assert " -> 503 unavailable" in answer, report.down_answers


def test_each_servers_listen_reconnects_after_a_postgres_restart(report):
    assert len(report.wake_after_restart_seconds) == 2
    for seconds in report.wake_after_restart_seconds:
        assert seconds is not None and seconds < 2


def test_statement_timeout_and_killed_backend_answer_503_behind_pgbouncer(report):
    for outcome in (report.statement_timeout, report.killed_backend):
        assert outcome["status"] == 503 and outcome["error"] == "unavailable"
        assert outcome["state_after"] == ["claimed", "victim"]
        assert outcome["complete_afterwards"] == 200


def test_every_check_of_the_pgbouncer_run_passed(report):
    assert not report.failures, report.failures
