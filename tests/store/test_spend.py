"""The spend the sweep loop folds from the ledger (CONTRACT §18): per-queue
totals (the metrics' counters) and per-minute spend (the Board's charts)."""

from decimal import Decimal

from django.db import connection

from todos import store
from todos.store import spend


def shift_minutes(minutes):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE usage_minutes SET minute = minute - make_interval(mins => %s)",
            [minutes],
        )


def test_a_running_total_charts_what_it_gained_in_the_minute_it_was_reported(scope):
    todo, _ = store.create_todo(scope, queue="q", group="g")
    store.claim_next(scope, "w")
    store.heartbeat(scope, todo.id, "w", usage={"cost_usd": 0.1, "input_tokens": 10})
    spend.roll_up_usage()
    shift_minutes(5)  # the heartbeat was five minutes ago
    store.complete_todo(
        scope, todo.id, "w", usage={"cost_usd": 0.25, "input_tokens": 40}
    )
    spend.roll_up_usage()
    spend.roll_up_usage()

    series = spend.spend_series(range_name="hour", by="group")

    [line] = series.lines
    assert (line.queue, line.group) == ("q", "g")
    spent = [
        (usd, tokens)
        for usd, tokens in zip(line.cost_usd, line.tokens, strict=True)
        if usd
    ]
    assert spent == [(Decimal("0.1"), 10), (Decimal("0.15"), 30)]
    assert series.total_usd == Decimal("0.25")


def test_the_spend_chart_keeps_the_top_lines_and_sums_the_others(scope):
    for number in range(7):
        store.report_usage(scope, queue=f"q{number}", usage={"cost_usd": number + 1})
    spend.roll_up_usage()

    series = spend.spend_series(range_name="day", by="queue", top=5)

    assert [line.queue for line in series.lines] == ["q6", "q5", "q4", "q3", "q2"]
    assert series.others.total_usd == 3  # q1 and q0
    assert series.total_usd == 28


def test_the_spend_chart_sees_only_the_endpoints_in_scope(scope, other_scope):
    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    store.report_usage(other_scope, queue="q", usage={"cost_usd": 2})
    spend.roll_up_usage()

    series = spend.spend_series(by="endpoint", endpoint_ids=[scope.endpoint_id])

    assert [line.total_usd for line in series.lines] == [1]


def test_minutes_older_than_two_days_are_dropped(scope):
    store.report_usage(scope, queue="q", usage={"cost_usd": 1})
    spend.roll_up_usage()
    shift_minutes(3 * 24 * 60)
    spend.roll_up_usage()

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM usage_minutes")
        assert cursor.fetchone()[0] == 0
    assert spend.spend_figures()[0].cost_usd == 1  # the counter keeps it
