"""The todo store: every todo read and write, as parameterized SQL.

This module is the only place that writes todo SQL. Each lifecycle transition is
one conditional statement (``UPDATE … WHERE id = … AND state = … AND owner = …``)
that also appends its ``todo_events`` row and, when the todo becomes claimable,
rings the doorbell with ``pg_notify`` — all in the statement's own transaction,
so a transition, its history and its wakeup commit or vanish together. When the
conditional statement matches no row, one lookup classifies the miss:
``NotFound`` when the todo is absent, foreign or the id is malformed;
``Conflict`` when it exists in the caller's scope but not in the needed state.

Caller-facing functions take a ``Scope`` (the authenticated endpoint and its
queue grant) and predicate every query on it. The ``*_any_endpoint`` twins are
for the operator Board only. The sweeps (``reap_expired``,
``requeue_due_retries``, ``purge_terminal``) are system-wide by design
(SPEC-0003 "Background sweeps are exempt").

Time always comes from PostgreSQL's clock (``now()``), never from Python, so
every process agrees on when a lease lapses, and tests move time by editing
timestamps in the database.
"""

import json
import logging
import uuid
from dataclasses import dataclass, fields
from datetime import datetime

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)

logger = logging.getLogger("switchboard.store")

DOORBELL_CHANNEL = "switchboard_todo_ready"
BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 900
MAX_LEASE_SECONDS = 43200
DEFAULT_MAX_ATTEMPTS = 5


# --- Errors ---------------------------------------------------------------------


class StoreError(Exception):
    """Base of the store's domain errors."""


class NotFound(StoreError):
    """No such todo in this scope: absent, foreign, malformed id, or no work."""

    def __init__(self, detail="no such todo", todo_id=None):
        super().__init__(detail)
        self.detail = detail
        self.todo_id = todo_id


class Conflict(StoreError):
    """The todo exists in this scope but is not in the state the call needs."""

    def __init__(self, detail, todo_id=None, state=None):
        super().__init__(detail)
        self.detail = detail
        self.todo_id = todo_id
        self.state = state


class QueueNotGranted(StoreError):
    """The endpoint's grant does not cover the named queue."""

    def __init__(self, queue):
        super().__init__(f"queue {queue!r} is outside this endpoint's grant")
        self.detail = str(self)
        self.queue = queue


class Unavailable(StoreError):
    """The database could not be reached or did not answer in time."""

    def __init__(self, operation, cause):
        super().__init__(
            f"{operation}: database unavailable ({cause.__class__.__name__})"
        )
        self.detail = "the database is unavailable; try again shortly"
        self.operation = operation


# --- Values ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Who is asking: an endpoint id and its queue grant (None = every queue)."""

    endpoint_id: str
    queues: tuple[str, ...] | None = None

    @classmethod
    def for_endpoint(cls, endpoint):
        return cls(str(endpoint.id), endpoint.granted_queues())

    def covers(self, queue):
        return self.queues is None or queue in self.queues


TODO_COLUMNS = (
    "id, endpoint_id, queue, title, payload, state, assignee, owner, attempt,"
    " max_attempts, lease_expires_at, claimed_at, next_retry_at, idempotency_key,"
    " last_error, result, created_at, updated_at"
)


def _iso(value):
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def _json(value):
    # Django's psycopg backend hands jsonb to raw cursors as text.
    return json.loads(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Todo:
    """One todo row, as the API and the Board render it."""

    id: str
    endpoint_id: str
    queue: str
    title: str
    payload: object
    state: str
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

    @classmethod
    def from_row(cls, row):
        values = list(row[:18])
        values[0], values[1] = str(values[0]), str(values[1])
        values[4], values[15] = _json(values[4]), _json(values[15])
        return cls(*values)

    @property
    def is_dead_letter(self):
        return self.state == "failed" and self.next_retry_at is None

    @property
    def is_retry_scheduled(self):
        return self.state == "failed" and self.next_retry_at is not None

    @property
    def display_state(self):
        """The state as an operator reads it: failed splits in two."""
        if self.is_dead_letter:
            return "dead_letter"
        if self.is_retry_scheduled:
            return "retry_scheduled"
        return self.state

    def to_dict(self):
        out = {}
        for field in fields(self):
            value = getattr(self, field.name)
            out[field.name] = _iso(value) if isinstance(value, datetime) else value
        return out


@dataclass(frozen=True)
class Moved:
    """A todo a sweep moved: enough to log it and ring its own endpoint's bell."""

    id: str
    endpoint_id: str
    queue: str
    state: str


@dataclass(frozen=True)
class Event:
    """One row of a todo's history."""

    id: int
    todo_id: str
    endpoint_id: str
    from_state: str | None
    to_state: str
    attempt: int
    actor: str
    error: str
    at: datetime

    def to_dict(self):
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["at"] = _iso(self.at)
        return out


# --- Plumbing -------------------------------------------------------------------


def _uuid(value):
    """Return the canonical string of a UUID, or None when it is malformed."""
    if isinstance(value, uuid.UUID):
        return str(value)
    try:
        return str(uuid.UUID(str(value)))
    except (TypeError, ValueError, AttributeError):
        return None


def _scope_params(scope):
    """Bind a scope, or raise NotFound when its endpoint id is malformed."""
    endpoint_id = _uuid(scope.endpoint_id)
    if endpoint_id is None:
        raise NotFound()
    queues = list(scope.queues) if scope.queues is not None else None
    return {"endpoint_id": endpoint_id, "queues": queues}


def _todo_id(value):
    todo_id = _uuid(value)
    if todo_id is None:
        raise NotFound(todo_id=str(value))
    return todo_id


def _lease(lease_seconds):
    if lease_seconds is None:
        return settings.SWITCHBOARD_LEASE_SECONDS
    lease = int(lease_seconds)
    if not 1 <= lease <= MAX_LEASE_SECONDS:
        raise ValueError(f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS}")
    return lease


def _run(operation, sql, params, fetch="all"):
    """Execute one statement; turn connection trouble into ``Unavailable``."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if fetch == "one":
                return cursor.fetchone()
            if fetch == "all":
                return cursor.fetchall()
            return cursor.rowcount
    except (OperationalError, InterfaceError) as exc:
        logger.warning(
            "store call failed: database unavailable",
            extra={"fields": {"operation": operation, "error": type(exc).__name__}},
        )
        raise Unavailable(operation, exc) from exc


def ping():
    """Say whether the database answers."""
    try:
        _run("ping", "SELECT 1", {}, fetch="one")
    except (Unavailable, DatabaseError):
        return False
    return True


# The scope predicate: the endpoint first (tenant boundary), then its grant.
# The operator twins substitute TRUE: they are authenticated by a staff session.
SCOPED = (
    "endpoint_id = %(endpoint_id)s"
    " AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))"
)
ANY_ENDPOINT = "TRUE"


def _variants(template):
    """Return the (scoped, any-endpoint) forms of a statement template."""
    return template.format(scope=SCOPED), template.format(scope=ANY_ENDPOINT)


def _scoped_call(scope, scoped_sql, any_sql, params):
    """Pick the statement for a scope (None = operator) and bind the scope."""
    if scope is None:
        return any_sql, params
    return scoped_sql, {**params, **_scope_params(scope)}


# The append to the history, shared by every transition statement: it reads
# the CTE named ``moved`` with columns id, endpoint_id, from_state, state, attempt.
EVENT_INSERT = """
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, from_state, state, attempt, %(actor)s, %(event_error)s,
           now()
      FROM moved
"""

# Ring the doorbell for a row of ``moved`` that became claimable. NOTIFY is
# delivered at commit, so a listener never hears of a transition that rolled back.
DOORBELL = (
    "CASE WHEN state = 'pending' THEN pg_notify('"
    + DOORBELL_CHANNEL
    + "', json_build_object('id', id, 'endpoint_id', endpoint_id,"
    " 'queue', queue)::text) END"
)

LOOKUP_STATE_SQL, LOOKUP_STATE_ANY_SQL = _variants(
    "SELECT state FROM todos WHERE id = %(id)s AND {scope}"
)


def _classify_miss(scope, todo_id, needed):
    """After a zero-row transition: NotFound if absent here, else Conflict."""
    sql, params = _scoped_call(
        scope, LOOKUP_STATE_SQL, LOOKUP_STATE_ANY_SQL, {"id": todo_id}
    )
    row = _run("classify", sql, params, fetch="one")
    if row is None:
        raise NotFound(todo_id=todo_id)
    raise Conflict(f"todo is {row[0]}; {needed}", todo_id=todo_id, state=row[0])


def _transition(operation, scope, todo_id, sql_pair, params, needed):
    """Run one conditional transition and return the todo, or classify the miss."""
    todo_id = _todo_id(todo_id)
    sql, bound = _scoped_call(scope, *sql_pair, {**params, "id": todo_id})
    row = _run(operation, sql, bound, fetch="one")
    if row is None:
        _classify_miss(scope, todo_id, needed)
    return Todo.from_row(row)


# --- Create ---------------------------------------------------------------------

# ON CONFLICT names the dedupe index by its columns and its exact predicate, so
# PostgreSQL infers todos_dedupe_idx; a NULL key never conflicts. The row is
# selected from its endpoint, so an unknown endpoint inserts nothing: Django's
# foreign keys are DEFERRABLE INITIALLY DEFERRED, and inside a caller's
# transaction the violation would only surface at its COMMIT.
CREATE_SQL = f"""
WITH moved AS (
    INSERT INTO todos (id, endpoint_id, queue, title, payload, state, assignee,
                       attempt, max_attempts, idempotency_key, last_error,
                       created_at, updated_at)
    SELECT %(id)s, e.id, %(queue)s, %(title)s, %(payload)s::jsonb,
           'pending', %(assignee)s, 0, %(max_attempts)s, %(idempotency_key)s, '',
           clock.at, clock.at
      FROM endpoints e,
           -- The wall clock, not the transaction's start: todos created in one
           -- transaction (a webhook fan-out) keep their order. One reading,
           -- so a new todo's updated_at equals its created_at.
           (SELECT clock_timestamp() AS at) clock
     WHERE e.id = %(endpoint_id)s
    ON CONFLICT (endpoint_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL
          AND state <> 'done'
          AND (state <> 'failed' OR next_retry_at IS NOT NULL)
    DO NOTHING
    RETURNING {TODO_COLUMNS}, NULL::text AS from_state
), history AS ({EVENT_INSERT})
SELECT {TODO_COLUMNS}, {DOORBELL} FROM moved
"""

LIVE_DUPLICATE_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE endpoint_id = %(endpoint_id)s AND idempotency_key = %(idempotency_key)s
   AND state <> 'done' AND (state <> 'failed' OR next_retry_at IS NOT NULL)
"""

ENDPOINT_EXISTS_SQL = "SELECT 1 FROM endpoints WHERE id = %(endpoint_id)s"


def create_todo(
    scope,
    *,
    queue,
    title="",
    payload=None,
    idempotency_key=None,
    assignee=None,
    max_attempts=None,
    actor="",
):
    """Enqueue a todo; return (todo, created).

    A live duplicate (same endpoint and idempotency key) returns created=False.
    """
    if not scope.covers(queue):
        raise QueueNotGranted(queue)
    return _create(
        _scope_params(scope)["endpoint_id"],
        queue,
        title,
        payload,
        idempotency_key,
        assignee,
        max_attempts,
        actor,
    )


def create_todo_any_endpoint(
    endpoint_id,
    *,
    queue,
    title="",
    payload=None,
    idempotency_key=None,
    assignee=None,
    max_attempts=None,
    actor="",
):
    """Enqueue a todo for any endpoint (the Board and webhooks); no grant check."""
    endpoint = _uuid(endpoint_id)
    if endpoint is None:
        raise NotFound("no such endpoint")
    return _create(
        endpoint, queue, title, payload, idempotency_key, assignee, max_attempts, actor
    )


def _create(
    endpoint_id, queue, title, payload, idempotency_key, assignee, max_attempts, actor
):
    max_attempts = DEFAULT_MAX_ATTEMPTS if max_attempts is None else int(max_attempts)
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    params = {
        "endpoint_id": endpoint_id,
        "queue": queue,
        "title": title or "",
        "payload": json.dumps({} if payload is None else payload),
        "assignee": assignee,
        "max_attempts": max_attempts,
        "idempotency_key": idempotency_key,
        "actor": actor,
        "event_error": "",
    }
    # A duplicate can turn terminal between the insert that lost and the read
    # of the winner; then the slot is free again and the next insert wins.
    for _ in range(3):
        params["id"] = str(uuid.uuid4())
        row = _run("create_todo", CREATE_SQL, params, fetch="one")
        if row is not None:
            return Todo.from_row(row), True
        row = _run("create_todo", LIVE_DUPLICATE_SQL, params, fetch="one")
        if row is not None:
            return Todo.from_row(row), False
        if _run("create_todo", ENDPOINT_EXISTS_SQL, params, fetch="one") is None:
            raise NotFound("no such endpoint")
    raise Conflict("the idempotency key is contended; try again")


# --- Read -----------------------------------------------------------------------

GET_SQL, GET_ANY_SQL = _variants(
    f"SELECT {TODO_COLUMNS} FROM todos WHERE id = %(id)s AND {{scope}}"
)


def get_todo(scope, todo_id):
    """Return one todo of this scope."""
    return _get(scope, todo_id)


def get_todo_any_endpoint(todo_id):
    """Return one todo of any endpoint (operator Board)."""
    return _get(None, todo_id)


def _get(scope, todo_id):
    todo_id = _todo_id(todo_id)
    sql, params = _scoped_call(scope, GET_SQL, GET_ANY_SQL, {"id": todo_id})
    row = _run("get_todo", sql, params, fetch="one")
    if row is None:
        raise NotFound(todo_id=todo_id)
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
    todos: list
    next_cursor: str | None


def encode_cursor(todo):
    """Return the opaque keyset cursor that resumes after this todo."""
    import base64

    raw = f"{todo.created_at.isoformat()}|{todo.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor):
    """Return (created_at, id) from a cursor; ValueError when it is not ours."""
    import base64

    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, todo_id = base64.urlsafe_b64decode(padded).decode().split("|")
        created_at = datetime.fromisoformat(created)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("cursor is not one this API issued") from exc
    if created_at.tzinfo is None or _uuid(todo_id) is None:
        raise ValueError("cursor is not one this API issued")
    return created_at, _uuid(todo_id)


def _filter_conditions(
    *,
    endpoint_id=None,
    queue=None,
    state=None,
    assignee=None,
    owner=None,
    text=None,
    endpoint_ids=None,
    fingerprint=None,
):
    """Return (conditions, params) of the list filters; None when none can match.

    ``endpoint_ids`` is the Board's owner scope (None = every endpoint);
    ``fingerprint`` picks one dead-letter group (``todos.error_fingerprint``).
    """
    if state and state not in STATE_FILTERS:
        raise ValueError(f"state must be one of {', '.join(STATE_FILTERS)}")
    conditions, params = [], {}
    if endpoint_ids is not None:
        params["scope_endpoints"] = [
            parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None
        ]
        if not params["scope_endpoints"]:
            return None
        conditions.append("endpoint_id = ANY(%(scope_endpoints)s::uuid[])")
    if fingerprint:
        params["fingerprint"] = fingerprint
        conditions.append("error_fingerprint = %(fingerprint)s")
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
    scope,
    *,
    endpoint_id=None,
    queue=None,
    state=None,
    assignee=None,
    owner=None,
    text=None,
    limit=50,
    cursor=None,
    newest_first=False,
    endpoint_ids=None,
    fingerprint=None,
):
    if state is not None and state not in STATE_FILTERS:
        raise ValueError(f"state must be one of {', '.join(STATE_FILTERS)}")
    limit = int(limit)
    if not 1 <= limit <= 200:
        raise ValueError("limit must be between 1 and 200")
    conditions, params = [], {"limit": limit + 1}
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


def list_todos(scope, *, queue=None, state=None, limit=50, cursor=None):
    """Return a page of this scope's todos, oldest first, with a keyset cursor."""
    return _list(scope, queue=queue, state=state, limit=limit, cursor=cursor)


def list_todos_any_endpoint(
    *,
    endpoint_id=None,
    queue=None,
    state=None,
    assignee=None,
    owner=None,
    text=None,
    limit=50,
    cursor=None,
    newest_first=True,
    endpoint_ids=None,
    fingerprint=None,
):
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
SELECT id, todo_id, endpoint_id, from_state, to_state, attempt, actor, error, at
  FROM todo_events WHERE todo_id = %(id)s ORDER BY id
"""


def todo_events_any_endpoint(todo_id):
    """Return a todo's history, oldest first (operator Board)."""
    todo_id = _uuid(todo_id)
    if todo_id is None:
        return []
    rows = _run("todo_events", EVENTS_SQL, {"id": todo_id})
    return [Event(r[0], str(r[1]), str(r[2]), *r[3:]) for r in rows]


# --- Claim ----------------------------------------------------------------------

# What the claim scan may take besides pending rows: a lapsed lease below the
# cap, and a parked retry whose window has elapsed. No sweep has to run first.
REDELIVERABLE = """(
    (state = 'claimed' AND lease_expires_at < now() AND attempt < max_attempts)
 OR (state = 'failed' AND next_retry_at <= now())
)"""

CLAIM_UPDATE = f"""
moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = %(worker)s, attempt = t.attempt + 1,
           claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => %(lease)s::int),
           next_retry_at = NULL, updated_at = now()
      FROM candidate c
     WHERE t.id = c.id
 RETURNING t.id, t.endpoint_id, t.queue, t.title, t.payload, t.state, t.assignee,
           t.owner, t.attempt, t.max_attempts, t.lease_expires_at, t.claimed_at,
           t.next_retry_at, t.idempotency_key, t.last_error, t.result,
           t.created_at, t.updated_at, c.from_state
), history AS ({EVENT_INSERT})
SELECT {TODO_COLUMNS} FROM moved
"""

# claim_next: first any redelivery that is due (lapsed lease or elapsed
# backoff: few rows, served by the lease and retry-window partial indexes),
# else the oldest pending row from the partial pending index. SKIP LOCKED makes
# concurrent claimants pass over each other's rows instead of queueing on them.
# The pending scan runs only when no redelivery was found (a one-time filter).
CLAIM_NEXT_SQL = f"""
WITH due AS (
    SELECT id, state AS from_state FROM todos
     WHERE {SCOPED} AND {REDELIVERABLE}
       AND (assignee IS NULL OR assignee = %(worker)s)
     ORDER BY created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), fresh AS (
    SELECT id, state AS from_state FROM todos
     WHERE {SCOPED} AND state = 'pending'
       AND (assignee IS NULL OR assignee = %(worker)s)
       AND NOT EXISTS (SELECT 1 FROM due)
     ORDER BY created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), candidate AS (
    SELECT * FROM due UNION ALL SELECT * FROM fresh
), {CLAIM_UPDATE}"""


def claim_next(scope, worker, *, queue=None, lease_seconds=None):
    """Claim the next claimable todo of this scope (optionally of one queue)."""
    if queue is not None:
        if not scope.covers(queue):
            raise QueueNotGranted(queue)
        scope = Scope(scope.endpoint_id, (queue,))
    params = {
        **_scope_params(scope),
        "worker": worker,
        "actor": worker,
        "event_error": "",
        "lease": _lease(lease_seconds),
    }
    row = _run("claim_next", CLAIM_NEXT_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no claimable todo")
    return Todo.from_row(row)


CLAIM_ONE_SQL, CLAIM_ONE_ANY_SQL = _variants(
    f"""
WITH candidate AS (
    SELECT id, state AS from_state FROM todos
     WHERE id = %(id)s AND {{scope}}
       AND (state = 'pending' OR {REDELIVERABLE})
       AND (assignee IS NULL OR assignee = %(worker)s)
       FOR UPDATE SKIP LOCKED
), {CLAIM_UPDATE}"""
)


def claim_todo(scope, todo_id, worker, *, lease_seconds=None):
    """Claim one specific todo of this scope."""
    return _claim_one(scope, todo_id, worker, lease_seconds)


def claim_todo_any_endpoint(todo_id, worker, *, lease_seconds=None):
    """Claim one specific todo of any endpoint (operator Board)."""
    return _claim_one(None, todo_id, worker, lease_seconds)


def _claim_one(scope, todo_id, worker, lease_seconds):
    params = {
        "worker": worker,
        "actor": worker,
        "event_error": "",
        "lease": _lease(lease_seconds),
    }
    return _transition(
        "claim_todo",
        scope,
        todo_id,
        (CLAIM_ONE_SQL, CLAIM_ONE_ANY_SQL),
        params,
        "only a pending todo (or a lapsed or due one) "
        "assigned to nobody or to this worker can be claimed",
    )


# --- Owner transitions ----------------------------------------------------------


def _owner_transition(set_clause, from_state="'claimed'"):
    """Build the scoped/any pair of a transition guarded by state and owner."""
    return _variants(
        f"""
WITH moved AS (
    UPDATE todos SET {set_clause}, updated_at = now()
     WHERE id = %(id)s AND {{scope}} AND state = 'claimed' AND owner = %(worker)s
 RETURNING {TODO_COLUMNS}, {from_state}::text AS from_state
), history AS ({EVENT_INSERT})
SELECT {TODO_COLUMNS}, {DOORBELL} FROM moved
"""
    )


OWNED = "only the current lease owner may do this to a claimed todo"

HEARTBEAT_SQL = _owner_transition(
    "lease_expires_at = now() + make_interval(secs => %(lease)s::int)"
)


def heartbeat(scope, todo_id, worker, *, lease_seconds=None):
    """Extend the owner's lease to now + lease_seconds (SQS ChangeMessageVisibility)."""
    params = {
        "worker": worker,
        "actor": worker,
        "event_error": "",
        "lease": _lease(lease_seconds),
    }
    return _transition("heartbeat", scope, todo_id, HEARTBEAT_SQL, params, OWNED)


COMPLETE_SQL = _owner_transition(
    "state = 'done', result = %(result)s::jsonb, lease_expires_at = NULL,"
    " next_retry_at = NULL"
)


def complete_todo(scope, todo_id, worker, *, result=None):
    """Mark the owner's claimed todo done, storing its result."""
    params = {
        "worker": worker,
        "actor": worker,
        "event_error": "",
        "result": None if result is None else json.dumps(result),
    }
    return _transition("complete_todo", scope, todo_id, COMPLETE_SQL, params, OWNED)


# Below the cap: park in failed with a backoff window of 30 s doubling per
# attempt, capped at 15 min (the exponent is bounded so power() cannot
# overflow). At the cap: dead-letter, no window.
FAIL_SQL = _owner_transition(
    f"""state = 'failed', last_error = %(error)s, lease_expires_at = NULL,
        next_retry_at = CASE
            WHEN attempt < max_attempts THEN now() + make_interval(secs => LEAST(
                {BACKOFF_BASE_SECONDS} * power(2, LEAST(GREATEST(attempt, 1), 16) - 1),
                {BACKOFF_CAP_SECONDS}))
            END"""
)


def fail_todo(scope, todo_id, worker, *, error=""):
    """Fail the owner's claimed todo: schedule a retry, or dead-letter at the cap."""
    params = {
        "worker": worker,
        "actor": worker,
        "event_error": error or "",
        "error": error or "",
    }
    return _transition("fail_todo", scope, todo_id, FAIL_SQL, params, OWNED)


# Release hands the lease back now, with the outcome its expiry would have had.
RELEASE_SET = """state = CASE WHEN attempt < max_attempts THEN 'pending'
                     ELSE 'failed' END,
        owner = CASE WHEN attempt < max_attempts THEN NULL ELSE owner END,
        last_error = CASE WHEN attempt < max_attempts THEN last_error
                          ELSE 'released at the attempt cap' END,
        lease_expires_at = NULL, next_retry_at = NULL"""
RELEASE_SQL = _owner_transition(RELEASE_SET)


def release_todo(scope, todo_id, worker):
    """Give the owner's lease back now: pending below the cap, else dead-letter."""
    params = {"worker": worker, "actor": worker, "event_error": ""}
    return _transition("release_todo", scope, todo_id, RELEASE_SQL, params, OWNED)


RELEASE_ANY_SQL = f"""
WITH moved AS (
    UPDATE todos SET {RELEASE_SET}, updated_at = now()
     WHERE id = %(id)s AND state = 'claimed'
 RETURNING {TODO_COLUMNS}, 'claimed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT {TODO_COLUMNS}, {DOORBELL} FROM moved
"""


def release_todo_any_endpoint(todo_id, *, actor="operator"):
    """Release a stuck claim whoever holds it (operator Board)."""
    params = {"actor": actor, "event_error": "released by an operator"}
    return _transition(
        "release_todo",
        None,
        todo_id,
        (RELEASE_ANY_SQL, RELEASE_ANY_SQL),
        params,
        "only a claimed todo can be released",
    )


# --- Retry ----------------------------------------------------------------------

RETRY_SQL, RETRY_ANY_SQL = _variants(
    f"""
WITH moved AS (
    UPDATE todos SET state = 'pending', owner = NULL, lease_expires_at = NULL,
                     next_retry_at = NULL, updated_at = now()
     WHERE id = %(id)s AND {{scope}} AND state = 'failed'
 RETURNING {TODO_COLUMNS}, 'failed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT {TODO_COLUMNS}, {DOORBELL} FROM moved
"""
)

DUPLICATE_ON_RETRY = (
    "another live todo holds the same idempotency key; finish or retire it first"
)


def retry_todo(scope, todo_id, *, actor="agent"):
    """Requeue a failed todo of this scope now (dead letter or open window)."""
    return _retry(scope, todo_id, actor)


def retry_todo_any_endpoint(todo_id, *, actor="operator"):
    """Requeue a failed todo of any endpoint now (operator Board)."""
    return _retry(None, todo_id, actor)


def _retry(scope, todo_id, actor):
    params = {"actor": actor, "event_error": ""}
    try:
        # A savepoint, so a dedupe collision does not poison a caller's transaction.
        with transaction.atomic():
            return _transition(
                "retry_todo",
                scope,
                todo_id,
                (RETRY_SQL, RETRY_ANY_SQL),
                params,
                "only a failed todo can be retried",
            )
    except IntegrityError as exc:
        # A dead letter left the dedupe index; a newer live todo took its key.
        raise Conflict(
            DUPLICATE_ON_RETRY, todo_id=_uuid(todo_id), state="failed"
        ) from exc


# --- Doorbell -------------------------------------------------------------------

PENDING_DOORBELL_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE {SCOPED} AND (state = 'pending' OR {REDELIVERABLE})
 ORDER BY created_at
 LIMIT %(limit)s
"""


def pending_doorbell_todos(scope, *, limit=100):
    """Return this scope's claimable todos, oldest first (the doorbell's backlog)."""
    try:
        params = {**_scope_params(scope), "limit": int(limit)}
    except NotFound:
        return []
    return [
        Todo.from_row(row)
        for row in _run("pending_doorbell_todos", PENDING_DOORBELL_SQL, params)
    ]


NOTIFY_SQL = "SELECT pg_notify(%(channel)s, %(payload)s)"


def publish_todo_ready(todo):
    """Ring the doorbell for a todo that is claimable (the store's statements
    already do this for their own transitions)."""
    payload = json.dumps(
        {"id": str(todo.id), "endpoint_id": str(todo.endpoint_id), "queue": todo.queue}
    )
    _run(
        "publish_todo_ready",
        NOTIFY_SQL,
        {"channel": DOORBELL_CHANNEL, "payload": payload},
        fetch="one",
    )


# --- Sweeps (system-wide: no endpoint predicate, by design) ---------------------

SWEEP_BATCH = 500

# Expired leases: back to pending below the cap, dead-letter at it. SKIP LOCKED
# lets several sweepers and the claim scan's own lapsed-lease branch coexist.
REAP_EXPIRED_SQL = f"""
WITH expired AS (
    SELECT id FROM todos
     WHERE state = 'claimed' AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = CASE WHEN t.attempt < t.max_attempts THEN 'pending'
                        ELSE 'failed' END,
           owner = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE t.owner END,
           last_error = CASE WHEN t.attempt < t.max_attempts THEN t.last_error
                             ELSE 'lease expired at the attempt cap' END,
           lease_expires_at = NULL, next_retry_at = NULL, updated_at = now()
      FROM expired e
     WHERE t.id = e.id
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt,
           'claimed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT id, endpoint_id, queue, state, {DOORBELL} FROM moved
"""


def reap_expired(*, limit=SWEEP_BATCH):
    """Requeue (or dead-letter at the cap) one batch of expired leases."""
    params = {
        "limit": int(limit),
        "actor": "system:reaper",
        "event_error": "lease expired",
    }
    rows = _run("reap_expired", REAP_EXPIRED_SQL, params)
    return [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


REQUEUE_DUE_SQL = f"""
WITH due AS (
    SELECT id FROM todos
     WHERE state = 'failed' AND next_retry_at <= now()
     ORDER BY next_retry_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = 'pending', owner = NULL, lease_expires_at = NULL,
           next_retry_at = NULL, updated_at = now()
      FROM due d
     WHERE t.id = d.id
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt,
           'failed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT id, endpoint_id, queue, state, {DOORBELL} FROM moved
"""


def requeue_due_retries(*, limit=SWEEP_BATCH):
    """Return one batch of failed todos whose backoff elapsed to pending."""
    params = {"limit": int(limit), "actor": "system:retry-scheduler", "event_error": ""}
    rows = _run("requeue_due_retries", REQUEUE_DUE_SQL, params)
    return [Moved(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


# Terminal = done, or failed with no retry window (a true dead letter), aged
# from when it became terminal. Live rows are never touched. The history goes
# with each row (ON DELETE CASCADE).
PURGE_TERMINAL_SQL = """
WITH doomed AS (
    SELECT id FROM todos
     WHERE (state = 'done' OR (state = 'failed' AND next_retry_at IS NULL))
       AND updated_at < now() - make_interval(days => %(days)s::int)
     ORDER BY updated_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM todos t USING doomed d WHERE t.id = d.id
"""


def purge_terminal(older_than_days, *, limit=5000):
    """Delete one batch of terminal todos older than the given days; return how many."""
    days = int(older_than_days)
    if days < 0:
        raise ValueError("older_than_days must not be negative")
    return _run(
        "purge_terminal",
        PURGE_TERMINAL_SQL,
        {"days": days, "limit": int(limit)},
        fetch="count",
    )


# --- Board (operator) -----------------------------------------------------------

# Terminal rows (done, dead letters) can number millions; the Board never
# counts them exactly. Each terminal count stops at this cap and the Board
# shows "10 000+" past it.
TERMINAL_COUNT_CAP = 10_000
BULK_RETRY_BATCH = 500
BULK_RETRY_LIMIT = 10_000


@dataclass(frozen=True)
class QueueCounts:
    """One (endpoint, queue) line of the overview."""

    endpoint_id: str
    queue: str
    pending: int = 0
    claimed: int = 0
    lapsed: int = 0
    retry_scheduled: int = 0
    dead_letter: int = 0
    done: int = 0
    oldest_pending_seconds: float | None = None


@dataclass(frozen=True)
class Overview:
    """Counts per (endpoint, queue); terminal counts are capped (see ``capped``)."""

    rows: list
    totals: dict
    capped: dict
    cap: int


# Live rows by endpoint, queue and state. The WHERE is exactly the predicate of
# todos_live_overview_idx, so this is an index-only scan that never reads the
# terminal backlog.
LIVE_OVERVIEW_SQL = """
SELECT endpoint_id, queue,
       count(*) FILTER (WHERE state = 'pending'),
       count(*) FILTER (WHERE state = 'claimed'),
       count(*) FILTER (WHERE state = 'failed'),
       EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending'))
  FROM todos
 WHERE (state IN ('pending', 'claimed')
        OR (state = 'failed' AND next_retry_at IS NOT NULL))
   AND {scope}
 GROUP BY endpoint_id, queue
"""

# Claims whose lease has lapsed but that no reaper has moved yet: few rows,
# served by todos_claimed_lease_idx.
LAPSED_OVERVIEW_SQL = """
SELECT endpoint_id, queue, count(*) FROM todos
 WHERE state = 'claimed' AND lease_expires_at < now() AND {scope}
 GROUP BY endpoint_id, queue
"""

# A terminal state, counted only up to the cap: the inner LIMIT stops the scan
# after cap + 1 rows, so a million done rows cost the same as ten thousand.
TERMINAL_OVERVIEW_SQL = """
SELECT endpoint_id, queue, count(*) FROM (
    SELECT endpoint_id, queue FROM todos WHERE {state} AND {scope}
     LIMIT %(cap)s + 1
) capped
 GROUP BY endpoint_id, queue
"""


# The Board's owner scope: only these endpoints (None = every endpoint).
BOARD_SCOPE = "endpoint_id = ANY(%(scope_endpoints)s::uuid[])"


def _board_scope(endpoint_ids):
    """Return (predicate, params) of the Board's owner scope."""
    if endpoint_ids is None:
        return ANY_ENDPOINT, {}
    ids = [parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None]
    return BOARD_SCOPE, {"scope_endpoints": ids}


def board_overview(*, cap=TERMINAL_COUNT_CAP, endpoint_ids=None):
    """Return counts per endpoint and queue; terminal counts stop at ``cap``.

    ``endpoint_ids`` limits it to those endpoints (the Board's owner scope).
    """
    counts = {}
    scope, scope_params = _board_scope(endpoint_ids)

    def line(endpoint_id, queue):
        key = (str(endpoint_id), queue)
        return counts.setdefault(key, {"endpoint_id": key[0], "queue": queue})

    for endpoint_id, queue, pending, claimed, retry, age in _run(
        "board_overview", LIVE_OVERVIEW_SQL.format(scope=scope), scope_params
    ):
        line(endpoint_id, queue).update(
            pending=pending,
            claimed=claimed,
            retry_scheduled=retry,
            oldest_pending_seconds=None if age is None else float(age),
        )
    for endpoint_id, queue, lapsed in _run(
        "board_overview", LAPSED_OVERVIEW_SQL.format(scope=scope), scope_params
    ):
        line(endpoint_id, queue)["lapsed"] = lapsed
    capped = {}
    for name in ("dead_letter", "done"):
        sql = TERMINAL_OVERVIEW_SQL.format(state=STATE_FILTERS[name], scope=scope)
        total = 0
        bound = {**scope_params, "cap": cap}
        for endpoint_id, queue, count in _run("board_overview", sql, bound):
            line(endpoint_id, queue)[name] = count
            total += count
        capped[name] = total > cap
    rows = sorted(
        (QueueCounts(**values) for values in counts.values()),
        key=lambda row: (row.endpoint_id, row.queue),
    )
    totals = {
        name: sum(getattr(row, name) for row in rows)
        for name in (
            "pending",
            "claimed",
            "lapsed",
            "retry_scheduled",
            "dead_letter",
            "done",
        )
    }
    for name, over in capped.items():
        if over:
            totals[name] = cap
    return Overview(rows, totals, capped, cap)


# A dead letter whose idempotency key a newer live todo holds: its requeue
# would collide in todos_dedupe_idx, so a bulk retry leaves it (and says so).
KEY_HELD_ELSEWHERE = """EXISTS (
    SELECT 1 FROM todos l
     WHERE c.next_retry_at IS NULL AND c.idempotency_key IS NOT NULL
       AND l.endpoint_id = c.endpoint_id
       AND l.idempotency_key = c.idempotency_key
       AND l.id <> c.id AND l.state <> 'done'
       AND (l.state <> 'failed' OR l.next_retry_at IS NOT NULL))"""

RETRYABLE_COUNT_SQL = """
SELECT count(*) FROM (
    SELECT 1 FROM todos c WHERE c.state = 'failed' AND {where} AND {held}
     LIMIT %(cap)s + 1
) capped
"""


def _count_failed(held, cap, filters):
    found = _filter_conditions(**filters)
    if found is None:
        return 0
    conditions, params = found
    sql = RETRYABLE_COUNT_SQL.format(
        where=" AND ".join(conditions) or "TRUE", held=held
    )
    return _run("count_retryable", sql, {**params, "cap": int(cap)}, fetch="one")[0]


def count_retryable_any_endpoint(*, cap=BULK_RETRY_LIMIT, **filters):
    """Count the failed todos a bulk retry of this filter would move, up to cap + 1."""
    return _count_failed(f"NOT {KEY_HELD_ELSEWHERE}", cap, filters)


def count_key_held_any_endpoint(*, cap=BULK_RETRY_LIMIT, **filters):
    """Count the matching dead letters a bulk retry must leave, up to cap + 1:
    a newer live todo holds their idempotency key."""
    return _count_failed(KEY_HELD_ELSEWHERE, cap, filters)


@dataclass(frozen=True)
class BulkRetry:
    """What a bulk retry did: how many moved, which were refused, and whether
    more matching todos are left for another pass."""

    retried: int
    conflicts: list
    more: bool
    # Matching dead letters left failed because a live todo holds their key.
    key_held: int = 0


# One batch of a bulk retry, in keyset order after the last batch. A dead
# letter whose idempotency key a newer live todo holds is left alone (its
# requeue would collide in todos_dedupe_idx); rows another transaction holds
# are skipped rather than waited for.
RETRY_BATCH_SQL = f"""
WITH candidate AS (
    SELECT c.id FROM todos c
     WHERE c.state = 'failed' AND {{where}}
       AND (c.created_at, c.id) > (%(after_created)s, %(after_id)s::uuid)
       AND NOT {KEY_HELD_ELSEWHERE}
     ORDER BY c.created_at, c.id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = 'pending', owner = NULL, lease_expires_at = NULL,
           next_retry_at = NULL, updated_at = now()
      FROM candidate
     WHERE t.id = candidate.id AND t.state = 'failed'
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt, t.created_at,
           'failed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT created_at, id, {DOORBELL} FROM moved ORDER BY created_at, id
"""

RETRY_BATCH_IDS_SQL = """
SELECT c.created_at, c.id FROM todos c
 WHERE c.state = 'failed' AND {where}
   AND (c.created_at, c.id) > (%(after_created)s, %(after_id)s::uuid)
 ORDER BY c.created_at, c.id
 LIMIT %(batch)s
"""

KEYSET_START = (
    datetime.fromisoformat("0001-01-01T00:00:00+00:00"),
    str(uuid.UUID(int=0)),
)


def retry_matching_any_endpoint(
    *, actor="operator", limit=BULK_RETRY_LIMIT, batch=BULK_RETRY_BATCH, **filters
):
    """Requeue every failed todo a filter matches, batch by batch (operator Board).

    Each batch commits on its own, so a large retry never holds thousands of
    row locks at once. At most ``limit`` todos move per call; ``more`` says
    whether matching failed todos remain.
    """
    found = _filter_conditions(**filters)
    if found is None:
        return BulkRetry(0, [], False)
    conditions, params = found
    where = " AND ".join(conditions) or "TRUE"
    batch_sql = RETRY_BATCH_SQL.format(where=where)
    ids_sql = RETRY_BATCH_IDS_SQL.format(where=where)
    params = {**params, "actor": actor, "event_error": ""}
    after = KEYSET_START
    retried, conflicts = 0, []
    while retried < limit:
        size = min(int(batch), limit - retried)
        bound = {
            **params,
            "batch": size,
            "after_created": after[0],
            "after_id": after[1],
        }
        try:
            with transaction.atomic():
                rows = _run("retry_matching", batch_sql, bound)
        except IntegrityError:
            # Two dead letters of one batch share a key: retry that batch one by
            # one, so the first takes the key and the rest report a conflict.
            rows = _run("retry_matching", ids_sql, bound)
            for _, todo_id in rows:
                try:
                    _retry(None, todo_id, actor)
                    retried += 1
                except Conflict as exc:
                    conflicts.append(exc)
                except NotFound:
                    pass
        else:
            retried += len(rows)
        if len(rows) < size:
            break
        after = (rows[-1][0], str(rows[-1][1]))
    more = retried >= limit and count_retryable_any_endpoint(cap=1, **filters) > 0
    held = count_key_held_any_endpoint(**filters)
    return BulkRetry(retried, conflicts, more, held)


def retry_many_any_endpoint(todo_ids, *, actor="operator"):
    """Requeue each of the given failed todos; return (retried, conflicts, missing)."""
    retried, conflicts, missing = [], [], []
    for todo_id in todo_ids:
        try:
            retried.append(_retry(None, todo_id, actor))
        except Conflict as exc:
            conflicts.append(exc)
        except NotFound as exc:
            missing.append(exc)
    return retried, conflicts, missing
