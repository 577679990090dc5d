"""What the MCP tests share: a JSON-RPC poster, answered on the served path
(tests.support.ServedClient): the rows a test writes are committed, and the
tables are emptied after it."""

import json

import pytest


@pytest.fixture
def db(asgi_server, committed):
    """Here ``db`` is committed, with the in-process server up."""


@pytest.fixture
def client(served_client):
    return served_client


@pytest.fixture
def post(client, endpoint):
    """Return post(body, session=None, **headers) -> response, raw body allowed."""

    def send(body, session=None, token=endpoint.token, **headers):
        data = body if isinstance(body, str | bytes) else json.dumps(body)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if session:
            headers["Mcp-Session-Id"] = session
        return client.post(
            "/mcp", data=data, content_type="application/json", headers=headers
        )

    return send


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "pytest", "version": "1"},
    },
}


@pytest.fixture
def session_id(post):
    response = post(INITIALIZE)
    assert response.status_code == 200
    return response["Mcp-Session-Id"]
