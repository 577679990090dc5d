"""GET /metrics: who may read it, what it says, and Debian's promtool accepts it."""

import shutil
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.support import deadlocked
from todos import store
from todos.store import stats

TOKEN = "metrics-scraper-token-0123456789"


@pytest.fixture
def staff(db):
    client = Client()
    client.force_login(
        get_user_model().objects.create_user("ops", password="x", is_staff=True)
    )
    return client


def samples(response):
    """{(metric sample name, frozenset of labels): value} of an exposition."""
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            labels = dict(sample.labels)
            labels.pop("endpoint_id", None)
            found[(sample.name, frozenset(labels.items()))] = sample.value
    return found


def test_metrics_without_credentials_answer_401(client, db, settings):
    settings.SWITCHBOARD_METRICS_TOKEN = TOKEN

    response = client.get("/metrics")

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_metrics_refuse_a_wrong_token_and_any_token_when_none_is_set(
    client, db, settings
):
    settings.SWITCHBOARD_METRICS_TOKEN = TOKEN
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    settings.SWITCHBOARD_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 401
    )


def test_metrics_refuse_a_board_session_that_is_not_staff(client, make_endpoint):
    owner = make_endpoint("agent", owner="alice").owner
    client.force_login(owner)

    assert client.get("/metrics").status_code == 403


def test_metrics_are_readable_with_the_bearer_token(client, db, settings):
    settings.SWITCHBOARD_METRICS_TOKEN = TOKEN

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")


@pytest.mark.django_db(transaction=True)
def test_metrics_stopped_by_a_deadlock_answer_a_busy_503_not_unavailable(
    client, settings
):
    """/metrics only reads, but a read can wait behind a table lock whose
    holder then waits for it: PostgreSQL stops the read. The database is up
    and busy, and the answer says so, with Retry-After."""
    settings.SWITCHBOARD_METRICS_TOKEN = TOKEN

    outcome = deadlocked(
        lambda: client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"),
        "LOCK TABLE todos IN ACCESS EXCLUSIVE MODE",
        [],
    )

    response = outcome["returned"]
    assert response.status_code == 503
    assert response.content == b"database busy; try again\n"
    assert response["Retry-After"] == "1"


def test_metrics_report_gauges_and_transition_counters_per_queue(
    staff, scope, time_travel
):
    for _ in range(3):
        store.create_todo(scope, queue="q")
    old, _ = store.create_todo(scope, queue="q")
    time_travel(old.id, created_at=-120, available_at=-120)
    busy, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, busy.id, "w")
    store.create_todo(scope, queue="q", delay_seconds=600)
    retry, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, retry.id, "w")
    store.fail_todo(scope, retry.id, "w", error="x")
    dead, _ = store.create_todo(scope, queue="other", max_attempts=1)
    store.claim_todo(scope, dead.id, "w")
    store.fail_todo(scope, dead.id, "w", error="boom")
    stats.roll_up_minutes()

    found = samples(staff.get("/metrics"))

    def value(name, queue, **labels):
        key = frozenset({"endpoint": "agent-a", "queue": queue, **labels}.items())
        return found[(name, key)]

    assert value("switchboard_todos", "q", state="pending") == 4
    assert value("switchboard_todos", "q", state="claimed") == 1
    assert value("switchboard_todos", "q", state="retry_scheduled") == 1
    assert value("switchboard_todos", "other", state="dead_letter") == 1
    assert value("switchboard_todos", "q", state="delayed") == 1
    assert 115 <= value("switchboard_oldest_pending_age_seconds", "q") <= 200
    assert value("switchboard_transitions_total", "q", transition="created") == 7
    assert value("switchboard_transitions_total", "q", transition="claimed") == 2
    assert value("switchboard_transitions_total", "q", transition="failed") == 1
    assert (
        value("switchboard_transitions_total", "other", transition="dead_lettered") == 1
    )


def test_metrics_report_open_questions_their_age_and_cancels(staff, scope, time_travel):
    asked, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, asked.id, "w")
    store.ask(scope, asked.id, "w", question="Ship it?")
    time_travel(asked.id, asked_at=-90)
    store.create_todo(scope, queue="q", delay_seconds=600)
    pending, _ = store.create_todo(scope, queue="q")
    store.cancel_todo(scope, pending.id)
    busy, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, busy.id, "w")
    store.cancel_todo(scope, busy.id)
    store.release_todo(scope, busy.id, "w")
    stats.roll_up_minutes()

    found = samples(staff.get("/metrics"))

    def value(name, **labels):
        key = frozenset({"endpoint": "agent-a", "queue": "q", **labels}.items())
        return found[(name, key)]

    assert value("switchboard_todos", state="held") == 1
    assert value("switchboard_todos", state="delayed") == 1
    assert 85 <= value("switchboard_oldest_question_age_seconds") <= 200
    assert value("switchboard_cancels_total") == 2
    # A cancel's composed claim and its done are no claim or completion.
    assert value("switchboard_transitions_total", transition="claimed") == 2
    assert value("switchboard_transitions_total", transition="completed") == 0


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="Debian's prometheus package (promtool) is not installed "
    "(scripts/system-deps.sh installs it)",
)
def test_metrics_pass_promtool_check_metrics(staff, scope, other_scope):
    store.create_todo(scope, queue="q")
    dead, _ = store.create_todo(other_scope, queue='we"ird\\queue', max_attempts=1)
    store.claim_todo(other_scope, dead.id, "w")
    store.fail_todo(other_scope, dead.id, "w", error="boom")
    stats.roll_up_minutes()
    exposition = staff.get("/metrics").content

    checked = subprocess.run(
        ["promtool", "check", "metrics"],
        input=exposition,
        capture_output=True,
        timeout=30,
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert b"switchboard_todos{" in exposition


def test_metrics_count_schedule_fires_skips_and_lateness(staff, scope):
    from tests.support import DatabaseClock

    clock = DatabaseClock().install("2026-03-27T00:00:00Z").use()
    store.create_schedule(
        scope, name="nightly", queue="q", every_seconds=60, missed="one"
    )
    clock.advance(seconds=181)
    store.fire_due_schedules()

    found = samples(staff.get("/metrics"))

    labels = frozenset(
        {("endpoint", "agent-a"), ("schedule", "nightly"), ("queue", "q")}
    )
    assert found[("switchboard_schedule_fires_total", labels)] == 1
    assert found[("switchboard_schedule_skips_total", labels)] == 2
    assert found[("switchboard_schedule_lateness_seconds_total", labels)] > 0


def test_metrics_report_groups_at_their_limit_and_the_todos_they_hold(staff, scope):
    from todos.store import admission

    admission.set_admission(scope, "q", group_concurrency=1)
    for group in ["repo-a", "repo-a", "repo-a", "repo-b", "repo-c"]:
        store.create_todo(scope, queue="q", group=group)
    store.claim_many(scope, "w", limit=10, queue="q")  # one of each group
    admission.set_group(scope, "q", "repo-c", paused=True)
    store.create_todo(scope, queue="q", group="repo-c")

    found = samples(staff.get("/metrics"))

    labels = frozenset({("endpoint", "agent-a"), ("queue", "q")})
    # repo-a: 1 claimed at its limit of 1, 2 waiting; repo-b: nothing waiting;
    # repo-c: paused, 1 waiting.
    assert found[("switchboard_groups_at_limit", labels)] == 2
    assert found[("switchboard_todos_held_by_limit", labels)] == 3


def test_metrics_count_spend_per_queue_once_per_report_folded_by_the_sweep(
    staff, scope
):
    from todos.store import spend

    todo, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, todo.id, "w")
    store.heartbeat(scope, todo.id, "w", usage={"input_tokens": 100, "cost_usd": 0.1})
    spend.roll_up_usage()
    # The attempt's running total replaces its last report: only the
    # difference is added, however often the sweep folds.
    store.complete_todo(
        scope,
        todo.id,
        "w",
        usage={"input_tokens": 250, "output_tokens": 40, "cost_usd": 0.25},
    )
    store.report_usage(scope, queue="other", usage={"cost_usd": 1.5})
    spend.roll_up_usage()
    spend.roll_up_usage()

    found = samples(staff.get("/metrics"))

    def value(name, queue, **labels):
        key = frozenset({"endpoint": "agent-a", "queue": queue, **labels}.items())
        return found[(name, key)]

    assert value("switchboard_usage_cost_usd_total", "q") == pytest.approx(0.25)
    assert value("switchboard_usage_tokens_total", "q", direction="input") == 250
    assert value("switchboard_usage_tokens_total", "q", direction="output") == 40
    assert value("switchboard_usage_cost_usd_total", "other") == pytest.approx(1.5)


def test_a_report_the_sweep_folded_late_counts_once(staff, scope):
    """A report whose row committed after a fold began, with an earlier
    timestamp, is caught by the next fold's margin and counted once."""
    from django.db import connection

    from todos.store import spend

    spend.roll_up_usage()
    store.report_usage(scope, queue="q", usage={"cost_usd": 2})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE usage_ledger SET reported_at = reported_at - interval '1 minute'"
        )
    spend.roll_up_usage()
    spend.roll_up_usage()

    found = samples(staff.get("/metrics"))

    key = frozenset({("endpoint", "agent-a"), ("queue", "q")})
    assert found[("switchboard_usage_cost_usd_total", key)] == 2


def test_metrics_report_budgets_and_those_at_their_limit(staff, scope):
    store.create_budget(scope, scope="queue", queue="q", window="day", limit_usd=1)
    store.create_budget(scope, scope="queue", queue="q", window="day", limit_usd=9)
    store.create_budget(scope, scope="endpoint", window="month", limit_tokens=10)
    store.report_usage(scope, queue="q", usage={"cost_usd": 1, "input_tokens": 4})

    found = samples(staff.get("/metrics"))

    def value(name, queue):
        return found[(name, frozenset({("endpoint", "agent-a"), ("queue", queue)}))]

    assert value("switchboard_budgets", "q") == 2
    assert value("switchboard_budgets_at_limit", "q") == 1
    assert value("switchboard_budgets", "") == 1
    assert value("switchboard_budgets_at_limit", "") == 0


def test_metrics_count_the_todos_admission_passed_over_per_reason(staff, scope):
    """CONTRACT §17 /metrics: claims passed over by a limit or a rate window,
    per queue: a batch claim the rate window lets take one of three todos
    counts two passed over, reason rate_limit; no rate-limited wait yet."""
    from todos.store import admission

    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 60, "burst": 1}
    )
    for _ in range(3):
        store.create_todo(scope, queue="q")
    assert len(store.claim_many(scope, "w", limit=3)) == 1

    found = samples(staff.get("/metrics"))

    labels = {("endpoint", "agent-a"), ("queue", "q")}
    passed = "switchboard_claims_passed_over_total"
    assert found[(passed, frozenset({*labels, ("reason", "rate_limit")}))] == 2
    assert (passed, frozenset({*labels, ("reason", "limit")})) not in found
    assert ("switchboard_rate_limited_waits_total", frozenset(labels)) not in found


def test_a_scrape_reads_the_folded_spend_never_the_ledger(staff, scope):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    store.create_budget(scope, scope="queue", queue="q", window="day", limit_usd=1)

    with CaptureQueriesContext(connection) as ran:
        assert staff.get("/metrics").status_code == 200

    assert ran.captured_queries
    assert not [q for q in ran.captured_queries if "usage_ledger" in q["sql"]]
