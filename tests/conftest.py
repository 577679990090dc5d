"""Shared fixtures: real PostgreSQL, endpoints with tokens, and time travel.

Time moves by editing timestamps in the database (the store reads PostgreSQL's
clock), never by sleeping.
"""

import pytest
from django.db import connection

from todos import endpoints, store
from todos.doorbell import hub


@pytest.fixture(scope="session", autouse=True)
def doorbell_hub(django_db_setup, django_db_blocker):
    """The process's doorbell hub, stopped before the test database is dropped
    (its LISTEN connection would hold the database open)."""
    yield hub
    hub.stop()
    from django.db import connections

    for conn in connections.all():
        conn.close_pool()


@pytest.fixture
def make_endpoint(db):
    """Return a factory: make_endpoint(name, queues=("*",), owner="alice")."""
    created = []

    def factory(name="agent", queues=("*",), owner="alice"):
        endpoint, endpoint.token = endpoints.create(name, owner, list(queues))
        created.append(endpoint)
        return endpoint

    return factory


@pytest.fixture
def endpoint(make_endpoint):
    return make_endpoint("agent-a")


@pytest.fixture
def scope(endpoint):
    return store.Scope.for_endpoint(endpoint)


@pytest.fixture
def other_endpoint(make_endpoint):
    return make_endpoint("agent-b", owner="bob")


@pytest.fixture
def other_scope(other_endpoint):
    return store.Scope.for_endpoint(other_endpoint)


def shift(todo_id, **columns_seconds):
    """Move a todo's timestamps by the given seconds (negative = into the past).

    shift(todo.id, lease_expires_at=-60) makes its lease lapse a minute ago.
    """
    assignments = ", ".join(
        f"{column} = {column} + make_interval(secs => %s)" for column in columns_seconds
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE todos SET {assignments} WHERE id = %s",
            [*columns_seconds.values(), str(todo_id)],
        )


@pytest.fixture
def time_travel():
    return shift
