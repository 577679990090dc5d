"""Shared fixtures: real PostgreSQL, endpoints with tokens, and time travel.

Time moves by editing timestamps in the database (the store reads PostgreSQL's
clock), never by sleeping.
"""

import contextlib

import pytest
from django.db import connection, transaction

from tests.support import InProcessServer
from todos import store
from todos.access import endpoints


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker):
    """The ASGI app served in this process (``.url``), for the waiting paths;
    stopped before the test database is dropped (its LISTEN would hold it)."""
    with django_db_blocker.unblock():
        server = InProcessServer()
    yield server
    server.stop()
    from django.db import connections

    for conn in connections.all():
        conn.close_pool()


@pytest.fixture(autouse=True)
def async_views_in_the_test_transaction(request, monkeypatch):
    """For Django's test client: the async views' statements, and their
    pooled calls, run in the test's own thread and transaction (which the
    async pool's connections could not see), with no doorbell hub. Such a
    test is of what a request answers, not of how it is served: that runs on
    the real serving (``asgi_server``, or gunicorn) and the real pool
    (``async_pool``)."""
    if "asgi_server" in request.fixturenames or "async_pool" in request.fixturenames:
        return
    from asgiref.sync import sync_to_async

    from todos.db import pool
    from todos.waiting.doorbell import hub
    from todos.web import threads

    def in_test_thread(fn, *args):
        return sync_to_async(fn, thread_sensitive=True)(*args)

    def on_test_connection(sql, params, fetch):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if fetch == "one":
                return cursor.fetchone()
            if fetch == "all":
                return cursor.fetchall()
            return cursor.rowcount

    async def run(self, sql, params, fetch):
        return await in_test_thread(on_test_connection, sql, params, fetch)

    @contextlib.asynccontextmanager
    async def atomic():
        block = transaction.atomic()
        await in_test_thread(block.__enter__)
        try:
            yield pool.db
        except BaseException as exc:
            await in_test_thread(block.__exit__, type(exc), exc, exc.__traceback__)
            raise
        await in_test_thread(block.__exit__, None, None, None)

    monkeypatch.setattr(threads, "run_pooled", in_test_thread)
    monkeypatch.setattr(pool.Runner, "run", run)
    monkeypatch.setattr(pool, "transaction", atomic)
    monkeypatch.setattr(hub, "start", lambda: None)


@pytest.fixture
def async_pool():
    """The async store on the process's real pool (todos.db.pool), not on the
    test's connection; the test's database must be committed
    (``transaction=True``)."""
    return


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
