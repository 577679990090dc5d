"""A todo's lifecycle: create, claim, the owner transitions and retry.

Each statement is written out whole right above the function that runs it. A
transition is one conditional statement that also appends its ``todo_events``
row and, when the todo becomes claimable, rings the doorbell (``pg_notify``,
delivered at commit, so a listener never hears of a transition that rolled
back). When it matches no row, one lookup classifies the miss.

The channel every statement rings is ``switchboard_todo_ready``
(``DOORBELL_CHANNEL``; a test checks each statement names it).
"""

import hmac
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from django.db import IntegrityError, transaction

from todos.telemetry import tracing
from todos.telemetry.tracing import TraceContext

from . import limit_figures
from .budgets import (
    PAUSED_BY_BUDGET,
    REFUSED_BY_BUDGET,
    BudgetExhausted,
    refusing_budget_steps,
)
from .rows import (
    DEFAULT_PRIORITY,
    MAX_ACK_BATCH,
    MAX_CHECKPOINT_BYTES,
    MAX_CLAIM_BATCH,
    MAX_COST,
    MAX_CREATE_BATCH,
    MAX_DELAY_SECONDS,
    MAX_GROUP_CHARS,
    MAX_NOTE_CHARS,
    MAX_PRIORITY,
    MAX_PROGRESS_MESSAGE_CHARS,
    MAX_USAGE_COST_USD,
    MIN_PRIORITY,
    TODO_COLUMN_COUNT,
    TODO_COLUMNS,
    Conflict,
    JSONObject,
    KeyHeld,
    LeaseSuperseded,
    NotFound,
    QueueNotGranted,
    Row,
    Scope,
    StoreError,
    Todo,
    TooLarge,
)
from .sql import (
    DOORBELL,
    ENDED_RING,
    LIVE_ROW,
    Statement,
    Steps,
    _defaults,
    _lease,
    _run,
    _scope,
    _scope_params,
    _todo_id,
    _uuid,
    on_django,
    on_pool,
    run_steps,
)
from .usage import BUDGET_SPEND, LEDGER_WRITTEN, usage_json

# A release that leaves the assignment as it was (None hands it to the pool).
KEEP_ASSIGNEE = object()

# The todo columns as an UPDATE … FROM's RETURNING names them (table alias t).
T_COLUMNS = ", ".join(f"t.{name.strip()}" for name in TODO_COLUMNS.split(","))

# --- Create ---------------------------------------------------------------------

# How a create ends: a live duplicate of the key inserts nothing; each row
# inserted gets its history row and, when due now, rings the doorbell.
CREATED = f"""
    ON CONFLICT (endpoint_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND {LIVE_ROW}
    DO NOTHING
    RETURNING {TODO_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, NULL, state, attempt, %(actor)s, '', now() FROM moved
)
SELECT {TODO_COLUMNS},
       CASE WHEN available_at <= created_at THEN pg_notify('switchboard_todo_ready',
           json_build_object('id', id, 'endpoint_id', endpoint_id,
                             'queue', queue)::text) END
  FROM moved
"""

# 1. queue_row: the first use of a queue name makes its row (NULL settings =
#    the server's defaults); an existing row costs an index probe, no write.
# 2. defaults: the call's max_attempts and delay, else the queue's, else the
#    server's.
# 3. moved: the insert. ON CONFLICT names the dedupe index by its columns and
#    its exact predicate (LIVE_ROW), so PostgreSQL infers todos_dedupe_idx; a
#    NULL key never conflicts. The row is selected from its endpoint, so an
#    unknown endpoint inserts nothing (Django's foreign keys are DEFERRABLE
#    INITIALLY DEFERRED: inside a caller's transaction the violation would only
#    surface at COMMIT). The wall clock, read once, not the transaction's
#    start: todos created in one transaction (a webhook fan-out) keep their
#    order, and a new todo's updated_at equals its created_at.
#    In a fair queue the todo gets its group's next start time (fair_tag,
#    switchboard_fair_tag): claims take the least first.
# 4. history, then the ring, unless the todo is delayed: the sweep rings when
#    it becomes due (ring_due_delayed).
# A reject_new budget in force over the todo's scope (CONTRACT §18) inserts
# nothing (a probe of budgets_in_force_idx); ``_create`` then names it.
CREATE_SQL = f"""
WITH queue_row AS (
    INSERT INTO queues (endpoint_id, name)
    SELECT e.id, %(queue)s FROM endpoints e WHERE e.id = %(endpoint_id)s
    ON CONFLICT (endpoint_id, name) DO NOTHING
), defaults AS (
    SELECT coalesce(%(max_attempts)s::int, q.max_attempts,
                    %(default_max_attempts)s::int) AS max_attempts,
           coalesce(%(delay_seconds)s::int, q.delay_seconds, 0) AS delay_seconds,
           coalesce(q.fair, FALSE) AS fair
      FROM (SELECT 1) one
      LEFT JOIN queues q ON q.endpoint_id = %(endpoint_id)s AND q.name = %(queue)s
), moved AS (
    INSERT INTO todos (id, endpoint_id, queue, title, payload, state, assignee,
                       attempt, max_attempts, idempotency_key, last_error,
                       created_at, updated_at, available_at, priority, group_key,
                       cost, fair_tag, trace_context, max_cost)
    SELECT %(id)s, e.id, %(queue)s, %(title)s, %(payload)s::jsonb, 'pending',
           %(assignee)s, 0, d.max_attempts, %(idempotency_key)s, '',
           clock.at, clock.at, clock.at + make_interval(secs => d.delay_seconds),
           %(priority)s::smallint, %(group)s::text, %(cost)s::float8,
           CASE WHEN d.fair THEN switchboard_fair_tag(
               e.id, %(queue)s, %(group)s::text, %(cost)s::float8) END,
           %(trace_context)s::jsonb, %(max_cost)s::float8
      FROM endpoints e, defaults d, (SELECT clock_timestamp() AS at) clock
     WHERE e.id = %(endpoint_id)s
       AND NOT {REFUSED_BY_BUDGET.format(queue="%(queue)s", group="%(group)s::text")}
{CREATED}"""

LIVE_DUPLICATE_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE endpoint_id = %(endpoint_id)s AND idempotency_key = %(idempotency_key)s
   AND {LIVE_ROW}
"""

ENDPOINT_EXISTS_SQL = "SELECT 1 FROM endpoints WHERE id = %(endpoint_id)s"

KEY_HELD_OUTSIDE_GRANT = (
    "a live todo in a queue outside this endpoint's grant holds this idempotency key"
)


class CreateItem(TypedDict):
    """One validated create, bound for CREATE_SQL (payload and trace context
    as JSON text)."""

    queue: str
    title: str
    payload: str
    assignee: str | None
    max_attempts: int | None
    delay_seconds: int | None
    idempotency_key: str | None
    priority: int
    group: str | None
    cost: float
    max_cost: float | None
    trace_context: str | None


class BatchItem(CreateItem):
    """A create of a batch, with the id its row gets."""

    id: uuid.UUID


# A create's outcome: the todo and whether this call created it (False: a live
# duplicate of its idempotency key).
Created = tuple[Todo, bool]


def create_todo_steps(
    scope: Scope,
    *,
    queue: str,
    title: str = "",
    payload: object = None,
    idempotency_key: str | None = None,
    assignee: str | None = None,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
    actor: str = "",
    priority: int | None = None,
    group: str | None = None,
    cost: float | None = None,
    trace_context: TraceContext | None = None,
    max_cost: float | None = None,
) -> Steps[Created]:
    """Enqueue a todo; return (todo, created).

    A live duplicate (same endpoint and idempotency key) returns created=False;
    one in a queue outside the grant raises KeyHeld. ``max_attempts`` and
    ``delay_seconds`` default to the queue's settings, then the server's.
    ``priority`` (1–5, default 3), ``group`` and ``cost`` (default 1) are
    what admission control decides by (CONTRACT §17); ``max_cost`` (USD) is
    reserved against the todo's budgets at each claim (CONTRACT §18).
    ``trace_context`` is the W3C context the caller's request carried.
    """
    if not scope.covers(queue):
        raise QueueNotGranted(queue)
    item = _create_item(
        queue,
        title,
        payload,
        idempotency_key,
        assignee,
        max_attempts,
        delay_seconds,
        priority,
        group,
        cost,
        max_cost,
    )
    endpoint_id = _scope_params(scope)["endpoint_id"]
    return (yield from _create_traced(endpoint_id, scope, item, actor, trace_context))


create_todo = on_django(create_todo_steps)
acreate_todo = on_pool(create_todo_steps)


def create_todo_any_endpoint(
    endpoint_id: str,
    *,
    queue: str,
    title: str = "",
    payload: object = None,
    idempotency_key: str | None = None,
    assignee: str | None = None,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
    actor: str = "",
    priority: int | None = None,
    group: str | None = None,
    cost: float | None = None,
    trace_context: TraceContext | None = None,
    max_cost: float | None = None,
) -> Created:
    """Enqueue a todo for any endpoint (the Board); no grant check."""
    endpoint = _uuid(endpoint_id)
    if endpoint is None:
        raise NotFound("no such endpoint")
    item = _create_item(
        queue,
        title,
        payload,
        idempotency_key,
        assignee,
        max_attempts,
        delay_seconds,
        priority,
        group,
        cost,
        max_cost,
    )
    return run_steps(_create_traced(endpoint, None, item, actor, trace_context))


def _create_item(
    queue: object,
    title: str | None,
    payload: object,
    idempotency_key: str | None,
    assignee: str | None,
    max_attempts: int | None,
    delay_seconds: int | None,
    priority: object = None,
    group: object = None,
    cost: object = None,
    max_cost: object = None,
) -> CreateItem:
    """Validate one create and bind it (ValueError names the bad field)."""
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue must be a non-empty string")
    if max_attempts is not None:
        max_attempts = int(max_attempts)
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
    if delay_seconds is not None:
        delay_seconds = int(delay_seconds)
        if not 0 <= delay_seconds <= MAX_DELAY_SECONDS:
            raise ValueError(f"delay_seconds must be between 0 and {MAX_DELAY_SECONDS}")
    return {
        "queue": queue,
        "title": title or "",
        "payload": json.dumps({} if payload is None else payload),
        "assignee": assignee,
        "max_attempts": max_attempts,
        "delay_seconds": delay_seconds,
        "idempotency_key": idempotency_key,
        "priority": validate_priority(priority),
        "group": validate_group(group),
        "cost": validate_cost(cost),
        "max_cost": validate_max_cost(max_cost),
        "trace_context": None,
    }


def validate_priority(priority: object) -> int:
    """A todo's priority: 1 (claimed first) to 5; None is the default, 3."""
    if priority is None:
        return DEFAULT_PRIORITY
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return priority


def validate_group(group: object) -> str | None:
    """A todo's group: null (none) or a name of 1 to 200 characters."""
    if group is None:
        return None
    if not isinstance(group, str) or not 1 <= len(group) <= MAX_GROUP_CHARS:
        raise ValueError(
            f"group must be null or a string of 1 to {MAX_GROUP_CHARS} characters"
        )
    return group


def validate_cost(cost: object) -> float:
    """A todo's cost against a rate limit: a number above 0; None is 1."""
    if cost is None:
        return 1.0
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise ValueError("cost must be a number greater than 0")
    if not 0 < cost <= MAX_COST:
        raise ValueError(f"cost must be a number greater than 0, at most {MAX_COST}")
    return float(cost)


def validate_max_cost(max_cost: object) -> float | None:
    """What one attempt may cost in USD (CONTRACT §18): a number ≥ 0, or None."""
    if max_cost is None:
        return None
    if isinstance(max_cost, bool) or not isinstance(max_cost, (int, float)):
        raise ValueError("max_cost must be a number of USD, at least 0")
    if not 0 <= max_cost <= MAX_USAGE_COST_USD:
        raise ValueError(f"max_cost must be a number from 0 to {MAX_USAGE_COST_USD}")
    return float(max_cost) + 0.0  # a -0 (JSON's, or the Board form's) is 0


def _duplicate(scope: Scope | None, todo: Todo) -> Created:
    """The live duplicate a create collapsed onto, if the caller may see it."""
    if scope is not None and not scope.covers(todo.queue):
        # After a grant narrowed: never hand out another queue's todo.
        raise KeyHeld(KEY_HELD_OUTSIDE_GRANT, key=todo.idempotency_key)
    return todo, False


def bind_create(
    endpoint_id: object, *, actor: str = "", **fields: Any
) -> dict[str, object]:
    """Return CREATE_SQL's parameters (the benchmarks run the same statement)."""
    item = _create_item(**_item_args(fields))
    return {
        **item,
        **_defaults(),
        "endpoint_id": str(endpoint_id),
        "actor": actor,
        "id": str(uuid.uuid4()),
    }


def _create_traced(
    endpoint_id: str,
    scope: Scope | None,
    item: CreateItem,
    actor: str,
    parent: TraceContext | None,
) -> Steps[Created]:
    """Create inside the create's ``send`` span; the todo keeps its context."""
    sent = tracing.send(item["queue"], parent)
    carrier = sent.carrier()
    item["trace_context"] = json.dumps(carrier) if carrier is not None else None
    try:
        todo, created = yield from _create(endpoint_id, scope, item, actor)
    except Exception as exc:
        sent.end(exc)
        raise
    sent.end(todo, created)
    return todo, created


def _create(
    endpoint_id: str, scope: Scope | None, item: CreateItem, actor: str
) -> Steps[Created]:
    params: dict[str, object] = {
        **item,
        **_defaults(),
        "endpoint_id": endpoint_id,
        "actor": actor,
    }
    # A duplicate can turn terminal between the insert that lost and the read
    # of the winner; then the slot is free again and the next insert wins.
    for _ in range(3):
        params["id"] = str(uuid.uuid4())
        row = yield Statement("create_todo", CREATE_SQL, params, "one")
        if row is not None:
            return Todo.from_row(row), True
        row = yield Statement("create_todo", LIVE_DUPLICATE_SQL, params, "one")
        if row is not None:
            return _duplicate(scope, Todo.from_row(row))
        refusing = yield from refusing_budget_steps(
            endpoint_id, item["queue"], item["group"]
        )
        if refusing is not None:
            raise BudgetExhausted(refusing)
        exists = yield Statement("create_todo", ENDPOINT_EXISTS_SQL, params, "one")
        if exists is None:
            raise NotFound("no such endpoint")
    raise Conflict("the idempotency key is contended; try again")


# Many creates in one statement: the items arrive as parallel arrays. Each
# item is its own row with its own history row and ring, deduplicated like a
# single create: ON CONFLICT DO NOTHING also skips an item whose key an
# earlier item of the same batch took (rows go in batch order). One clock
# reading for the batch, plus a microsecond per item so a batch keeps its
# order in the claim index.
# In a fair queue each item's tag moves its group's row (queue_groups) on, and
# the row stays locked until the batch commits. Taken in item order, two
# batches naming the same groups in opposite orders waited on each other until
# PostgreSQL broke the cycle (a deadlock: one batch failed). fair_groups takes
# the batch's group rows first, in (queue, group) order, the order every batch
# takes them in; moved waits for it (its count) before the first tag.
CREATE_MANY_SQL = f"""
WITH item AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(queue_names)s::text[],
                         %(titles)s::text[], %(payloads)s::jsonb[],
                         %(assignees)s::text[], %(keys)s::text[],
                         %(max_attempts)s::int[], %(delays)s::int[],
                         %(priorities)s::smallint[], %(groups)s::text[],
                         %(costs)s::float8[], %(trace_contexts)s::jsonb[],
                         %(max_costs)s::float8[])
           WITH ORDINALITY AS i (id, queue, title, payload, assignee,
                                 idempotency_key, max_attempts, delay_seconds,
                                 priority, group_key, cost, trace_context,
                                 max_cost, ord)
), queue_row AS (
    INSERT INTO queues (endpoint_id, name)
    SELECT DISTINCT e.id, i.queue FROM endpoints e, item i
     WHERE e.id = %(endpoint_id)s
    ON CONFLICT (endpoint_id, name) DO NOTHING
), fair_groups AS (
    INSERT INTO queue_groups AS g (endpoint_id, queue, group_key)
    SELECT DISTINCT e.id, i.queue, coalesce(i.group_key, '')
      FROM item i
      JOIN endpoints e ON e.id = %(endpoint_id)s
      JOIN queues q ON q.endpoint_id = e.id AND q.name = i.queue AND q.fair
     WHERE NOT {REFUSED_BY_BUDGET.format(queue="i.queue", group="i.group_key")}
     ORDER BY 2, 3
    ON CONFLICT (endpoint_id, queue, group_key) DO UPDATE SET finish = g.finish
    RETURNING 1
), moved AS (
    INSERT INTO todos (id, endpoint_id, queue, title, payload, state, assignee,
                       attempt, max_attempts, idempotency_key, last_error,
                       created_at, updated_at, available_at, priority, group_key,
                       cost, fair_tag, trace_context, max_cost)
    SELECT i.id, e.id, i.queue, i.title, i.payload, 'pending', i.assignee, 0,
           coalesce(i.max_attempts, q.max_attempts, %(default_max_attempts)s::int),
           i.idempotency_key, '', at.created, at.created,
           at.created + make_interval(
               secs => coalesce(i.delay_seconds, q.delay_seconds, 0)),
           i.priority, i.group_key, i.cost,
           CASE WHEN q.fair THEN switchboard_fair_tag(e.id, i.queue, i.group_key,
                                                      i.cost) END,
           i.trace_context, i.max_cost
      FROM item i
      JOIN endpoints e ON e.id = %(endpoint_id)s
      LEFT JOIN queues q ON q.endpoint_id = e.id AND q.name = i.queue
     CROSS JOIN (SELECT clock_timestamp() AS at) clock
     CROSS JOIN LATERAL (
         SELECT clock.at + (i.ord - 1) * interval '1 microsecond' AS created) at
     CROSS JOIN (SELECT count(*) FROM fair_groups) locked
     WHERE NOT {REFUSED_BY_BUDGET.format(queue="i.queue", group="i.group_key")}
     ORDER BY i.ord
{CREATED}"""

LIVE_DUPLICATES_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE endpoint_id = %(endpoint_id)s AND idempotency_key = ANY(%(keys)s::text[])
   AND {LIVE_ROW}
"""

CREATE_FIELDS = {
    "queue",
    "title",
    "payload",
    "idempotency_key",
    "assignee",
    "max_attempts",
    "delay_seconds",
    "priority",
    "group",
    "cost",
    "max_cost",
    "trace_context",
}


def create_many_steps(
    scope: Scope, items: Iterable[Mapping[str, Any]], *, actor: str = ""
) -> Steps[list[Created | Exception]]:
    """Enqueue 1–100 todos in one statement; return one result per item, in order.

    Each result is ``(todo, created)`` or the exception the single create would
    have raised (ValueError, QueueNotGranted, KeyHeld). Items are dicts of
    create_todo's keyword arguments; a key equal to an earlier item's (in this
    batch or before) collapses onto that live todo with created=False.
    """
    batch_items = list(items)
    if not 1 <= len(batch_items) <= MAX_CREATE_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_CREATE_BATCH} todos")
    endpoint_id = _scope_params(scope)["endpoint_id"]
    results: list[Created | Exception | None] = [None] * len(batch_items)
    bound: dict[int, BatchItem] = {}
    sends: dict[int, tracing.Send] = {}
    for index, fields in enumerate(batch_items):
        try:
            unknown = set(fields) - CREATE_FIELDS
            if unknown:
                raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
            item = _create_item(**_item_args(fields))
            if not scope.covers(item["queue"]):
                raise QueueNotGranted(item["queue"])
            sends[index] = sent = tracing.send(
                item["queue"], fields.get("trace_context")
            )
            carrier = sent.carrier()
            item["trace_context"] = json.dumps(carrier) if carrier else None
            bound[index] = BatchItem(**item, id=uuid.uuid4())
        except (ValueError, TypeError, QueueNotGranted) as exc:
            results[index] = exc if not isinstance(exc, TypeError) else ValueError(exc)
    if not bound:
        return _settled(results)
    batch = list(bound.values())
    params = {
        **_defaults(),
        "endpoint_id": endpoint_id,
        "actor": actor,
        "ids": [str(item["id"]) for item in batch],
        "queue_names": [item["queue"] for item in batch],
        "titles": [item["title"] for item in batch],
        "payloads": [item["payload"] for item in batch],
        "assignees": [item["assignee"] for item in batch],
        "keys": [item["idempotency_key"] for item in batch],
        "max_attempts": [item["max_attempts"] for item in batch],
        "delays": [item["delay_seconds"] for item in batch],
        "priorities": [item["priority"] for item in batch],
        "groups": [item["group"] for item in batch],
        "costs": [item["cost"] for item in batch],
        "trace_contexts": [item["trace_context"] for item in batch],
        "max_costs": [item["max_cost"] for item in batch],
    }
    rows = yield Statement("create_many", CREATE_MANY_SQL, params)
    created = {todo.id: todo for todo in map(Todo.from_row, rows)}
    keys = [
        item["idempotency_key"]
        for item in batch
        if str(item["id"]) not in created and item["idempotency_key"] is not None
    ]
    live: dict[str | None, Todo] = {}
    if keys:
        rows = yield Statement(
            "create_many",
            LIVE_DUPLICATES_SQL,
            {"endpoint_id": endpoint_id, "keys": keys},
        )
        live = {todo.idempotency_key: todo for todo in map(Todo.from_row, rows)}
    for index, item in bound.items():
        todo = created.get(str(item["id"]))
        if todo is not None:
            results[index] = (todo, True)
            continue
        try:
            duplicate = live.get(item["idempotency_key"])
            if duplicate is not None:
                results[index] = _duplicate(scope, duplicate)
            else:
                # The winner turned terminal meanwhile (or the endpoint is
                # gone): the single create's loop settles it.
                results[index] = yield from _create(endpoint_id, scope, item, actor)
        except (Conflict, NotFound, BudgetExhausted) as exc:
            results[index] = exc
    settled: list[Created | Exception] = _settled(results)
    for index, sent in sends.items():
        outcome = settled[index]
        if isinstance(outcome, tuple):
            sent.end(*outcome)
        else:
            sent.end(outcome)
    return settled


create_many = on_django(create_many_steps)
acreate_many = on_pool(create_many_steps)


def _settled[T](results: list[T | None]) -> list[T]:
    """The results of a batch once every item has one."""
    assert all(result is not None for result in results)
    return [result for result in results if result is not None]


def _item_args(fields: Mapping[str, Any]) -> dict[str, Any]:
    args = dict(fields)
    args.setdefault("title", "")
    return {
        "queue": args.get("queue"),
        "title": args.get("title"),
        "payload": args.get("payload"),
        "idempotency_key": args.get("idempotency_key"),
        "assignee": args.get("assignee"),
        "max_attempts": args.get("max_attempts"),
        "delay_seconds": args.get("delay_seconds"),
        "priority": args.get("priority"),
        "group": args.get("group"),
        "cost": args.get("cost"),
        "max_cost": args.get("max_cost"),
    }


# --- Claim ----------------------------------------------------------------------

# The history rows of one claimed row ``m``: a due retry is the SPEC's
# failed → pending (the elapsed window) then pending → claimed, one row each;
# anything else is its one transition (a lapsed lease's redelivery is
# claimed → claimed, as the lease passes from one owner to the next).
CLAIM_STEPS = """
    SELECT 'failed'::text AS from_state, 'pending'::text AS to_state,
           m.attempt - 1 AS attempt
     WHERE m.from_state = 'failed'
    UNION ALL
    SELECT CASE WHEN m.from_state = 'failed' THEN 'pending' ELSE m.from_state END,
           m.state, m.attempt
"""

# A claim of up to %(limit)s todos, in one statement:
# 1. pending_queue: when the call names no queues, the endpoint's queues that
#    have pending rows, found by skipping through todos_pending_claim_idx one
#    queue at a time (one index descent per queue, however long its backlog).
#    budget_paused: the endpoint's pause budgets in force (at their limit,
#    CONTRACT §18), read once through budgets_in_force_idx, which holds only
#    budgets in force: without one, a probe of an empty index. A claim whose
#    statement starts after the commit that reached a limit sees it.
# 2. lane: each queue that is not paused, times the pool ('' = assigned to
#    nobody) and the worker's own assignments, with the queue's admission
#    settings; a queue under a budget in force (its own, its endpoint's) has
#    no lane, and a group under one is ``blocked``. todos_pending_claim_idx
#    leads with exactly (endpoint_id, queue, assignee or ''), then priority
#    and available_at.
# 3. due: first the due redeliveries (a lapsed lease below the cap, an elapsed
#    retry window), oldest first, through the small lease and retry-window
#    indexes (the sweeps move them within seconds, so they are few).
# 4. fresh: then the due pending rows, lane by lane, the highest priority
#    first and the oldest within it: each lane is a range of the claim index
#    read in order and cut at the statement's clock (not now(): a todo
#    created later in the caller's own transaction is due too), so a claim
#    never reads another lane's backlog (another queue's, another endpoint's,
#    another worker's assignments). SKIP LOCKED makes concurrent claimants
#    pass over each other's rows; a row locked here but not taken (another
#    lane's rows came first) is free again when this statement commits.
#    A queue with priority aging reads each level apart (fresh_aged): within a
#    level the oldest row has aged most, so each level's head is its best.
#    A fair queue reads its lane by start time (fresh_fair, todos_fair_claim_
#    idx); its order key is the running latest available_at of the lane, so
#    that the lane's own order survives the sort across lanes.
#    A todo of a group with no room (as this statement's snapshot sees it:
#    HEAD_ROOM, ROOM) is passed over here; switchboard_admit decides under
#    the group's lock.
#    Claim order is total: rows that tie on every key (the first todos of
#    two groups in a fair lane share fair tag 0) go by id, in the lanes'
#    merge, in admission and in the answer, so every statement that takes
#    the same rows returns them in the same order.
# 5. admitted: a candidate with no group in a queue with no rate limit is
#    taken as it is; the others go, in claim order, through switchboard_admit
#    (group limits counted under the group's lock, token buckets), which
#    returns those admitted and what admitted them. Of those, a todo with a
#    max_cost goes through switchboard_reserve (CONTRACT §18: reserved against
#    its USD budgets under their locks), which returns those whose
#    reservation fit; the lanes passed over those that did not as their
#    snapshot saw it (FITS).
# 6. moved: claim them, with a fresh lease token each; the lease is the call's,
#    else the queue's, else the server's. The rows are fetched by primary key
#    (id = ANY(...)): the planner cannot know how few candidates there are,
#    and a join it guesses at could hash the whole table.
#    A held todo (an open question, CONTRACT §14) is a pending row whose
#    available_at is its deadline, or far ahead without one: its lane's range
#    ends before it. When a claim takes one, its deadline has passed, so the
#    claim marks the question expired (the sweep does so for the rest).
#    A lapsed lease under a cancel request is not redelivered: the reaper
#    ends it canceled.
# 7. history (a limited claim's row carries its admission), and the rows in
#    claim order (redeliveries first), each with what switchboard_admit passed
#    over (PASSED).
# Every value is read through a one-row subquery, (SELECT %(x)s): the planner
# then cannot see the values, so a custom plan costs exactly what the generic
# one does, and a prepared claim settles on the generic plan after five runs
# instead of being planned on every call (planning takes longer than the
# claim itself). That generic plan is the one tests/store/test_claim_plan.py
# holds to the claim index, for any mix of endpoints, queues and backlogs.
# What a claim row says past the todo's columns: where the todo came from
# and, for a lapsed lease it took, when that lease's claim began and when it
# ran out (todos.telemetry.tracing ends that delivery's span: the reaper never saw it).
LAPSED = "from_state, lapsed_claimed_at, lapsed_at"
# What switchboard_admit passed over (its rows with no id: a limit's reason and
# queue, todos.store.limit_figures counts them), as one jsonb array on every
# row claimed, or on one row of NULLs when it claimed none; a claim that passed
# over nothing answers its rows as ever (none when it claimed none).
PASSED = """moved
  FULL JOIN (SELECT jsonb_agg(a.admission) AS passed FROM admitted a
              WHERE a.id IS NULL HAVING count(*) > 0) p ON TRUE"""

# A grouped row passes the lanes' pre-filter when its group is not blocked
# (paused, an override of 0, or as many claimed as its limit: ``blocked``,
# read once per claim from the claimed rows, and only when a grouped row is
# met) and its queue does not hold every group (group_concurrency 0) unless
# an override opens this one.
ROOM = """(t.queue, t.group_key) NOT IN (SELECT b.queue, b.group_key FROM blocked b)
                 AND (lane.group_limit IS DISTINCT FROM 0
                      OR (t.queue, t.group_key) IN (
                          SELECT o.queue, o.group_key FROM opened o))"""

# ``blocked`` costs a claim as many rows as its queues have grouped todos in
# flight (5,000 of them: 2 ms a claim), however few rows the claim reads. So
# the plain and aged lanes first ask ``head``: the groups of each lane's first
# few pending rows, each judged by its own probes (budget, override, claimed
# count through todos_group_claimed_idx, as ``blocked`` judges it). A row of a
# group ``head`` judged is taken or passed over on that verdict; only a row
# past the head (its groups all full) reads ``blocked``. A fair lane reads in
# another order than ``head`` and asks ROOM alone.
HEAD_ROOM = f"""(t.queue, t.group_key) IN (
                     SELECT h.queue, h.group_key FROM head h WHERE h.room)
                 OR ((t.queue, t.group_key) NOT IN (
                          SELECT h.queue, h.group_key FROM head h WHERE NOT h.room)
                     AND {ROOM})"""

# The endpoint's queues with pending work, when the claim names none: a loose
# index scan of todos (one probe a queue), shared by both claim statements.
PENDING_QUEUES = """WITH RECURSIVE pending_queue (name) AS (
    (SELECT queue FROM todos
      WHERE endpoint_id = (SELECT %(endpoint_id)s::uuid) AND state = 'pending'
        AND (SELECT %(queues)s::text[]) IS NULL
      ORDER BY queue
      LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM todos t
             WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
               AND t.state = 'pending' AND t.queue > p.name
             ORDER BY t.queue
             LIMIT 1)
      FROM pending_queue p
     WHERE p.name IS NOT NULL
)"""

# A todo with a max_cost passes the lanes' pre-filter when its reservation
# fits its budgets (CONTRACT §18, as this statement's snapshot sees them);
# switchboard_reserve decides under the budgets' locks.
FITS = """switchboard_reservation_fits(t.endpoint_id, t.queue, t.group_key, t.id,
                                               t.max_cost)"""

# The claim's order, total (step 4), for the aggregates that hand candidates
# to admission and reservation in it.
IN_CLAIM_ORDER = "ORDER BY c.rank, c.level, c.rank_at, c.tag, c.id"

# CLAIM_SQL's parts that only the lanes that are not fair (``head``,
# ``fresh_plain``, ``fresh_aged``: steps 2 and 4) and the reservations
# (``reserved``: step 5) need; CLAIM_FAIR_SQL has none of them.
_HEAD = """), head (queue, group_key, room) AS (
    SELECT h.queue, h.group_key,
           NOT EXISTS (SELECT 1 FROM budget_paused s
                        WHERE s.group_key = h.group_key
                          AND (s.queue IS NULL OR s.queue = h.queue))
           AND coalesce((
               SELECT CASE WHEN g.paused THEN FALSE
                           WHEN coalesce(g.concurrency, h.group_limit) IS NULL
                               THEN TRUE
                           ELSE (SELECT count(*) FROM (
                                     SELECT 1 FROM todos c
                                      WHERE c.endpoint_id
                                            = (SELECT %(endpoint_id)s::uuid)
                                        AND c.queue = h.queue
                                        AND c.group_key = h.group_key
                                        AND c.state = 'claimed'
                                      LIMIT coalesce(g.concurrency, h.group_limit)) n)
                                < coalesce(g.concurrency, h.group_limit) END
                 FROM (SELECT 1) one
                 LEFT JOIN queue_groups g
                   ON g.endpoint_id = (SELECT %(endpoint_id)s::uuid)
                  AND g.queue = h.queue AND g.group_key = h.group_key), FALSE)
      FROM (SELECT DISTINCT lane.queue, w.group_key, lane.group_limit
              FROM lane
             CROSS JOIN LATERAL (
                 SELECT t.group_key FROM todos t
                  WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
                    AND t.state = 'pending' AND t.queue = lane.queue
                    AND coalesce(t.assignee, '') = lane.assignee_key
                    AND t.available_at <= statement_timestamp()
                  ORDER BY t.priority, t.available_at
                  LIMIT (SELECT %(limit)s::int) + 4) w
             WHERE NOT lane.fair AND w.group_key IS NOT NULL) h
"""

_FRESH_PLAIN_AGED = f"""), fresh_plain AS (
    SELECT lane.queue, lane.rated, c.*
      FROM lane
     CROSS JOIN LATERAL (
         SELECT t.id, t.priority::int AS level, t.available_at AS rank_at,
                NULL::float8 AS tag, t.group_key, t.cost, t.max_cost FROM todos t
          WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
            AND t.state = 'pending' AND t.queue = lane.queue
            AND coalesce(t.assignee, '') = lane.assignee_key
            AND t.available_at <= statement_timestamp()
            AND (t.group_key IS NULL OR ({HEAD_ROOM}))
            AND (t.max_cost IS NULL OR {FITS})
          ORDER BY t.priority, t.available_at
          LIMIT (SELECT %(limit)s::int)
            FOR UPDATE SKIP LOCKED) c
     WHERE NOT lane.fair AND lane.aging IS NULL
), fresh_aged AS (
    SELECT lane.queue, lane.rated, c.*
      FROM lane
     CROSS JOIN generate_series(1, 5) AS level (p)
     CROSS JOIN LATERAL (
         SELECT t.id,
                greatest(1, t.priority - floor(extract(epoch FROM
                    statement_timestamp() - t.available_at) / lane.aging))::int
                    AS level,
                t.available_at AS rank_at, NULL::float8 AS tag, t.group_key, t.cost,
                t.max_cost
           FROM todos t
          WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
            AND t.state = 'pending' AND t.queue = lane.queue
            AND coalesce(t.assignee, '') = lane.assignee_key
            AND t.priority = level.p
            AND t.available_at <= statement_timestamp()
            AND (t.group_key IS NULL OR ({HEAD_ROOM}))
            AND (t.max_cost IS NULL OR {FITS})
          ORDER BY t.available_at
          LIMIT (SELECT %(limit)s::int)
            FOR UPDATE SKIP LOCKED) c
     WHERE NOT lane.fair AND lane.aging IS NOT NULL
"""

_FRESH_LANES = """(SELECT * FROM fresh_plain
            UNION ALL SELECT * FROM fresh_aged
            UNION ALL SELECT * FROM fresh_fair)"""

_RESERVED = f"""), reserved AS (
    SELECT r.id
      FROM (SELECT array_agg(c.id {IN_CLAIM_ORDER}) AS ids,
                   array_agg(c.queue {IN_CLAIM_ORDER})
                       AS queues,
                   array_agg(c.group_key {IN_CLAIM_ORDER})
                       AS groups,
                   array_agg(c.max_cost {IN_CLAIM_ORDER})
                       AS costs
              FROM candidate c
             WHERE c.max_cost IS NOT NULL
               AND c.id IN (SELECT a.id FROM admitted a)
            HAVING count(*) > 0) b
     CROSS JOIN LATERAL switchboard_reserve((SELECT %(endpoint_id)s::uuid), b.ids,
                                            b.queues, b.groups, b.costs) r (id)
"""

# CLAIM_FAIR_SQL defers to CLAIM_SQL when a lane is not fair (its rows are
# CLAIM_SQL's fresh_plain's or fresh_aged's) or a candidate has a max_cost
# (its reservation is CLAIM_SQL's ``reserved``). Otherwise its lanes, its
# candidates and what it admits are exactly CLAIM_SQL's.
_FAIR_VERDICT = """, verdict (defers) AS (
    SELECT EXISTS (SELECT 1 FROM lane WHERE NOT lane.fair)
        OR EXISTS (SELECT 1 FROM candidate c WHERE c.max_cost IS NOT NULL)
)"""


def _claim_sql(*, fair_lanes_only: bool) -> str:
    """CLAIM_SQL, or with ``fair_lanes_only`` CLAIM_FAIR_SQL: the same
    statement without the plain and aged lanes (``head``, ``fresh_plain``,
    ``fresh_aged``) and without the reservations (``reserved``), which defers
    (claims nothing, admits nothing and answers one row of NULLs whose last
    column, ``defers``, is TRUE) when a lane is not fair or a candidate has a
    max_cost."""
    if fair_lanes_only:
        head = plain_aged = reserved = ""
        fresh_lanes = "fresh_fair"
        verdict = _FAIR_VERDICT
        unless_defers = " AND NOT (SELECT defers FROM verdict)"
        moves = "NOT (SELECT defers FROM verdict)"
        defers = ", v.defers"
        defers_row = "\n  FULL JOIN (SELECT defers FROM verdict WHERE defers) v ON TRUE"
    else:
        head, plain_aged, reserved = _HEAD, _FRESH_PLAIN_AGED, _RESERVED
        fresh_lanes = _FRESH_LANES
        verdict = unless_defers = defers = defers_row = ""
        moves = "(c.max_cost IS NULL OR t.id IN (SELECT r.id FROM reserved r))"
    return f"""
{PENDING_QUEUES}, budget_paused (queue, group_key) AS (
    SELECT b.queue, b.group_key FROM budgets b
     WHERE b.endpoint_id = (SELECT %(endpoint_id)s::uuid)
       AND b.in_force_until IS NOT NULL AND b.in_force_until > now()
       AND b.action = 'pause'
), lane (queue, assignee_key, group_limit, fair, aging, rated) AS (
    SELECT q.name, k.assignee_key, p.group_concurrency, coalesce(p.fair, FALSE),
           p.priority_aging_seconds, p.rate_limit IS NOT NULL
      FROM (SELECT name FROM pending_queue WHERE name IS NOT NULL
            UNION
            SELECT unnest((SELECT %(queues)s::text[]))) q (name)
     CROSS JOIN (SELECT ''
                 UNION
                 SELECT (SELECT %(worker)s::text)
                  WHERE (SELECT %(worker)s::text) <> '') k (assignee_key)
      LEFT JOIN queues p
        ON p.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND p.name = q.name
     WHERE p.paused_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM budget_paused s
                        WHERE s.group_key IS NULL
                          AND (s.queue IS NULL OR s.queue = q.name))
), blocked (queue, group_key) AS (
    SELECT busy.queue, busy.group_key
      FROM (SELECT t.queue, t.group_key, count(*) AS n FROM todos t
             WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
               AND t.state = 'claimed' AND t.group_key IS NOT NULL
               AND t.queue IN (SELECT l.queue FROM lane l)
             GROUP BY t.queue, t.group_key) busy
      LEFT JOIN queue_groups g
        ON g.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND g.queue = busy.queue
       AND g.group_key = busy.group_key
      LEFT JOIN queues q
        ON q.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND q.name = busy.queue
     WHERE busy.n >= coalesce(g.concurrency, q.group_concurrency)
    UNION ALL
    SELECT g.queue, g.group_key FROM queue_groups g
     WHERE g.endpoint_id = (SELECT %(endpoint_id)s::uuid)
       AND (g.paused OR g.concurrency = 0)
       AND g.queue IN (SELECT l.queue FROM lane l)
    UNION ALL
    SELECT s.queue, s.group_key FROM budget_paused s WHERE s.group_key IS NOT NULL
), opened (queue, group_key) AS (
    SELECT g.queue, g.group_key FROM queue_groups g
     WHERE g.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND g.concurrency > 0
       AND g.queue IN (SELECT l.queue FROM lane l)
{head}), due AS (
    SELECT t.id, t.state AS from_state, 0 AS rank, 0 AS level,
           t.created_at AS rank_at, NULL::float8 AS tag, t.queue, t.group_key,
           t.cost, t.max_cost, t.state = 'claimed' AS transfer,
           p.rate_limit IS NOT NULL AS rated,
           t.claimed_at AS lapsed_claimed_at, t.lease_expires_at AS lapsed_at
      FROM todos t
      LEFT JOIN queues p ON p.endpoint_id = t.endpoint_id AND p.name = t.queue
     WHERE ((t.state = 'claimed' AND t.lease_expires_at < now()
             AND t.attempt < t.max_attempts AND t.cancel_request IS NULL)
         OR (t.state = 'failed' AND t.next_retry_at <= now()))
       AND t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
       AND ((SELECT %(queues)s::text[]) IS NULL
            OR t.queue = ANY((SELECT %(queues)s::text[])::text[]))
       AND (t.assignee IS NULL OR t.assignee = (SELECT %(worker)s::text))
       AND p.paused_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM budget_paused s
                        WHERE (s.queue IS NULL OR s.queue = t.queue)
                          AND (s.group_key IS NULL OR s.group_key = t.group_key))
       AND (t.max_cost IS NULL OR {FITS})
       AND (t.group_key IS NULL OR t.state = 'claimed'
            OR NOT switchboard_group_full(t.endpoint_id, t.queue, t.group_key,
                                          p.group_concurrency))
     ORDER BY t.created_at
     LIMIT (SELECT %(limit)s::int)
       FOR UPDATE OF t SKIP LOCKED
{plain_aged}), fresh_fair AS (
    SELECT lane.queue, lane.rated, c.id, c.level,
           max(c.available_at) OVER (PARTITION BY lane.queue, lane.assignee_key
                                     ORDER BY c.level, c.tag) AS rank_at,
           c.tag, c.group_key, c.cost, c.max_cost
      FROM lane
     CROSS JOIN LATERAL (
         SELECT t.id, t.priority::int AS level, t.available_at, t.fair_tag AS tag,
                t.group_key, t.cost, t.max_cost FROM todos t
          WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
            AND t.state = 'pending' AND t.queue = lane.queue
            AND coalesce(t.assignee, '') = lane.assignee_key
            AND t.fair_tag IS NOT NULL
            AND t.available_at <= statement_timestamp()
            AND (t.group_key IS NULL OR ({ROOM}))
            AND (t.max_cost IS NULL OR {FITS})
          ORDER BY t.priority, t.fair_tag
          LIMIT (SELECT %(limit)s::int)
            FOR UPDATE SKIP LOCKED) c
     WHERE lane.fair
), fresh AS (
    SELECT f.id, 'pending'::text AS from_state, 1 AS rank, f.level, f.rank_at,
           f.tag, f.queue, f.group_key, f.cost, f.max_cost, FALSE AS transfer, f.rated,
           NULL::timestamptz AS lapsed_claimed_at, NULL::timestamptz AS lapsed_at
      FROM {fresh_lanes} f
     ORDER BY f.level, f.rank_at, f.tag, f.id
     LIMIT (SELECT %(limit)s::int) - (SELECT count(*) FROM due)
), candidate AS (
    SELECT * FROM due UNION ALL SELECT * FROM fresh
){verdict}, admitted AS (
    SELECT c.id, NULL::jsonb AS admission FROM candidate c
     WHERE c.group_key IS NULL AND NOT c.rated
    UNION ALL
    SELECT a.id, a.admission
      FROM (SELECT array_agg(c.id {IN_CLAIM_ORDER}) AS ids,
                   array_agg(c.queue {IN_CLAIM_ORDER})
                       AS queues,
                   array_agg(c.group_key {IN_CLAIM_ORDER})
                       AS groups,
                   array_agg(c.cost {IN_CLAIM_ORDER})
                       AS costs,
                   array_agg(c.transfer {IN_CLAIM_ORDER})
                       AS transfers
              FROM candidate c
             WHERE c.group_key IS NOT NULL OR c.rated
            HAVING count(*) > 0{unless_defers}) b
     CROSS JOIN LATERAL switchboard_admit((SELECT %(endpoint_id)s::uuid), b.ids,
                                          b.queues, b.groups, b.costs,
                                          b.transfers) a
{reserved}), moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = (SELECT %(worker)s::text),
           attempt = t.attempt + 1, deliveries = t.deliveries + 1,
           claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => coalesce(
               (SELECT %(lease)s::int),
               (SELECT q.lease_seconds FROM queues q
                 WHERE q.endpoint_id = t.endpoint_id AND q.name = t.queue),
               (SELECT %(default_lease)s::int))),
           lease_token = replace(gen_random_uuid()::text, '-', ''),
           next_retry_at = NULL, updated_at = now(),
           question_status = CASE WHEN t.question_status = 'open' THEN 'expired'
                                  ELSE t.question_status END
      FROM candidate c
      JOIN admitted a ON a.id = c.id
     WHERE t.id = c.id AND t.id = ANY(ARRAY(SELECT id FROM admitted))
       AND {moves}
 RETURNING {T_COLUMNS}, c.from_state, c.rank, c.level, c.rank_at, c.tag,
           a.admission, c.lapsed_claimed_at, c.lapsed_at
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at, admission)
    SELECT m.id, m.endpoint_id, step.from_state, step.to_state, step.attempt,
           coalesce((SELECT %(worker)s::text), ''), '', now(),
           CASE WHEN step.to_state = 'claimed' THEN m.admission END
      FROM moved m
     CROSS JOIN LATERAL ({CLAIM_STEPS}) step
)
SELECT {TODO_COLUMNS}, {LAPSED}, p.passed{defers}
  FROM {PASSED}{defers_row}
 ORDER BY rank, level, rank_at, tag, id
"""


CLAIM_SQL = _claim_sql(fair_lanes_only=False)

# The claim of a scope whose lanes are all fair (CONTRACT §17: fair turns),
# without the nodes only other lanes and max_cost reservations need: its plan
# is two thirds of CLAIM_SQL's, and PostgreSQL starts every node of a plan on
# every execution, whichever branches run.
CLAIM_FAIR_SQL = _claim_sql(fair_lanes_only=True)


# The claim as it was before admission control, for the scopes that need
# none: CLAIM_SQL's steps 1–4, 6 and 7 with the lanes read in priority order
# and no admission step. Its plan is a third of CLAIM_SQL's, and PostgreSQL
# starts every node of a plan on every execution, whichever branches run
# (measured: 0.25 ms of the database's CPU a claim). It claims only when
# nothing it met needs admission: every lane's queue without fair turns,
# priority aging or a rate limit, every candidate without a group (a
# group's limit, pause or rate applies only to grouped todos) and without a
# max_cost (its reservation is CLAIM_SQL's), and no pause
# budget of the endpoint in force (CONTRACT §18; a probe of
# budgets_in_force_idx). A grouped candidate that CLAIM_SQL's pre-filter
# would pass over is met here, so the candidates here are then exactly
# CLAIM_SQL's. Otherwise it claims nothing (the rows it locked are free again
# when it ends) and answers one row of NULLs whose last column, ``admits``,
# tells the caller to run CLAIM_SQL; else its rows as CLAIM_SQL's, with
# ``admits`` NULL (none when it claimed none).
CLAIM_PLAIN_SQL = f"""
{PENDING_QUEUES}, lane (queue, assignee_key, plain) AS (
    SELECT q.name, k.assignee_key,
           p.name IS NULL OR (NOT p.fair AND p.priority_aging_seconds IS NULL
                              AND p.rate_limit IS NULL)
      FROM (SELECT name FROM pending_queue WHERE name IS NOT NULL
            UNION
            SELECT unnest((SELECT %(queues)s::text[]))) q (name)
     CROSS JOIN (SELECT ''
                 UNION
                 SELECT (SELECT %(worker)s::text)
                  WHERE (SELECT %(worker)s::text) <> '') k (assignee_key)
      LEFT JOIN queues p
        ON p.endpoint_id = (SELECT %(endpoint_id)s::uuid) AND p.name = q.name
     WHERE p.paused_at IS NULL
), due AS (
    SELECT t.id, t.state AS from_state, 0 AS rank, 0 AS level,
           t.created_at AS rank_at,
           t.group_key IS NULL AND p.rate_limit IS NULL AND t.max_cost IS NULL
               AS plain,
           t.claimed_at AS lapsed_claimed_at, t.lease_expires_at AS lapsed_at
      FROM todos t
      LEFT JOIN queues p ON p.endpoint_id = t.endpoint_id AND p.name = t.queue
     WHERE ((t.state = 'claimed' AND t.lease_expires_at < now()
             AND t.attempt < t.max_attempts AND t.cancel_request IS NULL)
         OR (t.state = 'failed' AND t.next_retry_at <= now()))
       AND t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
       AND ((SELECT %(queues)s::text[]) IS NULL
            OR t.queue = ANY((SELECT %(queues)s::text[])::text[]))
       AND (t.assignee IS NULL OR t.assignee = (SELECT %(worker)s::text))
       AND p.paused_at IS NULL
     ORDER BY t.created_at
     LIMIT (SELECT %(limit)s::int)
       FOR UPDATE OF t SKIP LOCKED
), fresh AS (
    SELECT c.id, 'pending'::text AS from_state, 1 AS rank, c.priority::int AS level,
           c.available_at AS rank_at,
           c.group_key IS NULL AND c.max_cost IS NULL AS plain,
           NULL::timestamptz AS lapsed_claimed_at, NULL::timestamptz AS lapsed_at
      FROM lane
     CROSS JOIN LATERAL (
         SELECT t.id, t.priority, t.available_at, t.group_key, t.max_cost
           FROM todos t
          WHERE t.endpoint_id = (SELECT %(endpoint_id)s::uuid)
            AND t.state = 'pending' AND t.queue = lane.queue
            AND coalesce(t.assignee, '') = lane.assignee_key
            AND t.available_at <= statement_timestamp()
          ORDER BY t.priority, t.available_at
          LIMIT (SELECT %(limit)s::int)
            FOR UPDATE SKIP LOCKED) c
     WHERE lane.plain
     ORDER BY c.priority, c.available_at, c.id
     LIMIT (SELECT %(limit)s::int) - (SELECT count(*) FROM due)
), candidate AS (
    SELECT * FROM due UNION ALL SELECT * FROM fresh
), verdict (admits) AS (
    SELECT EXISTS (SELECT 1 FROM lane WHERE NOT lane.plain)
        OR EXISTS (SELECT 1 FROM candidate c WHERE NOT c.plain)
        OR EXISTS (SELECT 1 FROM budgets b
                    WHERE b.endpoint_id = (SELECT %(endpoint_id)s::uuid)
                      AND b.in_force_until IS NOT NULL
                      AND b.in_force_until > now() AND b.action = 'pause')
), moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = (SELECT %(worker)s::text),
           attempt = t.attempt + 1, deliveries = t.deliveries + 1,
           claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => coalesce(
               (SELECT %(lease)s::int),
               (SELECT q.lease_seconds FROM queues q
                 WHERE q.endpoint_id = t.endpoint_id AND q.name = t.queue),
               (SELECT %(default_lease)s::int))),
           lease_token = replace(gen_random_uuid()::text, '-', ''),
           next_retry_at = NULL, updated_at = now(),
           question_status = CASE WHEN t.question_status = 'open' THEN 'expired'
                                  ELSE t.question_status END
      FROM candidate c
     WHERE t.id = c.id AND t.id = ANY(ARRAY(SELECT id FROM candidate))
       AND NOT (SELECT admits FROM verdict)
 RETURNING {T_COLUMNS}, c.from_state, c.rank, c.level, c.rank_at,
           c.lapsed_claimed_at, c.lapsed_at
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT m.id, m.endpoint_id, step.from_state, step.to_state, step.attempt,
           coalesce((SELECT %(worker)s::text), ''), '', now()
      FROM moved m
     CROSS JOIN LATERAL ({CLAIM_STEPS}) step
)
SELECT {TODO_COLUMNS}, {LAPSED}, NULL::jsonb AS passed, v.admits
  FROM moved
  FULL JOIN (SELECT admits FROM verdict WHERE admits) v ON TRUE
 ORDER BY rank, level, rank_at, id
"""

# The claim of one todo from a scope whose one queue is fair (CONTRACT §17:
# fair turns): switchboard_claim_fair (migration 0043), a function of small
# statements, each run only when it applies, where CLAIM_FAIR_SQL starts every
# node of its plan on every execution. It decides as CLAIM_FAIR_SQL does with
# a limit of 1, or defers to it (one row whose last column, ``defers``, says
# why): several queues with pending todos, a queue that is not fair, a pause
# budget in force or a due redelivery ('passing': the scope's next claim asks
# it again), a candidate with a max_cost, a lane whose first rows are all of
# groups with no room (HEAD_ROWS). Its rows are CLAIM_FAIR_SQL's: the todo's
# columns, where it came from (always a pending todo), what admission passed
# over, ``defers``.
CLAIM_FAIR_ONE_SQL = f"""
SELECT {", ".join(f"(f.todo).{name.strip()}" for name in TODO_COLUMNS.split(","))},
       'pending'::text AS from_state, NULL::timestamptz AS lapsed_claimed_at,
       NULL::timestamptz AS lapsed_at, f.passed, f.defers
  FROM switchboard_claim_fair(%(endpoint_id)s::uuid, %(queues)s::text[],
                              %(worker)s::text, %(lease)s::int,
                              %(default_lease)s::int) f
"""
# Why a claim of one defers when the next claim may not: a pause budget in
# force or a due redelivery (the scope's claims keep asking it first).
PASSING = "passing"

# Scopes (endpoint, queues) whose plain claim last found admission to do:
# until when (time.monotonic()) their claims skip the plain claim, and the
# statement they go to next in _CLAIM_CHAIN: CLAIM_FAIR_ONE_SQL (a claim of
# one; a batch goes on to the next) until it defers for a reason that does
# not pass, then CLAIM_FAIR_SQL until it defers, then CLAIM_SQL. A
# scope with controls pays one statement a claim, not two, and tries the plain
# claim again after a while, in case its controls are gone. Only the cost
# depends on it: the plain and fair claims check for themselves, so a stale
# entry is never wrong.
_ADMITTING: dict[tuple[str, tuple[str, ...] | None], tuple[float, str]] = {}
ADMITTING_SECONDS = 30.0
_CLAIM_CHAIN = (CLAIM_PLAIN_SQL, CLAIM_FAIR_ONE_SQL, CLAIM_FAIR_SQL, CLAIM_SQL)


def claim_many_steps(
    scope: Scope,
    worker: str,
    *,
    limit: int,
    queue: str | None = None,
    lease_seconds: int | None = None,
    visible_at_once: bool = False,
) -> Steps[list[Todo]]:
    """Claim up to ``limit`` (1–10) todos of this scope in one statement; [] if none.

    Due redeliveries first, then the oldest due pending todos of queues that
    are not paused, assigned to nobody or to this worker. The statement is
    CLAIM_PLAIN_SQL while the scope needs no admission, else (a claim of
    one from a scope with one fair queue) CLAIM_FAIR_ONE_SQL, else
    CLAIM_FAIR_SQL while its lanes are all fair, else CLAIM_SQL (each after
    the one before found it could not decide, and claimed nothing).
    ``visible_at_once`` gives a lease that ends as it begins (SQS's
    ReceiveMessage with VisibilityTimeout 0): the next claim may take the
    todos at once, and the lease token stays good until one does.
    """
    params = bind_claim(
        scope,
        worker,
        limit=limit,
        queue=queue,
        lease_seconds=lease_seconds,
        visible_at_once=visible_at_once,
    )
    key = (scope.endpoint_id, scope.queues if queue is None else (queue,))
    until, sql = _ADMITTING.get(key, (0.0, CLAIM_SQL))
    if until <= time.monotonic():
        sql = CLAIM_PLAIN_SQL
    # Each statement of the chain decides, or defers to the next (claiming
    # nothing): the last column of its one row says so.
    start = _CLAIM_CHAIN.index(sql)
    for position, step in enumerate(_CLAIM_CHAIN[start:], start):
        if step is CLAIM_FAIR_ONE_SQL and limit != 1:
            continue
        rows = yield Statement("claim", step, params)
        if step is CLAIM_SQL:
            return _claimed(rows)
        if not rows or not rows[0][-1]:
            return _claimed([row[:-1] for row in rows])
        if step is CLAIM_FAIR_ONE_SQL and rows[0][-1] == PASSING:
            continue
        if step is CLAIM_PLAIN_SQL and len(_ADMITTING) >= 10_000:
            _ADMITTING.clear()
        following = _CLAIM_CHAIN[position + 1]
        _ADMITTING[key] = (time.monotonic() + ADMITTING_SECONDS, following)
    raise AssertionError("CLAIM_SQL decides every claim")


claim_many = on_django(claim_many_steps)
aclaim_many = on_pool(claim_many_steps)


def _claimed(rows: list[Row]) -> list[Todo]:
    """The todos a claim statement took (past a row of NULLs that only says
    what admission passed over: counted here, as the rows' ``passed``); while
    tracing is on, a lapsed lease it took ends that delivery's process span,
    as the reaper would have."""
    limit_figures.note_passed(rows[0][-1] if rows else None)
    rows = [row for row in rows if row[0] is not None]
    claimed = [Todo.from_row(row) for row in rows]
    if tracing.enabled():
        for row, todo in zip(rows, claimed, strict=True):
            from_state, claimed_at, lapsed_at = row[TODO_COLUMN_COUNT:][:3]
            if from_state == "claimed":
                lapsed = replace(
                    todo,
                    deliveries=todo.deliveries - 1,
                    attempt=todo.attempt - 1,
                    claimed_at=claimed_at,
                    owner=None,
                )
                tracing.ended(
                    lapsed, "lapsed", error="lease expired", end_time=lapsed_at
                )
    return claimed


def bind_claim(
    scope: Scope,
    worker: str,
    *,
    limit: int = 1,
    queue: str | None = None,
    lease_seconds: int | None = None,
    visible_at_once: bool = False,
) -> dict[str, object]:
    """Return CLAIM_SQL's parameters (the benchmarks run the same statement)."""
    limit = int(limit)
    if not 1 <= limit <= MAX_CLAIM_BATCH:
        raise ValueError(f"limit must be between 1 and {MAX_CLAIM_BATCH}")
    if queue is not None:
        if not scope.covers(queue):
            raise QueueNotGranted(queue)
        scope = Scope(scope.endpoint_id, (queue,))
    return {
        **_scope_params(scope),
        **_defaults(),
        "worker": worker,
        "lease": 0 if visible_at_once else _lease(lease_seconds),
        "limit": limit,
    }


def claim_next_steps(
    scope: Scope,
    worker: str,
    *,
    queue: str | None = None,
    lease_seconds: int | None = None,
) -> Steps[Todo]:
    """Claim the next claimable todo of this scope (optionally of one queue)."""
    claimed = yield from claim_many_steps(
        scope, worker, limit=1, queue=queue, lease_seconds=lease_seconds
    )
    if not claimed:
        raise NotFound("no claimable todo")
    return claimed[0]


claim_next = on_django(claim_next_steps)
aclaim_next = on_pool(claim_next_steps)


# Claim one named todo: pending and due, or a due redelivery; assigned to
# nobody or to this worker; its queue not paused. ``operator`` is TRUE for
# the Board (no endpoint or grant check). A todo of a group, or of a queue
# with a rate limit, is claimed only if switchboard_admit admits it.
CLAIM_ONE_SQL = f"""
WITH candidate AS (
    SELECT id, state AS from_state, endpoint_id, queue, group_key, cost, max_cost,
           claimed_at AS lapsed_claimed_at, lease_expires_at AS lapsed_at,
           state = 'claimed' AS transfer,
           (SELECT p.rate_limit IS NOT NULL FROM queues p
             WHERE p.endpoint_id = t.endpoint_id AND p.name = t.queue) AS rated
      FROM todos t
     WHERE id = %(id)s
       AND (%(operator)s OR (endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))))
       AND ((state = 'pending' AND available_at <= statement_timestamp())
         OR (state = 'claimed' AND lease_expires_at < now()
             AND attempt < max_attempts AND cancel_request IS NULL)
         OR (state = 'failed' AND next_retry_at <= now()))
       AND (assignee IS NULL OR assignee = %(worker)s)
       AND NOT EXISTS (
           SELECT 1 FROM queues p
            WHERE p.endpoint_id = t.endpoint_id AND p.name = t.queue
              AND p.paused_at IS NOT NULL)
       AND NOT {PAUSED_BY_BUDGET.format(t="t")}
       FOR UPDATE SKIP LOCKED
), admitted AS (
    SELECT c.id, NULL::jsonb AS admission FROM candidate c
     WHERE c.group_key IS NULL AND c.rated IS NOT TRUE
    UNION ALL
    SELECT a.id, a.admission
      FROM candidate c
     CROSS JOIN LATERAL switchboard_admit(c.endpoint_id, ARRAY[c.id], ARRAY[c.queue],
                                          ARRAY[c.group_key], ARRAY[c.cost],
                                          ARRAY[c.transfer]) a
     WHERE c.group_key IS NOT NULL OR c.rated
), reserved AS (
    SELECT r.id
      FROM candidate c
     CROSS JOIN LATERAL switchboard_reserve(c.endpoint_id, ARRAY[c.id],
                                            ARRAY[c.queue], ARRAY[c.group_key],
                                            ARRAY[c.max_cost]) r (id)
     WHERE c.max_cost IS NOT NULL AND c.id IN (SELECT a.id FROM admitted a)
), moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = %(worker)s, attempt = t.attempt + 1,
           deliveries = t.deliveries + 1, claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => coalesce(
               %(lease)s::int,
               (SELECT q.lease_seconds FROM queues q
                 WHERE q.endpoint_id = t.endpoint_id AND q.name = t.queue),
               %(default_lease)s::int)),
           lease_token = replace(gen_random_uuid()::text, '-', ''),
           next_retry_at = NULL, updated_at = now(),
           question_status = CASE WHEN t.question_status = 'open' THEN 'expired'
                                  ELSE t.question_status END
      FROM candidate c
      JOIN admitted a ON a.id = c.id
     WHERE t.id = c.id AND t.id = %(id)s
       AND (c.max_cost IS NULL OR t.id IN (SELECT r.id FROM reserved r))
 RETURNING {T_COLUMNS}, c.from_state, a.admission, c.lapsed_claimed_at,
           c.lapsed_at
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at, admission)
    SELECT m.id, m.endpoint_id, step.from_state, step.to_state, step.attempt,
           coalesce(%(worker)s, ''), '', now(),
           CASE WHEN step.to_state = 'claimed' THEN m.admission END
      FROM moved m
     CROSS JOIN LATERAL ({CLAIM_STEPS}) step
)
SELECT {TODO_COLUMNS}, {LAPSED}, p.passed FROM {PASSED}
"""

CLAIMABLE = (
    "only a due pending todo (or a lapsed or due one) of a queue that is not"
    " paused, assigned to nobody or to this worker, and admitted by its group's"
    " limit and the rate limits, can be claimed"
)


def claim_todo(
    scope: Scope, todo_id: str, worker: str, *, lease_seconds: int | None = None
) -> Todo:
    """Claim one specific todo of this scope."""
    return _claim_one(scope, todo_id, worker, lease_seconds)


def claim_todo_any_endpoint(
    todo_id: str, worker: str, *, lease_seconds: int | None = None
) -> Todo:
    """Claim one specific todo of any endpoint (operator Board)."""
    return _claim_one(None, todo_id, worker, lease_seconds)


def _claim_one(
    scope: Scope | None, given_id: str, worker: str, lease_seconds: int | None
) -> Todo:
    todo_id = _todo_id(given_id)
    params = {
        **_scope(scope),
        **_defaults(),
        "id": todo_id,
        "worker": worker,
        "lease": _lease(lease_seconds),
    }
    claimed = _claimed(_run("claim_todo", CLAIM_ONE_SQL, params))
    if not claimed:
        todo = _lookup(scope, todo_id)
        raise Conflict(
            f"todo is {todo.state}; {CLAIMABLE}", todo_id=todo_id, state=todo.state
        )
    return claimed[0]


# When a todo of a scope next turns claimable by itself, no transition ringing
# for it: a lease lapsing (below the cap, no cancel request), a retry window
# ending, a delayed or held todo of the pool coming due; in a queue that is not
# paused. Only instants ahead and within %(within)s seconds count (what is due
# already is the claim scan's or the sweeps'; what is later than the caller
# waits does not matter to it), so each branch reads a bounded index range:
# the leases and retry windows that end within the horizon (their indexes, or
# the endpoint's live rows), and per queue of the scope the claim index's pool
# lane, level by level, whose first entry past now is its minimum; and when
# an empty rate bucket (or a shard of one) of the scope holds a whole token
# again (a rate window opens: admission, CONTRACT §17); and when a pause
# budget of the scope in force reaches its window's end (CONTRACT §18: its
# pause lifts by itself).
NEXT_DUE_SQL = """
SELECT extract(epoch FROM least(
    (SELECT min(t.lease_expires_at) FROM todos t
      WHERE t.state = 'claimed'
        AND t.lease_expires_at > statement_timestamp()
        AND t.lease_expires_at <= statement_timestamp()
                                  + make_interval(secs => %(within)s)
        AND t.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))
        AND t.attempt < t.max_attempts AND t.cancel_request IS NULL
        AND NOT EXISTS (
            SELECT 1 FROM queues p
             WHERE p.endpoint_id = t.endpoint_id AND p.name = t.queue
               AND p.paused_at IS NOT NULL)),
    (SELECT min(t.next_retry_at) FROM todos t
      WHERE t.state = 'failed'
        AND t.next_retry_at > statement_timestamp()
        AND t.next_retry_at <= statement_timestamp()
                               + make_interval(secs => %(within)s)
        AND t.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))
        AND NOT EXISTS (
            SELECT 1 FROM queues p
             WHERE p.endpoint_id = t.endpoint_id AND p.name = t.queue
               AND p.paused_at IS NOT NULL)),
    (SELECT min(lane.at) FROM queues q
      CROSS JOIN generate_series(1, 5) AS level (p)
      CROSS JOIN LATERAL (
          SELECT min(t.available_at) AS at FROM todos t
           WHERE t.endpoint_id = q.endpoint_id AND t.queue = q.name
             AND t.state = 'pending' AND coalesce(t.assignee, '') = ''
             AND t.priority = level.p
             AND t.available_at > statement_timestamp()
             AND t.available_at <= statement_timestamp()
                                   + make_interval(secs => %(within)s)) lane
      WHERE q.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR q.name = ANY(%(queues)s::text[]))
        AND q.paused_at IS NULL),
    (SELECT min(refill.at) FROM rate_buckets b
       JOIN queues q ON q.endpoint_id = b.endpoint_id AND q.name = b.queue
      CROSS JOIN LATERAL (
          SELECT CASE WHEN b.group_key = '' THEN q.rate_limit
                      ELSE q.group_rate_limit END AS setting) s
      CROSS JOIN LATERAL (
          SELECT b.refilled_at + make_interval(secs => (1 - b.tokens)
                 * (s.setting->>'per_seconds')::float8
                 / (s.setting->>'count')::float8 * b.shards) AS at) refill
      WHERE b.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR b.queue = ANY(%(queues)s::text[]))
        AND q.paused_at IS NULL AND s.setting IS NOT NULL AND b.tokens < 1
        AND refill.at > statement_timestamp()
        AND refill.at <= statement_timestamp() + make_interval(secs => %(within)s)),
    (SELECT min(b.in_force_until) FROM budgets b
      WHERE b.endpoint_id = %(endpoint_id)s AND b.in_force_until IS NOT NULL
        AND b.in_force_until > statement_timestamp()
        AND b.in_force_until <= statement_timestamp()
                                + make_interval(secs => %(within)s)
        AND b.action = 'pause'
        AND (%(queues)s::text[] IS NULL OR b.queue IS NULL
             OR b.queue = ANY(%(queues)s::text[])))
) - statement_timestamp())::float8
"""


def next_due_steps(scope: Scope, within: float) -> Steps[float | None]:
    """Seconds until a todo of this scope turns claimable with no ring (a
    lease lapses, a retry window or a delay ends), if within ``within``
    seconds; else None."""
    params = {**_scope_params(scope), "within": float(within)}
    row = yield Statement("next_due", NEXT_DUE_SQL, params, "one")
    return row[0] if row is not None else None


next_due = on_django(next_due_steps)
anext_due = on_pool(next_due_steps)


# A claim its client never received (it left while the claim ran), handed back
# as the claim found the todo: claimed → pending with the attempt the claim
# counted taken back, so work nobody was given never moves toward its dead
# letter. Guarded by the claim itself: this endpoint, still claimed, the same
# owner and the claim's own lease token (a lease taken over since is not
# touched). The token is the claim's proof, so a grant narrowed meanwhile does
# not keep the todo out. A cancel request that arrived meanwhile ends it
# canceled instead (claimed → done), as a release would.
UNCLAIM_SQL = f"""
WITH moved AS (
    UPDATE todos
       SET state = CASE WHEN cancel_request IS NULL THEN 'pending' ELSE 'done' END,
           owner = CASE WHEN cancel_request IS NULL THEN NULL ELSE owner END,
           attempt = attempt - 1,
           result = CASE WHEN cancel_request IS NULL THEN result
                         ELSE jsonb_build_object('canceled', cancel_request) END,
           canceled_at = CASE WHEN cancel_request IS NULL THEN canceled_at
                              ELSE now() END,
           lease_expires_at = NULL, updated_at = now()
     WHERE id = %(id)s AND endpoint_id = %(endpoint_id)s AND state = 'claimed'
       AND owner IS NOT DISTINCT FROM %(worker)s AND lease_token = %(token)s
 RETURNING {TODO_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, 'claimed', state, attempt, coalesce(%(worker)s, ''),
           CASE WHEN canceled_at IS NOT NULL THEN 'canceled'
                ELSE %(event_error)s END,
           now()
      FROM moved
)
SELECT {TODO_COLUMNS}, {DOORBELL}, {ENDED_RING} FROM moved
"""

NOT_RECEIVED = "claim not received: the client left before its answer"


def unclaim_steps(scope: Scope, todo: Todo) -> Steps[Todo]:
    """Hand back a claim its client never received: pending, attempt restored.

    ``todo`` is the claim's answer (its owner and lease token guard the
    statement). Conflict when the todo is no longer that claim.
    """
    todo_id = _todo_id(todo.id)
    params = {
        "endpoint_id": _scope_params(scope)["endpoint_id"],
        "id": todo_id,
        "worker": todo.owner,
        "token": todo.lease_token,
        "event_error": NOT_RECEIVED,
    }
    row = yield Statement("unclaim", UNCLAIM_SQL, params, "one")
    if row is None:
        now = yield from _lookup_steps(Scope(scope.endpoint_id), todo_id)
        raise Conflict(
            f"todo is {now.state}; the claim was taken over",
            todo_id=todo_id,
            state=now.state,
        )
    handed_back = Todo.from_row(row)
    tracing.ended(handed_back, "not_received", given_back=True)
    return handed_back


unclaim = on_django(unclaim_steps)
aunclaim = on_pool(unclaim_steps)


LOOKUP_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE id = ANY(%(ids)s::uuid[])
   AND (%(operator)s OR (endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))))
"""


def _lookup_steps(scope: Scope | None, todo_id: str) -> Steps[Todo]:
    """After a zero-row transition: the todo as it is now, or NotFound."""
    found = yield from _lookup_many_steps(scope, [todo_id])
    if todo_id not in found:
        raise NotFound(todo_id=todo_id)
    return found[todo_id]


def _lookup_many_steps(
    scope: Scope | None, todo_ids: Iterable[str]
) -> Steps[dict[str, Todo]]:
    params = {**_scope(scope), "ids": list(todo_ids)}
    rows = yield Statement("classify", LOOKUP_SQL, params)
    return {str(row[0]): Todo.from_row(row) for row in rows}


_lookup = on_django(_lookup_steps)
_lookup_many = on_django(_lookup_many_steps)


# --- Owner transitions and acknowledgements -------------------------------------

OPS = ("complete", "fail", "heartbeat", "release")


@dataclass(frozen=True)
class Ack:
    """One owner action of ``acknowledge_many`` (and of the single transitions).

    ``progress`` and ``checkpoint`` ride on a heartbeat or a release (None
    keeps the last one); ``assignee`` is a release's handoff (``KEEP`` leaves
    the assignment as it is, None hands the todo to the pool) and ``note``
    its message to the next claimant. ``usage`` is the attempt's running
    total ({"input_tokens", "output_tokens", "cost_usd", "model"}).
    """

    op: str
    todo_id: str
    worker: str | None = None
    lease_token: str | None = None
    result: object = None
    error: str | None = None
    lease_seconds: int | None = None
    progress: JSONObject | None = None
    checkpoint: object = None
    # A worker name, None (the pool), or KEEP_ASSIGNEE.
    assignee: object = KEEP_ASSIGNEE
    note: str | None = None
    usage: JSONObject | None = None


# Every owner action — complete, fail, heartbeat, release — of one or many
# todos, in one statement. The actions arrive as parallel arrays; each is
# guarded on its own: in scope, claimed, and either the current lease's token
# or (without a token) the owner's name. Each action that matches moves its
# row, appends its history row, and rings when the todo became pending.
# - complete: done, with its result.
# - fail: below the cap, parked in failed with a backoff window of 30 s
#   doubling per attempt, capped at 15 min (the exponent is bounded so power()
#   cannot overflow); at the cap, a dead letter with no window.
# - heartbeat: the lease extended to now + the action's lease, else the
#   queue's (unless it is 0, SQS's "visible again at once", which extends
#   nothing), else the server's; the token stays. Its progress and checkpoint,
#   when given, replace the last ones.
# - release: the lease handed back now, with the outcome its expiry would have
#   had (pending below the cap, else a dead letter); its assignee (a handoff),
#   note and checkpoint, when given, go with it.
# - usage (CONTRACT §18), on any of them: the delivery's running total; its
#   fields replace the delivery's last ones on the row (attempt_usage), the
#   todo's sum moves by the difference (usage), the history row records it,
#   and ``ledger`` upserts the delivery's one row in usage_ledger, which
#   ``spend`` counts against the budgets it falls under (usage.BUDGET_SPEND).
#   All in this statement: a report counts exactly when its acknowledgement
#   does, and a repeated request that moves nothing writes nothing. Without
#   usage the two functions are not called at all: PostgreSQL cannot inline
#   them, so each call plans its body again (half of a plain
#   acknowledgement's time).
# - under a cancel request (CONTRACT §14), fail and release end the todo
#   canceled instead (claimed → done, ``result`` = {"canceled": request});
#   complete stores the worker's result as usual: the work was finished.
# The last column rings: the doorbell when the todo became pending, the event
# channel when it ended (todo.done, todo.canceled, todo.failed for a dead
# letter), so a creator waiting for the result wakes.
# The rows are fetched by primary key (id = ANY(ids)), never by a join the
# planner might turn into a scan of the table. The lease token stays on the
# row after the lease ends, so a complete repeated with the token that
# completed the todo can be told apart from a superseded one (see _ack_miss).
#
# One action alone (``ONE_ACK_SQL``) is the same statement with its values as
# scalars: psycopg adapts a list parameter in Python, element by element, and
# a single acknowledgement's twelve one-element arrays cost 75 µs of CPU where
# twelve scalars cost 7.
#
# Each action's columns: name, type, and the parameter that carries them.
ACK_FIELDS = (
    ("id", "uuid", "ids"),
    ("op", "text", "ops"),
    ("worker", "text", "workers"),
    ("token", "text", "tokens"),
    ("result", "jsonb", "results"),
    ("error", "text", "errors"),
    ("lease", "int", "leases"),
    ("progress", "jsonb", "progresses"),
    ("checkpoint", "jsonb", "checkpoints"),
    ("handoff", "boolean", "handoffs"),
    ("assignee", "text", "assignees"),
    ("note", "text", "notes"),
    ("usage", "jsonb", "usages"),
)
ACK_PARAMS = tuple(param for _, _, param in ACK_FIELDS)
_MANY_ACTIONS = (
    "SELECT * FROM unnest("
    + ", ".join(f"%({param})s::{kind}[]" for _, kind, param in ACK_FIELDS)
    + ") WITH ORDINALITY AS a ("
    + ", ".join(name for name, _, _ in ACK_FIELDS)
    + ", ord)"
)
_ONE_ACTION = (
    "SELECT "
    + ", ".join(f"%({param})s::{kind} AS {name}" for name, kind, param in ACK_FIELDS)
    + ", 1::bigint AS ord"
)


# Who acknowledged, for the history: the lease holder. Without a token the
# guard matched the owner's name (a.worker); with one, the holder is the row's
# owner, which a release below the cap clears: then the holder the history
# last recorded on the claimed todo (its claim, redelivery or heartbeat; read
# only in that case: coalesce stops at the first value).
ACK_ACTOR = """CASE WHEN a.token IS NULL THEN a.worker
                ELSE coalesce(t.owner,
                     (SELECT e.actor FROM todo_events e
                       WHERE e.todo_id = t.id AND e.to_state = 'claimed'
                       ORDER BY e.id DESC LIMIT 1), '') END"""


# The usage steps of an acknowledgement that carries usage: the ledger's upsert
# and its count against the budgets. An acknowledgement without usage runs
# the statement without them: it would write nothing, and PostgreSQL starts
# every step of a plan whether it writes or not (0.05 ms of CPU a todo).
LEDGER_STEPS = f""", ledger AS (
    INSERT INTO usage_ledger AS l (endpoint_id, queue, group_key, todo_id, delivery,
                                   attempt, input_tokens, output_tokens, cost_usd,
                                   model, reported_at)
    SELECT endpoint_id, queue, group_key, id, deliveries, attempt,
           coalesce((attempt_usage->>'input_tokens')::bigint, 0),
           coalesce((attempt_usage->>'output_tokens')::bigint, 0),
           coalesce((attempt_usage->>'cost_usd')::numeric, 0),
           coalesce(attempt_usage->>'model', ''), now()
      FROM moved
     WHERE reported
    ON CONFLICT (todo_id, delivery) DO UPDATE
       SET input_tokens = EXCLUDED.input_tokens,
           output_tokens = EXCLUDED.output_tokens,
           cost_usd = EXCLUDED.cost_usd, model = EXCLUDED.model,
           reported_at = EXCLUDED.reported_at,
           prev_cost_usd = l.cost_usd,
           prev_tokens = l.input_tokens + l.output_tokens,
           prev_reported_at = l.reported_at
    RETURNING {LEDGER_WRITTEN}
){BUDGET_SPEND}"""


def _ack_sql(actions: str, ids: str, *, ledger: bool) -> str:
    return f"""
WITH action AS (
    {actions}
), moved AS (
    UPDATE todos t
       SET state = CASE
               WHEN a.op = 'complete' THEN 'done'
               WHEN a.op IN ('fail', 'release') AND t.cancel_request IS NOT NULL
                   THEN 'done'
               WHEN a.op = 'fail' THEN 'failed'
               WHEN a.op = 'release' THEN CASE WHEN t.attempt < t.max_attempts
                                               THEN 'pending' ELSE 'failed' END
               ELSE t.state END,
           owner = CASE WHEN a.op = 'release' AND t.attempt < t.max_attempts
                             AND t.cancel_request IS NULL
                        THEN NULL ELSE t.owner END,
           assignee = CASE WHEN a.op = 'release' AND a.handoff THEN a.assignee
                           ELSE t.assignee END,
           result = CASE
               WHEN a.op = 'complete' THEN a.result
               WHEN a.op IN ('fail', 'release') AND t.cancel_request IS NOT NULL
                   THEN jsonb_build_object('canceled', t.cancel_request)
               ELSE t.result END,
           canceled_at = CASE WHEN a.op IN ('fail', 'release')
                                   AND t.cancel_request IS NOT NULL
                              THEN now() ELSE t.canceled_at END,
           last_error = CASE
               WHEN a.op = 'fail' THEN a.error
               WHEN a.op = 'release' AND t.cancel_request IS NOT NULL
                   THEN t.last_error
               WHEN a.op = 'release' AND t.attempt >= t.max_attempts
                   THEN 'released at the attempt cap'
               ELSE t.last_error END,
           lease_expires_at = CASE WHEN a.op = 'heartbeat'
               THEN now() + make_interval(secs => coalesce(
                   a.lease,
                   (SELECT NULLIF(q.lease_seconds, 0) FROM queues q
                     WHERE q.endpoint_id = t.endpoint_id AND q.name = t.queue),
                   %(default_lease)s::int)) END,
           next_retry_at = CASE WHEN a.op = 'fail' AND t.attempt < t.max_attempts
                                     AND t.cancel_request IS NULL
               THEN now() + make_interval(secs => LEAST(
                   30 * power(2, LEAST(GREATEST(t.attempt, 1), 16) - 1), 900)) END,
           progress = CASE WHEN a.op IN ('heartbeat', 'release')
                           THEN coalesce(a.progress, t.progress)
                           ELSE t.progress END,
           checkpoint = CASE WHEN a.op IN ('heartbeat', 'release')
                             THEN coalesce(a.checkpoint, t.checkpoint)
                             ELSE t.checkpoint END,
           note = CASE WHEN a.op = 'release' THEN coalesce(a.note, t.note)
                       ELSE t.note END,
           attempt_usage = CASE WHEN a.usage IS NULL THEN t.attempt_usage
               ELSE switchboard_attempt_usage(
                   t.attempt_usage, t.deliveries, t.attempt, a.usage) END,
           usage = CASE WHEN a.usage IS NULL THEN t.usage
               ELSE switchboard_usage_total(
                   t.usage, t.attempt_usage, t.deliveries, t.attempt, a.usage) END,
           updated_at = now()
      FROM action a
     WHERE t.id = a.id AND t.id = {ids}
       AND (%(operator)s OR (t.endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))))
       AND t.state = 'claimed'
       AND (t.lease_token = a.token OR (a.token IS NULL AND t.owner = a.worker))
 RETURNING {T_COLUMNS}, a.ord, a.op, {ACK_ACTOR} AS actor,
           CASE WHEN t.canceled_at IS NOT NULL AND a.op <> 'complete'
                    THEN 'canceled'
                WHEN a.op = 'fail' THEN a.error
                WHEN a.op = 'release' THEN coalesce(a.note, '')
                ELSE '' END AS event_error,
           a.usage IS NOT NULL AS reported
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at, usage)
    SELECT id, endpoint_id, 'claimed', state, attempt, actor, event_error, now(),
           CASE WHEN reported THEN attempt_usage END
      FROM moved
){LEDGER_STEPS if ledger else ""}
SELECT {TODO_COLUMNS}, ord,
       CASE WHEN state = 'pending' THEN pg_notify('switchboard_todo_ready',
               json_build_object('id', id, 'endpoint_id', endpoint_id,
                                 'queue', queue)::text)
            WHEN state = 'done' OR (state = 'failed' AND next_retry_at IS NULL)
            THEN pg_notify('switchboard_todo_event', json_build_object(
               'event', CASE WHEN canceled_at IS NOT NULL THEN 'todo.canceled'
                             WHEN state = 'done' THEN 'todo.done'
                             ELSE 'todo.failed' END,
               'id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text) END
  FROM moved
"""


ACK_SQL = _ack_sql(_MANY_ACTIONS, "ANY(%(ids)s::uuid[])", ledger=True)
ONE_ACK_SQL = _ack_sql(_ONE_ACTION, "%(ids)s::uuid", ledger=True)
ACK_NO_USAGE_SQL = _ack_sql(_MANY_ACTIONS, "ANY(%(ids)s::uuid[])", ledger=False)
ONE_ACK_NO_USAGE_SQL = _ack_sql(_ONE_ACTION, "%(ids)s::uuid", ledger=False)

OWNED = "only the current lease owner may do this to a claimed todo"


# One validated action as ACK_FIELDS lists its values: id, op, worker, token,
# result, error, lease, progress, checkpoint, handoff, assignee, note, usage.
BoundAck = tuple[
    str,
    str,
    str | None,
    str | None,
    str | None,
    str,
    int | None,
    str | None,
    str | None,
    bool,
    str | None,
    str | None,
    str | None,
]


def _bind_ack(action: Ack) -> BoundAck:
    """Validate one action; return its array values (ValueError/NotFound if bad)."""
    if action.op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    todo_id = _todo_id(action.todo_id)
    if action.lease_token is None and not action.worker:
        raise ValueError("worker or lease_token is required")
    if action.lease_token is not None and not isinstance(action.lease_token, str):
        raise ValueError("lease_token must be a string")
    lease = _lease(action.lease_seconds) if action.op == "heartbeat" else None
    result = None
    if action.op == "complete" and action.result is not None:
        result = json.dumps(action.result)
    error = (action.error or "") if action.op == "fail" else ""
    carries = action.op in ("heartbeat", "release")
    progress = _progress(action.progress) if carries else None
    checkpoint = _checkpoint(action.checkpoint) if carries else None
    handoff = action.op == "release" and action.assignee is not KEEP_ASSIGNEE
    assignee = _assignee(action.assignee) if handoff else None
    note = (
        _text("note", action.note, MAX_NOTE_CHARS) if action.op == "release" else None
    )
    return (
        todo_id,
        action.op,
        action.worker,
        action.lease_token,
        result,
        error,
        lease,
        progress,
        checkpoint,
        handoff,
        assignee,
        note,
        usage_json(action.usage),
    )


def _progress(progress: object) -> str | None:
    """Validate a heartbeat's progress ({"message", "fraction"}); return its JSON."""
    if progress is None:
        return None
    if not isinstance(progress, dict) or set(progress) - {"message", "fraction"}:
        raise ValueError("progress must be an object with message and fraction")
    message = _text(
        "progress.message", progress.get("message"), MAX_PROGRESS_MESSAGE_CHARS
    )
    fraction = progress.get("fraction")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError("progress.fraction must be a number from 0 to 1")
        if not 0 <= fraction <= 1:
            raise ValueError("progress.fraction must be a number from 0 to 1")
    return json.dumps({"message": message or "", "fraction": fraction})


def _checkpoint(checkpoint: object) -> str | None:
    """Return a checkpoint's JSON (None keeps the last one); TooLarge over 64 KiB."""
    if checkpoint is None:
        return None
    return _bounded_json("checkpoint", checkpoint, MAX_CHECKPOINT_BYTES)


def _bounded_json(field: str, value: object, limit: int) -> str:
    encoded = json.dumps(value)
    if len(encoded.encode()) > limit:
        raise TooLarge(field, limit)
    return encoded


def _assignee(assignee: object) -> str | None:
    if assignee is not None and (not isinstance(assignee, str) or not assignee):
        raise ValueError("assignee must be a worker name or null")
    return assignee


def _text(field: str, value: object, limit: int) -> str | None:
    """Validate an optional bounded string; return it (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string")
    if len(value) > limit:
        raise ValueError(f"{field} must be at most {limit} characters")
    return value


def _ack_statement(
    scope: Scope | None, bound: list[BoundAck]
) -> tuple[str, dict[str, object]]:
    """The statement for ``bound`` and its parameters: ONE_ACK_SQL's scalars
    for one action, ACK_SQL's arrays for more; without the usage steps when
    no action carries usage."""
    params = {**_scope(scope), **_defaults()}
    reported = any(values[-1] is not None for values in bound)
    if len(bound) == 1:
        params.update(zip(ACK_PARAMS, bound[0], strict=True))
        return (ONE_ACK_SQL if reported else ONE_ACK_NO_USAGE_SQL), params
    columns = zip(*bound, strict=True)
    params.update(zip(ACK_PARAMS, map(list, columns), strict=True))
    return (ACK_SQL if reported else ACK_NO_USAGE_SQL), params


def bind_acks(scope: Scope, actions: Iterable[Ack]) -> tuple[str, dict[str, object]]:
    """Return the statement and parameters the store runs for valid actions
    (the benchmarks run them too)."""
    return _ack_statement(scope, [_bind_ack(action) for action in actions])


def acknowledge_many_steps(
    scope: Scope, actions: Iterable[Ack]
) -> Steps[list[Todo | Exception]]:
    """Apply 1–100 owner actions; return one Todo or exception per action, in order.

    One statement moves every action that holds its lease; one lookup then
    classifies the rest: NotFound (absent, foreign, malformed id),
    LeaseSuperseded (a token that is not the current lease's), Conflict (not
    claimed, or not the owner), ValueError (a bad op or value). A complete
    repeated with the token that completed the todo returns the done todo.
    """
    batch = list(actions)
    if not 1 <= len(batch) <= MAX_ACK_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_ACK_BATCH} actions")
    return (yield from _acknowledge(scope, batch))


acknowledge_many = on_django(acknowledge_many_steps)
aacknowledge_many = on_pool(acknowledge_many_steps)


def _acknowledge(scope: Scope, actions: list[Ack]) -> Steps[list[Todo | Exception]]:
    results: list[Todo | Exception | None] = [None] * len(actions)
    bound: list[tuple[int, BoundAck]] = []
    for index, action in enumerate(actions):
        try:
            bound.append((index, _bind_ack(action)))
        except (ValueError, TypeError, NotFound) as exc:
            results[index] = exc if not isinstance(exc, TypeError) else ValueError(exc)
    if not bound:
        return _settled(results)
    statement, params = _ack_statement(scope, [values for _, values in bound])
    moved: dict[int, Todo] = {}
    for row in (yield Statement("acknowledge", statement, params)):
        moved[row[len(row) - 2] - 1] = Todo.from_row(row)
    missed = [(i, values) for i, (_, values) in enumerate(bound) if i not in moved]
    found: dict[str, Todo] = {}
    if missed:
        ids = [values[0] for _, values in missed]
        found = yield from _lookup_many_steps(scope, ids)
    for position, (index, _) in enumerate(bound):
        if position in moved:
            results[index] = moved[position]
    for position, values in missed:
        index = bound[position][0]
        results[index] = _ack_miss(actions[index], values[0], found.get(values[0]))
    if tracing.enabled():
        traced = [(actions[bound[p][0]], todo) for p, todo in moved.items()]
        yield from _trace_acks(traced)
    return _settled(results)


def _trace_acks(moved: list[tuple[Ack, Todo]]) -> Steps[None]:
    """Each acknowledgement's trace: a heartbeat's progress is an event of its
    delivery; complete, fail and release end the delivery's process span."""
    from .traces import record_trace_event_steps

    for action, todo in moved:
        if action.op == "heartbeat":
            if action.progress is not None:
                progress = todo.progress or {}
                event = tracing.event(
                    tracing.PROGRESS,
                    todo.deliveries,
                    **{
                        "progress.message": progress.get("message"),
                        "progress.fraction": progress.get("fraction"),
                    },
                )
                yield from record_trace_event_steps(todo, event)
            continue
        tracing.ended(
            todo,
            "canceled" if todo.is_canceled else action.op,
            settle=tracing.settle_name(todo, action.op),
            error=todo.last_error if action.op == "fail" else None,
            worker=action.worker,
        )


def _ack_miss(action: Ack, todo_id: str, todo: Todo | None) -> Todo | StoreError:
    """Classify an action that moved nothing (returned, never raised)."""
    if todo is None:
        return NotFound(todo_id=todo_id)
    if action.lease_token is not None:
        same = todo.lease_token is not None and hmac.compare_digest(
            todo.lease_token, action.lease_token
        )
        if not same:
            return LeaseSuperseded(todo_id=todo_id, state=todo.state)
        if action.op == "complete" and todo.state == "done":
            # A retried acknowledgement: the first one completed the todo.
            return todo
        return Conflict(
            f"todo is {todo.state}; its lease has ended",
            todo_id=todo_id,
            state=todo.state,
        )
    return Conflict(f"todo is {todo.state}; {OWNED}", todo_id=todo_id, state=todo.state)


def _one_ack(scope: Scope, action: Ack) -> Steps[Todo]:
    (result,) = yield from _acknowledge(scope, [action])
    if isinstance(result, Exception):
        raise result
    return result


def heartbeat_steps(
    scope: Scope,
    todo_id: str,
    worker: str | None,
    *,
    lease_seconds: int | None = None,
    lease_token: str | None = None,
    progress: JSONObject | None = None,
    checkpoint: object = None,
    usage: JSONObject | None = None,
) -> Steps[Todo]:
    """Extend the lease to now + lease_seconds (default: the queue's, the server's).

    ``progress`` ({"message", "fraction"}) and ``checkpoint`` (JSON, at most
    64 KiB), when given, replace the last ones; the answer carries
    ``cancel_requested`` so the owner learns of a cancel request. ``usage``
    is the attempt's running total (it replaces the attempt's last report).
    """
    return (
        yield from _one_ack(
            scope,
            Ack(
                "heartbeat",
                todo_id,
                worker,
                lease_token,
                lease_seconds=lease_seconds,
                progress=progress,
                checkpoint=checkpoint,
                usage=usage,
            ),
        )
    )


def complete_todo_steps(
    scope: Scope,
    todo_id: str,
    worker: str | None,
    *,
    result: object = None,
    lease_token: str | None = None,
    usage: JSONObject | None = None,
) -> Steps[Todo]:
    """Mark the lease holder's claimed todo done, storing its result (and
    the attempt's final ``usage``)."""
    return (
        yield from _one_ack(
            scope,
            Ack("complete", todo_id, worker, lease_token, result=result, usage=usage),
        )
    )


def fail_todo_steps(
    scope: Scope,
    todo_id: str,
    worker: str | None,
    *,
    error: str = "",
    lease_token: str | None = None,
    usage: JSONObject | None = None,
) -> Steps[Todo]:
    """Fail the lease holder's todo: schedule a retry, or dead-letter at the cap.

    Under a cancel request the todo ends canceled instead. ``usage`` is the
    attempt's final figure.
    """
    return (
        yield from _one_ack(
            scope, Ack("fail", todo_id, worker, lease_token, error=error, usage=usage)
        )
    )


def release_todo_steps(
    scope: Scope,
    todo_id: str,
    worker: str | None,
    *,
    lease_token: str | None = None,
    assignee: object = KEEP_ASSIGNEE,
    note: str | None = None,
    checkpoint: object = None,
) -> Steps[Todo]:
    """Give the lease back now: pending below the cap, else dead-letter.

    A handoff in the same transition: ``assignee`` names the worker that may
    claim it next (None = the pool; left out = as it was), ``note`` tells the
    next claimant why, ``checkpoint`` is where to resume. Under a cancel
    request the todo ends canceled instead.
    """
    return (
        yield from _one_ack(
            scope,
            Ack(
                "release",
                todo_id,
                worker,
                lease_token,
                assignee=assignee,
                note=note,
                checkpoint=checkpoint,
            ),
        )
    )


heartbeat = on_django(heartbeat_steps)
aheartbeat = on_pool(heartbeat_steps)
complete_todo = on_django(complete_todo_steps)
acomplete_todo = on_pool(complete_todo_steps)
fail_todo = on_django(fail_todo_steps)
afail_todo = on_pool(fail_todo_steps)
release_todo = on_django(release_todo_steps)
arelease_todo = on_pool(release_todo_steps)


# An operator's release of a stuck claim, whoever holds it.
RELEASE_ANY_SQL = f"""
WITH moved AS (
    UPDATE todos
       SET state = CASE WHEN attempt < max_attempts THEN 'pending' ELSE 'failed' END,
           owner = CASE WHEN attempt < max_attempts THEN NULL ELSE owner END,
           last_error = CASE WHEN attempt < max_attempts THEN last_error
                             ELSE 'released at the attempt cap' END,
           lease_expires_at = NULL, next_retry_at = NULL, updated_at = now()
     WHERE id = %(id)s AND state = 'claimed'
 RETURNING {TODO_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, 'claimed', state, attempt, %(actor)s,
           'released by an operator', now()
      FROM moved
)
SELECT {TODO_COLUMNS},
       CASE WHEN state = 'pending' THEN pg_notify('switchboard_todo_ready',
           json_build_object('id', id, 'endpoint_id', endpoint_id,
                             'queue', queue)::text) END
  FROM moved
"""


def release_todo_any_endpoint(given_id: str, *, actor: str = "operator") -> Todo:
    """Release a stuck claim whoever holds it (operator Board)."""
    todo_id = _todo_id(given_id)
    row = _run(
        "release_todo", RELEASE_ANY_SQL, {"id": todo_id, "actor": actor}, fetch="one"
    )
    if row is None:
        todo = _lookup(None, todo_id)
        raise Conflict(
            f"todo is {todo.state}; only a claimed todo can be released",
            todo_id=todo_id,
            state=todo.state,
        )
    released = Todo.from_row(row)
    tracing.ended(released, "release", settle=tracing.settle_name(released, "release"))
    return released


# --- Retry ----------------------------------------------------------------------

# Requeue a failed todo now (a dead letter, or a parked retry before its
# window). A dead letter left the dedupe index; if a newer live todo took its
# key, the requeue collides there (IntegrityError on todos_dedupe_idx).
RETRY_SQL = f"""
WITH moved AS (
    UPDATE todos SET state = 'pending', owner = NULL, lease_expires_at = NULL,
                     next_retry_at = NULL, dismissed_at = NULL, updated_at = now()
     WHERE id = %(id)s
       AND (%(operator)s OR (endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))))
       AND state = 'failed'
 RETURNING {TODO_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, 'failed', state, attempt, %(actor)s, '', now()
      FROM moved
)
SELECT {TODO_COLUMNS},
       pg_notify('switchboard_todo_ready',
           json_build_object('id', id, 'endpoint_id', endpoint_id,
                             'queue', queue)::text)
  FROM moved
"""

DUPLICATE_ON_RETRY = (
    "another live todo holds the same idempotency key; finish or retire it first"
)
DEDUPE_INDEX = "todos_dedupe_idx"


def retry_todo(scope: Scope, todo_id: str, *, actor: str = "agent") -> Todo:
    """Requeue a failed todo of this scope now (dead letter or open window)."""
    return _retry(scope, todo_id, actor)


def retry_todo_any_endpoint(todo_id: str, *, actor: str = "operator") -> Todo:
    """Requeue a failed todo of any endpoint now (operator Board)."""
    return _retry(None, todo_id, actor)


def is_dedupe_violation(exc: BaseException) -> bool:
    """Say whether an IntegrityError is a collision in todos_dedupe_idx."""
    cause = getattr(exc, "__cause__", None)
    diag = getattr(cause, "diag", None)
    constraint: object = getattr(diag, "constraint_name", None)
    return constraint == DEDUPE_INDEX


def _retry(scope: Scope | None, given_id: str, actor: str) -> Todo:
    todo_id = _todo_id(given_id)
    params = {**_scope(scope), "id": todo_id, "actor": actor}
    try:
        # A savepoint, so a dedupe collision does not poison a caller's transaction.
        with transaction.atomic():
            row = _run("retry_todo", RETRY_SQL, params, fetch="one")
    except IntegrityError as exc:
        if not is_dedupe_violation(exc):
            raise
        # Another live todo took the dead letter's key.
        raise KeyHeld(DUPLICATE_ON_RETRY, todo_id=todo_id, state="failed") from exc
    if row is None:
        todo = _lookup(scope, todo_id)
        raise Conflict(
            f"todo is {todo.state}; only a failed todo can be retried",
            todo_id=todo_id,
            state=todo.state,
        )
    return Todo.from_row(row)
