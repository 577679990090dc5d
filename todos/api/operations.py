"""The agent operations the JSON API and the MCP tools share.

Each reads validated ``Fields`` and calls the store, so both surfaces accept
the same input and answer the same outcomes: list a page, create (one, a
batch, or replacing a duplicate), claim the next todo (a long poll), ask,
acknowledge a batch, and set a queue's or a group's admission settings.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from django.http import HttpRequest

from todos import store
from todos.api import fields as table
from todos.api.fields import ACK_OPS, Fields, Operation
from todos.api.plumbing import aauthenticate, api_error_for, bad_request
from todos.store import admission
from todos.telemetry.tracing import TraceContext
from todos.waiting import longpoll
from todos.web import threads

# A response body, and one result of a batch: JSON values.
type Body = dict[str, Any]


def list_page(scope: store.Scope, fields: Fields) -> Body:
    """List a scope's todos from validated fields (queue, state, limit, cursor).

    Shared by the JSON view and the MCP tool, so both accept the same input.
    Returns the response body: ``{"todos": [...], "next_cursor": ...}``.
    """
    query = fields.read(table.LIST_TODOS)
    try:
        page = store.list_todos(scope, **{**query, "cursor": query["cursor"] or None})
    except ValueError as exc:
        raise bad_request(f"cursor: {exc}") from exc
    return {
        "todos": [todo.to_dict() for todo in page.todos],
        "next_cursor": page.next_cursor,
    }


def create_arguments(fields: Fields) -> tuple[dict[str, Any], bool]:
    """Return store.create_todo's keyword arguments (but the actor) from fields,
    and whether to replace the key's duplicate (``replace``; without an
    ``idempotency_key`` there is no duplicate to replace)."""
    arguments = fields.read(table.CREATE_TODO)
    replace = arguments.pop("replace")
    return arguments, replace and arguments["idempotency_key"] is not None


def transition(
    move: Callable[..., store.Todo],
    operation: Operation,
    scope: store.Scope,
    todo_id: str,
    fields: Fields,
) -> store.Todo:
    """Apply an owner transition (heartbeat, complete, fail, release, ask) with
    the operation's validated fields; shared by the JSON views and MCP tools."""
    arguments = fields.read(operation)
    fields.owner(arguments)
    try:
        return move(scope, todo_id, **arguments)
    except ValueError as exc:
        raise _refused(exc) from exc


async def atransition(
    move: Callable[..., Awaitable[store.Todo]],
    operation: Operation,
    scope: store.Scope,
    todo_id: str,
    fields: Fields,
) -> store.Todo:
    """``transition`` with the store's async twin (``store.acomplete_todo``, …)."""
    arguments = fields.read(operation)
    fields.owner(arguments)
    try:
        return await move(scope, todo_id, **arguments)
    except ValueError as exc:
        raise _refused(exc) from exc


def _refused(exc: ValueError) -> Exception:
    # The store names the field it refused (choices, answer_schema, …).
    return api_error_for(exc) or bad_request(str(exc))


def create_todo(
    scope: store.Scope,
    fields: Fields,
    *,
    actor: str,
    trace_context: TraceContext | None = None,
) -> tuple[store.Todo, bool]:
    """Enqueue a todo from validated fields; return (todo, created).

    With ``replace`` the key's pending live duplicate is canceled first (a
    claimed one gets a cancel request, and the create answers 409 naming it).
    Shared by the JSON view and the MCP tool, so both accept the same input.
    ``trace_context`` is the W3C context the request carried (todos.telemetry.tracing).
    """
    arguments, replace = create_arguments(fields)
    arguments["trace_context"] = trace_context
    if replace:
        return store.create_replacing(scope, **arguments, actor=actor)
    return store.create_todo(scope, **arguments, actor=actor)


def checked[R](call: Callable[..., R], *args: object, **kwargs: object) -> R:
    """Run a store call; a ValueError it raises (it names the field) is a 400."""
    try:
        return call(*args, **kwargs)
    except ValueError as exc:
        raise api_error_for(exc) or bad_request(str(exc)) from exc


def create_schedule(scope: store.Scope, fields: Fields) -> store.Schedule:
    """Create a schedule from validated fields (the JSON view and the MCP tool)."""
    values = fields.read(table.CREATE_SCHEDULE)
    return checked(store.create_schedule, scope, **values)


def schedule_page(scope: store.Scope, fields: Fields) -> Body:
    """A page of a scope's schedules by name: ``{"schedules", "next_cursor"}``."""
    query = fields.read(table.LIST_SCHEDULES)
    try:
        page, cursor = store.list_schedules(
            scope, limit=query["limit"], cursor=query["cursor"] or None
        )
    except ValueError as exc:
        raise bad_request(f"cursor: {exc}") from exc
    return {"schedules": [s.to_dict() for s in page], "next_cursor": cursor}


class ClaimNext(longpoll.LongPoll):
    """A ``claim_next`` of the JSON API or MCP: a long poll over the caller's
    scope (one queue, if given), one todo or up to ``max_todos``.
    ``read`` takes its fields; a surface's ``start`` authenticates first."""

    worker: str
    lease: int | None

    def __init__(self, request: HttpRequest | None) -> None:
        # None for an MCP tools/call: the transport sets it before the wait.
        self.request = request
        self.limit: int | None = None

    def read(self, fields: Fields) -> "ClaimNext":
        claim = fields.read(table.CLAIM_NEXT)
        self.worker, self.queue = claim["worker"], claim["queue"]
        self.lease, self.wait = claim["lease_seconds"], claim["wait_seconds"]
        self.limit = claim["max_todos"]
        return self

    async def revalidate(self) -> store.Scope:
        # A revoked or re-keyed token ends the wait (401); a new grant applies
        # from now on, and a named queue outside it ends the wait (403).
        assert self.request is not None  # the surface set it before the wait
        scope = store.Scope.for_endpoint(await aauthenticate(self.request))
        if self.queue is not None and not scope.covers(self.queue):
            raise store.QueueNotGranted(self.queue)
        return scope

    async def attempt(self, scope: store.Scope) -> longpoll.Claimed:
        if self.limit is not None:
            return await store.aclaim_many(
                scope,
                self.worker,
                limit=self.limit,
                queue=self.queue,
                lease_seconds=self.lease,
            )
        return await store.aclaim_next(
            scope, self.worker, queue=self.queue, lease_seconds=self.lease
        )


def _failure(exc: Exception) -> Body:
    """Render a per-item failure of a batch: its status, code and detail,
    as the single call would answer it (a field over its limit is 413)."""
    error = api_error_for(exc)
    if error is None and isinstance(exc, ValueError):
        # The store refused an item's arguments (the views check them first).
        error = bad_request(str(exc))
    if error is None:
        raise exc
    if error.status == 503:
        # The database went away mid-batch: the whole request answers 503.
        raise error
    return {"status": error.status, "error": error.code, "detail": error.detail}


def create_batch(
    scope: store.Scope,
    fields: Fields,
    *,
    actor: str,
    trace_context: TraceContext | None = None,
) -> Body:
    """Enqueue 1..100 todos (``{"todos": [...]}``); return the results body.

    Every item is validated before any is created: a bad field answers 400 for
    the whole batch (naming ``todos[i].field``) and creates nothing. Each valid
    item is then created and deduplicated on its own (CONTRACT §10); what the
    store refuses for one item (a queue outside the grant, a held key) is that
    item's result.
    """
    items: list[dict[str, Any]] = []
    replacing: set[int] = set()
    for index, item in enumerate(fields.read(table.CREATE_MANY)["todos"]):
        arguments, replace = create_arguments(Fields(item, prefix=f"todos[{index}]."))
        arguments["trace_context"] = trace_context
        items.append(arguments)
        if replace:
            replacing.add(index)
    plain = [item for i, item in enumerate(items) if i not in replacing]
    ordered = iter(store.create_many(scope, plain, actor=actor) if plain else ())
    results: list[Body] = []
    for index, item in enumerate(items):
        outcome: tuple[store.Todo, bool] | Exception
        if index in replacing:
            try:
                outcome = store.create_replacing(scope, **item, actor=actor)
            except (store.StoreError, ValueError) as exc:
                outcome = exc
        else:
            outcome = next(ordered)
        if isinstance(outcome, Exception):
            results.append(_failure(outcome))
        else:
            todo, created = outcome
            results.append(
                {
                    "status": 201 if created else 200,
                    "todo": todo.to_dict(),
                    "created": created,
                }
            )
    return {"results": results}


# What each owner op of a batch passes on besides the owner.
ACK_USES = {
    "complete": ("result", "usage"),
    "fail": ("error", "usage"),
    "heartbeat": ("lease_seconds", "progress", "checkpoint", "usage"),
    "release": ("assignee", "note", "checkpoint"),
}


def _ack(action: dict[str, Any], fields: Fields) -> store.Ack:
    """Return the store.Ack of one owner action from its validated fields."""
    fields.owner(action)
    extra = {name: action[name] for name in ACK_USES[action["op"]]}
    return store.Ack(
        action["op"],
        action["id"],
        worker=action["worker"],
        lease_token=action["lease_token"],
        **extra,
    )


def cancel_status(todo: store.Todo) -> int:
    """200 when the todo ended canceled now; 202 when its owner was asked."""
    return 202 if todo.state == "claimed" else 200


def acknowledge_batch(scope: store.Scope, fields: Fields) -> Body:
    """Apply 1..100 owner transitions (``POST /api/v1/todos/batch``).

    Every action is validated before any is applied: an unknown ``op``, a bad
    field, or an action with neither worker nor lease_token answers 400 for the
    whole batch (naming ``actions[i].field``) and applies nothing; an action
    without a worker is the batch's ``worker``'s. Each action is then applied
    on its own and answers the status the single call would have had (200,
    404, 409; 400 for what the store refuses).
    """
    batch = _Batch(fields)
    outcomes: dict[int, store.Todo | Exception] = {}
    if batch.acks:
        moved = store.acknowledge_many(scope, list(batch.acks.values()))
        outcomes.update(zip(batch.acks, moved, strict=True))
    if batch.cancels:
        outcomes.update(batch.cancel(scope))
    return batch.results(outcomes)


async def aacknowledge_batch(scope: store.Scope, fields: Fields) -> Body:
    """``acknowledge_batch`` for an async view: the acknowledgements awaited in
    the event loop, the cancels (which may take a transaction) in a pooled
    thread."""
    batch = _Batch(fields)
    outcomes: dict[int, store.Todo | Exception] = {}
    if batch.acks:
        moved = await store.aacknowledge_many(scope, list(batch.acks.values()))
        outcomes.update(zip(batch.acks, moved, strict=True))
    if batch.cancels:
        outcomes.update(await threads.run_pooled(batch.cancel, scope))
    return batch.results(outcomes)


class _Batch:
    """A batch's actions, each validated (else the whole batch is a 400):
    the owner actions and the cancels, by their index in the batch."""

    def __init__(self, fields: Fields) -> None:
        batch = fields.read(table.BATCH)
        self.default_worker, self.actions = batch["worker"], batch["actions"]
        self.acks: dict[int, store.Ack] = {}
        self.cancels: dict[int, tuple[str, str | None]] = {}
        for index, action in enumerate(self.actions):
            if action.get("op") not in ACK_OPS:
                raise bad_request(
                    f"actions[{index}].op: must be one of {', '.join(ACK_OPS)}"
                )
            # Every field an action may carry is checked, whatever its op (a
            # bad one is refused even where the op would not use it).
            action_fields = Fields(
                action, prefix=f"actions[{index}].", default_worker=self.default_worker
            )
            checked = action_fields.read(table.ACTION)
            if checked["op"] == "cancel":
                # A cancel needs no owner.
                self.cancels[index] = checked["id"], checked["reason"]
            else:
                self.acks[index] = _ack(checked, action_fields)

    def cancel(self, scope: store.Scope) -> dict[int, store.Todo | Exception]:
        """Apply the cancels (sync: Django's connection)."""
        moved = store.cancel_many(
            scope, list(self.cancels.values()), worker=self.default_worker
        )
        return dict(zip(self.cancels, moved, strict=True))

    def results(self, outcomes: dict[int, store.Todo | Exception]) -> Body:
        """The response body: one result per action, in order."""
        results: list[Body] = []
        for index in range(len(self.actions)):
            # The id as the caller sent it: a foreign id and a never-minted
            # one answer alike.
            if index in self.acks:
                todo_id = self.acks[index].todo_id
            else:
                todo_id = self.cancels[index][0]
            outcome = outcomes[index]
            if isinstance(outcome, Exception):
                results.append({"id": todo_id, **_failure(outcome)})
                continue
            status = cancel_status(outcome) if index in self.cancels else 200
            results.append({"id": todo_id, "status": status, "todo": outcome.to_dict()})
        return {"results": results}


# --- Admission (CONTRACT §17) -----------------------------------------------------

# The queue settings §10's update takes; the rest are admission's.
BASIC_SETTINGS = ("lease_seconds", "max_attempts", "delay_seconds")


def _given(fields: Fields, operation: Operation) -> dict[str, Any]:
    """The validated values of the fields given: a setting left out is kept,
    and null is a value (it clears the setting)."""
    return {
        field.name: fields.value(field)
        for field in operation
        if field.name in fields.data
    }


def update_queue(scope: store.Scope, name: str, fields: Fields) -> store.QueueInfo:
    """Change the settings given of a queue, making it on first use (the JSON
    view and the MCP tool); a setting the store refuses is a 400."""
    given = _given(fields, table.QUEUE_SETTINGS)
    basic = {key: given.pop(key) for key in BASIC_SETTINGS if key in given}
    checked(store.ensure_queue, scope, name)
    if basic:
        checked(store.update_queue, scope, name, **basic)
    checked(admission.set_admission, scope, name, **given)
    return store.get_queue(scope, name)


def groups_page(scope: store.Scope, name: str, fields: Fields) -> Body:
    """A page of a queue's groups by name: ``{"groups", "next_after"}``."""
    page = fields.read(table.GROUPS_PAGE)
    store.get_queue(scope, name)
    found = admission.list_groups(
        scope, name, after=page["after"] or "", limit=page["limit"]
    )
    more = len(found) == page["limit"]
    return {
        "groups": [group.to_dict() for group in found],
        "next_after": found[-1].group if more else None,
    }


def set_group(
    scope: store.Scope, name: str, group: str, fields: Fields
) -> admission.GroupInfo:
    """Set a group's override (concurrency, weight, paused), making the queue
    on first use."""
    given = _given(fields, table.GROUP_SETTINGS)
    checked(store.ensure_queue, scope, name)
    return checked(admission.set_group, scope, name, group, **given)
