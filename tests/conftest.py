"""Shared fixtures: real PostgreSQL, endpoints with tokens, and time travel.

Time moves by editing timestamps in the database (the store reads PostgreSQL's
clock), never by sleeping.
"""

import pytest
from django.db import connection

from tests.support import InProcessServer, ServedClient, empty_tables
from todos import store
from todos.access import endpoints


@pytest.fixture
def asgi_server(asgi_serving):
    """The ASGI app served in this process (``.url``), for the waiting paths.

    Set up after the database (pytest-django's autouse fixture), it is torn
    down before the test's rows are flushed, once the server has settled."""
    yield asgi_serving
    settle(asgi_serving)


def settle(server):
    """Wait for the in-process server to settle after a test: a request still
    served, or a claim outliving its client (a stopped worker's long poll),
    would run its statements while the test's rows are flushed or deleted,
    and a claim takes its locks in another order than TRUNCATE does (the two
    deadlock) or writes after the DELETE."""
    still = server.settle(timeout=30)
    if still:
        pytest.fail(f"the in-process server did not settle after the test: {still}")


@pytest.fixture(scope="session", autouse=True)
def admission_counts_end_with_the_session(django_db_setup):
    """Drop what the claims of the session counted but did not flush before
    the test database goes: the counters' exit flush would otherwise write
    to a dropped database at interpreter shutdown."""
    yield
    from todos.store import limit_figures

    with limit_figures._lock:
        limit_figures._pending.clear()


@pytest.fixture(scope="session")
def asgi_serving(django_db_setup, django_db_blocker):
    """The one in-process server of the session (see ``asgi_server``);
    stopped before the test database is dropped (its LISTEN would hold it)."""
    with django_db_blocker.unblock():
        server = InProcessServer()
    yield server
    server.stop()
    from django.db import connections

    for conn in connections.all():
        conn.close_pool()


@pytest.fixture
def committed(django_db_setup, django_db_blocker):
    """Database access with every statement committed, as the served path
    needs (its connections see only committed rows); the tables are emptied
    after the test (once the in-process server, if any, has settled)."""
    with django_db_blocker.unblock():
        try:
            yield
        finally:
            try:
                if InProcessServer.current is not None:
                    settle(InProcessServer.current)
            finally:
                empty_tables()


@pytest.fixture
def served_client(asgi_server, committed):
    """A test client whose requests the in-process server's application
    answers (tests.support.ServedClient)."""
    return ServedClient(asgi_server)


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
