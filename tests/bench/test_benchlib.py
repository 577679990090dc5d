"""bench/benchlib.py, the helpers every benchmark shares."""

import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.support import database_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import benchlib  # noqa: E402


def finish_in_reverse(index, count):
    """A worker loop whose process finishes later the lower its index."""

    def ready(stop_at):
        time.sleep(0.3 * (count - 1 - index))
        return {"index": index, "done": 1}

    return ready


def test_run_processes_answers_in_index_order_not_finishing_order():
    """A benchmark labels each outcome by its position (claim_latency's
    "beside" and "alone" tables): answering in the order the processes
    finished labelled the slower one wrongly."""
    outcomes = benchlib.run_processes(finish_in_reverse, 3, 0.1, args=(3,))
    assert [item["index"] for item in outcomes] == [0, 1, 2]


@pytest.mark.django_db
def test_postgres_cpu_counts_the_clusters_backends_as_they_work():
    """peers.py's PostgreSQL CPU per todo: the cluster's processes, found from
    a backend's parent, and the work of a backend that has already exited."""
    url = database_url()
    if urlsplit(url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        pytest.skip("the test database runs on another machine")
    postgres = benchlib.PostgresCpu(url)
    assert postgres.available
    before = postgres.cpu_seconds()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    # That backend is gone: its CPU is the postmaster's reaped children's now.
    time.sleep(0.2)
    assert postgres.cpu_seconds() - before >= 0.05


def reloptions(conn, table):
    row = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [table]
    ).fetchone()
    return row[0]


@pytest.mark.django_db
def test_a_settled_table_keeps_autovacuum_off_only_while_it_is_held():
    """peers.py holds autovacuum off on the tables it fills while it measures
    (an autovacuum worker inside a window swung PostgreSQL's CPU per todo
    twofold), and gives each table its own setting back afterwards."""
    url = database_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_settled (n int)")
        try:
            benchlib.settle(conn, url, "bench_settled")
            assert reloptions(conn, "bench_settled") is None
            with benchlib.autovacuum_held():
                benchlib.settle(conn, url, "bench_settled")
                held = reloptions(conn, "bench_settled")
            assert held == ["autovacuum_enabled=false"]
            assert reloptions(conn, "bench_settled") is None
        finally:
            conn.execute("DROP TABLE bench_settled")


def test_the_server_budget_is_the_machines_cpu_at_the_target_rate_less_the_others():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import peers
    import report

    median = {
        "pgqueuer1": {"rate": 1000.0, "peer": None},
        "http": {
            "rate": 400.0,
            "peer": "pgqueuer1",
            "client_cpu_ms_per_todo": 0.5,
            "postgres_cpu_ms_per_todo": 1.0,
        },
    }
    # 2 cores at 1 000 todos/s (the target, 1.0x the peer): 2 ms per todo in all.
    assert peers.server_budget("http", median, cores=2) == pytest.approx(0.5)
    assert peers.server_budget("http", median, cores=1) == pytest.approx(-0.5)
    assert report.budget_sentence(0.5) == "0.50 ms of CPU per todo"
    assert report.budget_sentence(-0.5).startswith("nothing")
    # No target, or a missing figure: no budget.
    assert peers.server_budget("pgqueuer1", median, cores=2) is None
    del median["http"]["postgres_cpu_ms_per_todo"]
    assert peers.server_budget("http", median, cores=2) is None


def test_a_results_command_leaves_out_where_the_record_went():
    """A committed result's command is the run as it measured: --results-dir
    (a scratch folder) is not part of it, in either spelling."""
    given = [
        "--reps",
        "5",
        "--results-dir",
        "/tmp/a",
        "--quick",
        "--results-dir=/tmp/b",
    ]
    assert benchlib._measuring(given) == ["--reps", "5", "--quick"]


def test_tracing_overhead_is_the_median_of_each_reps_own_slowdown():
    """bench/tracing.py's slowdown pairs each mode with bare in the same rep
    (they ran in turns, under the same load). The ratio of the medians of the
    figures mixed reps: here it said 20% where the reps said 0%, 20% and 5%."""
    import tracing

    def rep(on, bare):
        part = {"figures": {"on": on, "off": bare, "bare": bare}}
        part["slowdown"] = tracing.slowdown(part["figures"], "drain")
        return part

    parts = [rep(100, 100), rep(100, 120), rep(120, 126)]
    reps = [
        {f"{path}_{phase}": part for path, phase in tracing.PARTS} for part in parts
    ]
    drain = tracing.medians(reps)["http_drain"]
    assert drain["figures"]["on"] == 100 and drain["figures"]["bare"] == 120
    assert drain["slowdown"]["on"] == pytest.approx(0.05)
    assert drain["reps"]["on"] == pytest.approx([0.0, 0.2, 0.05])
