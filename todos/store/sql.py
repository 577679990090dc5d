"""Plumbing every store statement shares: binding, running, the scope predicate,
the history append and the doorbell ring, and the classification of a miss."""

import logging
import uuid

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from .rows import (
    DOORBELL_CHANNEL,
    MAX_LEASE_SECONDS,
    Conflict,
    NotFound,
    Todo,
    Unavailable,
)

logger = logging.getLogger("switchboard.store")

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


# What the claim scan may take besides pending rows: a lapsed lease below the
# cap, and a parked retry whose window has elapsed. No sweep has to run first.
REDELIVERABLE = """(
    (state = 'claimed' AND lease_expires_at < now() AND attempt < max_attempts)
 OR (state = 'failed' AND next_retry_at <= now())
)"""
