"""``subscriptions/listen``: the doorbell of 2026-07-28, for queues and tasks.

One long-lived POST-response stream, opted into per notification type:

- ``resourceSubscriptions`` (queue URIs, ``todos.mcp.resources``):
  ``notifications/resources/updated`` for a subscribed queue whenever a todo
  there becomes claimable (and, at once, for those that hold claimable work);
- ``taskIds`` (the tasks extension, ``todos.mcp.tasks``; a client that did not
  declare it is refused before the stream opens): ``notifications/tasks``
  carrying the task, as ``tasks/get`` answers it, once when the stream opens
  and again whenever its status changes.

It is a stream of ``todos.waiting.streams``, whose waiter hears every ring and
todo event of its scope (``todos.waiting.doorbell``): a todo turned claimable,
ended, asked or canceled. A ring of a named task has its todo read again (one
pooled call for the moment's rings), and the task is pushed when its status, or
the questions it waits on, differ from what was last pushed. The stream waits
holding no thread and no connection, and ends as the event stream does, when
its token is revoked or re-keyed or its grant narrowed; a graceful end
(shutdown, access gone) is the listen request's own result, as the spec asks.
"""

import json
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self

from django.conf import settings
from django.http import HttpRequest

from todos import store
from todos.api.events import same_access
from todos.mcp import resources, tasks
from todos.mcp.tasks import Json
from todos.waiting import streams
from todos.waiting.doorbell import Ring, Waiter
from todos.web import sse, threads
from todos.web.sse import EventStreamResponse

# How a revision finishes a result (stateless.completed).
type Completed = Callable[[Json], Json]

META_SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"
# A ring of a todo turned claimable names no event (the event channel's do).
READY = "todo.ready"
# A listen names at most this many tasks (each is read when the stream opens).
MAX_TASK_IDS = store.MAX_ACK_BATCH


def _strings(wanted: Json, field: str) -> list[str]:
    value = wanted.get(field, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise resources.BadParams(f"params.notifications.{field}: must be a list")
    return value


def _filter(params: Json) -> Json:
    wanted = params.get("notifications", {})
    if not isinstance(wanted, dict):
        raise resources.BadParams("params.notifications: must be an object")
    return wanted


def names_tasks(params: Json) -> bool:
    """Say whether a listen asks for task notifications (the extension's)."""
    wanted = params.get("notifications")
    return isinstance(wanted, dict) and "taskIds" in wanted


@dataclass(frozen=True)
class Listen:
    """A ``subscriptions/listen`` to open: the queues it hears (by URI) and
    the tasks it asked for (honoured when the stream opens: the endpoint's)."""

    request: HttpRequest
    scope: store.Scope
    subscription_id: object
    uris: dict[str, str]  # queue name -> the URI the client gave
    task_ids: tuple[str, ...] | None  # as the client gave them; None: not asked for

    @classmethod
    def of(
        cls, request: HttpRequest, scope: store.Scope, params: Json, message_id: object
    ) -> Self:
        wanted = _filter(params)
        # Honoured: the queue URIs the grant covers; the rest are left out of
        # the acknowledgement, as the spec has it.
        uris: dict[str, str] = {}
        for uri in _strings(wanted, "resourceSubscriptions"):
            name = resources.queue_name(uri)
            if name is not None and scope.covers(name):
                uris.setdefault(name, uri)
        task_ids = None
        if "taskIds" in wanted:
            task_ids = tuple(dict.fromkeys(_strings(wanted, "taskIds")))
            if len(task_ids) > MAX_TASK_IDS:
                raise resources.BadParams(
                    f"params.notifications.taskIds: at most {MAX_TASK_IDS}"
                )
        return cls(request, scope, message_id, uris, task_ids)

    def _meta(self) -> Json:
        return {META_SUBSCRIPTION: self.subscription_id}

    def acknowledgement(self, honoured_tasks: dict[str, str]) -> Json:
        notifications = {"resourceSubscriptions": list(self.uris.values())}
        if self.task_ids is not None:
            notifications["taskIds"] = list(honoured_tasks.values())
        return {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": self._meta(), "notifications": notifications},
        }

    def updates(self, rings: list[Ring]) -> list[Json]:
        """The notifications/resources/updated of these rings, one per queue
        where a todo became claimable: the stream hears the todos' other
        events too (ended, asked), which are no work for a queue's workers."""
        queues = dict.fromkeys(
            ring["queue"] for ring in rings if ring.get("event", READY) == READY
        )
        return [
            {
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"_meta": self._meta(), "uri": self.uris[queue]},
            }
            for queue in queues
            if queue in self.uris
        ]

    def task_notification(self, task: Json) -> Json:
        return {
            "jsonrpc": "2.0",
            "method": "notifications/tasks",
            "params": {**task, "_meta": self._meta()},
        }

    def closing(self, completed: Completed) -> Json:
        """The listen request's own result: the subscription ended gracefully."""
        result = completed({"_meta": self._meta()})
        return {"jsonrpc": "2.0", "id": self.subscription_id, "result": result}


def read_tasks(scope: store.Scope, task_ids: Iterable[str]) -> dict[str, Json]:
    """The task of each id that names a todo of the scope, by the id it was
    read by (the others are not the endpoint's, or not tasks at all)."""
    found: dict[str, Json] = {}
    for task_id in task_ids:
        try:
            found[task_id] = tasks.detailed(store.get_todo(scope, task_id).to_dict())
        except store.NotFound:
            continue
    return found


class TaskWatch:
    """The named tasks of one stream, and what was last pushed of each."""

    def __init__(self, found: dict[str, Json]) -> None:
        # taskId (the todo's id) -> the id as the client gave it, for the ack
        self.honoured: dict[str, str] = {}
        for given, task in found.items():
            self.honoured.setdefault(task["taskId"], given)
        self.pushed: dict[str, tuple[Any, tuple[str, ...]]] = {}

    def named(self, rings: list[Ring]) -> set[str]:
        """The honoured tasks these rings are about."""
        return {ring["id"] for ring in rings if ring["id"] in self.honoured}

    def changed(self, tasks_now: Iterable[Json]) -> list[Json]:
        """Those of ``tasks_now`` whose status, or the questions they wait
        on, moved since they were last pushed."""
        moved: list[Json] = []
        for task in tasks_now:
            signature = (task["status"], tuple(task.get("inputRequests", ())))
            if self.pushed.get(task["taskId"]) != signature:
                self.pushed[task["taskId"]] = signature
                moved.append(task)
        return moved


def _event(message: Json) -> str:
    return f"event: message\ndata: {json.dumps(message)}\n\n"


async def _body(
    listen: Listen, waiter: Waiter, first: list[Ring], completed: Completed
) -> AsyncGenerator[str]:
    async def refresh(notices: set[str]) -> bool:
        return await same_access(listen.request, listen.scope)

    found: dict[str, Json] = {}
    if listen.task_ids:
        # After the waiter subscribed: a change from now on rings.
        found = await threads.run_pooled(read_tasks, listen.scope, listen.task_ids)
    watch = TaskWatch(found)
    yield _event(listen.acknowledgement(watch.honoured))
    initial = watch.changed(found.values())
    if initial:
        yield "".join(_event(listen.task_notification(task)) for task in initial)
    async for said in streams.watch(
        waiter, first, refresh, settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS
    ):
        if isinstance(said, streams.Ended):
            # Unavailable: dropped without a result, so the client reconnects.
            if said.reason != "unavailable":
                yield _event(listen.closing(completed))
            return
        messages = listen.updates(said)
        named = watch.named(said)
        if named:
            found = await threads.run_pooled(read_tasks, listen.scope, named)
            moved = watch.changed(found.values())
            messages += map(listen.task_notification, moved)
        yield "".join(map(_event, messages)) if messages else ": keep-alive\n\n"


async def listen_stream(listen: Listen, completed: Completed) -> EventStreamResponse:
    """The event-stream response of an accepted ``subscriptions/listen``."""

    async def authorized() -> tuple[store.Scope, None]:
        return listen.scope, None

    waiter, first = await streams.open_stream(authorized)
    return sse.event_stream(_body(listen, waiter, first, completed), waiter.close)
