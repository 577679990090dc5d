"""The store's values and errors: rows as the API and the Board render them."""

import json
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Self, get_args, get_type_hints

from todos.telemetry import tracing

if TYPE_CHECKING:
    from todos.models import Endpoint

# A row as the database driver returns it: its columns are typed by the query,
# not by the driver, so each reader converts them into a typed value.
Row = tuple[Any, ...]
# A todo's state in the table; "failed" splits in two for an operator (see
# ``Todo.display_state``).
State = Literal["pending", "claimed", "done", "failed"]
QuestionStatus = Literal["open", "answered", "expired"]
# A JSON value as json.loads returns it (an answer, a payload).
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
# A JSON object (a todo's JSON, a question, an answer): its values are
# whatever JSON holds.
JSONObject = dict[str, Any]

DOORBELL_CHANNEL = "switchboard_todo_ready"
# What a creator may wait for: a todo ended (done, dead letter, canceled),
# asked a question, or got a cancel request. Its own channel, so that a
# waiting claim is never woken by a todo that cannot be claimed.
TODO_EVENT_CHANNEL = "switchboard_todo_event"
TODO_EVENTS = (
    "todo.done",
    "todo.failed",
    "todo.asked",
    "todo.cancel_requested",
    "todo.canceled",
)
# The field limits every surface reads (API, MCP, webhooks, SQS, Board forms).
MAX_NAME_CHARS = 200
# Admission (CONTRACT §17): priority levels (1 is claimed first), a group's
# name, and a todo's cost (what it counts against a rate limit).
MIN_PRIORITY = 1
MAX_PRIORITY = 5
DEFAULT_PRIORITY = 3
MAX_GROUP_CHARS = 200
MAX_COST = 1_000_000_000
MAX_TITLE_CHARS = 1000
# The dedupe index is a btree: a key must stay far below its ~2.7 kB row limit.
MAX_KEY_CHARS = 200
MAX_ERROR_CHARS = 10_000
# Lease tokens the store mints are at most 64 characters; a longer one can only
# be superseded, but there is no reason to read a huge one.
MAX_LEASE_TOKEN_CHARS = 200
MAX_LEASE_SECONDS = 43200
MAX_DELAY_SECONDS = 43200
MAX_CLAIM_BATCH = 10
MAX_ACK_BATCH = 100
MAX_CREATE_BATCH = 100
# A page of a todo listing; a cursor is opaque, and the store's are far shorter.
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50
MAX_CURSOR_CHARS = 500
# Terminal figures (dead letters of a queue) are counted up to this cap.
TERMINAL_FIGURE_CAP = 10_000

# Questions, cancel, progress and checkpoints (CONTRACT §14).
MAX_QUESTION_CHARS = 4000
MAX_CHOICES = 10
MAX_CHOICE_CHARS = 200
MAX_ANSWER_SCHEMA_BYTES = 16 * 1024
MIN_DEADLINE_SECONDS = 60
MAX_DEADLINE_SECONDS = 30 * 24 * 3600
MAX_CHECKPOINT_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 64 * 1024
MAX_PROGRESS_MESSAGE_CHARS = 500
MAX_REASON_CHARS = 1000
MAX_NOTE_CHARS = 2000
# Usage reports (CONTRACT §18): tokens and dollars an attempt may report, and
# a model's name.
MAX_USAGE_TOKENS = 10**15
MAX_USAGE_COST_USD = 10**9
MAX_MODEL_CHARS = 200
# An answer link lives as long as its question, or this long without a deadline.
ANSWER_LINK_SECONDS = 7 * 24 * 3600
# The available_at of a question without a deadline: not before it is answered.
# A finite date (psycopg cannot load 'infinity'), a year short of the calendar's
# end so that no time zone or arithmetic overflows it.
HELD_UNTIL_ANSWERED = "9998-12-31T00:00:00+00:00"
# Where a stored question keeps its answer schema's property order (jsonb
# keeps none); the Board's form reads it, the question's JSON leaves it out.
PROPERTY_ORDER = "property_order"


# --- Errors ---------------------------------------------------------------------


class StoreError(Exception):
    """Base of the store's domain errors."""


class NotFound(StoreError):
    """No such todo in this scope: absent, foreign, malformed id, or no work."""

    def __init__(
        self, detail: str = "no such todo", todo_id: str | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.todo_id = todo_id


class Conflict(StoreError):
    """The todo exists in this scope but is not in the state the call needs."""

    def __init__(
        self, detail: str, todo_id: str | None = None, state: str | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.todo_id = todo_id
        self.state = state


class LeaseSuperseded(Conflict):
    """The lease token is not the current lease's: a later claim took the todo.

    Nothing changed. ``todo_id`` is the caller's own todo (it is in scope).
    """

    def __init__(self, todo_id: str | None = None, state: str | None = None) -> None:
        super().__init__(
            "lease superseded: the lease token is not the current lease's",
            todo_id=todo_id,
            state=state,
        )


class KeyHeld(Conflict):
    """A live todo holds this idempotency key, and the caller may not have it.

    Raised by a create whose duplicate sits in a queue outside the caller's
    grant (its id, title and payload are not revealed), and by a retry of a
    dead letter whose key a newer live todo took.
    """

    def __init__(
        self,
        detail: str,
        todo_id: str | None = None,
        state: str | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(detail, todo_id=todo_id, state=state)
        self.key = key


class TooLarge(ValueError):
    """A field is over its size limit (the API answers 413)."""

    def __init__(self, field: str, limit: int) -> None:
        super().__init__(f"{field} is over its limit of {limit} bytes")
        self.field = field
        self.limit = limit


class InvalidAnswer(ValueError):
    """An answer that is not one of the choices or fails the answer schema.

    ``path`` names where in the answer it failed ("answer", "answer.amount").
    """

    def __init__(self, detail: str, path: str = "answer") -> None:
        super().__init__(detail)
        self.path = path


class QueueNotGranted(StoreError):
    """The endpoint's grant does not cover the named queue."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} is outside this endpoint's grant")
        self.detail = str(self)
        self.queue = queue


class Unavailable(StoreError):
    """The database could not be reached or did not answer in time."""

    # Seconds a client should wait before it tries again (Retry-After).
    retry_after = 1

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(
            f"{operation}: database unavailable ({cause.__class__.__name__})"
        )
        self.detail = "the database is unavailable; try again shortly"
        self.operation = operation


class Deadlocked(Unavailable):
    """PostgreSQL broke a lock cycle by failing this statement: this request
    and a concurrent one each waited for what the other held. The database
    is up and busy; the statement was undone, and may be tried again."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(operation, cause)
        self.args = (f"{operation}: deadlock, the database is up",)
        self.detail = (
            "the database is busy: this request and a concurrent one waited"
            " for each other, and this one was stopped (a deadlock); try again"
            " shortly"
        )


class TimedOut(Unavailable):
    """A statement ran past the statement timeout: the database is up.

    ``lock_wait`` says it waited all that time for a row another transaction
    held (PostgreSQL names the tuple it waited for): the todo was busy.
    """

    def __init__(
        self, operation: str, cause: BaseException, *, lock_wait: bool
    ) -> None:
        super().__init__(operation, cause)
        self.lock_wait = lock_wait
        if lock_wait:
            self.detail = (
                "the todo is busy: another request held it past the statement"
                " timeout; try again shortly"
            )
        else:
            self.detail = "the statement timed out; try again shortly"


# --- Values ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Who is asking: an endpoint id and its queue grant (None = every queue)."""

    endpoint_id: str
    queues: tuple[str, ...] | None = None

    @classmethod
    def for_endpoint(cls, endpoint: "Endpoint") -> Self:
        return cls(str(endpoint.id), endpoint.granted_queues())

    def covers(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues


TODO_COLUMNS = (
    "id, endpoint_id, queue, title, payload, state, assignee, owner, attempt,"
    " max_attempts, lease_expires_at, claimed_at, next_retry_at, idempotency_key,"
    " last_error, result, created_at, updated_at, lease_token, available_at,"
    " question, question_status, asked_at, answer_deadline, answer, answer_nonce,"
    " cancel_request, canceled_at, progress, checkpoint, note, dismissed_at,"
    " priority, group_key, cost, trace_context, deliveries, trace_events,"
    " usage, attempt_usage, max_cost"
)
# The jsonb columns, by position: payload, result, question, answer,
# cancel_request, progress, checkpoint, trace_context, trace_events, usage,
# attempt_usage.
_JSON_POSITIONS = (4, 15, 20, 24, 26, 28, 29, 35, 37, 38, 39)
TODO_COLUMN_COUNT = len(TODO_COLUMNS.split(","))


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def _json(value: object) -> Any:
    # Django's psycopg backend hands jsonb to raw cursors as text. The standard
    # library reads it: orjson would read an integer beyond 64 bits, which
    # jsonb holds, as a float.
    return json.loads(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Todo:
    """One todo row, as the API and the Board render it."""

    id: str
    endpoint_id: str
    queue: str
    title: str
    payload: object
    state: State
    assignee: str | None
    owner: str | None
    attempt: int
    max_attempts: int
    lease_expires_at: datetime | None
    claimed_at: datetime | None
    next_retry_at: datetime | None
    idempotency_key: str | None
    last_error: str
    result: object
    created_at: datetime
    updated_at: datetime
    lease_token: str | None
    available_at: datetime
    question: JSONObject | None = None
    question_status: QuestionStatus | None = None
    asked_at: datetime | None = None
    answer_deadline: datetime | None = None
    answer: JSONObject | None = None
    answer_nonce: str | None = None
    cancel_request: JSONObject | None = None
    canceled_at: datetime | None = None
    progress: JSONObject | None = None
    checkpoint: object = None
    note: str | None = None
    dismissed_at: datetime | None = None
    # Admission (CONTRACT §17): 1 (highest) to 5, the group (column
    # group_key), what the todo counts against a rate limit.
    priority: int = 3
    group: str | None = None
    cost: float = 1.0
    trace_context: JSONObject | None = None
    deliveries: int = 0
    trace_events: list[JSONObject] | None = None
    # Usage (CONTRACT §18): the sum over the todo's attempts
    # ({"input_tokens", "output_tokens", "cost_usd"}, null until a report),
    # and the current delivery's figure as last reported.
    usage: JSONObject | None = None
    attempt_usage: JSONObject | None = None
    # What one attempt may cost in USD, reserved against its budgets at claim.
    max_cost: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        values = list(row[:TODO_COLUMN_COUNT])
        values[0], values[1] = str(values[0]), str(values[1])
        for position in _JSON_POSITIONS:
            # _json inline: most rows' JSON columns arrive read already.
            if isinstance(values[position], str):
                values[position] = json.loads(values[position])
        # Every field, in order, as __init__ would set them (a frozen
        # dataclass's __init__ sets each through object.__setattr__: half of
        # a row's reading).
        todo = cls.__new__(cls)
        todo.__dict__.update(zip(_TODO_FIELDS, values, strict=True))
        return todo

    @property
    def is_held(self) -> bool:
        """Pending, waiting for an answer: no claim takes it.

        A question whose deadline has passed holds nothing, even before the
        sweep marks it expired: a claim may take the todo from then on.
        """
        return (
            self.state == "pending"
            and self.question_status == "open"
            and not self.deadline_passed
        )

    @property
    def deadline_passed(self) -> bool:
        """The open question's deadline has come (the sweep may not have run)."""
        return (
            self.question_status == "open"
            and self.answer_deadline is not None
            and self.answer_deadline <= datetime.now(UTC)
        )

    @property
    def is_canceled(self) -> bool:
        return self.canceled_at is not None

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_request is not None

    @property
    def outcome(self) -> str:
        """Where the todo stands, as CONTRACT §14 names it."""
        if self.is_held:
            return "held"
        if self.is_canceled:
            return "canceled"
        return self.display_state

    @property
    def is_dead_letter(self) -> bool:
        return self.state == "failed" and self.next_retry_at is None

    @property
    def is_retry_scheduled(self) -> bool:
        return self.state == "failed" and self.next_retry_at is not None

    @property
    def display_state(self) -> str:
        """The state as an operator reads it: failed splits in two."""
        if self.is_dead_letter:
            return "dead_letter"
        if self.is_retry_scheduled:
            return "retry_scheduled"
        return self.state

    def question_dict(self) -> JSONObject | None:
        """The question as the API renders it, or None when none was asked."""
        if self.question is None:
            return None
        shown = {k: v for k, v in self.question.items() if k != PROPERTY_ORDER}
        return {
            **shown,
            "asked_at": _iso(self.asked_at),
            "deadline": _iso(self.answer_deadline),
            "expired": self.question_status == "expired" or self.deadline_passed,
        }

    def to_dict(self) -> JSONObject:
        columns = self.__dict__
        out: JSONObject = {name: columns[name] for name in _SHOWN_COLUMNS}
        for name in _SHOWN_TIMES:
            out[name] = _iso(out[name])
        out["question"] = self.question_dict()
        out["outcome"] = self.outcome
        out["cancel_requested"] = self.cancel_requested
        context = self.trace_context
        if context is not None and self.state == "claimed" and tracing.enabled():
            # The delivery's own context (todos.telemetry.tracing); else the stored one,
            # validated when it came in.
            context = self.trace_carrier()
        out["trace_context"] = context
        return out

    def trace_carrier(self) -> dict[str, str] | None:
        """The W3C context a claim hands on (todos.telemetry.tracing): the delivery's
        own while tracing is on and the todo is claimed, else the create's."""
        context = tracing.claim_context(self)
        return context.to_dict() if context is not None else None


# Columns the todo JSON does not show as they are: the question's parts are
# rendered in ``question``, the cancel request as ``cancel_requested`` (and a
# canceled todo's ``result``), and the answer-link nonce never leaves the store.
_RENDERED_APART = frozenset(
    {
        "question",
        "question_status",
        "asked_at",
        "answer_deadline",
        "answer_nonce",
        "cancel_request",
        "canceled_at",
        "dismissed_at",
        "trace_context",
        "deliveries",
        "trace_events",
        "attempt_usage",
    }
)
# The columns a todo's JSON shows as they are (timestamps in ISO 8601), in
# order, named once: to_dict runs for every todo an agent is sent.
_SHOWN_COLUMNS = tuple(
    field.name for field in fields(Todo) if field.name not in _RENDERED_APART
)
# Those of them that hold a time (ISO 8601 in the JSON).
_SHOWN_TIMES = tuple(
    name
    for name, kind in get_type_hints(Todo).items()
    if name in _SHOWN_COLUMNS and (kind is datetime or datetime in get_args(kind))
)
# Every field, in the order of TODO_COLUMNS (Todo.from_row).
_TODO_FIELDS = tuple(field.name for field in fields(Todo))
# The keys of a todo's JSON: those columns, plus the composed ones.
TODO_JSON_FIELDS = (
    *_SHOWN_COLUMNS,
    "question",
    "outcome",
    "cancel_requested",
    "trace_context",
)


@dataclass(frozen=True)
class Moved:
    """A todo a sweep moved: enough to log it and ring its own endpoint's bell."""

    id: str
    endpoint_id: str
    queue: str
    state: State


@dataclass(frozen=True)
class Event:
    """One row of a todo's history."""

    id: int
    todo_id: str
    endpoint_id: str
    from_state: State | None
    to_state: State
    attempt: int
    actor: str
    error: str
    at: datetime
    # The attempt's usage after this acknowledgement, when it reported one.
    usage: JSONObject | None = None

    def to_dict(self) -> JSONObject:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["at"] = _iso(self.at)
        return out
