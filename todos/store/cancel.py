"""Cancel, replace-on-create and dismissal of dead letters (CONTRACT §14).

A cancel ends a todo that is not being worked on at once, through the SPEC's
own transitions in one statement, each with its history row:

- pending (due, delayed or held): pending → claimed → done;
- a parked retry (failed, its window open): failed → pending → claimed → done.

The composed claim is no delivery: ``attempt`` is left as it was. The todo
ends ``done`` with ``canceled_at`` set and ``result`` = ``{"canceled": {"reason",
"by", "worker", "at"}}``; done is not live, so its idempotency key is free
again. ``by`` is who acted (CONTRACT §16): ``agent:<endpoint>`` for an agent,
whose worker name is kept beside it as ``worker``; ``operator:<user>`` for the
Board.

A claimed todo is not taken from its worker: it gets a cancel request
(``cancel_request``), which its owner sees in every answer; its fail or
release, or its lease lapsing, then ends it canceled (lifecycle and sweeps).
A terminal todo cannot be canceled (Conflict).
"""

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from todos.telemetry import tracing

from .lifecycle import T_COLUMNS, Created, _lookup_many, _settled, _text, create_todo
from .rows import (
    MAX_ACK_BATCH,
    MAX_REASON_CHARS,
    TODO_COLUMNS,
    Conflict,
    NotFound,
    Scope,
    Todo,
)
from .sql import (
    AGENT_ACTOR,
    ISO_NOW,
    LIVE_ROW,
    _run,
    _scope,
    _todo_id,
    _uuid,
    actor_text,
)
from .traces import record_trace_event

# 1. target: the todos to cancel, locked (a concurrent claim or complete is
#    waited for, then the row is read again as it is now). Only a pending,
#    claimed, or retry-scheduled todo; a terminal one is left (Conflict).
# 2. moved: a claimed todo keeps its state and gets the request (the first
#    request stays); any other ends done and canceled.
# 3. history: the transitions each cancel composes, in order.
# 4. the ring: todo.cancel_requested for a claimed todo (its owner's event
#    stream), todo.canceled for the others (their creators' waits).
CANCEL_SQL = f"""
WITH action AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(reasons)s::text[])
           WITH ORDINALITY AS a (id, reason, ord)
), target AS (
    SELECT t.id, t.state AS from_state, a.ord,
           jsonb_build_object('reason', a.reason,
                              'by', coalesce(%(by)s::text, {AGENT_ACTOR}),
                              'worker', %(worker)s::text,
                              'at', {ISO_NOW}) AS request
      FROM todos t
      JOIN action a ON a.id = t.id
     WHERE t.id = ANY(%(ids)s::uuid[])
       AND (%(operator)s OR (t.endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))))
       AND (t.state IN ('pending', 'claimed')
            OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
     ORDER BY t.id
       FOR UPDATE OF t
), moved AS (
    UPDATE todos t
       SET state = CASE WHEN g.from_state = 'claimed' THEN 'claimed' ELSE 'done' END,
           cancel_request = coalesce(t.cancel_request, g.request),
           canceled_at = CASE WHEN g.from_state = 'claimed' THEN NULL ELSE now() END,
           result = CASE WHEN g.from_state = 'claimed' THEN t.result
                         ELSE jsonb_build_object('canceled', g.request) END,
           owner = CASE WHEN g.from_state = 'claimed' THEN t.owner END,
           next_retry_at = NULL,
           answer_nonce = CASE WHEN g.from_state = 'claimed' THEN t.answer_nonce END,
           updated_at = now()
      FROM target g
     WHERE t.id = g.id AND t.id = ANY(%(ids)s::uuid[])
 RETURNING {T_COLUMNS}, g.from_state, g.ord,
           {actor_text("(g.request->>'by')", "(g.request->>'worker')")} AS actor
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT m.id, m.endpoint_id, step.from_state, step.to_state, m.attempt,
           m.actor, step.error, now()
      FROM moved m
      JOIN (VALUES (1, 'failed', 'pending', 'canceling'),
                   (2, 'pending', 'claimed', 'canceling'),
                   (3, 'claimed', 'done', 'canceled')) step (n, from_state,
                                                            to_state, error)
        ON m.from_state <> 'claimed' AND (step.n > 1 OR m.from_state = 'failed')
     ORDER BY m.ord, step.n
)
SELECT {TODO_COLUMNS}, ord,
       pg_notify('switchboard_todo_event', json_build_object(
           'event', CASE WHEN state = 'claimed' THEN 'todo.cancel_requested'
                         ELSE 'todo.canceled' END,
           'id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text)
  FROM moved
"""

NOT_CANCELABLE = "todo is {state}; a terminal todo cannot be canceled"


def cancel_todo(
    scope: Scope, todo_id: str, *, reason: str | None = "", worker: str | None = None
) -> Todo:
    """Cancel one todo of this scope, by ``agent:<endpoint>``; return it.

    A todo not being worked on ends done and canceled at once; a claimed one
    comes back still claimed with ``cancel_requested`` (its owner ends it).
    ``worker``, the name the agent gives, is kept beside who canceled.
    """
    return _one(cancel_many(scope, [(todo_id, reason)], worker=worker))


def cancel_todo_any_endpoint(
    todo_id: str, *, reason: str | None = "", by: str = "operator"
) -> Todo:
    """Cancel one todo of any endpoint (operator Board: ``by`` is its user)."""
    return _one(_cancel(None, [(todo_id, reason)], by))


# One cancel of a batch: the todo id and the reason (None or "": none given).
Cancel = tuple[str, str | None]


def cancel_many(
    scope: Scope, cancels: Iterable[Cancel], *, worker: str | None = None
) -> list[Todo | Exception]:
    """Cancel 1–100 todos of this scope: ``cancels`` is (todo_id, reason) pairs.

    Return one Todo or exception (NotFound, Conflict, ValueError) per pair, in
    order; each cancel is atomic on its own. By ``agent:<endpoint>``, with
    ``worker`` beside it.
    """
    batch = list(cancels)
    if not 1 <= len(batch) <= MAX_ACK_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_ACK_BATCH} actions")
    return _cancel(scope, batch, None, worker or None)


def cancel_many_any_endpoint(
    todo_ids: Iterable[str], *, reason: str | None = "", by: str = "operator"
) -> list[Todo | Exception]:
    """Cancel each of the given todos of any endpoint (the Board's ticked rows)."""
    results: list[Todo | Exception] = []
    ids = list(todo_ids)
    for start in range(0, len(ids), MAX_ACK_BATCH):
        chunk = ids[start : start + MAX_ACK_BATCH]
        results.extend(_cancel(None, [(todo_id, reason) for todo_id in chunk], by))
    return results


def _cancel(
    scope: Scope | None,
    cancels: list[Cancel],
    by: str | None,
    worker: str | None = None,
) -> list[Todo | Exception]:
    """Run the cancels; ``by`` None is the scope's agent (AGENT_ACTOR)."""
    results: list[Todo | Exception | None] = [None] * len(cancels)
    bound: list[tuple[int, str, str | None]] = []
    for index, (todo_id, reason) in enumerate(cancels):
        try:
            bound.append(
                (index, _todo_id(todo_id), _text("reason", reason, MAX_REASON_CHARS))
            )
        except (ValueError, NotFound) as exc:
            results[index] = exc
    if not bound:
        return _settled(results)
    params = {
        **_scope(scope),
        "ids": [todo_id for _, todo_id, _ in bound],
        "reasons": [reason or "" for _, _, reason in bound],
        "by": by,
        "worker": worker,
    }
    moved: dict[int, Todo] = {}
    for row in _run("cancel", CANCEL_SQL, params):
        moved[row[-2] - 1] = Todo.from_row(row)
    missed = [
        todo_id
        for position, (_, todo_id, _) in enumerate(bound)
        if position not in moved
    ]
    found = _lookup_many(scope, missed) if missed else {}
    if tracing.enabled():
        _trace_cancels(moved.values())
    for position, (index, todo_id, _) in enumerate(bound):
        if position in moved:
            results[index] = moved[position]
        elif todo_id in found:
            state = found[todo_id].display_state
            results[index] = Conflict(
                NOT_CANCELABLE.format(state=state), todo_id=todo_id, state=state
            )
        else:
            results[index] = NotFound(todo_id=todo_id)
    return _settled(results)


def _trace_cancels(moved: Iterable[Todo]) -> None:
    """A cancel request is an event of the claimed todo's delivery."""
    for todo in moved:
        if todo.state == "claimed":
            by = (todo.cancel_request or {}).get("by")
            event = tracing.event(
                tracing.CANCEL_REQUESTED, todo.deliveries, **{"cancel.by": by}
            )
            record_trace_event(todo, event)


def _one(results: list[Todo | Exception]) -> Todo:
    (result,) = results
    if isinstance(result, Exception):
        raise result
    return result


# --- Replace on create ----------------------------------------------------------

LIVE_KEY_SQL = f"""
SELECT id FROM todos
 WHERE endpoint_id = %(endpoint_id)s AND idempotency_key = %(idempotency_key)s
   AND {LIVE_ROW}
"""

# Replacers of one key take turns, for the rest of their transaction: each
# finds the todo the one before it created (committed) and replaces it, as if
# they had come one after another. Without the turn, two replacers each found
# nothing to cancel, and the slower one's insert collapsed onto the faster
# one's todo (200, created false, someone else's todo). The key is the
# endpoint and idempotency key, hashed to the advisory lock's 64 bits.
REPLACE_TURN_SQL = """
SELECT pg_advisory_xact_lock(
    hashtextextended(%(endpoint_id)s::text || '/' || %(idempotency_key)s::text, 0))
"""

# How often a replace cancels a live duplicate and tries to create before it
# gives up: only a plain create of the same key (which takes no turn) can slip
# in between, each time.
REPLACE_TRIES = 3


class ReplaceBlocked(Conflict):
    """Create with replace found a claimed duplicate: it got a cancel request."""


def create_replacing(
    scope: Scope,
    *,
    queue: str,
    idempotency_key: str | None,
    actor: str = "",
    **fields: Any,
) -> Created:
    """Create a todo, canceling the pending live duplicate of its key first.

    One transaction: the duplicate ends canceled and the new todo takes the
    key. A claimed duplicate is not taken from its worker: it gets a cancel
    request (kept), and ReplaceBlocked names it. Concurrent replaces of one
    key take turns, so each creates its todo and the last one's stays live.
    """
    if not idempotency_key:
        raise ValueError("replace needs an idempotency_key")
    endpoint_id = _uuid(scope.endpoint_id)
    if endpoint_id is None:
        raise NotFound()
    key = {"endpoint_id": endpoint_id, "idempotency_key": idempotency_key}
    with transaction.atomic():
        _run("create_replacing", REPLACE_TURN_SQL, key, fetch=None)
        for _ in range(REPLACE_TRIES):
            blocked = _replace_live_duplicates(scope, key, actor)
            if blocked is not None:
                break
            created = create_todo(
                scope,
                queue=queue,
                idempotency_key=idempotency_key,
                actor=actor,
                **fields,
            )
            if created[1]:
                return created
        else:
            raise Conflict(
                "other creates of this idempotency key kept coming: try again",
                todo_id=created[0].id,
                state=created[0].state,
            )
    raise ReplaceBlocked(
        f"todo {blocked.id} holds this idempotency key and is claimed: it was"
        " asked to cancel; create again once it ends",
        todo_id=blocked.id,
        state=blocked.state,
    )


def _replace_live_duplicates(
    scope: Scope, key: dict[str, str], actor: str
) -> Todo | None:
    """Cancel the key's live duplicates; return one that is claimed, if any."""
    blocked: Todo | None = None
    for (duplicate_id,) in _run("create_replacing", LIVE_KEY_SQL, key):
        result = _cancel(scope, [(duplicate_id, "replaced")], actor or None)[0]
        if isinstance(result, Todo) and result.state == "claimed":
            blocked = result
    return blocked


# --- Dismissing dead letters ----------------------------------------------------

# A dismissed dead letter leaves its error group (todos_dead_letter_group_idx
# holds only undismissed ones); a retry clears the mark.
DISMISS_SQL = """
UPDATE todos SET dismissed_at = now(), updated_at = updated_at
 WHERE id = ANY(%(ids)s::uuid[])
   AND (%(endpoint_ids)s::uuid[] IS NULL OR endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
   AND state = 'failed' AND next_retry_at IS NULL AND dismissed_at IS NULL
"""


def dismiss_dead_letters_any_endpoint(
    todo_ids: Iterable[object], *, endpoint_ids: Iterable[object] | None = None
) -> int:
    """Dismiss dead letters from their groups; return how many were dismissed.

    ``endpoint_ids`` is the Board's owner scope (None = every endpoint).
    """
    ids = [parsed for parsed in map(_uuid, todo_ids) if parsed is not None]
    scope_ids = None
    if endpoint_ids is not None:
        scope_ids = [p for p in map(_uuid, endpoint_ids) if p is not None]
        if not scope_ids:
            return 0
    if not ids:
        return 0
    params = {"ids": ids, "endpoint_ids": scope_ids}
    return _run("dismiss", DISMISS_SQL, params, fetch="count")
