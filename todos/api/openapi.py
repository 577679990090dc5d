"""The OpenAPI 3.1 document of the agent API, served at /api/v1/openapi.json.

It is written by hand from what the views do (limits from the same constants),
and tests/api/test_schemathesis.py checks the running API against it.
"""

from django.conf import settings
from django.http import JsonResponse

from todos import store
from todos.api import core as api
from todos.api.core import api_view

TODO_ID = {
    "name": "todo_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}

# PostgreSQL text and jsonb cannot hold NUL: such strings are refused with 400.
NO_NUL = "^[^\\u0000]*$"
NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": api.MAX_NAME_LENGTH,
    "pattern": NO_NUL,
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
    "409": "The todo exists but is not in the needed state or not this worker's.",
    "413": "The body exceeds 256 KiB.",
    "503": "The database cannot be reached.",
}


def _json(schema):
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*codes):
    return {
        code: {"description": ERRORS[code], **_json(_ref("Error"))} for code in codes
    }


def _todo_ok(description):
    return {"200": {"description": description, **_json(_ref("TodoEnvelope"))}}


def _body(properties, required=()):
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return {"required": True, **_json(schema)}


# An optional field may also be null, which means the same as leaving it out.
OPTIONAL_NAME = {**NAME, "type": ["string", "null"]}
LEASE = {
    "type": ["integer", "null"],
    "minimum": 1,
    "maximum": store.MAX_LEASE_SECONDS,
    "description": "Lease (visibility timeout); default SWITCHBOARD_LEASE_SECONDS.",
}
WORKER = {**NAME, "description": "The claimant's name, stored as the todo's owner."}
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


def _transition(summary, operation_id, properties, required=("worker",)):
    return {
        "post": {
            "summary": summary,
            "operationId": operation_id,
            "parameters": [TODO_ID],
            "requestBody": _body(properties, required),
            "responses": {
                **_todo_ok("The todo after the transition."),
                **_errors(*WRITE_ERRORS),
            },
        }
    }


def build_document():
    """Return the OpenAPI document as a dict."""
    create_properties = {
        "queue": NAME,
        "title": {
            "type": ["string", "null"],
            "maxLength": api.MAX_TITLE_LENGTH,
            "pattern": NO_NUL,
        },
        "payload": JSON_VALUE,
        "idempotency_key": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": api.MAX_KEY_LENGTH,
            "pattern": NO_NUL,
        },
        "assignee": OPTIONAL_NAME,
        "max_attempts": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": api.MAX_ATTEMPTS_CAP,
            "default": 5,
        },
    }
    paths = {
        "/api/v1/todos": {
            "get": {
                "summary": "List this endpoint's todos, oldest first.",
                "operationId": "list_todos",
                "parameters": [
                    {"name": "queue", "in": "query", "schema": NAME},
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {"type": "string", "enum": list(store.STATE_FILTERS)},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 200,
                            "default": 50,
                        },
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {
                            "type": "string",
                            "description": "next_cursor of the page before.",
                        },
                    },
                ],
                "responses": {
                    "200": {
                        "description": "A page of todos.",
                        **_json(_ref("TodoPage")),
                    },
                    **_errors("400", "401", "403", "503"),
                },
            },
            "post": {
                "summary": "Enqueue a todo (deduplicated on idempotency_key).",
                "operationId": "create_todo",
                "requestBody": _body(create_properties, ["queue"]),
                "responses": {
                    "201": {
                        "description": "Created.",
                        **_json(_ref("CreatedEnvelope")),
                    },
                    "200": {
                        "description": "Collapsed onto a live duplicate.",
                        **_json(_ref("CreatedEnvelope")),
                    },
                    **_errors("400", "401", "403", "404", "409", "413", "503"),
                },
            },
        },
        "/api/v1/todos/claim": {
            "post": {
                "summary": "Claim the next claimable todo, waiting up to wait_seconds.",
                "operationId": "claim_next",
                "requestBody": _body(
                    {
                        "worker": WORKER,
                        "queue": OPTIONAL_NAME,
                        "lease_seconds": LEASE,
                        "wait_seconds": {
                            "type": ["integer", "null"],
                            "minimum": 0,
                            "maximum": settings.SWITCHBOARD_MAX_WAIT_SECONDS,
                            "default": 0,
                        },
                    },
                    ["worker"],
                ),
                "responses": {
                    **_todo_ok("The claimed todo."),
                    **_errors("400", "401", "403", "404", "413", "503"),
                },
            }
        },
        "/api/v1/todos/{todo_id}": {
            "get": {
                "summary": "Return one todo of this endpoint.",
                "operationId": "get_todo",
                "parameters": [TODO_ID],
                "responses": {**_todo_ok("The todo."), **_errors("401", "404", "503")},
            }
        },
        "/api/v1/todos/{todo_id}/claim": _transition(
            "Claim one specific todo.",
            "claim_todo",
            {"worker": WORKER, "lease_seconds": LEASE},
        ),
        "/api/v1/todos/{todo_id}/heartbeat": _transition(
            "Extend the caller's lease.",
            "heartbeat",
            {"worker": WORKER, "lease_seconds": LEASE},
        ),
        "/api/v1/todos/{todo_id}/complete": _transition(
            "Mark the caller's claimed todo done.",
            "complete_todo",
            {"worker": WORKER, "result": JSON_VALUE},
        ),
        "/api/v1/todos/{todo_id}/fail": _transition(
            "Fail the caller's claimed todo (retry window, or dead letter at the cap).",
            "fail_todo",
            {
                "worker": WORKER,
                "error": {
                    "type": ["string", "null"],
                    "maxLength": api.MAX_ERROR_LENGTH,
                    "pattern": NO_NUL,
                },
            },
        ),
        "/api/v1/todos/{todo_id}/release": _transition(
            "Give the caller's lease back now.", "release_todo", {"worker": WORKER}
        ),
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
        "/api/v1/events": {
            "get": {
                "summary": "The endpoint's doorbell as Server-Sent Events.",
                "description": (
                    "A comment line at once, then a `todo.ready` event for each todo "
                    "claimable now, then one per todo that becomes claimable, with "
                    "keep-alive comments. Each event's data is JSON with `id`, "
                    "`endpoint_id` and `queue`."
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
def openapi_json(request):
    """Serve the OpenAPI document; it needs no token."""
    return JsonResponse(build_document())
