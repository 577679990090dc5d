"""The client's tests run against a served Switchboard (the in-process ASGI
server, or gunicorn for restarts and worker processes), never a mock.

The package is imported from clients/python/src, so these tests exercise the
checkout's client whatever the virtualenv has installed.
"""

import sys
from pathlib import Path

import pytest

CLIENT_SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))

from switchboard_client import AsyncClient, Client, Retry  # noqa: E402

# Retries in tests give up within seconds, not the default thirty.
QUICK_RETRY = Retry(attempts=4, deadline=3.0, base=0.05, cap=0.5)


@pytest.fixture
def client(asgi_server, endpoint):
    with Client(asgi_server.url, endpoint.token, worker="w1", retry=QUICK_RETRY) as c:
        yield c


@pytest.fixture
def other_client(asgi_server, endpoint):
    """A second worker of the same endpoint."""
    with Client(asgi_server.url, endpoint.token, worker="w2", retry=QUICK_RETRY) as c:
        yield c


@pytest.fixture
def aclient_factory(asgi_server, endpoint):
    def make(worker="w1"):
        return AsyncClient(
            asgi_server.url, endpoint.token, worker=worker, retry=QUICK_RETRY
        )

    return make
