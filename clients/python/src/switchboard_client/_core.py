"""The one core both clients share: each API operation as a ``Call`` (what to
send, whether it is safe to send again, how to read the answer), the retry
policy, and the Server-Sent Events parser. ``Client`` and ``AsyncClient``
only carry calls over httpx; neither builds a request or reads an answer.
"""

from __future__ import annotations

import enum
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, TypeVar

import httpx

from switchboard_client import _tracing
from switchboard_client.errors import error_for
from switchboard_client.models import (
    JSON,
    ActionResult,
    Created,
    CreateResult,
    Event,
    Page,
    Progress,
    Queue,
    Todo,
)

T = TypeVar("T")

# A result wait is sent in slices the server accepts (wait_seconds ≤ 20).
WAIT_SLICE_SECONDS = 20

# A long poll's answer takes up to its wait; the read timeout covers that.
WAIT_MARGIN_SECONDS = 15.0


class Keep(enum.Enum):
    """A release's ``assignee`` left out: the assignment stays as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    ``safe``: sending it twice does what sending it once does (a read, an
    acknowledgement with a lease token, a create with an idempotency key), so a
    503 or a lost answer is retried. ``owner``: the body names its caller, so the
    client's worker name fills ``worker`` when neither it nor a lease token is
    given. ``empty``: statuses read as "nothing" rather than an error (a claim's
    404 when no work is claimable).
    """

    method: str
    path: str
    read: Callable[[Any], T]
    body: dict[str, Any] | None = None
    params: dict[str, str] | None = None
    safe: bool = False
    owner: bool = False
    empty: T | None = None
    empty_on: frozenset[int] = frozenset()
    wait: float = 0.0
    headers: Mapping[str, str] | None = None

    def bind(self, worker: str) -> Call[T]:
        """This call with ``worker`` filled in where the caller named nobody."""
        if not self.owner or self.body is None:
            return self
        if self.body.get("worker") is not None or self.body.get("lease_token"):
            return self
        return replace(self, body={**self.body, "worker": worker})

    def answer(self, response: httpx.Response) -> T:
        """Read the answer, or raise its typed error."""
        if response.status_code in self.empty_on:
            return self.empty  # type: ignore[return-value]
        raise_error(response)
        return self.read(response.json())

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        """The read timeout, lengthened by the call's wait."""
        if not self.wait:
            return base
        read = (base.read or 0.0) + self.wait + WAIT_MARGIN_SECONDS
        return httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)


def raise_error(response: httpx.Response) -> None:
    """Raise the typed error of an error answer (4xx, 5xx); else nothing."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"error": "http_error", "detail": response.text[:500]}
    raise error_for(response.status_code, body, response.headers.get("retry-after"))


def wait_slice(deadline: float | None) -> int:
    """The next result wait to send: the whole seconds left before ``deadline``
    (a monotonic time), in slices the server accepts (``wait_seconds`` 0–20)."""
    if deadline is None:
        return WAIT_SLICE_SECONDS
    return int(min(WAIT_SLICE_SECONDS, max(0.0, deadline - time.monotonic())))


@dataclass(frozen=True, slots=True)
class Retry:
    """When and how long to retry: exponential backoff with full jitter
    (``base`` × 2ⁿ, at most ``cap``, each delay drawn uniformly below it), for
    up to ``attempts`` tries and ``deadline`` seconds in all.

    A refused connection is retried for every call (nothing was sent). A 503,
    a timeout or a connection lost mid-call is retried only for a call that is
    safe to repeat."""

    attempts: int = 10
    deadline: float = 30.0
    base: float = 0.1
    cap: float = 5.0

    def again(self, call: Call[Any], failure: object, tries: int, spent: float) -> bool:
        """Whether to send ``call`` again after ``failure`` (an exception or
        a response), having tried ``tries`` times over ``spent`` seconds."""
        if tries >= self.attempts or spent >= self.deadline:
            return False
        if isinstance(failure, httpx.Response):
            return failure.status_code == 503 and call.safe
        if isinstance(failure, httpx.ConnectError):
            return True
        return isinstance(failure, httpx.TransportError) and call.safe

    def delay(self, tries: int) -> float:
        """How long to wait before try number ``tries + 1``."""
        return random.uniform(0, min(self.cap, self.base * 2 ** (tries - 1)))


NO_RETRY = Retry(attempts=1)


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _todo(body: Any) -> Todo:
    return Todo.from_json(body["todo"])


def _created(body: Any) -> Created:
    return Created(Todo.from_json(body["todo"]), bool(body["created"]))


def _create_results(body: Any) -> list[CreateResult]:
    return [CreateResult.from_json(item) for item in body["results"]]


def _claimed(body: Any) -> list[Todo]:
    return [Todo.from_json(item) for item in body["todos"]]


def _page(body: Any) -> Page:
    return Page([Todo.from_json(t) for t in body["todos"]], body.get("next_cursor"))


def _action_results(body: Any) -> list[ActionResult]:
    return [ActionResult.from_json(item) for item in body["results"]]


def _queues(body: Any) -> list[Queue]:
    return [Queue.from_json(item) for item in body["queues"]]


def _owner(
    todo: Todo | str, lease_token: str | None, worker: str | None
) -> tuple[str, dict[str, Any]]:
    """The path id and the body's owner fields: a Todo's own lease token unless
    a worker name (or another token) is given."""
    if isinstance(todo, Todo):
        if lease_token is None and worker is None:
            lease_token = todo.lease_token
        return todo.id, _drop_none(lease_token=lease_token, worker=worker)
    return todo, _drop_none(lease_token=lease_token, worker=worker)


def _id(todo: Todo | str) -> str:
    return todo.id if isinstance(todo, Todo) else todo


def acknowledgement(todo_id: str, verb: str, body: dict[str, Any]) -> Call[Todo]:
    """An owner transition: safe to repeat when fenced by a lease token."""
    return Call(
        "POST",
        f"/api/v1/todos/{todo_id}/{verb}",
        _todo,
        body=body,
        safe=bool(body.get("lease_token")),
        owner=True,
    )


def _nothing(body: Any) -> None:
    return None


def bare_acknowledgement(todo_id: str, verb: str, body: dict[str, Any]) -> Call[None]:
    """An ``acknowledgement`` whose answer is not read into a Todo (the
    runtime needs only whether it succeeded)."""
    return Call(
        "POST",
        f"/api/v1/todos/{todo_id}/{verb}",
        _nothing,
        body=body,
        safe=bool(body.get("lease_token")),
        owner=True,
    )


# The operations, one a function; the clients expose each as a method of the
# same name and signature (client.py, aio.py).


def create(
    queue: str,
    *,
    title: str | None = None,
    payload: JSON = None,
    idempotency_key: str | None = None,
    assignee: str | None = None,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
    replace: bool | None = None,
    **fields: JSON,
) -> Call[Created]:
    """Create a todo (``created`` False: it collapsed onto a live todo with the
    same ``idempotency_key``). Other fields the API takes pass through."""
    body = _drop_none(
        queue=queue,
        title=title,
        payload=payload,
        idempotency_key=idempotency_key,
        assignee=assignee,
        max_attempts=max_attempts,
        delay_seconds=delay_seconds,
        replace=replace,
        **fields,
    )
    # Retried only with a key and without replace (a replace sent again would
    # cancel the todo its first sending made).
    safe = idempotency_key is not None and not replace
    return Call(
        "POST",
        "/api/v1/todos",
        _created,
        body=body,
        safe=safe,
        headers=_tracing.headers(),
    )


def create_many(todos: Sequence[Mapping[str, JSON]]) -> Call[list[CreateResult]]:
    """Create 1–100 todos (each a create body) in one request; one result per
    item, in order, each standing alone."""
    items = [dict(item) for item in todos]
    safe = all(i.get("idempotency_key") and not i.get("replace") for i in items)
    return Call(
        "POST",
        "/api/v1/todos",
        _create_results,
        body={"todos": items},
        safe=safe,
        headers=_tracing.headers(),
    )


def get(todo_id: str, *, wait_seconds: int | None = None) -> Call[Todo]:
    """Read a todo; with ``wait_seconds`` (≤ 20), once it is done, canceled,
    dead-lettered or held for an answer, or at the end of the wait."""
    params = None if wait_seconds is None else {"wait_seconds": str(wait_seconds)}
    return Call(
        "GET",
        f"/api/v1/todos/{todo_id}",
        _todo,
        params=params,
        safe=True,
        wait=float(wait_seconds or 0),
    )


def list_todos(
    *,
    queue: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[Page]:
    """One page of the endpoint's todos, oldest first."""
    params = _drop_none(queue=queue, state=state, limit=limit, cursor=cursor)
    return Call(
        "GET",
        "/api/v1/todos",
        _page,
        params={k: str(v) for k, v in params.items()},
        safe=True,
    )


def claim(
    *,
    queue: str | None = None,
    worker: str | None = None,
    lease_seconds: int | None = None,
    wait_seconds: int | None = None,
) -> Call[Todo | None]:
    """Claim the next claimable todo, waiting up to ``wait_seconds`` (≤ 20) for
    one; None when there is none."""
    body = _drop_none(
        worker=worker,
        queue=queue,
        lease_seconds=lease_seconds,
        wait_seconds=wait_seconds,
    )
    return Call(
        "POST",
        "/api/v1/todos/claim",
        _todo,
        body=body,
        owner=True,
        empty_on=frozenset({404}),
        wait=float(wait_seconds or 0),
    )


def claim_many(
    max_todos: int,
    *,
    queue: str | None = None,
    worker: str | None = None,
    lease_seconds: int | None = None,
    wait_seconds: int | None = None,
) -> Call[list[Todo]]:
    """Claim up to ``max_todos`` (1–10) in one statement; [] after the wait."""
    body = _drop_none(
        worker=worker,
        queue=queue,
        max_todos=max_todos,
        lease_seconds=lease_seconds,
        wait_seconds=wait_seconds,
    )
    return Call(
        "POST",
        "/api/v1/todos/claim",
        _claimed,
        body=body,
        owner=True,
        wait=float(wait_seconds or 0),
    )


def claim_todo(
    todo: Todo | str,
    *,
    worker: str | None = None,
    lease_seconds: int | None = None,
) -> Call[Todo]:
    """Claim one named todo (after a ``todo.ready`` event, say)."""
    body = _drop_none(worker=worker, lease_seconds=lease_seconds)
    return Call(
        "POST", f"/api/v1/todos/{_id(todo)}/claim", _todo, body=body, owner=True
    )


def heartbeat(
    todo: Todo | str,
    *,
    lease_token: str | None = None,
    worker: str | None = None,
    lease_seconds: int | None = None,
    progress: Progress | Mapping[str, Any] | None = None,
    checkpoint: JSON = None,
) -> Call[Todo]:
    """Extend the lease (to now + ``lease_seconds``), with progress and a
    checkpoint; the answer's ``cancel_requested`` says whether to stop."""
    todo_id, body = _owner(todo, lease_token, worker)
    if isinstance(progress, Progress):
        progress = progress.to_json()
    body.update(
        _drop_none(
            lease_seconds=lease_seconds, progress=progress, checkpoint=checkpoint
        )
    )
    return acknowledgement(todo_id, "heartbeat", body)


def complete(
    todo: Todo | str,
    result: JSON = None,
    *,
    lease_token: str | None = None,
    worker: str | None = None,
) -> Call[Todo]:
    """Finish a claimed todo with its result."""
    todo_id, body = _owner(todo, lease_token, worker)
    body.update(_drop_none(result=result))
    return acknowledgement(todo_id, "complete", body)


def fail(
    todo: Todo | str,
    error: str,
    *,
    lease_token: str | None = None,
    worker: str | None = None,
) -> Call[Todo]:
    """Fail the attempt: retried later below the attempt cap, dead-lettered at it."""
    todo_id, body = _owner(todo, lease_token, worker)
    body["error"] = error
    return acknowledgement(todo_id, "fail", body)


def release(
    todo: Todo | str,
    *,
    lease_token: str | None = None,
    worker: str | None = None,
    assignee: str | None | Literal[Keep.KEEP] = KEEP,
    note: str | None = None,
    checkpoint: JSON = None,
) -> Call[Todo]:
    """Give the todo back now, with a checkpoint; a handoff when ``assignee``
    names a worker (None: to the pool; left out: the assignment stays)."""
    todo_id, body = _owner(todo, lease_token, worker)
    if assignee is not KEEP:
        body["assignee"] = assignee
    body.update(_drop_none(note=note, checkpoint=checkpoint))
    return acknowledgement(todo_id, "release", body)


def ask(
    todo: Todo | str,
    question: str,
    *,
    choices: Sequence[str] | None = None,
    answer_schema: Mapping[str, Any] | None = None,
    checkpoint: JSON = None,
    deadline_seconds: int | None = None,
    return_to: Literal["me", "pool"] | None = None,
    lease_token: str | None = None,
    worker: str | None = None,
) -> Call[Todo]:
    """Ask a question from inside the claim: the lease ends and the todo is
    held until it is answered (or its deadline passes)."""
    todo_id, body = _owner(todo, lease_token, worker)
    body.update(
        _drop_none(
            question=question,
            choices=None if choices is None else list(choices),
            answer_schema=None if answer_schema is None else dict(answer_schema),
            checkpoint=checkpoint,
            deadline_seconds=deadline_seconds,
            return_to=return_to,
        )
    )
    return acknowledgement(todo_id, "ask", body)


def answer(todo: Todo | str, answer: JSON, *, worker: str | None = None) -> Call[Todo]:
    """Answer a held todo's question (one of its choices, valid against its schema)."""
    body = {"answer": answer, **_drop_none(worker=worker)}
    return Call(
        "POST", f"/api/v1/todos/{_id(todo)}/answer", _todo, body=body, owner=True
    )


def cancel(
    todo: Todo | str, *, reason: str | None = None, worker: str | None = None
) -> Call[Todo]:
    """Cancel a todo: at once unless it is claimed, when its owner is asked to
    stop (``cancel_requested``)."""
    body = _drop_none(reason=reason, worker=worker)
    return Call(
        "POST", f"/api/v1/todos/{_id(todo)}/cancel", _todo, body=body, owner=True
    )


def retry(todo: Todo | str) -> Call[Todo]:
    """Put a failed todo back to pending now."""
    return Call("POST", f"/api/v1/todos/{_id(todo)}/retry", _todo, body={})


def batch(
    actions: Sequence[Mapping[str, JSON]], *, worker: str | None = None
) -> Call[list[ActionResult]]:
    """Apply 1–100 owner actions (``{"op": "complete"|"fail"|"heartbeat"|
    "release"|"cancel", "id", "lease_token", …}``), each on its own."""
    items = [dict(action) for action in actions]
    safe = all(a.get("lease_token") and a.get("op") != "cancel" for a in items)
    body = {"actions": items, **_drop_none(worker=worker)}
    return Call(
        "POST",
        "/api/v1/todos/batch",
        _action_results,
        body=body,
        safe=safe,
        owner=True,
    )


def queues() -> Call[list[Queue]]:
    """The endpoint's queues within its grant, with settings and live figures."""
    return Call("GET", "/api/v1/queues", _queues, safe=True)


class EventParser:
    """Server-Sent Events from a stream's lines, fed one at a time (comments,
    the keep-alives among them, are skipped)."""

    def __init__(self) -> None:
        self.name: str = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if not line:
            event = (
                Event(self.name, json.loads("\n".join(self.data)))
                if self.data
                else None
            )
            self.name, self.data = "message", []
            return event
        if not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                self.name = value
            elif key == "data":
                self.data.append(value)
        return None
