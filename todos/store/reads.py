"""Reads of one endpoint's todos: one todo, a page, a history, the doorbell backlog."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from .rows import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    TODO_COLUMNS,
    Event,
    NotFound,
    QueueNotGranted,
    Scope,
    Todo,
    _json,
)
from .sql import (
    REDELIVERABLE,
    SCOPED,
    Statement,
    Steps,
    _run,
    _scope,
    _scope_params,
    _todo_id,
    _uuid,
    on_django,
    on_pool,
    run_steps,
)

# --- Read -----------------------------------------------------------------------

# ``operator`` is TRUE for the Board: no endpoint or grant check.
GET_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE id = %(id)s
   AND (%(operator)s OR (endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))))
"""


def get_todo_steps(scope: Scope, todo_id: str) -> Steps[Todo]:
    """Return one todo of this scope."""
    return (yield from _get(scope, todo_id))


get_todo = on_django(get_todo_steps)
aget_todo = on_pool(get_todo_steps)


def get_todo_any_endpoint(todo_id: str) -> Todo:
    """Return one todo of any endpoint (operator Board)."""
    return run_steps(_get(None, todo_id))


def _get(scope: Scope | None, todo_id: str) -> Steps[Todo]:
    canonical_id = _todo_id(todo_id)
    params = {**_scope(scope), "id": canonical_id}
    row = yield Statement("get_todo", GET_SQL, params, "one")
    if row is None:
        raise NotFound(todo_id=canonical_id)
    return Todo.from_row(row)


# Display states split failed into its two meanings for filtering.
STATE_FILTERS = {
    "pending": "state = 'pending'",
    "claimed": "state = 'claimed'",
    "done": "state = 'done'",
    "failed": "state = 'failed'",
    "retry_scheduled": "state = 'failed' AND next_retry_at IS NOT NULL",
    "dead_letter": "state = 'failed' AND next_retry_at IS NULL",
}


@dataclass(frozen=True)
class Page:
    todos: list[Todo]
    next_cursor: str | None


def encode_cursor(todo: Todo) -> str:
    """Return the opaque keyset cursor that resumes after this todo."""
    import base64

    raw = f"{todo.created_at.isoformat()}|{todo.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return (created_at, id) from a cursor; ValueError when it is not ours."""
    import base64

    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, todo_id = base64.urlsafe_b64decode(padded).decode().split("|")
        created_at = datetime.fromisoformat(created)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("cursor is not one this API issued") from exc
    canonical_id = _uuid(todo_id)
    if created_at.tzinfo is None or canonical_id is None:
        raise ValueError("cursor is not one this API issued")
    return created_at, canonical_id


# The fingerprint filter's name for the todos that failed without an error
# message (their error_fingerprint is NULL): one dead-letter group of their own.
NO_ERROR_GROUP = "(no error recorded)"


class RowFilters(TypedDict, total=False):
    """The Board's list filters of a row, as ``_filter_conditions`` takes them."""

    endpoint_id: str | None
    queue: str | None
    state: str | None
    assignee: str | None
    owner: str | None
    text: str | None
    fingerprint: str | None


class Filters(RowFilters, total=False):
    """The row filters and the Board's owner scope (None = every endpoint)."""

    endpoint_ids: Iterable[object] | None


def _filter_conditions(
    *,
    endpoint_id: str | None = None,
    queue: str | None = None,
    state: str | None = None,
    assignee: str | None = None,
    owner: str | None = None,
    text: str | None = None,
    endpoint_ids: Iterable[object] | None = None,
    fingerprint: str | None = None,
) -> tuple[list[str], dict[str, Any]] | None:
    """Return (conditions, params) of the list filters; None when none can match.

    ``endpoint_ids`` is the Board's owner scope (None = every endpoint);
    ``fingerprint`` picks one dead-letter group (``todos.error_fingerprint``).
    """
    if state and state not in STATE_FILTERS:
        raise ValueError(f"state must be one of {', '.join(STATE_FILTERS)}")
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if endpoint_ids is not None:
        params["scope_endpoints"] = [
            parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None
        ]
        if not params["scope_endpoints"]:
            return None
        conditions.append("endpoint_id = ANY(%(scope_endpoints)s::uuid[])")
    # A fingerprint names a dead-letter group as the groups page shows it:
    # its dismissed members are not in it (and then the group's own index,
    # todos_dead_letter_group_idx, finds its members).
    if fingerprint == NO_ERROR_GROUP:
        conditions.append("error_fingerprint IS NULL AND dismissed_at IS NULL")
    elif fingerprint:
        params["fingerprint"] = fingerprint
        conditions.append(
            "error_fingerprint = %(fingerprint)s AND dismissed_at IS NULL"
        )
    if endpoint_id is not None:
        params["filter_endpoint"] = _uuid(endpoint_id)
        if params["filter_endpoint"] is None:
            return None
        conditions.append("endpoint_id = %(filter_endpoint)s")
    for name, value in (("queue", queue), ("assignee", assignee), ("owner", owner)):
        if value:
            params[name] = value
            conditions.append(f"{name} = %({name})s")
    if state:
        conditions.append(STATE_FILTERS[state])
    if text:
        params["text"] = (
            "%"
            + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            + "%"
        )
        conditions.append("(title ILIKE %(text)s OR idempotency_key ILIKE %(text)s)")
    return conditions, params


def _list(
    scope: Scope | None,
    *,
    endpoint_id: str | None = None,
    queue: str | None = None,
    state: str | None = None,
    assignee: str | None = None,
    owner: str | None = None,
    text: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    newest_first: bool = False,
    endpoint_ids: Iterable[object] | None = None,
    fingerprint: str | None = None,
) -> Page:
    if state is not None and state not in STATE_FILTERS:
        raise ValueError(f"state must be one of {', '.join(STATE_FILTERS)}")
    limit = int(limit)
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE_SIZE}")
    conditions: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if scope is not None:
        try:
            params.update(_scope_params(scope))
        except NotFound:
            return Page([], None)
        conditions.append(SCOPED)
    filters = _filter_conditions(
        endpoint_id=endpoint_id,
        queue=queue,
        state=state,
        assignee=assignee,
        owner=owner,
        text=text,
        endpoint_ids=endpoint_ids,
        fingerprint=fingerprint,
    )
    if filters is None:
        return Page([], None)
    conditions.extend(filters[0])
    params.update(filters[1])
    if cursor:
        params["after_created"], params["after_id"] = decode_cursor(cursor)
        op = "<" if newest_first else ">"
        conditions.append(
            f"(created_at, id) {op} (%(after_created)s, %(after_id)s::uuid)"
        )
    direction = "DESC" if newest_first else "ASC"
    where = " AND ".join(conditions) or "TRUE"
    # The WHERE is assembled from fixed fragments only; values are parameters.
    sql = (
        f"SELECT {TODO_COLUMNS} FROM todos WHERE {where}"
        f" ORDER BY created_at {direction}, id {direction} LIMIT %(limit)s"
    )
    rows = _run("list_todos", sql, params)
    todos = [Todo.from_row(row) for row in rows[:limit]]
    next_cursor = encode_cursor(todos[-1]) if len(rows) > limit else None
    return Page(todos, next_cursor)


def list_todos(
    scope: Scope,
    *,
    queue: str | None = None,
    state: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
) -> Page:
    """Return a page of this scope's todos, oldest first, with a keyset cursor.

    A queue outside the grant raises QueueNotGranted, never an empty page.
    """
    if queue is not None and not scope.covers(queue):
        raise QueueNotGranted(queue)
    return _list(scope, queue=queue, state=state, limit=limit, cursor=cursor)


def list_todos_any_endpoint(
    *,
    endpoint_id: str | None = None,
    queue: str | None = None,
    state: str | None = None,
    assignee: str | None = None,
    owner: str | None = None,
    text: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    newest_first: bool = True,
    endpoint_ids: Iterable[object] | None = None,
    fingerprint: str | None = None,
) -> Page:
    """Return a page of any endpoint's todos with the Board's filters
    (``endpoint_ids``: only these endpoints, the Board's owner scope)."""
    return _list(
        None,
        endpoint_id=endpoint_id,
        queue=queue,
        state=state,
        assignee=assignee,
        owner=owner,
        text=text,
        limit=limit,
        cursor=cursor,
        newest_first=newest_first,
        endpoint_ids=endpoint_ids,
        fingerprint=fingerprint,
    )


EVENTS_SQL = """
SELECT id, todo_id, endpoint_id, from_state, to_state, attempt, actor, error, at,
       usage
  FROM todo_events WHERE todo_id = %(id)s ORDER BY id
"""


def todo_events_any_endpoint(todo_id: str) -> list[Event]:
    """Return a todo's history, oldest first (operator Board)."""
    canonical_id = _uuid(todo_id)
    if canonical_id is None:
        return []
    rows = _run("todo_events", EVENTS_SQL, {"id": canonical_id})
    return [
        Event(
            r[0], str(r[1]), str(r[2]), r[3], r[4], r[5], r[6], r[7], r[8], _json(r[9])
        )
        for r in rows
    ]


# --- Doorbell -------------------------------------------------------------------

PENDING_DOORBELL_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE {SCOPED}
   AND ((state = 'pending' AND available_at <= statement_timestamp())
        OR {REDELIVERABLE})
 ORDER BY created_at
 LIMIT %(limit)s
"""


def pending_doorbell_todos_steps(
    scope: Scope, *, limit: int = 100
) -> Steps[list[Todo]]:
    """Return this scope's claimable todos, oldest first (the doorbell's backlog)."""
    try:
        params = {**_scope_params(scope), "limit": int(limit)}
    except NotFound:
        return []
    rows = yield Statement("pending_doorbell_todos", PENDING_DOORBELL_SQL, params)
    return [Todo.from_row(row) for row in rows]


pending_doorbell_todos = on_django(pending_doorbell_todos_steps)
apending_doorbell_todos = on_pool(pending_doorbell_todos_steps)
