"""What the API answers, as typed dataclasses.

Each is read from the API's JSON by ``from_json``; a field the API adds later
lands in ``extra`` untouched, so an older client still reads a newer server.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

JSON = Any
"""Any JSON value (the API's payloads, results, checkpoints and answers)."""


def _time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@functools.cache
def _declared(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls)) - {"extra"}


def _split(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields ``cls`` declares, and the rest (its ``extra``)."""
    known = _declared(cls)
    return (
        {k: v for k, v in data.items() if k in known},
        {k: v for k, v in data.items() if k not in known},
    )


@dataclass(frozen=True, slots=True)
class Question:
    """What a held todo asks: its text, its choices or schema, and its deadline."""

    text: str
    choices: list[str] | None = None
    answer_schema: dict[str, Any] | None = None
    asked_by: str | None = None
    asked_at: datetime | None = None
    deadline: datetime | None = None
    expired: bool = False
    return_to: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Question:
        known, extra = _split(cls, data)
        for name in ("asked_at", "deadline"):
            known[name] = _time(known.get(name))
        known["expired"] = bool(known.get("expired"))
        return cls(**known, extra=extra)


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer a question got: its value, who gave it (``by``, as the server
    knows them; ``worker``, the name the answering agent sent) and when."""

    value: JSON
    by: str | None = None
    worker: str | None = None
    at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        known, extra = _split(cls, data)
        known["at"] = _time(known.get("at"))
        return cls(**known, extra=extra)


@dataclass(frozen=True, slots=True)
class Progress:
    """The last progress a heartbeat reported."""

    message: str | None = None
    fraction: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Progress:
        return cls(message=data.get("message"), fraction=data.get("fraction"))

    def to_json(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (("message", self.message), ("fraction", self.fraction))
            if v is not None
        }


_TIMES = (
    "lease_expires_at",
    "claimed_at",
    "next_retry_at",
    "created_at",
    "updated_at",
    "available_at",
)


@dataclass(frozen=True, slots=True)
class Todo:
    """A todo as the API renders it (``docs/api.md``: every column)."""

    id: str
    queue: str
    state: str
    outcome: str
    endpoint_id: str | None = None
    title: str = ""
    payload: JSON = None
    assignee: str | None = None
    owner: str | None = None
    attempt: int = 0
    max_attempts: int = 0
    lease_expires_at: datetime | None = None
    claimed_at: datetime | None = None
    next_retry_at: datetime | None = None
    idempotency_key: str | None = None
    last_error: str | None = None
    result: JSON = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    available_at: datetime | None = None
    lease_token: str | None = None
    question: Question | None = None
    answer: Answer | None = None
    progress: Progress | None = None
    checkpoint: JSON = None
    cancel_requested: bool = False
    note: str | None = None
    # The W3C context a claim hands on ({"traceparent"[, "tracestate"]}): the
    # worker runs the handler in it (switchboard_client._tracing).
    trace_context: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Todo:
        known, extra = _split(cls, data)
        for name in _TIMES:
            known[name] = _time(known.get(name))
        for name, kind in (
            ("question", Question),
            ("answer", Answer),
            ("progress", Progress),
        ):
            value = known.get(name)
            known[name] = None if value is None else kind.from_json(value)
        known["cancel_requested"] = bool(known.get("cancel_requested"))
        return cls(**known, extra=extra)

    @property
    def held(self) -> bool:
        """Whether it waits for an answer to its question."""
        return self.outcome == "held"

    @property
    def finished(self) -> bool:
        """Whether it has ended: done, canceled or dead-lettered."""
        return self.outcome in ("done", "canceled", "dead_letter")


@dataclass(frozen=True, slots=True)
class Created:
    """A create's answer: the todo, and whether it is new (False: it collapsed
    onto a live todo with the same idempotency key)."""

    todo: Todo
    created: bool


@dataclass(frozen=True, slots=True)
class ItemError:
    """One item of a batch that failed on its own: the single call's status and
    error body."""

    status: int
    error: str
    detail: str


@dataclass(frozen=True, slots=True)
class CreateResult:
    """One item of a batch create: a Created, or its ItemError."""

    status: int
    created: Created | None = None
    error: ItemError | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CreateResult:
        status = int(data["status"])
        if "todo" in data:
            made = Created(Todo.from_json(data["todo"]), bool(data.get("created")))
            return cls(status, created=made)
        return cls(status, error=ItemError(status, data["error"], data["detail"]))


@dataclass(frozen=True, slots=True)
class ActionResult:
    """One action of a batch acknowledge: the todo after it, or its ItemError."""

    id: str
    status: int
    todo: Todo | None = None
    error: ItemError | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionResult:
        status = int(data["status"])
        if "todo" in data:
            return cls(str(data["id"]), status, todo=Todo.from_json(data["todo"]))
        error = ItemError(status, data["error"], data["detail"])
        return cls(str(data["id"]), status, error=error)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing; pass ``next_cursor`` back for the next."""

    todos: list[Todo]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue's settings and live figures (``GET /api/v1/queues``)."""

    name: str
    lease_seconds: int | None = None
    max_attempts: int | None = None
    delay_seconds: int | None = None
    paused: bool = False
    paused_at: datetime | None = None
    pending: int = 0
    delayed: int = 0
    claimed: int = 0
    retry_scheduled: int = 0
    dead_letter: int = 0
    held: int = 0
    lapsed: int = 0
    oldest_pending_age_seconds: float | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Queue:
        known, extra = _split(cls, data)
        for name in ("paused_at", "created_at", "updated_at"):
            known[name] = _time(known.get(name))
        return cls(**known, extra=extra)


@dataclass(frozen=True, slots=True)
class Event:
    """One Server-Sent Event of ``/api/v1/events``: its name (``todo.ready``,
    ``todo.done``…) and its data (``{"id", "endpoint_id", "queue"}``)."""

    event: str
    data: dict[str, Any]

    @property
    def todo_id(self) -> str:
        return str(self.data["id"])

    @property
    def queue(self) -> str:
        return str(self.data["queue"])
