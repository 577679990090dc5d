"""The agent API's tests run on the served path: the application answers each
request as a worker serves it (tests.support.ServedClient), so the rows a test
writes are committed, and the tables are emptied after it."""

import pytest


@pytest.fixture
def db(asgi_server, committed):
    """Here ``db`` is committed, with the in-process server up."""


@pytest.fixture
def client(served_client):
    return served_client
