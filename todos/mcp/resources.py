"""The endpoint's queues as MCP resources.

Each queue of the grant is the resource ``switchboard://queues/<name>`` (the
name percent-encoded): ``resources/list`` lists the queues in use,
``resources/read`` answers one's settings and live figures as JSON (what
``GET /api/v1/queues`` says of it). A subscription to one is
``subscriptions/listen`` (``todos.mcp.listen``).
"""

import json
from typing import Any
from urllib.parse import quote, unquote

from todos import store

PREFIX = "switchboard://queues/"
MIME_TYPE = "application/json"
TEMPLATE = {
    "uriTemplate": PREFIX + "{name}",
    "name": "queue",
    "title": "A queue",
    "description": "One queue of this endpoint: its settings and live figures.",
    "mimeType": MIME_TYPE,
}


class ResourceNotFound(Exception):
    """A URI that names no queue of this endpoint's grant."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"Resource not found: {uri}")
        self.uri = uri


class BadParams(ValueError):
    """A resources request or a ``subscriptions/listen`` whose params are wrong."""


def uri_for(name: str) -> str:
    return PREFIX + quote(name, safe="")


def queue_name(uri: object) -> str | None:
    """The queue a URI names, or None when it is no queue URI."""
    if not isinstance(uri, str) or not uri.startswith(PREFIX):
        return None
    name = unquote(uri[len(PREFIX) :])
    return name or None


def _resource(queue: store.QueueInfo) -> dict[str, Any]:
    return {
        "uri": uri_for(queue.name),
        "name": queue.name,
        "title": f"Queue {queue.name}",
        "description": (
            "Settings and live figures of this queue; subscribe to hear when a "
            "todo there becomes claimable."
        ),
        "mimeType": MIME_TYPE,
    }


def resource_list(scope: store.Scope) -> dict[str, Any]:
    return {"resources": [_resource(queue) for queue in store.list_queues(scope)]}


def read(scope: store.Scope, params: dict[str, Any]) -> dict[str, Any]:
    """The contents of one queue resource, or ``ResourceNotFound``."""
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise BadParams("params.uri: must be a resource URI")
    name = queue_name(uri)
    if name is None:
        raise ResourceNotFound(uri)
    try:
        queue = store.get_queue(scope, name)
    except (store.NotFound, store.QueueNotGranted, ValueError):
        raise ResourceNotFound(uri) from None
    text = json.dumps(queue.to_dict())
    return {"contents": [{"uri": uri, "mimeType": MIME_TYPE, "text": text}]}
