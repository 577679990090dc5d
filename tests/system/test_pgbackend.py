"""board.serving.pgbackend: timestamps read in UTC; the long statements parsed once."""

import asyncio
import datetime

import psycopg
import pytest
from django.db import connection
from psycopg import _queries

from board.serving.pgbackend import base
from todos import store
from todos.db import pool
from todos.db.params import async_params
from todos.models import Todo
from todos.store import lifecycle

pytestmark = pytest.mark.django_db


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


def test_an_async_pool_connection_reads_a_timestamp_as_djangos_does():
    """The async pool's connections (todos.db.pool) read with Django's adapters."""

    async def read():
        async with await psycopg.AsyncConnection.connect(**async_params()) as conn:
            cursor = await conn.execute(
                "SELECT '2026-01-01 10:00:00.123456+05'::timestamptz"
            )
            return (await cursor.fetchone())[0]

    read = asyncio.run(read())
    assert read == datetime.datetime(2026, 1, 1, 5, 0, 0, 123456, tzinfo=datetime.UTC)
    assert read.isoformat() == "2026-01-01T05:00:00.123456+00:00"


def test_the_async_pool_reads_a_timestamp_as_the_same_utc_datetime_as_django():
    """The pool's connections read timestamps with psycopg's own loader in the
    session zone UTC (todos.db.params.utc_timestamps): the value is the one
    Django's loader gives, its zone the same datetime.UTC, whatever the
    server's default zone is called."""
    statement = "SELECT '2026-01-01 10:00:00.123456+05'::timestamptz"

    async def read():
        try:
            return await pool.db.fetch_one(statement, [])
        finally:
            await pool.close()

    (pooled,) = asyncio.run(read())
    with connection.cursor() as cursor:
        cursor.execute(statement)
        (django_read,) = cursor.fetchone()
    assert pooled == django_read
    assert pooled.tzinfo is django_read.tzinfo is datetime.UTC
    assert pooled.isoformat() == "2026-01-01T05:00:00.123456+00:00"


def test_the_orm_and_the_store_read_aware_utc_datetimes(scope):
    made, _ = store.create_todo(scope, queue="q", title="t")
    row = Todo.objects.get(id=made.id)
    assert row.created_at == made.created_at
    for value in (row.created_at, made.created_at):
        assert value.utcoffset() == datetime.timedelta(0)
        assert value.isoformat().endswith("+00:00")


def test_the_claim_and_the_acknowledgement_are_parsed_once(scope):
    """psycopg keeps the parse of the store's longest statements (no re-parse)."""
    for statement in (
        lifecycle.CLAIM_SQL,
        lifecycle.CLAIM_PLAIN_SQL,
        lifecycle.ACK_SQL,
        lifecycle.ONE_ACK_SQL,
    ):
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
