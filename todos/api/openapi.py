"""The OpenAPI 3.1 document of the agent API, served at /api/v1/openapi.json.

Its request bodies and parameters are built from the tables the views read
(``todos.api.fields``); its responses are written here. tests/api/
test_schemathesis.py checks the running API against it.
"""

from dataclasses import replace
from typing import Any
from zoneinfo import available_timezones

from django.http import HttpRequest

from todos import store
from todos.api import fields
from todos.api.fields import NO_NUL, Operation, Schema, object_schema
from todos.api.plumbing import api_view
from todos.store.admission import (
    MAX_AGING_SECONDS,
    MAX_GROUP_CONCURRENCY,
    MAX_RATE_COUNT,
    MAX_RATE_PERIOD_SECONDS,
    MAX_WEIGHT,
)
from todos.store.queues import MAX_ATTEMPTS_CAP, UNLIMITED_ATTEMPTS
from todos.store.rows import (
    MAX_COST,
    MAX_DELAY_SECONDS,
    MAX_GROUP_CHARS,
    MAX_LEASE_SECONDS,
    MAX_PRIORITY,
    MIN_PRIORITY,
)
from todos.web.http import JsonResponse

TODO_ID = {
    "name": "todo_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}

NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}

TODO_SCHEMA = {
    "type": "object",
    "required": [
        "id",
        "endpoint_id",
        "queue",
        "title",
        "payload",
        "state",
        "assignee",
        "owner",
        "attempt",
        "max_attempts",
        "lease_expires_at",
        "claimed_at",
        "next_retry_at",
        "idempotency_key",
        "last_error",
        "result",
        "created_at",
        "updated_at",
        "available_at",
        "lease_token",
        "question",
        "answer",
        "outcome",
        "progress",
        "checkpoint",
        "cancel_requested",
        "note",
        "trace_context",
        "usage",
        "priority",
        "group",
        "cost",
        "max_cost",
    ],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "endpoint_id": {"type": "string", "format": "uuid"},
        "queue": {"type": "string"},
        "title": {"type": "string"},
        "payload": {"description": "Any JSON value the producer attached."},
        "state": {"type": "string", "enum": ["pending", "claimed", "done", "failed"]},
        "assignee": {"type": ["string", "null"]},
        "owner": {
            "type": ["string", "null"],
            "description": "The worker holding (or last holding) the lease.",
        },
        "attempt": {"type": "integer", "minimum": 0},
        "max_attempts": {"type": "integer", "minimum": 1},
        "lease_expires_at": NULLABLE_TIME,
        "claimed_at": NULLABLE_TIME,
        "next_retry_at": {
            **NULLABLE_TIME,
            "description": "Set on a failed todo with a retry window.",
        },
        "idempotency_key": {"type": ["string", "null"]},
        "last_error": {"type": "string"},
        "result": {"description": "The JSON result given on complete, or null."},
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "available_at": {
            "type": "string",
            "format": "date-time",
            "description": "When a pending todo becomes claimable; created_at "
            "unless it was created with delay_seconds.",
        },
        "priority": {
            "type": "integer",
            "minimum": store.MIN_PRIORITY,
            "maximum": store.MAX_PRIORITY,
            "description": "1 is claimed first; the oldest first within a level.",
        },
        "group": {
            "type": ["string", "null"],
            "description": "The group whose limit, turn and rate limit it shares.",
        },
        "cost": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "What it counts against its queue's rate limits.",
        },
        "max_cost": {
            "type": ["number", "null"],
            "minimum": 0,
            "description": "What one attempt may cost in dollars, reserved "
            "against its budgets at each claim; null: none.",
        },
        "lease_token": {
            "type": ["string", "null"],
            "description": "Minted fresh by every claim: pass it to heartbeat, "
            "complete, fail and release (fencing).",
        },
        "question": {
            "type": ["object", "null"],
            "description": "The last question its owner asked; it stays after the "
            "answer, for the next claimant.",
            "required": [
                "text",
                "choices",
                "answer_schema",
                "asked_by",
                "asked_at",
                "deadline",
                "expired",
                "return_to",
            ],
            "properties": {
                "text": {"type": "string"},
                "choices": {"type": ["array", "null"], "items": {"type": "string"}},
                "answer_schema": {"type": ["object", "null"]},
                "asked_by": {"type": ["string", "null"]},
                "asked_at": {"type": "string", "format": "date-time"},
                "deadline": NULLABLE_TIME,
                "expired": {
                    "type": "boolean",
                    "description": "The deadline passed with no answer.",
                },
                "return_to": {"type": "string", "enum": ["me", "pool"]},
            },
        },
        "answer": {
            "type": ["object", "null"],
            "required": ["value", "by", "at"],
            "properties": {
                "value": {"description": "The answer: any JSON value."},
                "by": {
                    "type": "string",
                    "description": "Who answered: agent:<endpoint>, "
                    "operator:<username> (the Board) or link (an answer link).",
                },
                "worker": {
                    "type": ["string", "null"],
                    "description": "The worker name an agent gave, if any.",
                },
                "at": {"type": "string", "format": "date-time"},
            },
        },
        "outcome": {
            "type": "string",
            "enum": [
                "pending",
                "claimed",
                "retry_scheduled",
                "held",
                "done",
                "canceled",
                "dead_letter",
            ],
            "description": "Where the todo stands: its state, with failed split "
            "in two, pending held for an answer, and done canceled.",
        },
        "progress": {
            "type": ["object", "null"],
            "properties": {
                "message": {"type": "string"},
                "fraction": {"type": ["number", "null"]},
            },
        },
        "checkpoint": {
            "description": "The last checkpoint (any JSON), handed to every "
            "later claimant."
        },
        "cancel_requested": {
            "type": "boolean",
            "description": "A cancel was asked of this todo's owner: end it.",
        },
        "note": {
            "type": ["string", "null"],
            "description": "The last release's note to the next claimant.",
        },
        "trace_context": {
            "type": ["object", "null"],
            "description": "The W3C trace context the create carried "
            "(traceparent, tracestate): start the work's spans from it. With "
            "tracing on, a claimed todo's is its delivery's process span.",
            "properties": {
                "traceparent": {"type": "string"},
                "tracestate": {"type": "string"},
            },
            "required": ["traceparent"],
        },
        "usage": {
            "type": ["object", "null"],
            "description": "What the todo's attempts reported they spent, summed "
            "over its attempts (each attempt's last report); null until one "
            "reports.",
            "required": ["input_tokens", "output_tokens", "cost_usd"],
            "properties": {
                "input_tokens": {"type": "integer", "minimum": 0},
                "output_tokens": {"type": "integer", "minimum": 0},
                "cost_usd": {"type": "number", "minimum": 0},
            },
        },
    },
}

USAGE_REPORT_SCHEMA = {
    "type": "object",
    "required": [
        "id",
        "queue",
        "group",
        "todo_id",
        "attempt",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "model",
        "idempotency_key",
        "reported_at",
    ],
    "properties": {
        "id": {"type": "integer"},
        "queue": {"type": "string"},
        "group": {"type": ["string", "null"]},
        "todo_id": {"type": ["string", "null"], "format": "uuid"},
        "attempt": {"type": ["integer", "null"]},
        "input_tokens": {"type": "integer", "minimum": 0},
        "output_tokens": {"type": "integer", "minimum": 0},
        "cost_usd": {"type": "number", "minimum": 0},
        "model": {"type": "string"},
        "idempotency_key": {"type": ["string", "null"]},
        "reported_at": {"type": "string", "format": "date-time"},
    },
}

RATE_LIMIT_SCHEMA = {
    "type": ["object", "null"],
    "description": "At most count (a todo counts its cost) per per_seconds, "
    "burst at once; null: no limit.",
    "additionalProperties": False,
    "required": ["count"],
    "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": MAX_RATE_COUNT},
        "per_seconds": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_RATE_PERIOD_SECONDS,
            "default": 1,
        },
        "burst": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_RATE_COUNT,
            "description": "null or left out: the count.",
        },
    },
}

GROUP_CONCURRENCY_SCHEMA = {
    "type": ["integer", "null"],
    "minimum": 0,
    "maximum": MAX_GROUP_CONCURRENCY,
    "description": "At most this many claimed todos per group (0 holds every "
    "group; null: no limit).",
}
AGING_SCHEMA = {
    "type": ["integer", "null"],
    "minimum": 1,
    "maximum": MAX_AGING_SECONDS,
    "description": "A waiting todo rises one level per this many seconds.",
}

QUEUE_SCHEMA = {
    "type": "object",
    "required": [
        "name",
        "lease_seconds",
        "max_attempts",
        "delay_seconds",
        "paused",
        "pending",
        "delayed",
        "claimed",
        "retry_scheduled",
        "dead_letter",
        "oldest_pending_age_seconds",
        "lapsed",
    ],
    "properties": {
        "name": {"type": "string"},
        "lease_seconds": {"type": ["integer", "null"]},
        "max_attempts": {"type": ["integer", "null"]},
        "delay_seconds": {"type": ["integer", "null"]},
        "paused": {"type": "boolean"},
        "paused_at": NULLABLE_TIME,
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "pending": {"type": "integer", "minimum": 0},
        "delayed": {"type": "integer", "minimum": 0},
        "claimed": {"type": "integer", "minimum": 0},
        "retry_scheduled": {"type": "integer", "minimum": 0},
        "dead_letter": {"type": "integer", "minimum": 0},
        "oldest_pending_age_seconds": {"type": ["number", "null"]},
        "lapsed": {"type": "integer", "minimum": 0},
        "group_concurrency": GROUP_CONCURRENCY_SCHEMA,
        "fair": {
            "type": "boolean",
            "description": "Claims serve the groups in turn, weighted.",
        },
        "rate_limit": RATE_LIMIT_SCHEMA,
        "group_rate_limit": RATE_LIMIT_SCHEMA,
        "priority_aging_seconds": AGING_SCHEMA,
        "groups_at_limit": {"type": "integer", "minimum": 0},
    },
}

GROUP_SCHEMA = {
    "type": "object",
    "required": [
        "group",
        "in_flight",
        "pending",
        "oldest_wait_seconds",
        "limit",
        "concurrency",
        "weight",
        "paused",
    ],
    "properties": {
        "group": {"type": "string"},
        "in_flight": {"type": "integer", "minimum": 0},
        "pending": {"type": "integer", "minimum": 0},
        "oldest_wait_seconds": {"type": ["number", "null"]},
        "limit": {
            "type": ["integer", "null"],
            "description": "The limit in force: the override, else the queue's.",
        },
        "concurrency": {"type": ["integer", "null"], "minimum": 0},
        "weight": {"type": "integer", "minimum": 1},
        "paused": {"type": "boolean"},
    },
}

QUEUE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
GROUP_NAME = {
    "name": "group",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "maxLength": store.MAX_GROUP_CHARS},
}

SCHEDULE_ID = {
    "name": "schedule_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}

# A schedule's todo template: the create fields each slot's todo takes.
TEMPLATE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "The todo each slot makes.",
    "properties": {
        "title": {
            "type": ["string", "null"],
            "maxLength": store.MAX_TITLE_CHARS,
            "pattern": NO_NUL,
            "description": "Default (also for null): the schedule's name.",
        },
        "payload": {"$ref": "#/components/schemas/JsonValue"},
        "max_attempts": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": store.MAX_ATTEMPTS_CAP,
        },
        "priority": {
            "type": ["integer", "null"],
            "minimum": MIN_PRIORITY,
            "maximum": MAX_PRIORITY,
            "description": "1 (claimed first) to 5; default 3.",
        },
        "group": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": MAX_GROUP_CHARS,
            "pattern": NO_NUL,
        },
        "cost": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_COST,
            "description": "What the todo counts against a rate limit; default 1.",
        },
        "max_cost": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": store.MAX_USAGE_COST_USD,
            "description": "What one attempt may cost in dollars, reserved "
            "against the todo's budgets at each claim.",
        },
    },
}

SCHEDULE_SCHEMA = {
    "type": "object",
    "required": [
        "id",
        "name",
        "queue",
        "cron",
        "every_seconds",
        "time_zone",
        "todo",
        "overlap",
        "missed",
        "paused",
        "paused_at",
        "next_slot_at",
        "last_slot_at",
        "last_todo_id",
        "created_at",
        "updated_at",
    ],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string"},
        "queue": {"type": "string"},
        "cron": {"type": ["string", "null"]},
        "every_seconds": {"type": ["integer", "null"]},
        "time_zone": {"type": "string"},
        "todo": {"type": "object"},
        "overlap": {"type": "string", "enum": list(store.SCHEDULE_OVERLAP)},
        "missed": {"type": "string", "enum": list(store.SCHEDULE_MISSED)},
        "paused": {"type": "boolean"},
        "paused_at": NULLABLE_TIME,
        "next_slot_at": {
            **NULLABLE_TIME,
            "description": "The next slot to fire (null while paused).",
        },
        "last_slot_at": {
            **NULLABLE_TIME,
            "description": "The last slot that made its todo.",
        },
        "last_todo_id": {
            "type": ["string", "null"],
            "format": "uuid",
            "description": "The last todo the schedule made (a slot or fire now).",
        },
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
    },
}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {
            "type": "string",
            "enum": [
                "bad_request",
                "unauthorized",
                "forbidden",
                "not_found",
                "method_not_allowed",
                "conflict",
                "payload_too_large",
                "unavailable",
            ],
        },
        "detail": {"type": "string"},
    },
}

ERRORS = {
    "400": "Invalid JSON or fields; the detail names the field.",
    "401": "Missing, unknown or revoked token.",
    "403": "A queue outside the endpoint's grant.",
    "404": "No such todo in this endpoint (absent, foreign or malformed id), "
    "or no claimable work.",
    "409": "The todo exists but is not in the needed state or not this worker's, "
    "or the lease_token is not the current lease's (lease superseded).",
    "413": "The body exceeds 256 KiB.",
    "429": "budget_exhausted: a reject_new budget of the todo's endpoint, queue or "
    "group is at its limit; the detail names it, Retry-After says when its "
    "window ends.",
    "503": "The database cannot be reached.",
}


def _json(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*codes: str) -> Schema:
    return {
        code: {"description": ERRORS[code], **_json(_ref("Error"))} for code in codes
    }


def _todo_ok(description: str) -> Schema:
    return {"200": {"description": description, **_json(_ref("TodoEnvelope"))}}


def _body(operation: Operation, **extra: Any) -> Schema:
    schema = {**object_schema(operation, JSON_VALUE), **extra}
    return {"required": True, **_json(schema)}


def _query(operation: Operation) -> list[Schema]:
    """An operation's query parameters (a query string has no null)."""
    return [
        {
            "name": field.name,
            "in": "query",
            "schema": replace(field, required=True).schema(JSON_VALUE),
        }
        for field in operation
    ]


def _present(name: str) -> Schema:
    """A schema saying that ``name`` is given as a string (not left out or null)."""
    return {"required": [name], "properties": {name: {"type": "string"}}}


# An owner transition names its worker or passes its lease token (or both).
WORKER_OR_TOKEN = [_present("worker"), _present("lease_token")]
# A batch's cancel is not an owner transition: it names neither.
CANCEL_ACTION = {"required": ["op"], "properties": {"op": {"const": "cancel"}}}


JSON_VALUE = {"$ref": "#/components/schemas/JsonValue"}
# Any JSON value PostgreSQL's jsonb can store: no NUL in a string or a key.
JSON_VALUE_SCHEMA = {
    "description": "Any JSON value; no string or key may contain NUL.",
    "anyOf": [
        {"type": ["number", "boolean", "null"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": JSON_VALUE},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": JSON_VALUE,
        },
    ],
}

WRITE_ERRORS = ("400", "401", "404", "409", "413", "503")


def _transition(
    summary: str, operation_id: str, operation: Operation, owner: bool = True
) -> Schema:
    extra = {"anyOf": WORKER_OR_TOKEN} if owner else {}
    return {
        "post": {
            "summary": summary,
            "operationId": operation_id,
            "parameters": [TODO_ID],
            "requestBody": _body(operation, **extra),
            "responses": {
                **_todo_ok("The todo after the transition."),
                **_errors(*WRITE_ERRORS),
            },
        }
    }


def _schedule_ok(description: str, status: str = "200") -> Schema:
    return {status: {"description": description, **_json(_ref("ScheduleEnvelope"))}}


SCHEDULE_NOT_FOUND = {
    "404": {
        "description": "No such schedule in this endpoint (absent, foreign, "
        "outside the grant, or a malformed id).",
        **_json(_ref("Error")),
    }
}
NAME_TAKEN = {
    "409": {
        "description": "A schedule of this name exists in this endpoint.",
        **_json(_ref("Error")),
    }
}


# A schedule's slots come from cron or every_seconds, never both.
CRON_OR_EVERY = [
    {
        "required": ["cron"],
        "properties": {"cron": {"type": "string"}, "every_seconds": {"type": "null"}},
    },
    {
        "required": ["every_seconds"],
        "properties": {"every_seconds": {"type": "integer"}, "cron": {"type": "null"}},
    },
]


CRON_AND_EVERY = {
    "required": ["cron", "every_seconds"],
    "properties": {"cron": {"type": "string"}, "every_seconds": {"type": "integer"}},
}


# A string with a character that is not blank, as the server reads blank
# (Python's str.isspace): a JSON Schema pattern is ECMA-262's, whose \s leaves
# out U+001C-U+001F and U+0085, so they are named too.
NOT_BLANK = "[^\\s\\u001c-\\u001f\\u0085]"


def _schedule_body(operation: Operation, create: bool = False) -> Schema:
    """A schedule's body: its template's fields, a time zone the server knows,
    and (to create one) cron or every_seconds. A cron expression's validity
    (its grammar, a slot within fifty years) is beyond JSON Schema."""
    body = _body(operation)
    schema = body["content"]["application/json"]["schema"]
    properties = schema["properties"]
    properties["cron"] = {**properties["cron"], "pattern": NOT_BLANK}
    zones = sorted({*available_timezones(), "UTC"})
    properties["time_zone"] = {**properties["time_zone"], "enum": [*zones, None]}
    if create:
        schema["oneOf"] = CRON_OR_EVERY
    else:
        schema["not"] = CRON_AND_EVERY
    schema["properties"]["todo"] = {
        **TEMPLATE_SCHEMA,
        "type": ["object", "null"],
        "description": schema["properties"]["todo"]["description"],
    }
    return body


def _absent(*names: str) -> Schema:
    """Properties that, when given, are null."""
    return {name: {"type": "null"} for name in names}


def _present_number(name: str) -> Schema:
    return {"required": [name], "properties": {name: {"type": "number"}}}


# A budget's scope names what it covers: an endpoint budget no queue or group,
# a queue budget its queue, a group budget its queue and group.
BUDGET_SCOPES = [
    {"properties": {"scope": {"const": "endpoint"}, **_absent("queue", "group")}},
    {
        "required": ["queue"],
        "properties": {
            "scope": {"const": "queue"},
            "queue": {"type": "string"},
            **_absent("group"),
        },
    },
    {
        "required": ["queue", "group"],
        "properties": {
            "scope": {"const": "group"},
            "queue": {"type": "string"},
            "group": {"type": "string"},
        },
    },
]


def _dollars_body(operation: Operation) -> Schema:
    """A body whose dollar limits and raises are kept to the millionth: the
    smallest one the store takes is a millionth of a dollar."""
    body = _body(operation)
    properties = body["content"]["application/json"]["schema"]["properties"]
    for name in ("limit_usd", "amount_usd"):
        if name in properties:
            properties[name].pop("exclusiveMinimum", None)
            properties[name]["minimum"] = store.budgets.MIN_USD
    return body


def _budget_body(operation: Operation) -> Schema:
    """A budget's body: its scope's names, a limit in dollars (to the
    millionth, as kept), tokens or both, and a time zone the server knows."""
    body = _dollars_body(operation)
    schema = body["content"]["application/json"]["schema"]
    properties = schema["properties"]
    if "time_zone" in properties:
        zones = sorted({*available_timezones(), "UTC"})
        properties["time_zone"] = {
            **properties["time_zone"],
            "enum": [*zones, None],
        }
    if "scope" in properties and "limit_usd" in properties:
        schema["oneOf"] = BUDGET_SCOPES
        limits = ("limit_usd", "limit_tokens")
        schema["anyOf"] = [_present_number(name) for name in limits]
    return body


BUDGET_SCHEMA = {
    "type": "object",
    "required": [
        "id",
        "scope",
        "queue",
        "group",
        "window",
        "time_zone",
        "limit_usd",
        "limit_tokens",
        "soft_percent",
        "action",
        "created_at",
        "updated_at",
        "window_start",
        "window_end",
        "spent_usd",
        "spent_tokens",
        "left_usd",
        "left_tokens",
        "raised_usd",
        "raised_tokens",
        "reserved_usd",
        "state",
        "soft_reached_at",
        "exhausted_at",
        "resumed_at",
        "in_force_until",
    ],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "scope": {"type": "string", "enum": list(store.BUDGET_SCOPES)},
        "queue": {"type": ["string", "null"]},
        "group": {"type": ["string", "null"]},
        "window": {"type": "string", "enum": list(store.BUDGET_WINDOWS)},
        "time_zone": {"type": "string"},
        "limit_usd": {"type": ["number", "null"]},
        "limit_tokens": {"type": ["integer", "null"]},
        "soft_percent": {"type": "integer"},
        "action": {"type": "string", "enum": list(store.BUDGET_ACTIONS)},
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "window_start": {
            "type": "string",
            "format": "date-time",
            "description": "Where the current window began (UTC).",
        },
        "window_end": {"type": "string", "format": "date-time"},
        "spent_usd": {
            "type": "number",
            "description": "What the scope's usage reports, last reported in the "
            "current window, add up to.",
        },
        "spent_tokens": {"type": "integer"},
        "left_usd": {
            "type": ["number", "null"],
            "description": "The limit, plus what the owner raised it by for "
            "this window, less what was spent (never below 0).",
        },
        "left_tokens": {"type": ["integer", "null"]},
        "raised_usd": {"type": "number"},
        "raised_tokens": {"type": "integer"},
        "reserved_usd": {
            "type": "number",
            "description": "What the attempts running now hold reserved against "
            "the budget: the max_cost of each claimed todo that has one.",
        },
        "state": {
            "type": "string",
            "enum": ["ok", "soft_limit", "exhausted", "resumed"],
            "description": "ok; soft_limit (past soft_percent); exhausted (at "
            "the limit: the action holds until in_force_until); resumed (at the "
            "limit, and the owner resumed it for this window).",
        },
        "soft_reached_at": NULLABLE_TIME,
        "exhausted_at": NULLABLE_TIME,
        "resumed_at": NULLABLE_TIME,
        "in_force_until": {
            **NULLABLE_TIME,
            "description": "While the action (pause or reject_new) holds: "
            "until the window's end.",
        },
    },
}

BUDGET_ID = {
    "name": "budget_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}

BUDGET_NOT_FOUND = {
    "404": {
        "description": "No such budget in this endpoint (absent, foreign, outside "
        "the grant, or a malformed id).",
        **_json(_ref("Error")),
    }
}


def _budget_ok(description: str, status: str = "200") -> Schema:
    return {status: {"description": description, **_json(_ref("BudgetEnvelope"))}}


def _budget_paths() -> Schema:
    """The budgets' paths (CONTRACT §18)."""
    on_one = [BUDGET_ID]
    return {
        "/api/v1/budgets": {
            "get": {
                "summary": "List this endpoint's budgets, with what each scope "
                "spent in its current window and what is left.",
                "operationId": "list_budgets",
                "responses": {
                    "200": {
                        "description": "The budgets.",
                        **_json(
                            {
                                "type": "object",
                                "required": ["budgets"],
                                "properties": {
                                    "budgets": {
                                        "type": "array",
                                        "items": _ref("Budget"),
                                    }
                                },
                            }
                        ),
                    },
                    **_errors("401", "503"),
                },
            },
            "post": {
                "summary": "Create a budget: a limit in dollars and/or tokens on "
                "what the endpoint, a queue or a group spends in an hour, day or "
                "month of its time zone.",
                "operationId": "create_budget",
                "requestBody": _budget_body(fields.CREATE_BUDGET),
                "responses": {
                    **_budget_ok("Created.", "201"),
                    **_errors("400", "401", "403", "413", "503"),
                },
            },
        },
        "/api/v1/budgets/{budget_id}": {
            "get": {
                "summary": "Return one budget with its spend.",
                "operationId": "get_budget",
                "parameters": on_one,
                "responses": {
                    **_budget_ok("The budget."),
                    **_errors("401", "503"),
                    **BUDGET_NOT_FOUND,
                },
            },
            "put": {
                "summary": "Change the fields given.",
                "operationId": "update_budget",
                "parameters": on_one,
                "requestBody": _dollars_body(fields.UPDATE_BUDGET),
                "responses": {
                    **_budget_ok("The changed budget."),
                    **_errors("400", "401", "403", "413", "503"),
                    **BUDGET_NOT_FOUND,
                },
            },
            "delete": {
                "summary": "Delete a budget.",
                "operationId": "delete_budget",
                "parameters": on_one,
                "responses": {
                    "204": {"description": "Deleted."},
                    **_errors("401", "503"),
                    **BUDGET_NOT_FOUND,
                },
            },
        },
        "/api/v1/budgets/{budget_id}/decision": {
            "post": {
                "summary": "Answer a budget at its limit for the current window: "
                "raise it by amount_usd and/or amount_tokens, resume anyway, or "
                "keep it paused. Acts at once, is recorded in the budget's "
                "history, and wakes the scope's waiting claims.",
                "operationId": "decide_budget",
                "parameters": on_one,
                "requestBody": _dollars_body(fields.DECIDE_BUDGET),
                "responses": {
                    **_budget_ok("The budget after the decision."),
                    **_errors("400", "401", "413", "503"),
                    **BUDGET_NOT_FOUND,
                },
            },
        },
    }


def _schedule_paths() -> Schema:
    """The schedules' paths (CONTRACT §20)."""
    on_one = [SCHEDULE_ID]
    return {
        "/api/v1/schedules": {
            "get": {
                "summary": "List this endpoint's schedules by name.",
                "operationId": "list_schedules",
                "parameters": _query(fields.LIST_SCHEDULES),
                "responses": {
                    "200": {
                        "description": "A page of schedules.",
                        **_json(_ref("SchedulePage")),
                    },
                    **_errors("400", "401", "503"),
                },
            },
            "post": {
                "summary": "Create a schedule: a todo from its template at each "
                "slot of its cron (in its time zone) or interval.",
                "operationId": "create_schedule",
                "requestBody": _schedule_body(fields.CREATE_SCHEDULE, create=True),
                "responses": {
                    **_schedule_ok("Created.", "201"),
                    **_errors("400", "401", "403", "413", "503"),
                    **NAME_TAKEN,
                },
            },
        },
        "/api/v1/schedules/{schedule_id}": {
            "get": {
                "summary": "Return one schedule.",
                "operationId": "get_schedule",
                "parameters": on_one,
                "responses": {
                    **_schedule_ok("The schedule."),
                    **_errors("401", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            },
            "put": {
                "summary": "Change the fields given; a new cron, interval or time "
                "zone starts at its first slot after now.",
                "operationId": "update_schedule",
                "parameters": on_one,
                "requestBody": _schedule_body(fields.UPDATE_SCHEDULE),
                "responses": {
                    **_schedule_ok("The changed schedule."),
                    **_errors("400", "401", "403", "413", "503"),
                    **SCHEDULE_NOT_FOUND,
                    **NAME_TAKEN,
                },
            },
            "delete": {
                "summary": "Delete a schedule; the todos it made stay.",
                "operationId": "delete_schedule",
                "parameters": on_one,
                "responses": {
                    "204": {"description": "Deleted."},
                    **_errors("401", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            },
        },
        "/api/v1/schedules/{schedule_id}/pause": {
            "post": {
                "summary": "Pause a schedule: no slot fires until it is resumed.",
                "operationId": "pause_schedule",
                "parameters": on_one,
                "responses": {
                    **_schedule_ok("The paused schedule."),
                    **_errors("401", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            }
        },
        "/api/v1/schedules/{schedule_id}/resume": {
            "post": {
                "summary": "Resume a schedule: with missed skip from its next "
                "slot; with one or all the slots of the pause fire as that says.",
                "operationId": "resume_schedule",
                "parameters": on_one,
                "responses": {
                    **_schedule_ok("The resumed schedule."),
                    **_errors("401", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            }
        },
        "/api/v1/schedules/{schedule_id}/fire": {
            "post": {
                "summary": "Fire now: one todo from the template per call, paused "
                "or not; the schedule's slots are not touched.",
                "operationId": "fire_schedule",
                "parameters": on_one,
                "requestBody": {**_body(fields.FIRE_SCHEDULE), "required": False},
                "responses": {
                    "201": {
                        "description": "The todo made.",
                        **_json(_ref("CreatedEnvelope")),
                    },
                    "200": {
                        "description": "The live todo an earlier call with this "
                        "idempotency_key made.",
                        **_json(_ref("CreatedEnvelope")),
                    },
                    **_errors("400", "401", "403", "409", "413", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            }
        },
        "/api/v1/schedules/{schedule_id}/next": {
            "get": {
                "summary": "The schedule's next n slots, in UTC.",
                "operationId": "next_slots",
                "parameters": [*on_one, *_query(fields.NEXT_SLOTS)],
                "responses": {
                    "200": {
                        "description": "The slots, earliest first.",
                        **_json(
                            {
                                "type": "object",
                                "required": ["slots"],
                                "properties": {
                                    "slots": {
                                        "type": "array",
                                        "items": {
                                            "type": "string",
                                            "format": "date-time",
                                        },
                                    }
                                },
                            }
                        ),
                    },
                    **_errors("400", "401", "503"),
                    **SCHEDULE_NOT_FOUND,
                },
            }
        },
    }


# Only the settings given change: no body (like {}) changes none.
QUEUE_SETTINGS_BODY = {
    "required": False,
    **_json(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "lease_seconds": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_LEASE_SECONDS,
                },
                "max_attempts": {
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS_CAP},
                        {"const": UNLIMITED_ATTEMPTS, "description": "Unlimited."},
                        {"type": "null"},
                    ]
                },
                "delay_seconds": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_DELAY_SECONDS,
                },
                "group_concurrency": GROUP_CONCURRENCY_SCHEMA,
                "fair": {"type": "boolean"},
                "rate_limit": RATE_LIMIT_SCHEMA,
                "group_rate_limit": RATE_LIMIT_SCHEMA,
                "priority_aging_seconds": AGING_SCHEMA,
            },
        }
    ),
}

# Only the settings given change: no body (like {}) changes none.
GROUP_SETTINGS_BODY = {
    "required": False,
    **_json(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "concurrency": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_GROUP_CONCURRENCY,
                    "description": "This group's limit; null follows the queue's.",
                },
                "weight": {"type": "integer", "minimum": 1, "maximum": MAX_WEIGHT},
                "paused": {"type": "boolean"},
            },
        }
    ),
}


def _queue_ok(description: str) -> Schema:
    return {
        "200": {
            "description": description,
            **_json(
                {
                    "type": "object",
                    "required": ["queue"],
                    "properties": {"queue": _ref("Queue")},
                }
            ),
        }
    }


def _group_ok(description: str) -> Schema:
    return {
        "200": {
            "description": description,
            **_json(
                {
                    "type": "object",
                    "required": ["group"],
                    "properties": {"group": _ref("Group")},
                }
            ),
        }
    }


def _admission_paths() -> Schema:
    """A queue's settings and groups (CONTRACT §17)."""
    return {
        "/api/v1/queues/{name}": {
            "get": {
                "summary": "One queue of this endpoint, its settings and figures.",
                "operationId": "get_queue",
                "parameters": [QUEUE_NAME],
                "responses": {
                    **_queue_ok("The queue."),
                    **_errors("401", "403", "404", "503"),
                },
            },
            "patch": {
                "summary": "Change a queue's settings (made on first use): "
                "§10's and admission's; only the settings given change.",
                "operationId": "update_queue",
                "parameters": [QUEUE_NAME],
                "requestBody": QUEUE_SETTINGS_BODY,
                "responses": {
                    **_queue_ok("The queue after the change."),
                    **_errors("400", "401", "403", "404", "503"),
                },
            },
        },
        "/api/v1/queues/{name}/groups": {
            "get": {
                "summary": "A page of the queue's groups by name (those with "
                "todos pending or claimed, and those with an override).",
                "operationId": "list_groups",
                "parameters": [QUEUE_NAME, *_query(fields.GROUPS_PAGE)],
                "responses": {
                    "200": {
                        "description": "The page; next_after reads the next.",
                        **_json(
                            {
                                "type": "object",
                                "required": ["groups", "next_after"],
                                "properties": {
                                    "groups": {
                                        "type": "array",
                                        "items": _ref("Group"),
                                    },
                                    "next_after": {"type": ["string", "null"]},
                                },
                            }
                        ),
                    },
                    **_errors("400", "401", "403", "404", "503"),
                },
            }
        },
        "/api/v1/queues/{name}/groups/{group}": {
            "get": {
                "summary": "One group of the queue.",
                "operationId": "get_group",
                "parameters": [QUEUE_NAME, GROUP_NAME],
                "responses": {
                    **_group_ok("The group."),
                    **_errors("400", "401", "403", "404", "503"),
                },
            },
            "put": {
                "summary": "Set a group's override: concurrency, weight, paused.",
                "operationId": "set_group",
                "parameters": [QUEUE_NAME, GROUP_NAME],
                "requestBody": GROUP_SETTINGS_BODY,
                "responses": {
                    **_group_ok("The group after the change."),
                    **_errors("400", "401", "403", "404", "503"),
                },
            },
        },
    }


def build_document() -> Schema:
    """Return the OpenAPI document as a dict."""
    create_one = {
        **object_schema(fields.CREATE_TODO, JSON_VALUE),
        "not": {"required": ["todos"]},
    }
    create_many = object_schema(fields.CREATE_MANY, JSON_VALUE)
    paths = {
        "/api/v1/todos": {
            "get": {
                "summary": "List this endpoint's todos, oldest first.",
                "operationId": "list_todos",
                "parameters": _query(fields.LIST_TODOS),
                "responses": {
                    "200": {
                        "description": "A page of todos.",
                        **_json(_ref("TodoPage")),
                    },
                    **_errors("400", "401", "403", "503"),
                },
            },
            "post": {
                "summary": "Enqueue a todo, or up to 100 with {todos: [...]} "
                "(deduplicated on idempotency_key).",
                "operationId": "create_todo",
                "requestBody": {
                    "required": True,
                    **_json({"oneOf": [create_one, create_many]}),
                },
                "responses": {
                    "201": {
                        "description": "Created.",
                        **_json(_ref("CreatedEnvelope")),
                    },
                    "200": {
                        "description": "Collapsed onto a live duplicate; or, for "
                        "{todos: [...]}, one result per item in order.",
                        **_json(
                            {
                                "oneOf": [
                                    _ref("CreatedEnvelope"),
                                    _ref("CreateResults"),
                                ]
                            }
                        ),
                    },
                    **_errors("400", "401", "403", "404", "409", "413", "429", "503"),
                },
            },
        },
        "/api/v1/todos/claim": {
            "post": {
                "summary": "Claim the next claimable todo, waiting up to wait_seconds.",
                "operationId": "claim_next",
                "requestBody": _body(fields.CLAIM_NEXT),
                "responses": {
                    "200": {
                        "description": "The claimed todo; with max_todos, the "
                        "claimed todos (possibly none).",
                        **_json({"oneOf": [_ref("TodoEnvelope"), _ref("TodoList")]}),
                    },
                    **_errors("400", "401", "403", "404", "413", "503"),
                },
            }
        },
        "/api/v1/todos/batch": {
            "post": {
                "summary": "Apply up to 100 complete/fail/heartbeat/release/cancel "
                "actions, each on its own.",
                "operationId": "batch",
                "requestBody": _body(
                    fields.BATCH,
                    # Every owner action has a worker (its own or the default)
                    # or a token; a cancel needs no owner.
                    anyOf=[
                        _present("worker"),
                        {
                            "properties": {
                                "actions": {
                                    "items": {
                                        "anyOf": [*WORKER_OR_TOKEN, CANCEL_ACTION]
                                    }
                                }
                            }
                        },
                    ],
                ),
                "responses": {
                    "200": {
                        "description": "One result per action, in order; status is "
                        "what the single call would have answered.",
                        **_json(_ref("BatchResults")),
                    },
                    **_errors("400", "401", "413", "503"),
                },
            }
        },
        "/api/v1/queues": {
            "get": {
                "summary": "This endpoint's queues: settings and live figures.",
                "operationId": "list_queues",
                "responses": {
                    "200": {
                        "description": "The queues.",
                        **_json(
                            {
                                "type": "object",
                                "required": ["queues"],
                                "properties": {
                                    "queues": {
                                        "type": "array",
                                        "items": _ref("Queue"),
                                    }
                                },
                            }
                        ),
                    },
                    **_errors("401", "503"),
                },
            }
        },
        "/api/v1/usage": {
            "post": {
                "summary": "Report usage spent outside a todo (an agent's planning "
                "calls), against a queue of the grant.",
                "operationId": "report_usage",
                "requestBody": _body(fields.REPORT_USAGE),
                "responses": {
                    "201": {
                        "description": "Recorded.",
                        **_json(_ref("UsageEnvelope")),
                    },
                    "200": {
                        "description": "The report an earlier call with this "
                        "idempotency_key recorded; nothing counted again.",
                        **_json(_ref("UsageEnvelope")),
                    },
                    **_errors("400", "401", "403", "413", "503"),
                },
            }
        },
        "/api/v1/todos/{todo_id}": {
            "get": {
                "summary": "Return one todo of this endpoint, waiting up to "
                "wait_seconds for it to end or ask.",
                "operationId": "get_todo",
                "parameters": [TODO_ID, *_query(fields.GET_TODO)],
                "responses": {
                    **_todo_ok("The todo."),
                    **_errors("400", "401", "404", "503"),
                },
            }
        },
        "/api/v1/todos/{todo_id}/claim": _transition(
            "Claim one specific todo.",
            "claim_todo",
            fields.CLAIM_TODO,
            owner=False,
        ),
        "/api/v1/todos/{todo_id}/heartbeat": _transition(
            "Extend the caller's lease (the lease_token stays), with progress and "
            "a checkpoint; the answer's cancel_requested says whether to stop.",
            "heartbeat",
            fields.HEARTBEAT,
        ),
        "/api/v1/todos/{todo_id}/complete": _transition(
            "Mark the caller's claimed todo done (repeatable with the same "
            "lease_token).",
            "complete_todo",
            fields.COMPLETE_TODO,
        ),
        "/api/v1/todos/{todo_id}/fail": _transition(
            "Fail the caller's claimed todo (retry window, or dead letter at the cap).",
            "fail_todo",
            fields.FAIL_TODO,
        ),
        "/api/v1/todos/{todo_id}/release": _transition(
            "Give the caller's lease back now: a handoff with assignee, note and "
            "checkpoint; under a cancel request it ends canceled.",
            "release_todo",
            fields.RELEASE_TODO,
        ),
        "/api/v1/todos/{todo_id}/ask": _transition(
            "Ask a question as the lease holder: the lease ends and the todo is "
            "held (pending, claimed by no one) until it is answered or its "
            "deadline passes.",
            "ask",
            fields.ASK,
        ),
        "/api/v1/todos/{todo_id}/answer": _transition(
            "Answer a held todo of this endpoint: the hold ends and the doorbell "
            "rings (400 naming the path when the answer fails its schema).",
            "answer",
            fields.ANSWER,
            owner=False,
        ),
        "/api/v1/todos/{todo_id}/cancel": {
            "post": {
                "summary": "Cancel a todo: 200 when it ended canceled at once "
                "(pending, delayed, held, retry-scheduled); 202 when it is claimed "
                "and its owner was asked to stop.",
                "operationId": "cancel_todo",
                "parameters": [TODO_ID],
                "requestBody": _body(fields.CANCEL_TODO),
                "responses": {
                    **_todo_ok("The canceled todo."),
                    "202": {
                        "description": "The claimed todo, with cancel_requested.",
                        **_json(_ref("TodoEnvelope")),
                    },
                    **_errors(*WRITE_ERRORS),
                },
            }
        },
        "/api/v1/todos/{todo_id}/retry": {
            "post": {
                "summary": "Requeue a failed todo now.",
                "operationId": "retry_todo",
                "parameters": [TODO_ID],
                "responses": {
                    **_todo_ok("The requeued todo."),
                    **_errors(*WRITE_ERRORS),
                },
            }
        },
        "/api/v1/todos/{todo_id}/priority": _transition(
            "Change a pending todo's priority (409 once claimed or finished).",
            "set_priority",
            fields.SET_PRIORITY,
            owner=False,
        ),
        **_admission_paths(),
        **_schedule_paths(),
        **_budget_paths(),
        "/api/v1/events": {
            "get": {
                "summary": "The endpoint's doorbell as Server-Sent Events.",
                "description": (
                    "A comment line at once, then a `todo.ready` event for each todo "
                    "claimable now, then one per todo that becomes claimable, and "
                    "`todo.done`, `todo.failed` (dead letter), `todo.asked`, "
                    "`todo.cancel_requested` and `todo.canceled` as its todos "
                    "settle, with keep-alive comments. Each event's data is JSON "
                    "with `id`, `endpoint_id` and `queue`."
                ),
                "operationId": "events",
                "responses": {
                    "200": {
                        "description": "An endless event stream.",
                        "content": {
                            "text/event-stream": {"schema": {"type": "string"}}
                        },
                    },
                    **_errors("401", "503"),
                },
            }
        },
        "/api/v1/openapi.json": {
            "get": {
                "summary": "This document.",
                "operationId": "openapi",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The OpenAPI document.",
                        **_json({"type": "object"}),
                    }
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchboard agent API",
            "version": "1",
            "description": (
                "Endpoint-scoped todo work-queue. Every call but this document's "
                "needs `Authorization: Bearer <endpoint token>`. Errors are "
                '`{"error": code, "detail": text}`.'
            ),
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Todo": TODO_SCHEMA,
                "JsonValue": JSON_VALUE_SCHEMA,
                "Error": ERROR_SCHEMA,
                "TodoEnvelope": {
                    "type": "object",
                    "required": ["todo"],
                    "properties": {"todo": _ref("Todo")},
                },
                "CreatedEnvelope": {
                    "type": "object",
                    "required": ["todo", "created"],
                    "properties": {
                        "todo": _ref("Todo"),
                        "created": {"type": "boolean"},
                    },
                },
                "Queue": QUEUE_SCHEMA,
                "UsageReport": USAGE_REPORT_SCHEMA,
                "Budget": BUDGET_SCHEMA,
                "BudgetEnvelope": {
                    "type": "object",
                    "required": ["budget"],
                    "properties": {"budget": _ref("Budget")},
                },
                "UsageEnvelope": {
                    "type": "object",
                    "required": ["usage", "created"],
                    "properties": {
                        "usage": _ref("UsageReport"),
                        "created": {"type": "boolean"},
                    },
                },
                "Group": GROUP_SCHEMA,
                "Schedule": SCHEDULE_SCHEMA,
                "ScheduleEnvelope": {
                    "type": "object",
                    "required": ["schedule"],
                    "properties": {"schedule": _ref("Schedule")},
                },
                "SchedulePage": {
                    "type": "object",
                    "required": ["schedules", "next_cursor"],
                    "properties": {
                        "schedules": {"type": "array", "items": _ref("Schedule")},
                        "next_cursor": {"type": ["string", "null"]},
                    },
                },
                "TodoList": {
                    "type": "object",
                    "required": ["todos"],
                    "properties": {"todos": {"type": "array", "items": _ref("Todo")}},
                },
                "ItemError": {
                    "type": "object",
                    "required": ["status", "error", "detail"],
                    "properties": {
                        "status": {"type": "integer"},
                        "error": {"type": "string"},
                        "detail": {"type": "string"},
                    },
                },
                "CreateResults": {
                    "type": "object",
                    "required": ["results"],
                    "properties": {
                        "results": {
                            "type": "array",
                            "items": {
                                "oneOf": [
                                    {
                                        "type": "object",
                                        "required": ["status", "todo", "created"],
                                        "properties": {
                                            "status": {"enum": [200, 201]},
                                            "todo": _ref("Todo"),
                                            "created": {"type": "boolean"},
                                        },
                                    },
                                    _ref("ItemError"),
                                ]
                            },
                        }
                    },
                },
                "BatchResults": {
                    "type": "object",
                    "required": ["results"],
                    "properties": {
                        "results": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["id", "status"],
                                "properties": {
                                    "id": {"type": ["string", "null"]},
                                    "status": {
                                        "enum": [200, 202, 400, 403, 404, 409, 413]
                                    },
                                    "todo": _ref("Todo"),
                                    "error": {"type": "string"},
                                    "detail": {"type": "string"},
                                },
                            },
                        }
                    },
                },
                "TodoPage": {
                    "type": "object",
                    "required": ["todos", "next_cursor"],
                    "properties": {
                        "todos": {"type": "array", "items": _ref("Todo")},
                        "next_cursor": {"type": ["string", "null"]},
                    },
                },
            },
        },
    }


@api_view("GET", authenticated=False)
def openapi_json(request: HttpRequest) -> JsonResponse:
    """Serve the OpenAPI document; it needs no token."""
    return JsonResponse(build_document())
