"""The plans of the Board's overview and list beside a large table.

One module-scoped table, seeded and ANALYZEd like a busy deployment's (as
test_claim_plan.py does): PostgreSQL plans each statement itself, with no
planner switch, and each must read its own index, never the whole table.
"""

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.store.test_claim_plan import seed
from todos import store
from todos.models import Endpoint
from todos.store import operator, rows

DONE_ROWS = 60_000
DEAD_ROWS = 5_000
PENDING_ROWS = 20_000


@pytest.fixture(scope="module")
def seeded(django_db_setup, django_db_blocker):
    """A table the size of a busy deployment's, committed and ANALYZEd once for
    the module: the plans below are the ones PostgreSQL picks for it, with no
    planner switch (on a near-empty table any plan is cheapest)."""
    with django_db_blocker.unblock():
        owner, _ = get_user_model().objects.get_or_create(username="board-plan")
        endpoint = Endpoint(name="board-plan", owner=owner, queues=["*"])
        endpoint.set_new_token()
        endpoint.save()
        with connection.cursor() as cursor:
            seed(cursor, endpoint.id, "q", DONE_ROWS, state="done", attempt=1)
            seed(cursor, endpoint.id, "q", DEAD_ROWS, state="failed", attempt=5)
            seed(cursor, endpoint.id, "q", PENDING_ROWS)
            # As autovacuum leaves a busy table: statistics and a visibility map.
            cursor.execute("VACUUM ANALYZE todos")
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM todos WHERE endpoint_id = %s", [endpoint.id])
        cursor.execute("DELETE FROM endpoints WHERE id = %s", [endpoint.id])
        cursor.execute("ANALYZE todos")


def plan(sql, params):
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_overview_live_counts_use_the_live_overview_index(seeded, db):
    lines = plan(operator.LIVE_OVERVIEW_SQL.format(scope="TRUE"), {})

    assert "todos_live_overview_idx" in lines
    assert "Seq Scan" not in lines


def test_the_overview_is_one_statement_whose_parts_keep_their_indexes(seeded, db):
    """Its five counts came in five round trips, each a wait for the page;
    joined, each part must still be planned on its own."""
    lines = plan(operator.overview_sql("TRUE"), {"cap": 10})

    assert "todos_live_overview_idx" in lines
    assert "todos_open_question_idx" in lines
    assert "todos_dead_letter" in lines
    assert lines.count("->  GroupAggregate") + lines.count("->  HashAggregate") == 5
    # The terminal counts stop at the cap. Where done rows are most of the
    # table, a sequential read of the first cap + 1 is the cheapest: only
    # that part may scan the table. The third limit is the oldest pending
    # todo that is not held: one ordered probe of the live index per queue.
    assert lines.count("->  Limit") == 3
    assert "Index Scan using todos_live_overview_idx on todos t " in lines
    scans = re.findall(r"Seq Scan on todos.*\n\s*Filter: (.*)", lines)
    assert set(scans) <= {"(state = 'done'::text)"}, scans


def test_overview_dead_letter_count_reads_only_the_dead_letter_index(seeded, db):
    sql = operator.TERMINAL_OVERVIEW_SQL.format(
        name="dead_letter", state=store.STATE_FILTERS["dead_letter"], scope="TRUE"
    )

    lines = plan(sql, {"cap": 10})

    # Index-only or bitmap: either way only a dead-letter index is read (the
    # group index also holds dead letters alone), never the table's backlog.
    assert "Seq Scan" not in lines
    used = set(re.findall(r"todos_\w+_idx", lines))
    assert used and used <= {"todos_dead_letter_idx", "todos_dead_letter_group_idx"}


def test_newest_first_list_walks_the_created_index_instead_of_sorting(seeded, db):
    sql = (
        f"SELECT {rows.TODO_COLUMNS} FROM todos WHERE TRUE"
        " ORDER BY created_at DESC, id DESC LIMIT 51"
    )

    lines = plan(sql, {})

    assert "todos_created_idx" in lines
    assert "Sort" not in lines


def test_the_list_text_search_reads_the_trigram_indexes(seeded, db):
    """A substring of a title or key is found from the trigram indexes, not by
    reading the table newest first until a page is full (1.5 s at p95 over a
    million todos before them)."""
    conditions, params = store.reads._filter_conditions(text="delivery-4242")
    sql = (
        f"SELECT {rows.TODO_COLUMNS} FROM todos WHERE {' AND '.join(conditions)}"
        " ORDER BY created_at DESC, id DESC LIMIT 51"
    )

    lines = plan(sql, params)

    assert "todos_title_trgm_idx" in lines
    assert "todos_key_trgm_idx" in lines
    assert "Seq Scan" not in lines
