"""The claim scan's plan with a large terminal backlog: the backlog costs nothing.

PostgreSQL plans ``store.CLAIM_NEXT_SQL`` with real parameters after ANALYZE.
The scan must come from the partial pending index (and, for redeliveries, the
partial lease and retry-window indexes), never from a sequential scan or from
an index that holds the done and dead-lettered rows.
"""

import json
import re

import pytest
from django.db import connection, transaction

from todos import store

TERMINAL_ROWS = 100_000
# Enough pending work that only the pending index, already in created_at order,
# is cheap for the claim: an index that must sort the endpoint's live rows is not
# (with a handful of live rows every live-only index costs the same, and the
# planner's pick between them would depend on the statistics of the day).
PENDING_BACKLOG = 2_000

# Partial indexes that hold no terminal row (see migration 0002).
LIVE_ONLY_INDEXES = {
    "todos_pending_claim_idx",
    "todos_claimed_lease_idx",
    "todos_retry_window_idx",
    "todos_live_overview_idx",
}


@pytest.fixture
def backlog(scope, other_scope):
    """100 000 done and dead-lettered todos, half in the caller's own endpoint,
    beside its live ones: one claimed, one parked, and 3 + 2 000 pending."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO todos (id, endpoint_id, queue, title, state, attempt,
                               max_attempts, owner, result, last_error,
                               created_at, updated_at)
            SELECT gen_random_uuid(),
                   CASE WHEN n %% 2 = 0 THEN %(mine)s::uuid ELSE %(other)s::uuid END,
                   'q', 'old ' || n,
                   CASE WHEN n %% 5 = 0 THEN 'failed' ELSE 'done' END,
                   CASE WHEN n %% 5 = 0 THEN 5 ELSE 1 END, 5, 'w-old',
                   '{}'::jsonb, '',
                   now() - interval '30 days' + n * interval '1 second', now()
              FROM generate_series(1, %(rows)s) AS n
            """,
            {
                "mine": scope.endpoint_id,
                "other": other_scope.endpoint_id,
                "rows": TERMINAL_ROWS,
            },
        )
    # A few live rows beside the backlog: in flight, parked, and pending.
    in_flight, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, in_flight.id, "busy")
    waiting, _ = store.create_todo(scope, queue="q")
    store.claim_todo(scope, waiting.id, "flaky")
    store.fail_todo(scope, waiting.id, "flaky", error="retry later")
    pending = [
        store.create_todo(scope, queue="q", title=f"new {n}")[0] for n in range(3)
    ]
    with connection.cursor() as cursor:
        # Younger pending work queued behind those three.
        cursor.execute(
            """
            INSERT INTO todos (id, endpoint_id, queue, title, state, created_at)
            SELECT gen_random_uuid(), %(mine)s, 'q', 'later ' || n, 'pending',
                   now() + interval '1 hour' + n * interval '1 millisecond'
              FROM generate_series(1, %(rows)s) AS n
            """,
            {"mine": scope.endpoint_id, "rows": PENDING_BACKLOG},
        )
        cursor.execute("ANALYZE todos")
    yield pending
    # ANALYZE writes the table's size into pg_class in place, past this test's
    # rollback: leave the size of an emptied table, not 100 000 rows, for the
    # plans of the tests that run after this one.
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM todos WHERE endpoint_id IN (%s, %s)",
            [scope.endpoint_id, other_scope.endpoint_id],
        )
        cursor.execute("ANALYZE todos")


def claim_params(scope):
    return {
        "endpoint_id": scope.endpoint_id,
        "queues": None,
        "worker": "w1",
        "actor": "w1",
        "event_error": "",
        "lease": 60,
    }


def explain(sql, params, options="FORMAT JSON"):
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def assert_backlog_is_not_scanned(plan):
    nodes = list(plan_nodes(plan["Plan"]))
    on_todos = [node for node in nodes if node.get("Relation Name") == "todos"]
    assert on_todos, "the plan reads todos"
    assert not [n for n in on_todos if n["Node Type"] == "Seq Scan"], "seq scan"
    indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
    assert "todos_pending_claim_idx" in indexes
    for node in nodes:
        name = node.get("Index Name")
        if name is None or name in LIVE_ONLY_INDEXES:
            continue
        # The one index with terminal rows allowed: the UPDATE's primary-key
        # lookup of the candidate the partial indexes already chose.
        assert name == "todos_pkey", f"{name} holds terminal rows"
        assert node["Index Cond"].startswith("(id = "), node["Index Cond"]
        assert node.get("Parent Relationship") == "Inner", node


def test_claim_scan_is_served_by_the_partial_pending_index(scope, backlog):
    """SPEC: Claim never scans terminal rows"""
    plan = explain(store.CLAIM_NEXT_SQL, claim_params(scope))
    assert_backlog_is_not_scanned(plan)


PARAM_TYPES = {
    "endpoint_id": "uuid",
    "queues": "text[]",
    "worker": "text",
    "actor": "text",
    "event_error": "text",
    "lease": "int",
}


def explain_generic(sql, params):
    """EXPLAIN the generic plan a prepared statement settles on after 5 runs.

    Django's connections prepare the store's statements (prepare_threshold),
    and PostgreSQL may then plan once for every endpoint: that plan, which
    cannot see the endpoint id, must avoid the backlog too.
    """
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    numbered = re.sub(
        r"%\((\w+)\)s", lambda match: f"${names.index(match[1]) + 1}", sql
    )
    types = ", ".join(PARAM_TYPES[name] for name in names)
    arguments = ", ".join(f"%s::{PARAM_TYPES[name]}" for name in names)
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE claim_plan_probe ({types}) AS {numbered}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # EXECUTE's arguments cannot be bound parameters: quote them client-side.
        cursor.execute(
            connection.ops.compose_sql(
                f"EXPLAIN (FORMAT JSON) EXECUTE claim_plan_probe({arguments})",
                [params[name] for name in names],
            )
        )
        raw = cursor.fetchone()[0]
        cursor.execute("DEALLOCATE claim_plan_probe")
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def test_claim_scan_keeps_its_plan_when_prepared_generically(scope, backlog):
    """SPEC: Claim never scans terminal rows (a prepared, generic plan too)."""
    plan = explain_generic(store.CLAIM_NEXT_SQL, claim_params(scope))
    conditions = [node.get("Index Cond", "") for node in plan_nodes(plan["Plan"])]
    assert any("$1" in condition for condition in conditions), "a generic plan"
    assert_backlog_is_not_scanned(plan)


def test_claim_reads_a_handful_of_rows_and_pages_not_the_backlog(scope, backlog):
    """SPEC: Claim never scans terminal rows (measured: rows and pages read)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpages FROM pg_class WHERE relname = 'todos'")
        (table_pages,) = cursor.fetchone()
    with transaction.atomic():
        plan = explain(
            store.CLAIM_NEXT_SQL,
            claim_params(scope),
            options="ANALYZE, BUFFERS, FORMAT JSON",
        )
        transaction.set_rollback(True)
    scans = [
        node
        for node in plan_nodes(plan["Plan"])
        if node.get("Relation Name") == "todos" or "Index Name" in node
    ]
    rows_read = sum(
        node["Actual Rows"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
        for node in scans
    )
    # A claim reads the row it takes (and the few redeliverable candidates),
    # never the 50 000 terminal rows of its endpoint nor its pending backlog.
    assert rows_read <= 10, rows_read
    touched = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert table_pages > 1000
    # Index pages and the rows' own pages; dead index entries that earlier
    # tests left behind may add some, never a scan of the table.
    assert touched < table_pages // 10, f"{touched} pages of {table_pages}"


def test_claim_with_a_backlog_takes_the_oldest_pending_todo(scope, backlog):
    """SPEC: Claim never scans terminal rows (and still claims the right row)."""
    taken = [store.claim_next(scope, "w1").id for _ in backlog]
    assert taken == [todo.id for todo in backlog]
    assert store.claim_next(scope, "w1").title == "later 1"
