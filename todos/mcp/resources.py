"""The endpoint's queues as MCP resources, and ``subscriptions/listen``.

Each queue of the grant is the resource ``switchboard://queues/<name>`` (the
name percent-encoded): ``resources/list`` lists the queues in use,
``resources/read`` answers one's settings and live figures as JSON (what
``GET /api/v1/queues`` says of it).

``subscriptions/listen`` with ``resourceSubscriptions`` is the doorbell of
2026-07-28: one long-lived POST-response stream that says
``notifications/resources/updated`` for a subscribed queue whenever a todo
there becomes claimable (and, at once, for those that hold claimable work).
It is a stream of ``todos.streams``: it waits holding no thread and no
connection, and ends as the event stream does, when its token is revoked or
re-keyed or its grant narrowed; a graceful end (shutdown, access gone) is
the listen request's own result, as the spec asks.
"""

import json
from dataclasses import dataclass
from urllib.parse import quote, unquote

from django.conf import settings

from todos import aio, store, streams
from todos.api.events import same_access

PREFIX = "switchboard://queues/"
MIME_TYPE = "application/json"
TEMPLATE = {
    "uriTemplate": PREFIX + "{name}",
    "name": "queue",
    "title": "A queue",
    "description": "One queue of this endpoint: its settings and live figures.",
    "mimeType": MIME_TYPE,
}
META_SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"


class ResourceNotFound(Exception):
    """A URI that names no queue of this endpoint's grant."""

    def __init__(self, uri):
        super().__init__(f"Resource not found: {uri}")
        self.uri = uri


class BadParams(ValueError):
    """A resources request or a ``subscriptions/listen`` whose params are wrong."""


def uri_for(name):
    return PREFIX + quote(name, safe="")


def queue_name(uri):
    """The queue a URI names, or None when it is no queue URI."""
    if not isinstance(uri, str) or not uri.startswith(PREFIX):
        return None
    name = unquote(uri[len(PREFIX) :])
    return name or None


def _resource(queue):
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


def resource_list(scope):
    return {"resources": [_resource(queue) for queue in store.list_queues(scope)]}


def read(scope, params):
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


@dataclass(frozen=True)
class Listen:
    """A ``subscriptions/listen`` to open: the queues it hears, by URI."""

    request: object
    scope: store.Scope
    subscription_id: object
    uris: dict  # queue name -> the URI the client gave

    @classmethod
    def of(cls, request, scope, params, message_id):
        wanted = params.get("notifications", {})
        if not isinstance(wanted, dict):
            raise BadParams("params.notifications: must be an object")
        subscriptions = wanted.get("resourceSubscriptions", [])
        if not isinstance(subscriptions, list) or not all(
            isinstance(uri, str) for uri in subscriptions
        ):
            raise BadParams(
                "params.notifications.resourceSubscriptions: must be a list of URIs"
            )
        # Honoured: the queue URIs the grant covers; the rest are left out of
        # the acknowledgement, as the spec has it.
        uris = {}
        for uri in subscriptions:
            name = queue_name(uri)
            if name is not None and scope.covers(name):
                uris.setdefault(name, uri)
        return cls(request, scope, message_id, uris)

    def _meta(self):
        return {META_SUBSCRIPTION: self.subscription_id}

    def acknowledgement(self):
        return {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {
                "_meta": self._meta(),
                "notifications": {"resourceSubscriptions": list(self.uris.values())},
            },
        }

    def updates(self, rings):
        """The notifications/resources/updated of these rings, one per queue."""
        queues = dict.fromkeys(ring["queue"] for ring in rings)
        return [
            {
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"_meta": self._meta(), "uri": self.uris[queue]},
            }
            for queue in queues
            if queue in self.uris
        ]

    def closing(self, completed):
        """The listen request's own result: the subscription ended gracefully."""
        result = completed({"_meta": self._meta()})
        return {"jsonrpc": "2.0", "id": self.subscription_id, "result": result}


def _event(message):
    return f"event: message\ndata: {json.dumps(message)}\n\n"


async def _body(listen, waiter, first, completed):
    def refresh(notices):
        return same_access(listen.request, listen.scope)

    yield _event(listen.acknowledgement())
    async for said in streams.watch(
        waiter, first, refresh, settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS
    ):
        if isinstance(said, streams.Ended):
            # Unavailable: dropped without a result, so the client reconnects.
            if said.reason != "unavailable":
                yield _event(listen.closing(completed))
            return
        updates = listen.updates(said)
        yield "".join(map(_event, updates)) if updates else ": keep-alive\n\n"


async def listen_stream(listen, completed):
    """The event-stream response of an accepted ``subscriptions/listen``."""
    waiter, first = await streams.open_stream(lambda: (listen.scope, None))
    return aio.event_stream(_body(listen, waiter, first, completed), waiter.close)
