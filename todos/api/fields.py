"""Every input field of the agent API, declared once.

An operation is a tuple of ``Field``s: name, kind, bounds, whether it is
required, its default and a description. ``Fields.read`` validates a JSON
body, a query string or MCP tool arguments against one; ``object_schema``
describes one for the OpenAPI document and the MCP tools' input schemas. The
bounds are the store's limits, so a limit changes in one place; a bound that
is a setting is a function, read when the field is used, never at import.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from django.conf import settings

from todos import store
from todos.store.admission import MAX_WEIGHT
from todos.store.questions import RETURN_TO
from todos.web import http

type Schema = dict[str, Any]
type Bound = int | Callable[[], int]
type Operation = tuple[Field, ...]
# text: a string; worker: a worker's name the caller may leave to its default
# (an MCP session's, a batch's); enum: one of ``choices``; json: any JSON
# jsonb stores; object: a JSON object (the store checks the type); items: a
# list of objects of ``items``' fields; handoff: a name, null for the pool,
# absent to keep the assignee; progress, usage and choices: those fields' shapes.
type Kind = Literal[
    "text",
    "worker",
    "integer",
    "number",
    "usd",
    "boolean",
    "enum",
    "json",
    "object",
    "items",
    "handoff",
    "progress",
    "usage",
    "choices",
]

# PostgreSQL text and jsonb cannot hold NUL: such strings are refused with 400.
NO_NUL = "^[^\\u0000]*$"


# Kinds whose reading tells null from absent: null is a JSON value, refused as
# a boolean or a list, and hands a todo to the pool.
SELF_NULL = {"boolean", "json", "object", "items", "handoff"}


class InvalidField(http.BadBody):
    """A field the caller must fix (400); the detail names the field."""


def _now(bound: Bound) -> int:
    """The bound in force: a setting's is read now."""
    return bound() if callable(bound) else bound


@dataclass
class Field:
    """One input field. ``maximum`` bounds a text's length, an integer's value
    and a list's items; ``empty`` lets a text be "".

    The tables share their fields and no code changes one: a variant is a
    ``dataclasses.replace``. (Not frozen, so that a test can move a bound.)"""

    name: str
    kind: Kind = "text"
    description: str = ""
    required: bool = False
    minimum: Bound = 0
    maximum: Bound = store.MAX_NAME_CHARS
    default: object = None
    empty: bool = False
    choices: tuple[str, ...] = ()
    items: Operation = ()

    def schema(self, any_json: Schema, null: bool = True) -> Schema:
        """Describe the field as JSON Schema: ``any_json`` is a JSON value's;
        with ``null``, an optional field admits null (as the reading does:
        leaving it out), else only a handoff does (null: the pool)."""
        schema = self._shape(any_json, null)
        optional = not self.required and self.kind not in {"boolean", "json"}
        if (null and optional) or self.kind == "handoff":
            schema = _or_null(schema)
        if self.default is not None:
            schema["default"] = self.default_value()
        if self.description:
            schema["description"] = self.description
        return schema

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def _shape(self, any_json: Schema, null: bool) -> Schema:
        maximum = _now(self.maximum)
        if self.kind in {"text", "worker", "handoff"}:
            minimum = {} if self.empty else {"minLength": 1}
            return {
                "type": "string",
                **minimum,
                "maxLength": maximum,
                "pattern": NO_NUL,
            }
        if self.kind == "integer":
            return {
                "type": "integer",
                "minimum": _now(self.minimum),
                "maximum": maximum,
            }
        if self.kind == "number":
            return {"type": "number", "exclusiveMinimum": 0, "maximum": maximum}
        if self.kind == "usd":
            return {"type": "number", "minimum": 0, "maximum": maximum}
        if self.kind == "boolean":
            return {"type": "boolean"}
        if self.kind == "enum":
            return {"type": "string", "enum": list(self.choices)}
        if self.kind == "json":
            return dict(any_json)
        if self.kind == "object":
            return {"type": "object"}
        if self.kind == "items":
            return {
                "type": "array",
                "minItems": 1,
                "maxItems": maximum,
                "items": object_schema(self.items, any_json, null),
            }
        if self.kind == "progress":
            message = {"type": "string", "maxLength": maximum, "pattern": NO_NUL}
            fraction = {"type": "number", "minimum": 0, "maximum": 1}
            if null:
                message, fraction = _or_null(message), _or_null(fraction)
            return {
                "type": "object",
                "additionalProperties": False,
                "properties": {"message": message, "fraction": fraction},
            }
        if self.kind == "usage":
            return _usage_schema(null, given=self.required)
        return {
            "type": "array",
            "minItems": 1,
            "maxItems": maximum,
            "uniqueItems": True,
            "items": CHOICE._shape(any_json, null),
        }


def _usage_schema(null: bool, given: bool = False) -> Schema:
    """A usage report's shape; ``given``: a required report must give at
    least one field, not null (an empty report records nothing)."""
    tokens = {"type": "integer", "minimum": 0, "maximum": store.MAX_USAGE_TOKENS}
    properties: Schema = {
        "input_tokens": {**tokens, "description": "Prompt tokens."},
        "output_tokens": {**tokens, "description": "Completion tokens."},
        "cost_usd": {
            "type": "number",
            "minimum": 0,
            "maximum": store.MAX_USAGE_COST_USD,
            "description": "Dollars spent.",
        },
        "model": {
            "type": "string",
            "minLength": 1,
            "maxLength": store.MAX_MODEL_CHARS,
            "pattern": NO_NUL,
            "description": "The model that spent it.",
        },
    }
    if null:
        properties = {name: _or_null(value) for name, value in properties.items()}
    schema: Schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if given:
        schema["anyOf"] = [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in properties
        ]
    return schema


def _or_null(schema: Schema) -> Schema:
    schema = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    return schema


def object_schema(operation: Operation, any_json: Schema, null: bool = True) -> Schema:
    """Describe an operation's fields as a JSON Schema object (``null``: as
    ``Field.schema``)."""
    properties = {field.name: field.schema(any_json, null) for field in operation}
    schema: Schema = {"type": "object", "properties": properties}
    required = [field.name for field in operation if field.required]
    if required:
        schema["required"] = required
    return schema


class Fields:
    """Typed, validated access to a mapping of input fields.

    Every error names the field, so an agent can fix its call.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        from_query: bool = False,
        prefix: str = "",
        default_worker: str | None = None,
    ) -> None:
        self.data = data
        # A query string carries every value as text; a JSON body has types.
        self.from_query = from_query
        # Where these fields sit in a batch body, e.g. "actions[3].": errors
        # name the field as the caller wrote it.
        self.prefix = prefix
        # The worker of a "worker" field left out: an MCP session's, a batch's.
        self.default_worker = default_worker

    def read(self, operation: Operation) -> dict[str, Any]:
        """Return each field's validated value (its default when left out)."""
        return {field.name: self.value(field) for field in operation}

    def owner(self, values: Mapping[str, Any]) -> None:
        """Require an owner transition's worker or lease_token: the token alone
        authorizes (CONTRACT §10); without it the worker is required (§5)."""
        if values["worker"] is None and values["lease_token"] is None:
            raise self.invalid("worker", "is required without lease_token")

    def invalid(self, name: str, problem: str) -> InvalidField:
        return InvalidField(f"{self.prefix}{name}: {problem}")

    def value(self, field: Field) -> Any:
        """Return one field's validated value, or raise InvalidField."""
        value = self.data.get(field.name)
        reader = getattr(self, f"_{field.kind}")
        # Null is leaving the field out, but where the kind says otherwise.
        if value is None and field.kind not in SELF_NULL:
            if field.kind == "worker" and self.default_worker is not None:
                return reader(field, self.default_worker)
            if field.required:
                raise self.invalid(field.name, "is required")
            return field.default_value()
        return reader(field, value)

    def _text(self, field: Field, value: object) -> str:
        if not isinstance(value, str):
            raise self.invalid(field.name, "must be a string")
        if not value and not field.empty:
            raise self.invalid(field.name, "must not be empty")
        maximum = _now(field.maximum)
        if len(value) > maximum:
            raise self.invalid(field.name, f"must be at most {maximum} characters")
        problem = http.text_problem(value)
        if problem:
            raise self.invalid(field.name, problem)
        return value

    _worker = _text

    def _integer(self, field: Field, value: object) -> int:
        if isinstance(value, str) and self.from_query:
            try:
                value = int(value, 10)
            except ValueError:
                raise self.invalid(field.name, "must be an integer") from None
        if isinstance(value, float) and value.is_integer():
            # JSON has one number type: 30.0 is the integer 30 to JSON Schema.
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.invalid(field.name, "must be an integer")
        minimum, maximum = _now(field.minimum), _now(field.maximum)
        if not minimum <= value <= maximum:
            raise self.invalid(field.name, f"must be between {minimum} and {maximum}")
        return value

    def _number(self, field: Field, value: object) -> float:
        """A number above 0, at most the maximum (a cost)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid(field.name, "must be a number")
        maximum = _now(field.maximum)
        if not 0 < value <= maximum:
            raise self.invalid(field.name, f"must be above 0 and at most {maximum}")
        return float(value)

    def _usd(self, field: Field, value: object) -> float:
        """An amount of dollars: a number from 0 to the maximum."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid(field.name, "must be a number")
        maximum = _now(field.maximum)
        if not 0 <= value <= maximum:
            raise self.invalid(field.name, f"must be from 0 to {maximum}")
        return float(value)

    def _boolean(self, field: Field, value: object) -> bool:
        # Left out is the default; null is no boolean.
        value = self.data.get(field.name, field.default)
        if not isinstance(value, bool):
            raise self.invalid(field.name, "must be a boolean")
        return value

    def _enum(self, field: Field, value: object) -> str:
        if not isinstance(value, str) or value not in field.choices:
            raise self.invalid(field.name, f"must be one of {', '.join(field.choices)}")
        return value

    def _json(self, field: Field, value: object) -> object:
        if field.required and field.name not in self.data:
            # null is a JSON value: only leaving the field out is missing it.
            raise self.invalid(field.name, "is required")
        problem = http.unstorable(value)
        if problem:
            raise self.invalid(field.name, problem)
        return value

    _object = _json

    def _items(self, field: Field, value: object) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise self.invalid(field.name, "must be a list of objects")
        maximum = _now(field.maximum)
        if not 1 <= len(value) <= maximum:
            raise self.invalid(
                field.name, f"must hold 1 to {maximum} items, not {len(value)}"
            )
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.invalid(f"{field.name}[{index}]", "must be an object")
        return value

    def _handoff(self, field: Field, value: object) -> object:
        if field.name not in self.data:
            return store.KEEP_ASSIGNEE
        return None if value is None else self._text(field, value)

    def _progress(self, field: Field, value: object) -> dict[str, object]:
        if not isinstance(value, dict) or set(value) - {"message", "fraction"}:
            raise self.invalid(
                field.name, "must be an object with message and fraction"
            )
        nested = Fields(value, prefix=f"{self.prefix}{field.name}.")
        message = nested.value(
            Field("message", maximum=field.maximum, empty=True, default="")
        )
        fraction = value.get("fraction")
        if fraction is not None and (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 <= fraction <= 1
        ):
            raise self.invalid(f"{field.name}.fraction", "must be from 0 to 1")
        return {"message": message, "fraction": fraction}

    def _usage(self, field: Field, value: object) -> dict[str, object] | None:
        if isinstance(value, dict) and isinstance(value.get("model"), str):
            Fields(value, prefix=f"{self.prefix}{field.name}.").value(
                Field("model", maximum=store.MAX_MODEL_CHARS)
            )
        try:
            report = store.validate_usage(value, f"{self.prefix}{field.name}")
        except ValueError as exc:
            raise InvalidField(str(exc)) from None
        return report or None

    def _choices(self, field: Field, value: object) -> list[str]:
        maximum = _now(field.maximum)
        if not isinstance(value, list) or not 1 <= len(value) <= maximum:
            raise self.invalid(field.name, f"must be a list of 1 to {maximum} strings")
        listed = Fields(
            {f"[{index}]": choice for index, choice in enumerate(value)},
            prefix=f"{self.prefix}{field.name}",
        )
        for name in listed.data:
            listed.value(replace(CHOICE, name=name))
        return value


# --- The fields, each declared once ---------------------------------------------

# One of an ask's choices (its name is its place in the list).
CHOICE = Field("", required=True, maximum=store.MAX_CHOICE_CHARS)

QUEUE = Field("queue", description="The queue's name.")
WORKER = Field(
    "worker",
    "worker",
    "Your worker name, stored as the todo's owner: use the same one for every "
    "call on a todo you claimed.",
    required=True,
)
OWNER = replace(
    WORKER,
    required=False,
    description="The worker that claimed the todo; required unless lease_token "
    "is given.",
)
LEASE_TOKEN = Field(
    "lease_token",
    description="The lease_token the claim returned: the call succeeds only while "
    "that claim is the todo's current one (else a conflict: the lease was "
    "superseded, nothing changed), and worker may be left out.",
    maximum=store.MAX_LEASE_TOKEN_CHARS,
)
LEASE_SECONDS = Field(
    "lease_seconds",
    "integer",
    "Seconds the claim stays the worker's without a heartbeat (default: the "
    "queue's lease_seconds, else SWITCHBOARD_LEASE_SECONDS). When it lapses the "
    "todo goes back to the queue for another worker.",
    minimum=1,
    maximum=store.MAX_LEASE_SECONDS,
)
WAIT_SECONDS = Field(
    "wait_seconds",
    "integer",
    "If nothing is claimable, wait this long for work.",
    maximum=lambda: settings.SWITCHBOARD_MAX_WAIT_SECONDS,
    default=0,
)
TODO_ID = Field(
    "todo_id",
    description="The todo's id, as list_todos, create_todo or claim_next give it.",
    required=True,
)
CHECKPOINT = Field(
    "checkpoint",
    "json",
    "Where to resume: any JSON, at most "
    f"{store.MAX_CHECKPOINT_BYTES // 1024} KiB encoded (else 413). It replaces "
    "the last one and is handed to whoever claims the todo next (after a lapsed "
    "lease, a retry, a release or an answer).",
)
BY = Field(
    "worker",
    description="The worker's name, kept as `worker` beside who acted "
    "(`by`: always agent:<endpoint>).",
)

# --- The operations ---------------------------------------------------------------

LIMIT = Field(
    "limit",
    "integer",
    minimum=1,
    maximum=store.MAX_PAGE_SIZE,
    default=store.DEFAULT_PAGE_SIZE,
)
CURSOR = Field(
    "cursor",
    description="next_cursor of the previous page: read the next one.",
    maximum=store.MAX_CURSOR_CHARS,
    empty=True,
)
LIST_TODOS = (
    replace(QUEUE, description="Only todos of this queue."),
    Field(
        "state",
        "enum",
        "Only todos in this state. failed splits into retry_scheduled (will be "
        "retried) and dead_letter (gave up).",
        choices=tuple(store.STATE_FILTERS),
    ),
    LIMIT,
    CURSOR,
)
GET_TODO = (
    replace(
        WAIT_SECONDS,
        description="Answer once the todo is done, canceled, dead-lettered or held "
        "for an answer, else after this many seconds, with the todo as it is then.",
    ),
)
CREATE_TODO = (
    replace(QUEUE, required=True, description="The queue to put the todo in."),
    Field(
        "title",
        description="A one-line summary of the work.",
        maximum=store.MAX_TITLE_CHARS,
        empty=True,
        default="",
    ),
    Field("payload", "json", "What the worker needs to do the work: any JSON."),
    Field(
        "idempotency_key",
        description="A key that makes the call safe to repeat: while a todo with "
        "this key is live, creating again returns it with created=false.",
        maximum=store.MAX_KEY_CHARS,
    ),
    Field("assignee", description="Only this worker may claim the todo."),
    Field(
        "max_attempts",
        "integer",
        "Claims allowed before it dead-letters (default: the queue's setting, else "
        "SWITCHBOARD_MAX_ATTEMPTS).",
        minimum=1,
        maximum=store.MAX_ATTEMPTS_CAP,
    ),
    Field(
        "delay_seconds",
        "integer",
        "Keep the todo unclaimable this long (default: the queue's setting, else "
        "0). Its available_at says when it is due.",
        maximum=store.MAX_DELAY_SECONDS,
    ),
    Field(
        "priority",
        "integer",
        "1 (claimed first) to 5; within a level the oldest is claimed first "
        "(default 3).",
        minimum=store.MIN_PRIORITY,
        maximum=store.MAX_PRIORITY,
    ),
    Field(
        "group",
        description="The group the todo belongs to (a repository, a customer): "
        "the queue's group_concurrency, fair turns and group_rate_limit apply "
        "per group.",
        maximum=store.MAX_GROUP_CHARS,
    ),
    Field(
        "cost",
        "number",
        "What the todo counts against its queue's rate limits (default 1), "
        "e.g. the tokens it is expected to use.",
        maximum=store.MAX_COST,
    ),
    Field(
        "max_cost",
        "usd",
        "What one attempt may cost, in dollars: each claim reserves it against "
        "the todo's budgets with a dollar limit and passes the todo over while "
        "the reservation does not fit; the attempt's end releases it.",
        maximum=store.MAX_USAGE_COST_USD,
    ),
    Field(
        "replace",
        "boolean",
        "With an idempotency_key: cancel the key's pending live todo and create "
        "this one instead (a conflict when that todo is claimed: it gets a cancel "
        "request). Without idempotency_key it is a plain create.",
        default=False,
    ),
)
SET_PRIORITY = (
    Field(
        "priority",
        "integer",
        "The pending todo's new priority: 1 (claimed first) to 5.",
        required=True,
        minimum=store.MIN_PRIORITY,
        maximum=store.MAX_PRIORITY,
    ),
)
QUEUE_NAME = replace(QUEUE, required=True)
GROUP_NAME = Field(
    "group",
    description="The group's name, as todos carry it.",
    required=True,
    maximum=store.MAX_GROUP_CHARS,
)
# A queue's settings: only those given change. null is a value here (it puts
# back the server's default, or turns the control off), so the nullable ones
# are JSON the store checks.
QUEUE_SETTINGS = (
    Field(
        "lease_seconds",
        "json",
        "Seconds a claim's lease lasts (an integer, 0 or more); null: the "
        "server's default.",
    ),
    Field(
        "max_attempts",
        "json",
        "Claims allowed before a todo dead-letters (an integer, 1 or more); "
        "null: the server's default.",
    ),
    Field(
        "delay_seconds",
        "json",
        "Seconds a new todo waits before it can be claimed (an integer, 0 or "
        "more); null: none.",
    ),
    Field(
        "group_concurrency",
        "json",
        "At most this many claimed todos per group (an integer; 1 = one at a "
        "time, 0 holds every group); null: no limit.",
    ),
    Field(
        "fair",
        "boolean",
        "Serve the queue's groups in turn, weighted, oldest first within a "
        "group, instead of oldest first overall.",
    ),
    Field(
        "rate_limit",
        "json",
        'Claims per window across every server: {"count", "per_seconds", '
        '"burst"}, each todo counting its cost; null: none.',
    ),
    Field("group_rate_limit", "json", "A rate limit per group, as rate_limit."),
    Field(
        "priority_aging_seconds",
        "json",
        "Raise a waiting todo one level per this many seconds (an integer), so "
        "no level waits forever; null: off.",
    ),
)
GROUP_SETTINGS = (
    Field(
        "concurrency",
        "json",
        "This group's limit of claimed todos (an integer, 0 holds it); null "
        "follows the queue's group_concurrency.",
    ),
    Field(
        "weight",
        "integer",
        "The group's share of a fair queue's turns.",
        minimum=1,
        maximum=MAX_WEIGHT,
    ),
    Field("paused", "boolean", "Hold the group's todos: none is claimed."),
)
GROUPS_PAGE = (
    Field("after", description="List the groups named after this one.", empty=True),
    Field("limit", "integer", minimum=1, maximum=200, default=50),
)
CREATE_MANY = (
    Field(
        "todos",
        "items",
        "The todos to create, each on its own.",
        required=True,
        maximum=store.MAX_CREATE_BATCH,
        items=CREATE_TODO,
    ),
)
CLAIM_NEXT = (
    replace(QUEUE, description="Claim only from this queue."),
    WORKER,
    LEASE_SECONDS,
    WAIT_SECONDS,
    Field(
        "max_todos",
        "integer",
        "Claim up to this many at once, in one statement: the answer is then "
        "{todos: [...]}, an empty list (not an error) when nothing came.",
        minimum=1,
        maximum=store.MAX_CLAIM_BATCH,
    ),
)
CLAIM_TODO = (WORKER, LEASE_SECONDS)
PROGRESS = Field(
    "progress",
    "progress",
    'How far the work got, shown on the Board, e.g. {"message": "3 of 10 files", '
    '"fraction": 0.3}.',
    maximum=store.MAX_PROGRESS_MESSAGE_CHARS,
)
USAGE = Field(
    "usage",
    "usage",
    "What this attempt has spent so far, as a running total: input_tokens, "
    "output_tokens, cost_usd, model (each optional, at least 0). It replaces "
    "the attempt's last report, field by field, and is never added to it: "
    "report the total, not the increment.",
)
HEARTBEAT = (OWNER, LEASE_TOKEN, LEASE_SECONDS, PROGRESS, CHECKPOINT, USAGE)
RESULT = Field(
    "result", "json", 'What was done, any JSON, e.g. {"summary": "…", "url": "…"}.'
)
COMPLETE_TODO = (OWNER, LEASE_TOKEN, RESULT, USAGE)
ERROR = Field(
    "error",
    description="What went wrong, for whoever looks next.",
    maximum=store.MAX_ERROR_CHARS,
    empty=True,
    default="",
)
FAIL_TODO = (OWNER, LEASE_TOKEN, ERROR, USAGE)
ASSIGNEE = Field(
    "assignee",
    "handoff",
    "Hand the todo to this worker: only it may claim it next. null gives it to "
    "any worker of the queue; left out, the assignment stays as it was.",
)
NOTE = Field(
    "note",
    description="Why it is handed back, for whoever claims it next.",
    maximum=store.MAX_NOTE_CHARS,
    empty=True,
)
RELEASE_TODO = (OWNER, LEASE_TOKEN, ASSIGNEE, NOTE, CHECKPOINT)
ASK = (
    OWNER,
    LEASE_TOKEN,
    Field(
        "question",
        description="The question, in words a person can answer.",
        required=True,
        maximum=store.MAX_QUESTION_CHARS,
    ),
    Field(
        "deadline_seconds",
        "integer",
        "Stop waiting for an answer after this long: the todo is claimable again "
        "with answer null and question.expired true.",
        minimum=store.MIN_DEADLINE_SECONDS,
        maximum=store.MAX_DEADLINE_SECONDS,
    ),
    Field(
        "choices",
        "choices",
        "The answers allowed, shown as buttons.",
        maximum=store.MAX_CHOICES,
    ),
    Field(
        "answer_schema",
        "object",
        "A JSON Schema object the answer must be valid against, at most "
        f"{store.MAX_ANSWER_SCHEMA_BYTES // 1024} KiB and "
        f"{store.MAX_SCHEMA_DEPTH} levels deep. Its $refs must be local (#...): "
        "the server fetches nothing. Its patterns run on RE2: no backreferences "
        "or lookaround.",
    ),
    CHECKPOINT,
    Field(
        "return_to",
        "enum",
        "Who gets the answered todo: me (the asking worker only) or pool (any "
        "worker of the queue).",
        default="me",
        choices=RETURN_TO,
    ),
)
ANSWER = (
    Field(
        "answer",
        "json",
        "The answer: any JSON; one of the question's choices when it has them, "
        "valid against its answer_schema when it has one.",
        required=True,
    ),
    replace(
        BY,
        description="The worker that answers, kept as the answer's `worker`; "
        "its `by` is agent:<endpoint>.",
    ),
)
REASON = Field(
    "reason",
    description="Why it is canceled, kept in the todo's result.",
    maximum=store.MAX_REASON_CHARS,
    empty=True,
    default="",
)
CANCEL_TODO = (
    REASON,
    replace(
        BY,
        description="The worker that cancels, kept as the request's `worker`; "
        "its `by` is agent:<endpoint>.",
    ),
)
ACK_OPS = ("complete", "fail", "heartbeat", "release", "cancel")
ACTION = (
    Field("op", "enum", required=True, choices=ACK_OPS),
    replace(TODO_ID, name="id"),
    OWNER,
    LEASE_TOKEN,
    RESULT,
    ERROR,
    LEASE_SECONDS,
    PROGRESS,
    CHECKPOINT,
    ASSIGNEE,
    NOTE,
    REASON,
    USAGE,
)
BATCH = (
    replace(OWNER, description="The worker of every action that names none."),
    Field(
        "actions",
        "items",
        "The transitions to apply, each on its own.",
        required=True,
        maximum=store.MAX_ACK_BATCH,
        items=ACTION,
    ),
)

REPORT_USAGE = (
    replace(
        QUEUE, required=True, description="The queue the spend is counted against."
    ),
    replace(
        USAGE,
        required=True,
        description="What was spent outside a todo: input_tokens, output_tokens, "
        "cost_usd, model (at least one of them).",
    ),
    Field(
        "group",
        description="The group of the queue the spend is counted against.",
        maximum=store.MAX_GROUP_CHARS,
    ),
    Field(
        "idempotency_key",
        description="A key that makes the report safe to repeat: a report with a "
        "key already used returns the first one with created=false.",
        maximum=store.MAX_KEY_CHARS,
    ),
)

# --- Budgets (CONTRACT §18) ------------------------------------------------------

BUDGET_ID = Field(
    "budget_id",
    description="The budget's id, as list_budgets or create_budget give it.",
    required=True,
)
BUDGET_SCOPE = Field(
    "scope",
    "enum",
    "What the budget covers: endpoint (everything this endpoint spends), queue "
    "(one queue) or group (one group of a queue).",
    choices=store.BUDGET_SCOPES,
)
BUDGET_WINDOW = Field(
    "window",
    "enum",
    "The window the limit applies to: the current hour, day or calendar month "
    "in time_zone.",
    choices=store.BUDGET_WINDOWS,
)
LIMIT_USD = Field(
    "limit_usd",
    "number",
    "The most the scope may spend in a window, in dollars.",
    maximum=store.MAX_USAGE_COST_USD,
)
LIMIT_TOKENS = Field(
    "limit_tokens",
    "integer",
    "The most tokens (input plus output) the scope may spend in a window.",
    minimum=1,
    maximum=store.MAX_USAGE_TOKENS,
)
SOFT_PERCENT = Field(
    "soft_percent",
    "integer",
    "The share of a limit, in percent, past which the budget is near its limit.",
    minimum=1,
    maximum=100,
)
BUDGET_ACTION = Field(
    "action",
    "enum",
    "What happens at the limit: pause (claims pass over the scope's todos) or "
    "reject_new (creates in the scope are refused).",
    choices=store.BUDGET_ACTIONS,
)
BUDGET_QUEUE = replace(QUEUE, description="The queue of a queue or group budget.")
BUDGET_GROUP = Field(
    "group",
    description="The group of a group budget.",
    maximum=store.MAX_GROUP_CHARS,
)
BUDGET_TIME_ZONE = Field(
    "time_zone",
    description="The IANA time zone the window is read in, e.g. Europe/Berlin "
    "(default UTC).",
)
CREATE_BUDGET = (
    replace(BUDGET_SCOPE, required=True),
    BUDGET_QUEUE,
    BUDGET_GROUP,
    replace(BUDGET_WINDOW, required=True),
    BUDGET_TIME_ZONE,
    LIMIT_USD,
    LIMIT_TOKENS,
    replace(SOFT_PERCENT, default=store.DEFAULT_SOFT_PERCENT),
    replace(BUDGET_ACTION, default="pause"),
)
UPDATE_BUDGET = (
    BUDGET_SCOPE,
    BUDGET_QUEUE,
    BUDGET_GROUP,
    BUDGET_WINDOW,
    BUDGET_TIME_ZONE,
    LIMIT_USD,
    LIMIT_TOKENS,
    SOFT_PERCENT,
    BUDGET_ACTION,
)
BUDGET_DECISION = Field(
    "decision",
    "enum",
    "The owner's answer to a budget at its limit, for the current window: "
    "raise (allow amount_usd and/or amount_tokens more), resume (lift the "
    "action anyway until the window ends) or keep_paused (leave it as it is).",
    choices=store.BUDGET_DECISIONS,
    required=True,
)
AMOUNT_USD = Field(
    "amount_usd",
    "number",
    "A raise: the dollars allowed on top of the limit for the current window.",
    maximum=store.MAX_USAGE_COST_USD,
)
AMOUNT_TOKENS = Field(
    "amount_tokens",
    "integer",
    "A raise: the tokens allowed on top of the limit for the current window.",
    minimum=1,
    maximum=store.MAX_USAGE_TOKENS,
)
DECIDE_BUDGET = (BUDGET_DECISION, AMOUNT_USD, AMOUNT_TOKENS)

# --- Schedules (CONTRACT §20) ------------------------------------------------------

SCHEDULE_ID = Field(
    "schedule_id",
    description="The schedule's id, as list_schedules or create_schedule give it.",
    required=True,
)
CRON = Field(
    "cron",
    description="When each slot is: five fields (minute hour day-of-month month "
    "day-of-week) read in time_zone, or @hourly, @daily, @weekly, @monthly. Give "
    "cron or every_seconds.",
    maximum=store.MAX_CRON_CHARS,
)
EVERY_SECONDS = Field(
    "every_seconds",
    "integer",
    "A slot every this many seconds, counted from the Unix epoch (3600: on the "
    "hour). Give cron or every_seconds.",
    minimum=store.MIN_EVERY_SECONDS,
    maximum=store.MAX_EVERY_SECONDS,
)
TIME_ZONE = Field(
    "time_zone",
    description="The IANA time zone cron is read in, e.g. Europe/Berlin (default UTC).",
)
TEMPLATE = Field(
    "todo",
    "object",
    "The todo each slot makes: title (default: the schedule's name), payload, "
    "max_attempts, priority, group, cost, max_cost.",
)
OVERLAP = Field(
    "overlap",
    "enum",
    "allow: every slot makes its todo; skip: a slot is skipped while the last "
    "todo the schedule made is still live (pending, claimed or waiting to retry).",
    choices=store.SCHEDULE_OVERLAP,
)
MISSED = Field(
    "missed",
    "enum",
    "Slots that came and went while no sweep ran (or while paused): skip fires "
    "none of them; one fires one todo for the latest; all fires each, up to "
    f"the latest {store.MAX_MISSED_SLOTS}.",
    choices=store.SCHEDULE_MISSED,
)
CREATE_SCHEDULE = (
    Field(
        "name",
        description="The schedule's name, unique in this endpoint.",
        required=True,
    ),
    replace(QUEUE, required=True, description="The queue each slot's todo goes to."),
    CRON,
    EVERY_SECONDS,
    replace(TIME_ZONE, default="UTC"),
    TEMPLATE,
    replace(OVERLAP, default="allow"),
    replace(MISSED, default="skip"),
    Field(
        "paused",
        "boolean",
        "Create it paused: nothing fires until it is resumed.",
        default=False,
    ),
)
UPDATE_SCHEDULE = (
    Field("name", description="A new name, unique in this endpoint."),
    replace(QUEUE, description="The queue each slot's todo goes to from now on."),
    CRON,
    EVERY_SECONDS,
    TIME_ZONE,
    TEMPLATE,
    OVERLAP,
    MISSED,
)
LIST_SCHEDULES = (LIMIT, CURSOR)
NEXT_SLOTS = (
    Field(
        "n",
        "integer",
        "How many slots to list.",
        minimum=1,
        maximum=store.MAX_NEXT_SLOTS,
        default=5,
    ),
)
FIRE_SCHEDULE = (
    Field(
        "idempotency_key",
        description="Makes the call safe to repeat: while the todo this key made "
        "is live, firing again returns it with created=false.",
        maximum=store.MAX_KEY_CHARS,
    ),
)
