"""A todo's lifecycle: create, claim, the owner transitions and retry."""

import json
import uuid

from django.db import IntegrityError, transaction

from .rows import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    TODO_COLUMNS,
    Conflict,
    NotFound,
    QueueNotGranted,
    Scope,
    Todo,
)
from .sql import (
    DOORBELL,
    EVENT_INSERT,
    REDELIVERABLE,
    SCOPED,
    _lease,
    _run,
    _scope_params,
    _transition,
    _uuid,
    _variants,
)

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


# --- Claim ----------------------------------------------------------------------

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
