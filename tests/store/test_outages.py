"""Which database errors are outages: connection loss and timeouts only."""

import pytest
from django.db import DatabaseError, connection, transaction

from todos import store


def raised_by(sql, params=()):
    with (
        pytest.raises(DatabaseError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, params)
    return caught.value


@pytest.mark.django_db
def test_a_statement_timeout_is_an_outage():
    error = raised_by("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")
    assert store.is_outage(error)


@pytest.mark.django_db
def test_text_postgresql_refuses_is_not_an_outage():
    """Defect: every DatabaseError was taken for an outage (/hooks/%00 was 503)."""
    error = raised_by("SELECT %s::text", ["nul \x00 inside"])
    assert not store.is_outage(error)


@pytest.mark.django_db
def test_a_bad_statement_is_not_an_outage():
    error = raised_by("SELECT 1 / 0")
    assert not store.is_outage(error)
