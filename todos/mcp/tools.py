"""The MCP tools: the agent API's operations, described for a model.

Each tool's arguments are its JSON view's table in ``todos.api.fields`` (with
the todo's id, which the JSON API has in its path): its input schema is built
from it, its arguments are validated by it, and it calls the same
endpoint-scoped store function as the view, so a tool and its view accept the
same input and fail the same way. A failure the caller can act on
(``NotFound``, ``Conflict``, a queue outside the grant, a bad argument) comes
back as a tool result with ``isError`` set, whose text says what happened and
what to do next; only an outage or a bug leaves the tool as a transport error.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from todos import store
from todos.api import fields
from todos.api import operations as api
from todos.api.fields import TODO_ID, Field, Fields, Operation, Schema, object_schema
from todos.api.plumbing import aauthenticate, api_error_for, bad_request
from todos.models import Endpoint
from todos.store import admission
from todos.telemetry import tracing
from todos.waiting import results
from todos.web import http

# A tool result (content, structuredContent, isError): JSON values.
type Result = dict[str, Any]


@dataclass(frozen=True)
class Caller:
    """Who calls a tool: the token's endpoint, its scope, and the MCP session;
    and the W3C trace context of its request's ``params._meta``."""

    endpoint: Endpoint
    scope: store.Scope
    session_id: str
    trace_context: tracing.TraceContext | None = None

    def traced(self, params: dict[str, Any]) -> "Caller":
        """This caller with the trace context a request's params carry."""
        context = tracing.from_meta(params.get("_meta"))
        return self if context is None else replace(self, trace_context=context)

    @property
    def actor(self) -> str:
        return f"agent:{self.endpoint.name}"


# What a model may do next after each kind of failure.
HINTS = {
    "not_found": "Check the todo_id: list_todos shows the todos of this endpoint.",
    "conflict": (
        "Call get_todo to see its state and owner. Only the worker that claimed a "
        "todo may heartbeat, complete, fail or release it: pass the same worker "
        "name you claimed it with, or the lease_token of the claim. A superseded "
        "lease means the todo was claimed again since: drop your work on it."
    ),
    "forbidden": "Use a queue this endpoint is granted, or leave queue out.",
    "bad_request": "Fix the argument and call the tool again.",
}
# Where a tool's failure means something of its own.
TOOL_HINTS = {
    ("ask", "conflict"): (
        "Only the worker holding a todo's current lease may ask, and not under a "
        "cancel request: call get_todo to see its state and cancel_requested."
    ),
    ("answer", "conflict"): (
        "The todo is not waiting for an answer (answered already, its deadline "
        "passed, or it never asked): call get_todo to see its question."
    ),
    ("cancel_todo", "conflict"): (
        "The todo has ended (done, canceled or dead letter): nothing to cancel."
    ),
    ("create_schedule", "conflict"): (
        "This endpoint has a schedule of that name: list_schedules shows it; "
        "pick another name."
    ),
    ("pause_schedule", "not_found"): (
        "Check the schedule_id: list_schedules shows this endpoint's schedules."
    ),
    ("resume_schedule", "not_found"): (
        "Check the schedule_id: list_schedules shows this endpoint's schedules."
    ),
}
NO_WORK_HINT = (
    "Nothing is claimable right now. Call claim_next again later, or pass "
    "wait_seconds (up to 20) to wait for work to arrive."
)


def _ok(data: dict[str, Any]) -> Result:
    return {
        "content": [{"type": "text", "text": json.dumps(data, indent=2)}],
        "structuredContent": data,
        "isError": False,
    }


def _tool_error(code: str, detail: str, hint: str) -> Result:
    return {
        "content": [{"type": "text", "text": f"{code}: {detail}. {hint}"}],
        "structuredContent": http.error_body(code, detail),
        "isError": True,
    }


def _todo(todo: store.Todo, **extra: Any) -> Result:
    return _ok({"todo": todo.to_dict(), **extra})


def _claimed(todo: store.Todo) -> Result:
    """A claim's result: the todo, and its trace context in ``_meta`` (as MCP
    carries one), so the agent's spans join the trace."""
    result = _todo(todo)
    carrier = todo.trace_carrier()
    if carrier is not None:
        result["_meta"] = carrier
    return result


# --- Handlers: one store call each, like the JSON views -------------------------


def list_todos(args: Fields, caller: Caller) -> Result:
    return _ok(api.list_page(caller.scope, args))


def get_todo(args: Fields, caller: Caller) -> Result:
    return _todo(store.get_todo(caller.scope, args.value(TODO_ID)))


def create_todo(args: Fields, caller: Caller) -> Result:
    todo, created = api.create_todo(
        caller.scope, args, actor=caller.actor, trace_context=caller.trace_context
    )
    return _todo(todo, created=created)


def claim_next(args: Fields, caller: Caller) -> api.ClaimNext:
    """Read the claim; the transport makes it, a long poll (todos.waiting.longpoll)."""
    return api.ClaimNext(None).read(args)


def claim_todo(args: Fields, caller: Caller) -> Result:
    todo_id, claim = args.value(TODO_ID), args.read(fields.CLAIM_TODO)
    return _claimed(store.claim_todo(caller.scope, todo_id, **claim))


def _transition(move: Callable[..., store.Todo], operation: Operation) -> "Handler":
    """The handler of an owner transition: ``operations.transition``."""

    def handler(args: Fields, caller: Caller) -> Result:
        todo_id = args.value(TODO_ID)
        return _todo(api.transition(move, operation, caller.scope, todo_id, args))

    return handler


def _atransition(
    move: Callable[..., Awaitable[store.Todo]], operation: Operation
) -> "AsyncHandler":
    """``_transition``'s async twin, with the store's (``store.acomplete_todo``)."""

    async def handler(args: Fields, caller: Caller) -> Result:
        todo_id = args.value(TODO_ID)
        moved = await api.atransition(move, operation, caller.scope, todo_id, args)
        return _todo(moved)

    return handler


def answer(args: Fields, caller: Caller) -> Result:
    todo_id, answer = args.value(TODO_ID), args.read(fields.ANSWER)
    worker = answer["worker"]
    return _todo(
        store.answer_todo(caller.scope, todo_id, answer["answer"], worker=worker)
    )


def cancel_todo(args: Fields, caller: Caller) -> Result:
    todo_id, cancel = args.value(TODO_ID), args.read(fields.CANCEL_TODO)
    worker = cancel["worker"]
    todo = store.cancel_todo(
        caller.scope, todo_id, reason=cancel["reason"], worker=worker
    )
    return _todo(todo)


class TodoWait(results.ResultWait):
    """A wait_for_todo, read and checked; the transport awaits it
    (``todos.waiting.results``), as it makes claim_next's long poll."""

    def __init__(self, scope: store.Scope, todo_id: str, wait: float) -> None:
        super().__init__(None, todo_id)  # the transport sets the request
        self.scope, self.wait = scope, wait

    async def start(self) -> store.Scope:
        # The POST's own database call authenticated the caller already.
        return self.scope

    async def revalidate(self) -> store.Scope:
        # A revoked or re-keyed token ends the wait (401).
        assert self.request is not None  # the transport set it before the wait
        return store.Scope.for_endpoint(await aauthenticate(self.request))


WAIT_FOR_TODO = replace(
    fields.WAIT_SECONDS,
    description="Wait at most this long for the todo to end or ask.",
    default=lambda: settings.SWITCHBOARD_MAX_WAIT_SECONDS,
)


# What a tool's handler answers: its result, or the wait the transport makes
# for it (claim_next's long poll, wait_for_todo's wait).
type Outcome = Result | api.ClaimNext | TodoWait
type Handler = Callable[[Fields, Caller], Outcome]
type AsyncHandler = Callable[[Fields, Caller], Awaitable[Outcome]]


def _unawaited(handler: Handler) -> AsyncHandler:
    """A handler that makes no statement (it reads a wait the transport then
    makes in the loop), as an async one."""

    async def ahandler(args: Fields, caller: Caller) -> Outcome:
        return handler(args, caller)

    return ahandler


def wait_for_todo(args: Fields, caller: Caller) -> TodoWait:
    """Read the wait; the transport waits, holding no thread or connection."""
    todo_id, wait = args.value(TODO_ID), args.value(WAIT_FOR_TODO)
    return TodoWait(caller.scope, todo_id, wait)


def finished(outcome: store.Todo | list[store.Todo]) -> Result:
    """The tool result of a tool whose waiting the transport did: a claim_next
    that claimed ``outcome`` (a list with max_todos), or a wait_for_todo that
    ended on it."""
    if isinstance(outcome, list):
        return _ok({"todos": [todo.to_dict() for todo in outcome]})
    return _claimed(outcome) if outcome.state == "claimed" else _todo(outcome)


def batch(args: Fields, caller: Caller) -> Result:
    return _ok(api.acknowledge_batch(caller.scope, args))


def list_queues(args: Fields, caller: Caller) -> Result:
    return _ok(
        {"queues": [queue.to_dict() for queue in store.list_queues(caller.scope)]}
    )


def retry_todo(args: Fields, caller: Caller) -> Result:
    todo_id = args.value(TODO_ID)
    return _todo(store.retry_todo(caller.scope, todo_id, actor=caller.actor))


def _schedule(schedule: store.Schedule) -> Result:
    return _ok({"schedule": schedule.to_dict()})


def create_schedule(args: Fields, caller: Caller) -> Result:
    return _schedule(api.create_schedule(caller.scope, args))


def list_schedules(args: Fields, caller: Caller) -> Result:
    return _ok(api.schedule_page(caller.scope, args))


def pause_schedule(args: Fields, caller: Caller) -> Result:
    schedule_id = args.value(fields.SCHEDULE_ID)
    return _schedule(store.pause_schedule(caller.scope, schedule_id))


def resume_schedule(args: Fields, caller: Caller) -> Result:
    schedule_id = args.value(fields.SCHEDULE_ID)
    return _schedule(store.resume_schedule(caller.scope, schedule_id))


def list_budgets(args: Fields, caller: Caller) -> Result:
    budgets = store.list_budgets(caller.scope)
    return _ok({"budgets": [budget.to_dict() for budget in budgets]})


def _queue(queue: store.QueueInfo) -> Result:
    return _ok({"queue": queue.to_dict()})


def get_queue(args: Fields, caller: Caller) -> Result:
    return _queue(store.get_queue(caller.scope, args.value(fields.QUEUE_NAME)))


def update_queue(args: Fields, caller: Caller) -> Result:
    name = args.value(fields.QUEUE_NAME)
    return _queue(api.update_queue(caller.scope, name, args))


def list_groups(args: Fields, caller: Caller) -> Result:
    name = args.value(fields.QUEUE_NAME)
    return _ok(api.groups_page(caller.scope, name, args))


def set_group(args: Fields, caller: Caller) -> Result:
    name, group = args.value(fields.QUEUE_NAME), args.value(fields.GROUP_NAME)
    return _ok({"group": api.set_group(caller.scope, name, group, args).to_dict()})


def set_priority(args: Fields, caller: Caller) -> Result:
    todo_id, values = args.value(TODO_ID), args.read(fields.SET_PRIORITY)
    return _todo(admission.set_priority(caller.scope, todo_id, values["priority"]))


# --- Schemas and descriptions ---------------------------------------------------

# The session names the worker a call leaves out (``Fields.default_worker``).
SESSION_WORKER = (
    " Defaults to this MCP session's id or, without a session, a name derived "
    "from your token and client name."
)


def _for_session(field: Field) -> Field:
    if field.kind != "worker":
        return field
    description = field.description + SESSION_WORKER
    return replace(field, required=False, description=description)


def input_schema(operation: Operation) -> Schema:
    """A tool's inputSchema: its fields' table, any JSON left open, and null
    only where it means something (a model leaves an optional field out)."""
    operation = tuple(_for_session(field) for field in operation)
    schema = object_schema(operation, any_json={}, null=False)
    schema["required"] = [field.name for field in operation if field.required]
    schema["additionalProperties"] = False
    return schema


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    handler: "Handler"
    # The tool's arguments; each call reads them, so a bound that is a setting
    # is the one in force.
    fields: Operation = ()
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False
    # The same work awaited in the event loop on the async store: a
    # transport in the loop awaits it instead of calling ``handler`` in a
    # thread (the acknowledgements, an agent's hot path).
    ahandler: AsyncHandler | None = None

    def schema(self) -> Schema:
        return input_schema(self.fields)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.schema(),
            "annotations": {
                "readOnlyHint": self.read_only,
                "destructiveHint": self.destructive,
                "idempotentHint": self.idempotent,
                "openWorldHint": False,
            },
        }


TOOLS = {
    tool.name: tool
    for tool in (
        Tool(
            "list_todos",
            "List todos",
            "List this endpoint's todos, oldest first, optionally filtered by queue "
            "and state. Returns {todos, next_cursor}; pass next_cursor back as cursor "
            "for the next page. Use it to look around, not to take work: claim_next "
            "does that safely.",
            list_todos,
            fields=fields.LIST_TODOS,
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "get_todo",
            "Get a todo",
            "Return one todo of this endpoint by id, with its state, owner, lease, "
            "attempts, payload and result.",
            get_todo,
            fields=(TODO_ID,),
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "create_todo",
            "Create a todo",
            "Put a new pending todo in a queue for some worker to claim. Returns "
            "{todo, created}; with an idempotency_key, repeating the call while the "
            "first todo is live returns that todo with created=false.",
            create_todo,
            fields=fields.CREATE_TODO,
        ),
        Tool(
            "claim_next",
            "Claim the next todo",
            "Take the oldest claimable todo (of one queue, if given) and hold it "
            "under a lease. Work on it, call heartbeat before the lease lapses if "
            "you need longer, then complete_todo or fail_todo. When nothing is "
            "claimable this is an error; pass wait_seconds to wait for work. With "
            "max_todos it claims up to that many at once (then an empty list is "
            "not an error). Keep each todo's lease_token: pass it to heartbeat, "
            "complete_todo, fail_todo, release_todo or batch.",
            claim_next,
            fields=fields.CLAIM_NEXT,
            ahandler=_unawaited(claim_next),
        ),
        Tool(
            "claim_todo",
            "Claim a todo",
            "Claim one specific pending todo by id and hold it under a lease.",
            claim_todo,
            fields=(TODO_ID, *fields.CLAIM_TODO),
        ),
        Tool(
            "heartbeat",
            "Extend a lease",
            "Keep a todo you claimed: push its lease to now + lease_seconds. Call it "
            "well before the lease lapses while the work goes on, with progress "
            "for the Board and a checkpoint to resume from. When the answer's "
            "todo.cancel_requested is true, someone canceled the work: stop, and "
            "end the todo with complete_todo, fail_todo or release_todo.",
            _transition(store.heartbeat, fields.HEARTBEAT),
            fields=(TODO_ID, *fields.HEARTBEAT),
            idempotent=True,
            ahandler=_atransition(store.aheartbeat, fields.HEARTBEAT),
        ),
        Tool(
            "complete_todo",
            "Complete a todo",
            "Mark a todo you claimed done, with an optional JSON result.",
            _transition(store.complete_todo, fields.COMPLETE_TODO),
            fields=(TODO_ID, *fields.COMPLETE_TODO),
            ahandler=_atransition(store.acomplete_todo, fields.COMPLETE_TODO),
        ),
        Tool(
            "fail_todo",
            "Fail a todo",
            "Report that a todo you claimed failed. Below its attempt cap it is "
            "retried after a backoff; at the cap it becomes a dead letter.",
            _transition(store.fail_todo, fields.FAIL_TODO),
            fields=(TODO_ID, *fields.FAIL_TODO),
            ahandler=_atransition(store.afail_todo, fields.FAIL_TODO),
        ),
        Tool(
            "release_todo",
            "Release a todo",
            "Give a todo you claimed back to the queue now, unfinished, so another "
            "worker can take it. Hand it to a named worker with assignee, and tell "
            "it where you got with note and checkpoint.",
            _transition(store.release_todo, fields.RELEASE_TODO),
            fields=(TODO_ID, *fields.RELEASE_TODO),
            ahandler=_atransition(store.arelease_todo, fields.RELEASE_TODO),
        ),
        Tool(
            "ask",
            "Ask a question",
            "Ask a person (or an orchestrating agent) a question about a todo you "
            "claimed, e.g. approval before a risky action, and stop working on it: "
            "your lease ends and no worker gets the todo until it is answered or "
            "the deadline passes. Then claim_next returns it (to you, with "
            "return_to me, the default) with question, answer and your checkpoint. "
            "Asking does not count as a failed attempt.",
            _transition(store.ask, fields.ASK),
            fields=(TODO_ID, *fields.ASK),
        ),
        Tool(
            "answer",
            "Answer a question",
            "Answer the open question of one of this endpoint's todos (a todo "
            "whose outcome is held, as wait_for_todo or get_todo shows it, with "
            "its question). The todo goes back to its queue with the answer, for "
            "the worker that asked. Answering twice is a conflict.",
            answer,
            fields=(TODO_ID, *fields.ANSWER),
        ),
        Tool(
            "cancel_todo",
            "Cancel a todo",
            "Stop a todo. One that is not being worked on (pending, delayed, held "
            "for an answer, waiting for its retry) ends at once: done, with "
            "outcome canceled. A claimed one gets a cancel request "
            "(cancel_requested true) that its worker sees in its next heartbeat; "
            "it ends canceled when that worker ends it or its lease lapses.",
            cancel_todo,
            fields=(TODO_ID, *fields.CANCEL_TODO),
            destructive=True,
        ),
        Tool(
            "wait_for_todo",
            "Wait for a todo",
            "Wait until a todo ended (done, dead letter, canceled) or asks a "
            "question, or wait_seconds pass; return it as it is then. Its outcome "
            "says which: done, dead_letter, canceled, held (asking: see question; "
            "answer it with answer), or still pending/claimed after the wait.",
            wait_for_todo,
            fields=(TODO_ID, WAIT_FOR_TODO),
            ahandler=_unawaited(wait_for_todo),
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "batch",
            "Acknowledge many todos",
            "Apply up to 100 complete/fail/heartbeat/release actions on todos you "
            "claimed, in one call (e.g. after claim_next with max_todos). Each "
            "action succeeds or fails on its own; the result lists one {id, status, "
            "todo | error, detail} per action, in order, status being what the "
            "single tool call would have answered (200, 404, 409, 400).",
            batch,
            fields=fields.BATCH,
        ),
        Tool(
            "list_queues",
            "List queues",
            "List this endpoint's queues with their settings (lease_seconds, "
            "max_attempts, delay_seconds, paused) and live counts (pending, "
            "delayed, claimed, retry_scheduled, dead_letter, oldest pending age).",
            list_queues,
            fields=(),
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "retry_todo",
            "Retry a failed todo",
            "Put a failed todo (dead letter or waiting for its retry) back in the "
            "queue now.",
            retry_todo,
            fields=(TODO_ID,),
        ),
        Tool(
            "create_schedule",
            "Create a schedule",
            "Make a todo recur: at each slot of a cron expression (five fields, "
            "or @hourly/@daily/@weekly/@monthly, read in time_zone, e.g. "
            '"0 2 * * *" with "Europe/Berlin" for every night at 02:00 Berlin '
            "time) or every every_seconds, the server puts a todo made from the "
            "todo template (title, payload, max_attempts) in queue, exactly once "
            "per slot. overlap skip skips a slot while the last one's todo is "
            "still open; missed says what to make for slots passed while the "
            "server was down. Returns {schedule}, with its next_slot_at.",
            create_schedule,
            fields=fields.CREATE_SCHEDULE,
        ),
        Tool(
            "list_schedules",
            "List schedules",
            "List this endpoint's schedules by name: their recurrence, template, "
            "policies, whether paused, next and last slot. Returns {schedules, "
            "next_cursor}.",
            list_schedules,
            fields=fields.LIST_SCHEDULES,
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "list_budgets",
            "List budgets",
            "List this endpoint's spend budgets: each one's scope (endpoint, queue "
            "or group), window, limits, and what its scope spent in the current "
            "window and what is left. Report your spend with usage on heartbeat, "
            "complete_todo and fail_todo. Returns {budgets}.",
            list_budgets,
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "pause_schedule",
            "Pause a schedule",
            "Stop a schedule making todos until resume_schedule; the todos it made "
            "stay.",
            pause_schedule,
            fields=(fields.SCHEDULE_ID,),
            idempotent=True,
        ),
        Tool(
            "resume_schedule",
            "Resume a schedule",
            "Start a paused schedule again. With missed skip it goes on from its "
            "next slot (no burst of the paused slots); with one or all the slots "
            "passed while paused are made as that policy says.",
            resume_schedule,
            fields=(fields.SCHEDULE_ID,),
            idempotent=True,
        ),
        Tool(
            "get_queue",
            "Get a queue",
            "Return one queue of this endpoint: its settings (lease_seconds, "
            "max_attempts, delay_seconds, paused, and admission's "
            "group_concurrency, fair, rate_limit, group_rate_limit, "
            "priority_aging_seconds), its live counts and groups_at_limit.",
            get_queue,
            fields=(fields.QUEUE_NAME,),
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "update_queue",
            "Change a queue's settings",
            "Change the settings given of a queue (made on first use); the others "
            "stay. E.g. group_concurrency 1 lets one todo per group be claimed at "
            "a time (one agent per repository), fair true serves the groups in "
            "turn, rate_limit caps claims per window across every server. null "
            "turns a control off. Returns {queue}.",
            update_queue,
            fields=(fields.QUEUE_NAME, *fields.QUEUE_SETTINGS),
            idempotent=True,
        ),
        Tool(
            "list_groups",
            "List a queue's groups",
            "List a queue's groups by name (those with todos pending or claimed, "
            "and those with an override): in_flight, pending, oldest_wait_seconds, "
            "the limit in force, weight, paused. Returns {groups, next_after}; "
            "pass next_after back as after for the next page.",
            list_groups,
            fields=(fields.QUEUE_NAME, *fields.GROUPS_PAGE),
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "set_group",
            "Set a group's override",
            "Override the queue's settings for one group: concurrency (null "
            "follows the queue's group_concurrency), weight (its share of fair "
            "turns), paused. Only the settings given change. Returns {group}.",
            set_group,
            fields=(fields.QUEUE_NAME, fields.GROUP_NAME, *fields.GROUP_SETTINGS),
            idempotent=True,
        ),
        Tool(
            "set_priority",
            "Change a todo's priority",
            "Change a pending todo's priority: 1 is claimed first, 5 last. A "
            "claimed or finished todo keeps its priority (a conflict).",
            set_priority,
            fields=(TODO_ID, *fields.SET_PRIORITY),
            idempotent=True,
        ),
    )
}


def tool_list() -> list[dict[str, Any]]:
    """Return the tools as tools/list describes them."""
    return [tool.to_dict() for tool in TOOLS.values()]


def call(tool: Tool, arguments: dict[str, Any], caller: Caller) -> Outcome:
    """Run a tool; return its result, with domain failures as ``isError`` results.

    An unavailable database is raised, for the transport to answer 503.
    """
    try:
        return tool.handler(_arguments(tool, arguments, caller), caller)
    except Exception as exc:
        return failure(tool, exc)


async def acall(tool: Tool, arguments: dict[str, Any], caller: Caller) -> Outcome:
    """``call`` of a tool with an async handler, awaited in the event loop."""
    assert tool.ahandler is not None  # the transport checked
    try:
        return await tool.ahandler(_arguments(tool, arguments, caller), caller)
    except Exception as exc:
        return failure(tool, exc)


def _arguments(tool: Tool, arguments: dict[str, Any], caller: Caller) -> Fields:
    unknown = sorted(set(arguments) - {field.name for field in tool.fields})
    if unknown:
        raise bad_request(f"{', '.join(unknown)}: not an argument of {tool.name}")
    return Fields(arguments, default_worker=caller.session_id)


def failure(tool: Tool, exc: Exception) -> Result:
    """A tool's failure as an ``isError`` result; an outage, a refused token
    (for the transport to answer 503 or 401) or a bug is raised."""
    error = api_error_for(exc)
    if error is None or error.status >= 500 or error.status == 401:
        raise exc
    if tool.name == "claim_next" and isinstance(exc, store.NotFound):
        return _tool_error(error.code, error.detail, NO_WORK_HINT)
    hint = TOOL_HINTS.get((tool.name, error.code), HINTS.get(error.code, ""))
    return _tool_error(error.code, error.detail, hint)
