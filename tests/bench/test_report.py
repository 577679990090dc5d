"""The benchmarks as tools: each answers --help, the cheap ones run at quick
sizes, and the docs' marked tables match the committed result files."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPTS = (
    "store_vs_sql",
    "claim_latency",
    "peers",
    "waiting_agents",
    "doorbell_latency",
    "failover_cost",
    "board",
    "worker_runtime",
    "admission_run",
    "admission",
    "schedule_lateness",
    "tracing",
    "budgets",
)
sys.path.insert(0, str(BENCH))
import report  # noqa: E402


def run(*command, timeout=120):
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_holds_the_thirteen_scripts_their_helpers_the_floor_and_the_profiler():
    found = {path.stem for path in BENCH.glob("*.py")}
    helpers = {"benchlib", "report", "floor_server", "profile_served", "profile_phases"}
    helpers |= {"tracing_bare"}
    assert found == {*SCRIPTS, *helpers}
    assert set(report.RENDERERS) == {*SCRIPTS, *report.ALSO_WRITTEN}
    assert {run.split(".py")[0] for run in report.ALSO_WRITTEN.values()} <= {*SCRIPTS}


@pytest.mark.parametrize("name", [*SCRIPTS, "report", "profile_served"])
def test_each_bench_script_explains_itself_with_help(name):
    done = run(f"bench/{name}.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "Question:" in done.stdout or name == "report"
    assert f"bench/{name}.py" in done.stdout


def test_the_docs_marked_tables_match_the_committed_result_files():
    done = run("bench/report.py", "--check", "--committed")
    assert done.returncode == 0, done.stderr


def marked_page(tmp_path, monkeypatch, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    monkeypatch.setattr(report, "doc_pages", lambda: [page])
    monkeypatch.setattr(report, "ROOT", tmp_path)
    return page


def test_check_fails_on_a_marker_that_names_no_benchmark(tmp_path, monkeypatch):
    marked_page(
        tmp_path, monkeypatch, "<!-- bench:nothing -->\n<!-- /bench:nothing -->\n"
    )
    problems = report.sync_docs(write=False, committed_only=True)
    assert problems == ["page.md: marker bench:nothing names no benchmark"]


def test_check_fails_on_a_marker_whose_result_file_is_missing(tmp_path, monkeypatch):
    marked_page(tmp_path, monkeypatch, "<!-- bench:board -->\n<!-- /bench:board -->\n")
    monkeypatch.setattr(report, "LATEST", tmp_path / "none")
    problems = report.sync_docs(write=False, committed_only=False)
    assert problems == ["page.md: no result file for bench:board"]


def quick_result(tmp_path, name, database_url, *extra, timeout=120):
    done = run(
        f"bench/{name}.py",
        "--quick",
        "--database-url",
        database_url,
        "--results-dir",
        str(tmp_path),
        *extra,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def bench_database_url(django_db_setup, django_db_blocker):
    """A database of the quick runs' own, on the test database's server."""
    from django.db import connection

    given = connection.settings_dict
    host, port = given["HOST"] or "127.0.0.1", given["PORT"] or 5432
    user = given["USER"] or "postgres"
    return f"postgres://{user}@{host}:{port}/switchboard_bench_smoke"


def test_docs_check_then_rewrite_a_quick_result_labelled_quick(
    tmp_path, monkeypatch, bench_database_url
):
    """A quick doorbell run writes its file; --docs puts its table between the
    markers, labelled (quick); --check then passes."""
    data = quick_result(tmp_path, "doorbell_latency", bench_database_url)
    assert data["quick"] is True
    assert data["command"].startswith("python bench/doorbell_latency.py --quick")
    assert {"cores", "memory_gib", "kernel", "postgresql", "python"} <= set(
        data["machine"]
    )
    assert set(data["load_average"]) == {"before", "after"}
    assert data["results"]["http"]["count"] == 5
    page = marked_page(
        tmp_path,
        monkeypatch,
        "Before.\n<!-- bench:doorbell_latency -->\nold\n"
        "<!-- /bench:doorbell_latency -->\n",
    )
    monkeypatch.setattr(report, "LATEST", tmp_path)
    assert report.sync_docs(write=False, committed_only=False) == [
        "page.md: bench:doorbell_latency differs from its file"
    ]
    report.sync_docs(write=True, committed_only=False)
    text = page.read_text()
    assert "**(quick)**" in text and "old" not in text
    assert text.startswith("Before.\n<!-- bench:doorbell_latency -->\n")
    assert report.sync_docs(write=False, committed_only=False) == []


def test_store_vs_sql_runs_at_quick_sizes(tmp_path, bench_database_url):
    data = quick_result(tmp_path, "store_vs_sql", bench_database_url)
    moves = data["results"]["claim_complete"][0]
    assert moves["plain"]["done"] > 0 and moves["store"]["done"] > 0
    assert [run["workload"] for run in data["results"]["create"]] == [
        "no-key",
        "unique-keys",
        "duplicates",
    ]
    assert "Claim+complete:" in report.render(data)


def test_board_runs_at_quick_sizes(tmp_path, bench_database_url):
    data = quick_result(
        tmp_path, "board", bench_database_url, "--todos", "3000", "--history", "15000"
    )
    assert {page["status"] for page in data["results"]["pages"]} == {200}
    assert "median ms" in report.render(data)


@pytest.mark.slow
def test_admission_runs_at_quick_sizes(tmp_path, bench_database_url):
    """The admission bench's parts run and its table renders; a quick run's
    figures are a smoke test, not a measurement, so only the orders are held."""
    data = quick_result(
        tmp_path,
        "admission",
        bench_database_url,
        "--port",
        os.environ.get("BENCH_HTTP_PORT", "0"),
        timeout=300,
    )
    results = data["results"]
    assert results["fairness"]["small_claimed"] == {"alone": 5, "flood": 5}
    weights = results["fairness"]["weights"]
    assert weights["weight_1"] + weights["weight_3"] == 200
    assert results["cheap_store"]["all"]["done"] > 0
    assert results["cheap_http"]["all"]["done"] > 0
    assert results["cheap_store"]["reps"] == [results["cheap_store"]["all_over_none"]]
    assert results["deep"]["groups_at_limit"] == 250
    assert results["priority"]["urgent_claimed_next"] is True
    assert results["aging"]["level_5_claimed_after_seconds"] is not None
    assert "weight 3 / weight 1" in report.render(data)


def test_schedule_lateness_runs_at_quick_sizes(tmp_path, bench_database_url):
    """A few schedules fire their one slot under the sweep loop, each once;
    the quick run's lateness is a smoke figure, so only its presence is held."""
    data = quick_result(tmp_path, "schedule_lateness", bench_database_url)
    results = data["results"]
    assert results["slots_expected"] == results["slots_fired"] == 4
    assert results["slots_missing"] == results["slots_doubled"] == 0
    assert results["lateness_seconds"]["p99"] is not None
    assert results["sweep_exit_code"] == 0
    assert "lateness p99 (s)" in report.render(data)


def test_the_bare_build_strips_every_tracing_hook_the_code_calls():
    """bench/tracing.py's "bare" mode is the code without its tracing only if
    every function of todos.telemetry.tracing the rest calls is replaced."""
    import tracing_bare

    from todos.telemetry import tracing

    called = set()
    for top in ("todos", "board"):
        for path in (ROOT / top).rglob("*.py"):
            if path != ROOT / "todos" / "telemetry" / "tracing.py":
                called |= set(re.findall(r"\btracing\.([a-z_]+)\(", path.read_text()))
    assert called, "the scan found no call"
    assert called <= set(tracing_bare.noops(tracing))


@pytest.mark.slow
def test_tracing_runs_at_quick_sizes(tmp_path, bench_database_url):
    """The three modes serve and drain, the on mode's spans reach the receiver,
    and the bare mode keeps no context; a quick run's ratios are a smoke
    figure, so only their presence is held."""
    data = quick_result(
        tmp_path,
        "tracing",
        bench_database_url,
        "--port",
        os.environ.get("BENCH_HTTP_PORT", "0"),
        timeout=300,
    )
    results = data["results"]
    [rep] = results["reps"]
    for part in ("http_create", "http_drain", "store_create", "store_drain"):
        assert all(rep[part]["done"][mode] > 0 for mode in ("on", "off", "bare"))
    for part in ("http_create", "store_create"):
        kept = rep[part]["contexts_kept"]
        assert kept["bare"]["kept"] == 0
        assert kept["on"]["kept"] == kept["on"]["todos"] > 0
        assert kept["off"]["kept"] == kept["off"]["todos"] > 0
    spans = results["spans_received"]
    assert spans["send"] >= results["on_todos"]["created"]
    assert spans["process"] >= results["on_todos"]["drained"]
    assert spans["settle"] == spans["process"]
    assert "on vs bare" in report.render(data)


def peers_data(**figures):
    row = {"label": "HTTP single", "rate": 500.0, "ratio": 0.5, "peer": "pgqueuer1"}
    median = {
        "pgqueuer1": {
            "label": "pgqueuer batch 1",
            "rate": 1000.0,
            "ratio": None,
            "peer": None,
        },
        "http": {**row, **figures},
    }
    return {
        "parameters": {"workers": 4, "seconds": 8},
        "results": {
            "median": median,
            "reps": [{"load_before": [0.1], "load_after": [1.0]}],
        },
    }


def test_the_peers_table_shows_only_the_cpu_figures_its_result_file_has():
    old = report.peers(peers_data(server_cpu_ms_per_todo=1.5))
    assert "| path | todos/s | vs peer | server CPU |" in old
    assert "PostgreSQL CPU" not in old and "left of the machine" not in old
    new = report.peers(
        peers_data(
            client_cpu_ms_per_todo=0.4,
            server_cpu_ms_per_todo=1.5,
            postgres_cpu_ms_per_todo=1.1,
            server_budget_ms_per_todo=-0.2,
        )
    )
    assert "| vs peer | client CPU | server CPU | PostgreSQL CPU |" in new
    assert "| HTTP single | 500 | 0.50× pgqueuer batch 1 | 0.40 | 1.50 | 1.10 |" in new
    assert "HTTP single: nothing (its clients and PostgreSQL alone" in new


def test_the_peers_report_gives_each_served_paths_ratio_to_its_floor_in_turns():
    """Each served path's ratio to its floor, taken in turns beside it, is the
    median over the reps, with every rep's ratio in the table."""
    import peers

    reps = [
        {"side_by_side": {"httpfloorstore": {"ratios": {"http": ratio}}}}
        for ratio in (0.6, 0.7, 0.65)
    ]
    floors = peers.floor_ratios(reps)
    assert floors == {
        "http": {
            "label": peers.PATHS["http"].label,
            "floor": "httpfloorstore",
            "ratio": 0.65,
            "reps": [0.6, 0.7, 0.65],
        }
    }
    data = peers_data()
    data["results"]["floors"] = floors
    data["results"]["median"]["httpfloorstore"] = {
        "label": "HTTP floor: the store's SQL",
        "rate": 800.0,
        "ratio": None,
        "peer": None,
    }
    text = report.peers(data)
    assert "| path | floor | vs floor | reps |" in text
    assert (
        "| HTTP single claim+complete | HTTP floor: the store's SQL | 0.65× "
        "| 0.60, 0.70, 0.65 |"
    ) in text
    assert "vs floor" not in report.peers(peers_data())


def test_the_admission_cheapness_figure_is_the_median_reps():
    """Repeated cheapness runs report the rep whose ratio is the median (the
    lower middle one of an even count), its rates with it, and every rep's
    ratio."""
    import admission

    runs = [
        {"all_over_none": ratio, "all": {"rate": ratio * 100}, "none": {"rate": 100}}
        for ratio in (0.7, 0.9, 0.8, 0.6)
    ]
    median = admission.median_rep(runs)
    assert median["all_over_none"] == 0.7 and median["all"]["rate"] == 70
    assert median["reps"] == [0.7, 0.9, 0.8, 0.6]
    assert admission.median_rep(runs[:3])["all_over_none"] == 0.8
