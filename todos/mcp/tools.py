"""The MCP tools: the agent API's operations, described for a model.

Each tool validates its arguments with the agent API's ``Fields`` and calls
the same endpoint-scoped store function as the matching JSON view, so a tool
and its view accept the same input and fail the same way. A failure the
caller can act on (``NotFound``, ``Conflict``, a queue outside the grant, a
bad argument) comes back as a tool result with ``isError`` set, whose text
says what happened and what to do next; only an outage or a bug leaves the
tool as a transport error.
"""

import json
from dataclasses import dataclass

from django.conf import settings

from todos import http, store, waits
from todos.api import operations as api
from todos.api.plumbing import (
    Fields,
    api_error_for,
    authenticate,
    bad_request,
)
from todos.store.questions import RETURN_TO


@dataclass(frozen=True)
class Caller:
    """Who calls a tool: the token's endpoint, its scope, and the MCP session."""

    endpoint: object
    scope: store.Scope
    session_id: str

    @property
    def actor(self):
        return f"agent:{self.endpoint.name}"


class ToolArguments(Fields):
    """The agent API's field validation, plus the defaults of an MCP session."""

    def __init__(self, data, caller):
        super().__init__(data)
        self.caller = caller

    def worker(self):
        return self.text("worker") or self.caller.session_id

    def owner(self, default_worker=None):
        return super().owner(default_worker or self.caller.session_id)

    def todo_id(self):
        return self.text("todo_id", required=True)


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
}
NO_WORK_HINT = (
    "Nothing is claimable right now. Call claim_next again later, or pass "
    "wait_seconds (up to 20) to wait for work to arrive."
)


def _ok(data):
    return {
        "content": [{"type": "text", "text": json.dumps(data, indent=2)}],
        "structuredContent": data,
        "isError": False,
    }


def _tool_error(code, detail, hint):
    return {
        "content": [{"type": "text", "text": f"{code}: {detail}. {hint}"}],
        "structuredContent": http.error_body(code, detail),
        "isError": True,
    }


def _todo(todo, **extra):
    return _ok({"todo": todo.to_dict(), **extra})


# --- Handlers: one store call each, like the JSON views -------------------------


def list_todos(args, caller):
    return _ok(api.list_page(caller.scope, args))


def get_todo(args, caller):
    return _todo(store.get_todo(caller.scope, args.todo_id()))


def create_todo(args, caller):
    todo, created = api.create_todo(caller.scope, args, actor=caller.actor)
    return _todo(todo, created=created)


def claim_next(args, caller):
    """Read the claim; the transport makes it, a long poll (todos.longpoll)."""
    return api.ClaimNext(None).read(args)


def claim_todo(args, caller):
    todo_id, worker, lease = args.todo_id(), args.worker(), args.lease_seconds()
    return _todo(store.claim_todo(caller.scope, todo_id, worker, lease_seconds=lease))


def heartbeat(args, caller):
    todo_id, (worker, token) = args.todo_id(), args.owner()
    return _todo(
        store.heartbeat(
            caller.scope,
            todo_id,
            worker,
            lease_seconds=args.lease_seconds(),
            lease_token=token,
            progress=args.progress(),
            checkpoint=args.checkpoint(),
        )
    )


def complete_todo(args, caller):
    todo_id, (worker, token) = args.todo_id(), args.owner()
    result = args.json("result")
    return _todo(
        store.complete_todo(
            caller.scope, todo_id, worker, result=result, lease_token=token
        )
    )


def fail_todo(args, caller):
    todo_id, (worker, token) = args.todo_id(), args.owner()
    error = args.text("error", max_length=store.MAX_ERROR_CHARS, empty=True) or ""
    return _todo(
        store.fail_todo(caller.scope, todo_id, worker, error=error, lease_token=token)
    )


def release_todo(args, caller):
    todo_id, (worker, token) = args.todo_id(), args.owner()
    return _todo(
        store.release_todo(
            caller.scope,
            todo_id,
            worker,
            lease_token=token,
            assignee=args.handoff(),
            note=args.text("note", max_length=store.MAX_NOTE_CHARS, empty=True),
            checkpoint=args.checkpoint(),
        )
    )


def ask(args, caller):
    todo_id, (worker, token) = args.todo_id(), args.owner()
    arguments = api.ask_arguments(args)
    try:
        todo = store.ask(caller.scope, todo_id, worker, lease_token=token, **arguments)
    except ValueError as exc:
        # The store names the field it refused (choices, answer_schema, …).
        raise api_error_for(exc) or bad_request(str(exc)) from exc
    return _todo(todo)


def answer(args, caller):
    todo_id = args.todo_id()
    if "answer" not in args.data:
        raise bad_request("answer: is required")
    by = args.text("worker") or caller.actor
    return _todo(store.answer_todo(caller.scope, todo_id, args.json("answer"), by=by))


def cancel_todo(args, caller):
    todo_id = args.todo_id()
    reason = args.text("reason", max_length=store.MAX_REASON_CHARS, empty=True)
    by = args.text("worker") or caller.actor
    return _todo(store.cancel_todo(caller.scope, todo_id, reason=reason or "", by=by))


class TodoWait(waits.ResultWait):
    """A wait_for_todo, read and checked; the transport awaits it
    (``todos.waits``), as it makes claim_next's long poll."""

    def __init__(self, scope, todo_id, wait):
        super().__init__(None, todo_id)  # the transport sets the request
        self.scope, self.wait = scope, wait

    def start(self):
        # The POST's own database call authenticated the caller already.
        return self.scope

    def revalidate(self):
        # A revoked or re-keyed token ends the wait (401).
        return store.Scope.for_endpoint(authenticate(self.request))


def wait_for_todo(args, caller):
    """Read the wait; the transport waits, holding no thread or connection."""
    wait = args.integer(
        "wait_seconds",
        minimum=0,
        maximum=settings.SWITCHBOARD_MAX_WAIT_SECONDS,
        default=settings.SWITCHBOARD_MAX_WAIT_SECONDS,
    )
    return TodoWait(caller.scope, args.todo_id(), wait)


def finished(work, outcome):
    """The tool result of a tool whose waiting the transport did: a claim_next
    that claimed ``outcome``, or a wait_for_todo that ended on it."""
    if isinstance(work, api.ClaimNext) and work.limit is not None:
        return _ok({"todos": [todo.to_dict() for todo in outcome]})
    return _todo(outcome)


def batch(args, caller):
    return _ok(
        api.acknowledge_batch(caller.scope, args, default_worker=caller.session_id)
    )


def list_queues(args, caller):
    return _ok(
        {"queues": [queue.to_dict() for queue in store.list_queues(caller.scope)]}
    )


def retry_todo(args, caller):
    return _todo(store.retry_todo(caller.scope, args.todo_id(), actor=caller.actor))


# --- Schemas and descriptions ---------------------------------------------------

TODO_ID = {
    "type": "string",
    "description": "The todo's id, as list_todos, create_todo or claim_next give it.",
}
WORKER = {
    "type": "string",
    "minLength": 1,
    "maxLength": store.MAX_NAME_CHARS,
    "description": (
        "Your worker name, stored as the todo's owner. Defaults to this MCP "
        "session's id or, without a session, a name derived from your token and "
        "client name. Use the same name for every call on a todo you claimed."
    ),
}
QUEUE = {"type": "string", "minLength": 1, "maxLength": store.MAX_NAME_CHARS}
LEASE_TOKEN = {
    "type": "string",
    "maxLength": store.MAX_LEASE_TOKEN_CHARS,
    "description": (
        "The lease_token your claim returned. With it the call succeeds only "
        "while that claim is the todo's current one (else a conflict: the lease "
        "was superseded, nothing changed), and worker may be left out."
    ),
}
RESULT = {
    "type": "object",
    "description": 'What was done, e.g. {"summary": "…", "url": "…"}.',
}
ERROR_TEXT = {
    "type": "string",
    "maxLength": store.MAX_ERROR_CHARS,
    "description": "What went wrong, for whoever looks next.",
}


CHECKPOINT = {
    "description": (
        "Where to resume: any JSON, at most "
        f"{store.MAX_CHECKPOINT_BYTES // 1024} KiB encoded. It replaces the last "
        "one and is handed to whoever claims the todo next (after a lapsed lease, "
        "a retry, a release or an answer)."
    ),
}
PROGRESS = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "maxLength": store.MAX_PROGRESS_MESSAGE_CHARS},
        "fraction": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "additionalProperties": False,
    "description": (
        'How far the work got, shown on the Board, e.g. {"message": "3 of 10 '
        'files", "fraction": 0.3}.'
    ),
}
ASSIGNEE = {
    "type": ["string", "null"],
    "minLength": 1,
    "maxLength": store.MAX_NAME_CHARS,
    "description": (
        "Hand the todo to this worker: only it may claim it next. null gives it "
        "to any worker of the queue; left out, the assignment stays as it was."
    ),
}
NOTE = {
    "type": "string",
    "maxLength": store.MAX_NOTE_CHARS,
    "description": "Why it is handed back, for whoever claims it next.",
}
REASON = {
    "type": "string",
    "maxLength": store.MAX_REASON_CHARS,
    "description": "Why it is canceled, kept in the todo's result.",
}


def _wait(description, default):
    return {
        "type": "integer",
        "minimum": 0,
        "maximum": settings.SWITCHBOARD_MAX_WAIT_SECONDS,
        "default": default,
        "description": description,
    }


def _lease():
    return {
        "type": "integer",
        "minimum": 1,
        "maximum": store.MAX_LEASE_SECONDS,
        "description": (
            "Seconds the claim stays yours without a heartbeat "
            f"(default {settings.SWITCHBOARD_LEASE_SECONDS}). When it lapses the "
            "todo goes back to the queue for another worker."
        ),
    }


def _object(properties, required=()):
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    handler: object
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False

    def schema(self):
        return SCHEMAS[self.name]()

    def to_dict(self):
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


# Built per call, not at import: the lease default comes from settings.
SCHEMAS = {
    "list_todos": lambda: _object(
        {
            "queue": {**QUEUE, "description": "Only todos of this queue."},
            "state": {
                "type": "string",
                "enum": list(store.STATE_FILTERS),
                "description": (
                    "Only todos in this state. failed splits into retry_scheduled "
                    "(will be retried) and dead_letter (gave up)."
                ),
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
            "cursor": {
                "type": "string",
                "description": "next_cursor of the previous page: read the next one.",
            },
        }
    ),
    "get_todo": lambda: _object({"todo_id": TODO_ID}, ["todo_id"]),
    "create_todo": lambda: _object(
        {
            "queue": {**QUEUE, "description": "The queue to put the todo in."},
            "title": {
                "type": "string",
                "maxLength": store.MAX_TITLE_CHARS,
                "description": "A one-line summary of the work.",
            },
            "payload": {
                "type": "object",
                "description": "What the worker needs to do the work.",
            },
            "idempotency_key": {
                "type": "string",
                "maxLength": store.MAX_KEY_CHARS,
                "description": (
                    "A key that makes the call safe to repeat: while a todo with this "
                    "key is live, creating again returns it with created=false."
                ),
            },
            "assignee": {
                **QUEUE,
                "description": "Only this worker may claim the todo.",
            },
            "max_attempts": {
                "type": "integer",
                "minimum": 1,
                "maximum": store.MAX_ATTEMPTS_CAP,
                "description": (
                    "Claims allowed before it dead-letters (default: the queue's "
                    "setting, else 5)."
                ),
            },
            "replace": {
                "type": "boolean",
                "default": False,
                "description": (
                    "With an idempotency_key: cancel the key's pending live todo "
                    "and create this one instead (a conflict when that todo is "
                    "claimed: it gets a cancel request)."
                ),
            },
            "delay_seconds": {
                "type": "integer",
                "minimum": 0,
                "maximum": store.MAX_DELAY_SECONDS,
                "description": (
                    "Keep the todo invisible to claims for this long (default: the "
                    "queue's setting, else 0). Its available_at says when it is due."
                ),
            },
        },
        ["queue"],
    ),
    "claim_next": lambda: _object(
        {
            "queue": {**QUEUE, "description": "Claim only from this queue."},
            "worker": WORKER,
            "lease_seconds": _lease(),
            "wait_seconds": _wait(
                "If nothing is claimable, wait this long for work.", default=0
            ),
            "max_todos": {
                "type": "integer",
                "minimum": 1,
                "maximum": store.MAX_CLAIM_BATCH,
                "description": (
                    "Claim up to this many at once. The result is then {todos: "
                    "[...]}, an empty list (not an error) when nothing came."
                ),
            },
        }
    ),
    "claim_todo": lambda: _object(
        {"todo_id": TODO_ID, "worker": WORKER, "lease_seconds": _lease()}, ["todo_id"]
    ),
    "heartbeat": lambda: _object(
        {
            "todo_id": TODO_ID,
            "worker": WORKER,
            "lease_token": LEASE_TOKEN,
            "lease_seconds": _lease(),
            "progress": PROGRESS,
            "checkpoint": CHECKPOINT,
        },
        ["todo_id"],
    ),
    "complete_todo": lambda: _object(
        {
            "todo_id": TODO_ID,
            "worker": WORKER,
            "lease_token": LEASE_TOKEN,
            "result": RESULT,
        },
        ["todo_id"],
    ),
    "fail_todo": lambda: _object(
        {
            "todo_id": TODO_ID,
            "worker": WORKER,
            "lease_token": LEASE_TOKEN,
            "error": ERROR_TEXT,
        },
        ["todo_id"],
    ),
    "release_todo": lambda: _object(
        {
            "todo_id": TODO_ID,
            "worker": WORKER,
            "lease_token": LEASE_TOKEN,
            "assignee": ASSIGNEE,
            "note": NOTE,
            "checkpoint": CHECKPOINT,
        },
        ["todo_id"],
    ),
    "ask": lambda: _object(
        {
            "todo_id": TODO_ID,
            "worker": WORKER,
            "lease_token": LEASE_TOKEN,
            "question": {
                "type": "string",
                "minLength": 1,
                "maxLength": store.MAX_QUESTION_CHARS,
                "description": "The question, in words a person can answer.",
            },
            "choices": {
                "type": "array",
                "minItems": 1,
                "maxItems": store.MAX_CHOICES,
                "uniqueItems": True,
                "items": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": store.MAX_CHOICE_CHARS,
                },
                "description": "The answers allowed, shown as buttons.",
            },
            "answer_schema": {
                "type": "object",
                "description": (
                    "A JSON Schema the answer must be valid against, at most "
                    f"{store.MAX_ANSWER_SCHEMA_BYTES // 1024} KiB."
                ),
            },
            "checkpoint": CHECKPOINT,
            "deadline_seconds": {
                "type": "integer",
                "minimum": store.MIN_DEADLINE_SECONDS,
                "maximum": store.MAX_DEADLINE_SECONDS,
                "description": (
                    "Stop waiting for an answer after this long: the todo is "
                    "claimable again with answer null and question.expired true."
                ),
            },
            "return_to": {
                "type": "string",
                "enum": list(RETURN_TO),
                "default": "me",
                "description": (
                    "Who gets the answered todo: me (the asking worker only) or "
                    "pool (any worker of the queue)."
                ),
            },
        },
        ["todo_id", "question"],
    ),
    "answer": lambda: _object(
        {
            "todo_id": TODO_ID,
            "answer": {
                "description": (
                    "The answer: any JSON; one of the question's choices when it "
                    "has them, valid against its answer_schema when it has one."
                ),
            },
            "worker": {
                **WORKER,
                "description": "Who answers, stored with the answer.",
            },
        },
        ["todo_id", "answer"],
    ),
    "cancel_todo": lambda: _object(
        {
            "todo_id": TODO_ID,
            "reason": REASON,
            "worker": {**WORKER, "description": "Who cancels, stored with it."},
        },
        ["todo_id"],
    ),
    "wait_for_todo": lambda: _object(
        {
            "todo_id": TODO_ID,
            "wait_seconds": _wait(
                "Wait at most this long for the todo to end or ask.",
                default=settings.SWITCHBOARD_MAX_WAIT_SECONDS,
            ),
        },
        ["todo_id"],
    ),
    "batch": lambda: _object(
        {
            "worker": WORKER,
            "actions": {
                "type": "array",
                "minItems": 1,
                "maxItems": store.MAX_ACK_BATCH,
                "description": "The transitions to apply, each on its own.",
                "items": {
                    "type": "object",
                    "properties": {
                        "op": {"type": "string", "enum": list(api.ACK_OPS)},
                        "id": TODO_ID,
                        "lease_token": LEASE_TOKEN,
                        "worker": WORKER,
                        "result": RESULT,
                        "error": ERROR_TEXT,
                        "lease_seconds": _lease(),
                        "progress": PROGRESS,
                        "checkpoint": CHECKPOINT,
                        "assignee": ASSIGNEE,
                        "note": NOTE,
                        "reason": REASON,
                    },
                    "required": ["op", "id"],
                },
            },
        },
        ["actions"],
    ),
    "list_queues": lambda: _object({}),
    "retry_todo": lambda: _object({"todo_id": TODO_ID}, ["todo_id"]),
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
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "get_todo",
            "Get a todo",
            "Return one todo of this endpoint by id, with its state, owner, lease, "
            "attempts, payload and result.",
            get_todo,
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
        ),
        Tool(
            "claim_todo",
            "Claim a todo",
            "Claim one specific pending todo by id and hold it under a lease.",
            claim_todo,
        ),
        Tool(
            "heartbeat",
            "Extend a lease",
            "Keep a todo you claimed: push its lease to now + lease_seconds. Call it "
            "well before the lease lapses while the work goes on, with progress "
            "for the Board and a checkpoint to resume from. When the answer's "
            "todo.cancel_requested is true, someone canceled the work: stop, and "
            "end the todo with complete_todo, fail_todo or release_todo.",
            heartbeat,
            idempotent=True,
        ),
        Tool(
            "complete_todo",
            "Complete a todo",
            "Mark a todo you claimed done, with an optional JSON result.",
            complete_todo,
        ),
        Tool(
            "fail_todo",
            "Fail a todo",
            "Report that a todo you claimed failed. Below its attempt cap it is "
            "retried after a backoff; at the cap it becomes a dead letter.",
            fail_todo,
        ),
        Tool(
            "release_todo",
            "Release a todo",
            "Give a todo you claimed back to the queue now, unfinished, so another "
            "worker can take it. Hand it to a named worker with assignee, and tell "
            "it where you got with note and checkpoint.",
            release_todo,
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
            ask,
        ),
        Tool(
            "answer",
            "Answer a question",
            "Answer the open question of one of this endpoint's todos (a todo "
            "whose outcome is held, as wait_for_todo or get_todo shows it, with "
            "its question). The todo goes back to its queue with the answer, for "
            "the worker that asked. Answering twice is a conflict.",
            answer,
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
        ),
        Tool(
            "list_queues",
            "List queues",
            "List this endpoint's queues with their settings (lease_seconds, "
            "max_attempts, delay_seconds, paused) and live counts (pending, "
            "delayed, claimed, retry_scheduled, dead_letter, oldest pending age).",
            list_queues,
            read_only=True,
            idempotent=True,
        ),
        Tool(
            "retry_todo",
            "Retry a failed todo",
            "Put a failed todo (dead letter or waiting for its retry) back in the "
            "queue now.",
            retry_todo,
        ),
    )
}


def tool_list():
    """Return the tools as tools/list describes them."""
    return [tool.to_dict() for tool in TOOLS.values()]


def call(tool, arguments, caller):
    """Run a tool; return its result, with domain failures as ``isError`` results.

    An unavailable database is raised, for the transport to answer 503.
    """
    unknown = sorted(set(arguments) - set(tool.schema()["properties"]))
    try:
        if unknown:
            raise bad_request(f"{', '.join(unknown)}: not an argument of {tool.name}")
        return tool.handler(ToolArguments(arguments, caller), caller)
    except Exception as exc:
        return failure(tool, exc)


def failure(tool, exc):
    """A tool's failure as an ``isError`` result; an outage, a refused token
    (for the transport to answer 503 or 401) or a bug is raised."""
    error = api_error_for(exc)
    if error is None or error.status >= 500 or error.status == 401:
        raise exc
    if tool.name == "claim_next" and isinstance(exc, store.NotFound):
        return _tool_error(error.code, error.detail, NO_WORK_HINT)
    hint = TOOL_HINTS.get((tool.name, error.code), HINTS.get(error.code, ""))
    return _tool_error(error.code, error.detail, hint)
