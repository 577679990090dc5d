"""Plumbing every store statement shares: binding, running, the scope predicate,
the scope, the live-row predicate and the server's defaults."""

import functools
import logging
import uuid
from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, overload

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from todos.db.pool import Runner, db

from .rows import (
    DOORBELL_CHANNEL,
    MAX_LEASE_SECONDS,
    TODO_EVENT_CHANNEL,
    Deadlocked,
    NotFound,
    Row,
    Scope,
    TimedOut,
    Unavailable,
)

logger = logging.getLogger("switchboard.store")

# --- Plumbing -------------------------------------------------------------------


def _uuid(value: object) -> str | None:
    """Return the canonical string of a UUID, or None when it is malformed."""
    if isinstance(value, uuid.UUID):
        return str(value)
    try:
        return str(uuid.UUID(str(value)))
    except (TypeError, ValueError, AttributeError):
        return None


class ScopeParams(TypedDict):
    """A scope bound: its endpoint's canonical id and its grant."""

    endpoint_id: str
    queues: list[str] | None


def _scope_params(scope: Scope) -> ScopeParams:
    """Bind a scope, or raise NotFound when its endpoint id is malformed."""
    endpoint_id = _uuid(scope.endpoint_id)
    if endpoint_id is None:
        raise NotFound()
    queues = list(scope.queues) if scope.queues is not None else None
    return {"endpoint_id": endpoint_id, "queues": queues}


def _todo_id(value: object) -> str:
    todo_id = _uuid(value)
    if todo_id is None:
        raise NotFound(todo_id=str(value))
    return todo_id


# Connection loss and timeouts (a statement timeout is an OperationalError):
# the database is unavailable, the caller may try again. Any other
# DatabaseError (bad input PostgreSQL refused, a bug) is not an outage.
OUTAGES = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def is_outage(exc: BaseException) -> bool:
    """Say whether an exception means the database is unavailable (503)."""
    return isinstance(exc, (Unavailable, *OUTAGES))


# What a statement binds: its named parameters, of any type psycopg adapts
# (as psycopg.abc.Params types them).
Params = Mapping[str, Any]


type Fetch = Literal["all", "one", "count", "rowcount"] | None


@overload
def _run(
    operation: str, sql: str, params: Params, fetch: Literal["all"] = "all"
) -> list[Row]: ...
@overload
def _run(
    operation: str, sql: str, params: Params, fetch: Literal["one"]
) -> Row | None: ...
@overload
def _run(
    operation: str,
    sql: str,
    params: Params,
    fetch: Literal["count", "rowcount"] | None,
) -> int: ...
def _run(
    operation: str, sql: str, params: Params, fetch: Fetch = "all"
) -> list[Row] | Row | None | int:
    """Execute one statement on Django's connection of this thread; turn
    connection trouble into ``Unavailable`` (``_arun`` is its async twin)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if fetch == "one":
                row: Row | None = cursor.fetchone()
                return row
            if fetch == "all":
                rows: list[Row] = cursor.fetchall()
                return rows
            count: int = cursor.rowcount
            return count
    except OUTAGES as exc:
        raise _outage(operation, exc) from exc


@overload
async def _arun(
    operation: str,
    sql: str,
    params: Params,
    fetch: Literal["all"] = "all",
    on: Runner = db,
) -> list[Row]: ...
@overload
async def _arun(
    operation: str, sql: str, params: Params, fetch: Literal["one"], on: Runner = db
) -> Row | None: ...
@overload
async def _arun(
    operation: str,
    sql: str,
    params: Params,
    fetch: Literal["count", "rowcount"] | None,
    on: Runner = db,
) -> int: ...
async def _arun(
    operation: str, sql: str, params: Params, fetch: Fetch = "all", on: Runner = db
) -> list[Row] | Row | None | int:
    """``_run``'s twin for async code: the statement awaited in the event loop
    on the process's async pool (todos.db.pool), or on the transaction ``on``;
    the same outage and timeout mapping."""
    try:
        if fetch == "one":
            return await on.fetch_one(sql, params)
        if fetch == "all":
            return await on.fetch_all(sql, params)
        return await on.execute(sql, params)
    except OUTAGES as exc:
        raise _outage(operation, exc) from exc


def is_deadlock(exc: BaseException) -> bool:
    """Say whether a failure is PostgreSQL breaking a lock cycle: Deadlocked,
    or the driver's error (Django's wraps it) where no store call mapped it.
    The database is up and busy; the caller may try again."""
    if isinstance(exc, Deadlocked):
        return True
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return isinstance(cause, psycopg.errors.DeadlockDetected)


def _outage(operation: str, exc: BaseException) -> Unavailable:
    """What a failed statement raises: Deadlocked, TimedOut or Unavailable,
    logged. Only the last is an outage; the others say the database is busy."""
    if is_deadlock(exc):
        logger.warning(
            "store call deadlocked", extra={"fields": {"operation": operation}}
        )
        return Deadlocked(operation, exc)
    timed_out = _timed_out(operation, exc)
    if timed_out is not None:
        logger.warning(
            "store call timed out",
            extra={
                "fields": {"operation": operation, "lock_wait": timed_out.lock_wait}
            },
        )
        return timed_out
    logger.warning(
        "store call failed: database unavailable",
        extra={"fields": {"operation": operation, "error": type(exc).__name__}},
    )
    return Unavailable(operation, exc)


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a store operation written as steps (``Steps``)."""

    operation: str
    sql: str
    params: Params
    fetch: Fetch = "all"


# A store operation whose statements both runners make: a generator that
# yields each Statement, is sent its rows (as ``_run`` returns them), and
# returns the operation's result. The SQL and every rule about the rows are
# written once; ``run_steps`` runs them on Django's connection of the thread,
# ``arun_steps`` awaits them in the event loop.
type Steps[T] = Generator[Statement, Any, T]


def run_steps[T](steps: Steps[T]) -> T:
    """Run an operation's statements here, on Django's connection."""
    try:
        statement = next(steps)
        while True:
            rows = _run(
                statement.operation, statement.sql, statement.params, statement.fetch
            )
            statement = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


async def arun_steps[T](steps: Steps[T], on: Runner = db) -> T:
    """Await an operation's statements in the event loop, on the async pool
    (todos.db.pool) or the transaction ``on``."""
    try:
        statement = next(steps)
        while True:
            rows = await _arun(
                statement.operation,
                statement.sql,
                statement.params,
                statement.fetch,
                on,
            )
            statement = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


def on_django[**P, T](steps: Callable[P, Steps[T]]) -> Callable[P, T]:
    """The operation ``steps`` as a sync function: its statements made here,
    on Django's connection (the Board, webhooks, commands, sweeps)."""

    @functools.wraps(steps)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_steps(steps(*args, **kwargs))

    return run


def on_pool[**P, T](
    steps: Callable[P, Steps[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """The operation ``steps`` as an async function: its statements awaited in
    the event loop, on the async pool (the agent surfaces' async views)."""

    @functools.wraps(steps)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await arun_steps(steps(*args, **kwargs))

    return run


# PostgreSQL's message when statement_timeout cancels a statement (a cancel by
# an operator's pg_cancel_backend says "due to user request").
STATEMENT_TIMEOUT = "canceling statement due to statement timeout"


def _timed_out(operation: str, exc: BaseException) -> TimedOut | None:
    """The TimedOut a statement timeout is, else None (a real outage).

    A lock wait is told by the context PostgreSQL adds while it waits for a
    row: "while updating tuple (0,1) in relation "todos"".
    """
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    if not isinstance(cause, psycopg.errors.QueryCanceled):
        return None
    if (cause.diag.message_primary or "") != STATEMENT_TIMEOUT:
        return None
    context = cause.diag.context or ""
    lock_wait = " tuple " in context and " in relation " in context
    return TimedOut(operation, exc, lock_wait=lock_wait)


def ping() -> bool:
    """Say whether the database answers."""
    try:
        _run("ping", "SELECT 1", {}, fetch="one")
    except (Unavailable, DatabaseError):
        return False
    return True


# One live row per (endpoint, idempotency key): not done and not a true dead
# letter (a parked retry keeps its slot, SPEC-0003). It is exactly the
# predicate of todos_dedupe_idx, so ON CONFLICT can name that index by it
# (tests/store/test_store.py checks the two are equal).
LIVE_ROW = "state <> 'done' AND (state <> 'failed' OR next_retry_at IS NOT NULL)"

# What the claim scan may take besides pending rows: a lapsed lease below the
# cap, and a parked retry whose window has elapsed. No sweep has to run first.
# A lapsed lease under a cancel request is not: the reaper ends it canceled.
REDELIVERABLE = """(
    (state = 'claimed' AND lease_expires_at < now() AND attempt < max_attempts
     AND cancel_request IS NULL)
 OR (state = 'failed' AND next_retry_at <= now())
)"""

# The scope predicate of the list and doorbell reads: the endpoint first
# (tenant boundary), then its grant.
SCOPED = (
    "endpoint_id = %(endpoint_id)s"
    " AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))"
)


def _scope(scope: Scope | None) -> dict[str, object]:
    """Bind a scope for a statement that takes ``%(operator)s``.

    ``scope=None`` is the operator Board (authenticated by a staff session):
    ``operator`` is TRUE and the endpoint and grant are not checked. An agent's
    scope binds its endpoint id (NotFound when malformed) and grant.
    """
    if scope is None:
        return {"operator": True, "endpoint_id": None, "queues": None}
    return {"operator": False, **_scope_params(scope)}


def _lease(lease_seconds: int | str | None) -> int | None:
    """Validate a lease in seconds; None stays None (the queue's or the server's)."""
    if lease_seconds is None:
        return None
    lease = int(lease_seconds)
    if not 1 <= lease <= MAX_LEASE_SECONDS:
        raise ValueError(f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS}")
    return lease


def _defaults() -> dict[str, int]:
    """The server's defaults the statements fall back on after the queue's."""
    return {
        "default_lease": settings.SWITCHBOARD_LEASE_SECONDS,
        "default_max_attempts": settings.SWITCHBOARD_MAX_ATTEMPTS,
    }


# The append to the history for the sweeps' and the Board's batch statements:
# it reads the CTE named ``moved`` with columns id, endpoint_id, from_state,
# state, attempt.
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

# A scope's waiting claims look again (a queue resumed, a limit raised, a
# budget's decision): a ring for each of its due pending todos, as a create
# rings, so waiting claims and the event streams hear of them. A ring names a
# real todo: the doorbell drops one that does not. At most RING_DUE_LIMIT: a
# waiting claim that wakes and claims passes the ring on, and the next ring or
# the periodic re-check finds the rest. NOTIFY is delivered at commit.
RING_DUE_LIMIT = 100
RING_DUE_SQL = (
    "SELECT pg_notify('"
    + DOORBELL_CHANNEL
    + """', json_build_object(
           'id', t.id, 'endpoint_id', t.endpoint_id, 'queue', t.queue)::text)
  FROM (SELECT id, endpoint_id, queue FROM todos
         WHERE endpoint_id = %(endpoint_id)s AND state = 'pending'
           AND available_at <= now()
           AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
           AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
         LIMIT %(limit)s) t
"""
)


def ring_due(
    operation: str, endpoint_id: str, queue: str | None, group: str | None = None
) -> None:
    """Ring for the due pending todos of an endpoint's ``queue`` (None: all of
    its queues), of one ``group`` when given."""
    params = {
        "endpoint_id": endpoint_id,
        "queue": queue,
        "group": group,
        "limit": RING_DUE_LIMIT,
    }
    _run(operation, RING_DUE_SQL, params, fetch=None)


# Tell waiting creators (GET /api/v1/todos/<id>?wait_seconds, the event
# stream) of a row of ``moved`` that ended: done, canceled, or a dead letter.
# Its own channel, so no waiting claim wakes for it.
ENDED_RING = (
    "CASE WHEN state = 'done' OR (state = 'failed' AND next_retry_at IS NULL)"
    " THEN pg_notify('" + TODO_EVENT_CHANNEL + "', json_build_object("
    "'event', CASE WHEN canceled_at IS NOT NULL THEN 'todo.canceled'"
    " WHEN state = 'done' THEN 'todo.done' ELSE 'todo.failed' END,"
    " 'id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text) END"
)

# A timestamp inside a jsonb value (an answer's or a cancel's "at"), written
# as the todo JSON writes times: ISO-8601 UTC with a Z.
ISO_NOW = "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

# Who an agent's action is by (CONTRACT §16): its endpoint, read from the row's
# endpoint (``t``), never a name the agent sends, which could say
# ``operator:<user>`` or ``link``.
AGENT_ACTOR = "(SELECT 'agent:' || e.name FROM endpoints e WHERE e.id = t.endpoint_id)"


def actor_text(by: str, worker: str) -> str:
    """The history's actor from SQL expressions for who acted and the worker
    name an agent gave: ``agent:reviewer (worker lead)``, or ``by`` alone."""
    return f"({by}) || coalesce(' (worker ' || ({worker}) || ')', '')"
