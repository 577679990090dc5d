"""The claim's plan beside a large backlog: nobody's backlog costs a claim anything.

One module-scoped table, seeded and ANALYZEd like a busy production one:
100 000 done and dead-lettered todos split over two endpoints, 40 000 pending
todos in endpoint A's queue ``bulk``, delayed todos, a paused queue full of
pending todos, another worker's assignments, and a handful of claimable todos
in A's queue ``rare`` and in endpoint B. PostgreSQL plans ``lifecycle.CLAIM_SQL``
itself (no planner switches): with each call's values (custom plans) and with
the one plan a prepared statement settles on (``plan_cache_mode =
force_generic_plan``). Each claim must be served by the partial indexes, read
a bounded handful of rows and pages whatever the backlog, and never touch a
terminal row (SPEC-0003 "Claim never scans terminal rows"; issue #13, "a
claim must not pay for anyone else's backlog").
"""

import json
import re
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from todos import store
from todos.models import Endpoint
from todos.store import lifecycle

TERMINAL_ROWS = 100_000
BULK_BACKLOG = 40_000
PAUSED_BACKLOG = 5_000
DELAYED_ROWS = 5_000
ASSIGNED_ELSEWHERE = 5_000

# Partial indexes that hold no terminal row.
LIVE_ONLY_INDEXES = {
    "todos_pending_claim_idx",
    "todos_claimed_lease_idx",
    "todos_retry_window_idx",
    "todos_live_overview_idx",
    "todos_fair_claim_idx",
    "todos_group_claimed_idx",
}
# The most rows and pages a claim may read: the lanes' heads and the few
# redeliveries in flight, plus per todo claimed its row, index entries and
# history row (a bitmap scan counts its rows twice, index and heap).
# Measured: 2-6 rows and 34-63 pages for one todo, 36-56 rows and
# ~290 pages for ten (340-367 since the claim reads each lane's admission
# settings); the bulk lane alone is 40 000 rows on ~500 pages.
MAX_ROWS_READ = 10
ROWS_PER_TODO = 5
MAX_PAGES_READ = 60
PAGES_PER_TODO = 33

SEED_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, state, attempt, max_attempts,
                   owner, assignee, result, last_error, next_retry_at,
                   created_at, updated_at, available_at)
SELECT gen_random_uuid(), %(endpoint)s, %(queue)s, %(title)s || n, %(state)s,
       %(attempt)s, 5, %(owner)s, %(assignee)s, NULL, '', NULL,
       %(start)s::timestamptz + n * interval '1 millisecond', now(),
       %(start)s::timestamptz + n * interval '1 millisecond' + %(delay)s::interval
  FROM generate_series(1, %(rows)s) AS n
"""


def seed(cursor, endpoint, queue, rows, *, state="pending", title="t ", **extra):
    cursor.execute(
        SEED_SQL,
        {
            "endpoint": endpoint,
            "queue": queue,
            "rows": rows,
            "state": state,
            "title": title,
            "attempt": extra.get("attempt", 0),
            "owner": extra.get("owner"),
            "assignee": extra.get("assignee"),
            "start": extra.get("start", "2026-01-01T00:00:00Z"),
            "delay": extra.get("delay", "0 seconds"),
        },
    )


@pytest.fixture(scope="module")
def backlog(django_db_setup, django_db_blocker):
    """Commit the seeded table once for the module; remove it afterwards."""
    with django_db_blocker.unblock():
        owner, _ = get_user_model().objects.get_or_create(username="plan-owner")
        endpoints = []
        for name in ("plan-a", "plan-b"):
            endpoint = Endpoint(name=name, owner=owner, queues=["*"])
            endpoint.set_new_token()
            endpoint.save()
            endpoints.append(endpoint)
        a, b = (str(endpoint.id) for endpoint in endpoints)
        with connection.cursor() as cursor:
            for index, state in enumerate(("done", "failed")):
                for endpoint in (a, b):
                    seed(
                        cursor,
                        endpoint,
                        "rare",
                        TERMINAL_ROWS // 4,
                        state=state,
                        title="old ",
                        attempt=5,
                        owner="w-old",
                        start=f"2025-0{index + 1}-01T00:00:00Z",
                    )
            seed(cursor, a, "bulk", BULK_BACKLOG, title="bulk ")
            seed(cursor, a, "frozen", PAUSED_BACKLOG, title="frozen ")
            seed(
                cursor,
                a,
                "rare",
                DELAYED_ROWS,
                title="later ",
                start="now",
                delay="1 day",
            )
            seed(
                cursor,
                b,
                "rare",
                DELAYED_ROWS,
                title="later ",
                start="now",
                delay="1 day",
            )
            seed(cursor, a, "rare", ASSIGNED_ELSEWHERE, title="theirs ", assignee="bob")
            # The claimable ones, younger than every backlog row.
            for endpoint in (a, b):
                seed(cursor, endpoint, "rare", 3, title="ready ", start="2026-06-01")
            cursor.execute(
                "INSERT INTO queues (endpoint_id, name, paused_at)"
                " VALUES (%s, 'frozen', now())",
                [a],
            )
            cursor.execute("ANALYZE todos")
            cursor.execute("ANALYZE queues")
            cursor.execute("SELECT relpages FROM pg_class WHERE relname = 'todos'")
            (pages,) = cursor.fetchone()
    yield {"a": a, "b": b, "pages": pages}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos WHERE endpoint_id IN (%s, %s)", [a, b])
        cursor.execute("DELETE FROM queues WHERE endpoint_id IN (%s, %s)", [a, b])
        cursor.execute("DELETE FROM endpoints WHERE id IN (%s, %s)", [a, b])
        # ANALYZE writes the table's size into pg_class: leave an emptied
        # table's, not 200 000 rows', for the plans of later tests.
        cursor.execute("ANALYZE todos")


def claim_params(endpoint_id, queues=None, worker="w1", limit=1):
    return {
        "endpoint_id": endpoint_id,
        "queues": queues,
        "worker": worker,
        "lease": None,
        "limit": limit,
        "default_lease": 300,
    }


PARAM_TYPES = {
    "endpoint_id": "uuid",
    "queues": "text[]",
    "worker": "text",
    "lease": "int",
    "limit": "int",
    "default_lease": "int",
}


def explain(params, *, generic, analyze, sql=lifecycle.CLAIM_SQL):
    """EXPLAIN the claim, with a custom or the generic plan, rolled back after."""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with transaction.atomic(), connection.cursor() as cursor:
        if not generic:
            cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        else:
            names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
            numbered = re.sub(
                r"%\((\w+)\)s", lambda match: f"${names.index(match[1]) + 1}", sql
            )
            types = ", ".join(PARAM_TYPES[name] for name in names)
            probe = f"claim_probe_{uuid.uuid4().hex[:8]}"
            cursor.execute(f"PREPARE {probe} ({types}) AS {numbered}")
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            arguments = ", ".join(f"%s::{PARAM_TYPES[name]}" for name in names)
            # EXECUTE's arguments cannot be bound parameters: quote them here.
            cursor.execute(
                connection.ops.compose_sql(
                    f"EXPLAIN ({options}) EXECUTE {probe}({arguments})",
                    [params[name] for name in names],
                )
            )
        raw = cursor.fetchone()[0]
        transaction.set_rollback(True)
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def assert_backlog_is_not_scanned(plan, lanes_indexes=("todos_pending_claim_idx",)):
    """The plan reads todos through indexes of live rows only, its lanes
    through one of ``lanes_indexes`` (the fair claim's lanes read
    todos_fair_claim_idx; its probe for the endpoint's queues with pending
    work may take todos_live_overview_idx, as the table's statistics have it)."""
    nodes = list(plan_nodes(plan["Plan"]))
    on_todos = [node for node in nodes if node.get("Relation Name") == "todos"]
    assert on_todos, "the plan reads todos"
    assert not [n for n in on_todos if n["Node Type"] == "Seq Scan"], "seq scan"
    indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
    assert indexes & set(lanes_indexes), indexes
    for node in nodes:
        name = node.get("Index Name")
        if name is None or name in LIVE_ONLY_INDEXES:
            continue
        # Settings and budgets in force: a few rows per queue, none a todo's.
        if name.startswith(("queues_", "queue_groups_", "budgets_")):
            continue
        # The one index with terminal rows allowed: the UPDATE's primary-key
        # lookup of the candidate the partial indexes already chose.
        assert name == "todos_pkey", f"{name} holds terminal rows"
        assert node["Index Cond"].startswith("(id = "), node["Index Cond"]


def rows_read(plan):
    """Rows the claim read from todos: returned plus filtered out, every loop.

    A bitmap index scan's count is of index entries, dead versions included
    (this module's earlier claims, rolled back, leave one per claim while any
    snapshot is older): the rows it points at are counted by the bitmap heap
    scan above it.
    """
    total = 0
    for node in plan_nodes(plan["Plan"]):
        if node.get("Relation Name") != "todos" and "Index Name" not in node:
            continue
        if node["Node Type"] == "Bitmap Index Scan":
            continue
        loops = node.get("Actual Loops", 1)
        total += loops * (
            node["Actual Rows"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
    return total


def pages_read(plan):
    top = plan["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


CASES = {
    # A's other queue, beside 40 000 pending in bulk, delayed and assigned rows.
    "own_other_queue": lambda t: claim_params(t["a"], ["rare"]),
    # Endpoint B: nothing of A's backlog is in its way.
    "other_endpoint": lambda t: claim_params(t["b"]),
    "other_endpoint_queue": lambda t: claim_params(t["b"], ["rare"]),
    # A's whole grant: bulk's head is the oldest, the paused queue passed over.
    "own_whole_grant": lambda t: claim_params(t["a"]),
    # A batch of ten across the grant.
    "own_batch_of_ten": lambda t: claim_params(t["a"], limit=10),
}


# The claim of a scope that needs admission, the one of a scope whose lanes are
# all fair (CLAIM_FAIR_SQL), and the plain one of a scope that needs none
# (CLAIM_PLAIN_SQL, which the store runs first).
STATEMENTS = {
    "admitting": lifecycle.CLAIM_SQL,
    "fair": lifecycle.CLAIM_FAIR_SQL,
    "plain": lifecycle.CLAIM_PLAIN_SQL,
}
# The indexes a statement may read its lanes through.
LANES_INDEXES = {
    "admitting": ("todos_pending_claim_idx",),
    "fair": ("todos_fair_claim_idx", "todos_pending_claim_idx"),
    "plain": ("todos_pending_claim_idx",),
}


@pytest.mark.parametrize("statement", STATEMENTS)
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("case", CASES)
def test_claim_plan_uses_the_pending_index_and_never_reads_terminal_rows(
    backlog, db, case, generic, statement
):
    """SPEC: Claim never scans terminal rows (delayed and paused rows beside it)."""
    plan = explain(
        CASES[case](backlog),
        generic=generic,
        analyze=False,
        sql=STATEMENTS[statement],
    )
    assert_backlog_is_not_scanned(plan, LANES_INDEXES[statement])


@pytest.mark.parametrize("statement", STATEMENTS)
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("case", CASES)
def test_claim_reads_a_bounded_handful_of_rows_whatever_the_backlog(
    backlog, db, case, generic, statement
):
    """SPEC: Claim never scans terminal rows (measured: rows and pages read).

    Issue #13: with 40 000 pending in endpoint A's queue bulk, a claim on A's
    other queue or of endpoint B reads what a claim on an empty table reads.
    """
    params = CASES[case](backlog)
    plan = explain(params, generic=generic, analyze=True, sql=STATEMENTS[statement])
    # A base cost (lanes, redeliveries, index descents) plus, per todo
    # claimed, its row, its new index entries and its history row.
    most_rows = MAX_ROWS_READ + ROWS_PER_TODO * params["limit"]
    most_pages = MAX_PAGES_READ + PAGES_PER_TODO * params["limit"]
    assert rows_read(plan) <= most_rows, rows_read(plan)
    assert backlog["pages"] > 2000
    assert pages_read(plan) <= most_pages, pages_read(plan)


def test_claim_beside_the_backlog_takes_the_right_todos(backlog, db):
    """SPEC: Claim never scans terminal rows (and still claims the right rows)."""
    a = store.Scope(backlog["a"])
    b = store.Scope(backlog["b"])

    rare = [store.claim_next(a, "w1", queue="rare").title for _ in range(3)]
    theirs = store.claim_next(a, "bob", queue="rare")
    none_left = store.claim_many(a, "w1", limit=10, queue="rare")
    whole_grant = store.claim_next(a, "w1")
    other = store.claim_many(b, "w1", limit=10)

    assert rare == ["ready 1", "ready 2", "ready 3"]
    assert theirs.title == "theirs 1"
    assert none_left == []
    assert whole_grant.queue == "bulk" and whole_grant.title == "bulk 1"
    assert [todo.title for todo in other] == ["ready 1", "ready 2", "ready 3"]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_claim_fetches_its_rows_by_key_on_a_modest_table(scope, generic):
    """Issue #13: on a table of a few thousand pending rows the planner must not
    hash the whole table to join the candidates (it did: 165 ms a claim)."""
    with connection.cursor() as cursor:
        seed(cursor, scope.endpoint_id, "q", 5_000)
        cursor.execute("ANALYZE todos")
    try:
        plan = explain(claim_params(scope.endpoint_id), generic=generic, analyze=True)
        on_todos = [
            node
            for node in plan_nodes(plan["Plan"])
            if node.get("Relation Name") == "todos"
        ]
        assert not [node for node in on_todos if node["Node Type"] == "Seq Scan"]
        assert rows_read(plan) <= MAX_ROWS_READ + ROWS_PER_TODO
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM todos WHERE endpoint_id = %s", [scope.endpoint_id]
            )
            cursor.execute("ANALYZE todos")
