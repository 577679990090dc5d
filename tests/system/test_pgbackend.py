"""board.serving.pgbackend: timestamps read by psycopg's compiled loader, in UTC."""

import datetime

import pytest
from django.db import connection
from psycopg import _queries
from psycopg.pq import Format

from board.serving.pgbackend import base
from todos import store
from todos.models import Todo
from todos.store import lifecycle

pytestmark = pytest.mark.django_db

needs_compiled = pytest.mark.skipif(
    base.COMPILED_TIMESTAMPTZ is None, reason="psycopg's compiled part is absent"
)


@needs_compiled
def test_timestamps_are_read_by_psycopgs_compiled_loader():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        loader = cursor.cursor._tx.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT)
    assert type(loader) is base.COMPILED_TIMESTAMPTZ


@needs_compiled
def test_a_timestamp_read_is_the_same_instant_in_utc():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT '2026-01-01 10:00:00.123456+05'::timestamptz, NULL::timestamptz"
        )
        read, empty = cursor.fetchone()
    assert read == datetime.datetime(2026, 1, 1, 5, 0, 0, 123456, tzinfo=datetime.UTC)
    assert read.utcoffset() == datetime.timedelta(0)
    assert read.isoformat() == "2026-01-01T05:00:00.123456+00:00"
    assert empty is None


def test_the_orm_and_the_store_read_aware_utc_datetimes(scope):
    made, _ = store.create_todo(scope, queue="q", title="t")
    row = Todo.objects.get(id=made.id)
    assert row.created_at == made.created_at
    for value in (row.created_at, made.created_at):
        assert value.utcoffset() == datetime.timedelta(0)
        assert value.isoformat().endswith("+00:00")


def test_the_claim_and_the_acknowledgement_are_parsed_once(scope):
    """psycopg keeps the parse of the store's longest statements (no re-parse)."""
    for statement in (lifecycle.CLAIM_SQL, lifecycle.ACK_SQL, lifecycle.ONE_ACK_SQL):
        assert 4096 < len(statement.encode()) <= base.PARSED_STATEMENT_BYTES
    for _ in range(3):
        made, _ = store.create_todo(scope, queue="q", title="t")
        claimed = store.claim_next(scope, "w")
        assert claimed is not None
        before = _queries._query2pg.cache_info()
        store.complete_todo(scope, claimed.id, "w", lease_token=claimed.lease_token)
        after = _queries._query2pg.cache_info()
    assert after.hits == before.hits + 1
    assert after.misses == before.misses
