"""The agent operations the JSON API and the MCP tools share.

Each reads validated ``Fields`` and calls the store, so both surfaces accept
the same input and answer the same outcomes: list a page, create (one, a
batch, or replacing a duplicate), claim the next todo (a long poll), ask, and
acknowledge a batch.
"""

from todos import longpoll, store
from todos.api.plumbing import (
    ApiError,
    Fields,
    api_error_for,
    authenticate,
    bad_request,
)

ACK_OPS = ("complete", "fail", "heartbeat", "release", "cancel")


def list_page(scope, fields):
    """List a scope's todos from validated fields (queue, state, limit, cursor).

    Shared by the JSON view and the MCP tool, so both accept the same input.
    Returns the response body: ``{"todos": [...], "next_cursor": ...}``.
    """
    queue = fields.text("queue")
    state = fields.text("state")
    if state is not None and state not in store.STATE_FILTERS:
        raise bad_request(f"state: must be one of {', '.join(store.STATE_FILTERS)}")
    limit = fields.integer("limit", minimum=1, maximum=200, default=50)
    cursor = fields.text("cursor", max_length=500, empty=True) or None
    try:
        page = store.list_todos(
            scope, queue=queue, state=state, limit=limit, cursor=cursor
        )
    except ValueError as exc:
        raise bad_request(f"cursor: {exc}") from exc
    return {
        "todos": [todo.to_dict() for todo in page.todos],
        "next_cursor": page.next_cursor,
    }


def create_arguments(fields):
    """Return store.create_todo's keyword arguments (but the actor) from fields."""
    return {
        "queue": fields.text("queue", required=True),
        "title": fields.text("title", max_length=store.MAX_TITLE_CHARS, empty=True)
        or "",
        "payload": fields.json("payload"),
        "idempotency_key": fields.text(
            "idempotency_key", max_length=store.MAX_KEY_CHARS
        ),
        "assignee": fields.text("assignee"),
        # None: the queue's setting, else SWITCHBOARD_MAX_ATTEMPTS.
        "max_attempts": fields.integer(
            "max_attempts", minimum=1, maximum=store.MAX_ATTEMPTS_CAP
        ),
        "delay_seconds": fields.integer(
            "delay_seconds", minimum=0, maximum=store.MAX_DELAY_SECONDS
        ),
    }


def ask_arguments(fields):
    """Return store.ask's keyword arguments (the question and its options)."""
    return {
        "question": fields.text(
            "question", required=True, max_length=store.MAX_QUESTION_CHARS
        ),
        "deadline_seconds": fields.integer(
            "deadline_seconds",
            minimum=store.MIN_DEADLINE_SECONDS,
            maximum=store.MAX_DEADLINE_SECONDS,
        ),
        "choices": fields.choices(),
        "answer_schema": fields.json("answer_schema"),
        "checkpoint": fields.checkpoint(),
        "return_to": fields.text("return_to") or "me",
    }


def replace_requested(fields):
    """Read ``replace`` (a boolean). Without an ``idempotency_key`` there is no
    duplicate to replace: the create is a plain one."""
    replace = fields.data.get("replace", False)
    if not isinstance(replace, bool):
        raise bad_request(f"{fields.prefix}replace: must be a boolean")
    return replace and bool(fields.data.get("idempotency_key"))


def create_todo(scope, fields, *, actor):
    """Enqueue a todo from validated fields; return (todo, created).

    With ``replace`` the key's pending live duplicate is canceled first (a
    claimed one gets a cancel request, and the create answers 409 naming it).
    Shared by the JSON view and the MCP tool, so both accept the same input.
    """
    arguments = create_arguments(fields)
    if replace_requested(fields):
        return store.create_replacing(scope, **arguments, actor=actor)
    return store.create_todo(scope, **arguments, actor=actor)


class ClaimNext(longpoll.LongPoll):
    """A ``claim_next`` of the JSON API or MCP: a long poll over the caller's
    scope (one queue, if given), one todo or up to ``max_todos``.
    ``read`` takes its fields; a surface's ``start`` authenticates first."""

    def __init__(self, request):
        self.request = request
        self.limit = None

    def read(self, fields):
        self.worker, self.queue = fields.worker(), fields.text("queue")
        self.lease, self.wait = fields.lease_seconds(), fields.wait_seconds()
        self.limit = fields.integer(
            "max_todos", minimum=1, maximum=store.MAX_CLAIM_BATCH
        )
        return self

    def revalidate(self):
        # A revoked or re-keyed token ends the wait (401); a new grant applies
        # from now on, and a named queue outside it ends the wait (403).
        scope = store.Scope.for_endpoint(authenticate(self.request))
        if self.queue is not None and not scope.covers(self.queue):
            raise store.QueueNotGranted(self.queue)
        return scope

    def attempt(self, scope):
        if self.limit is not None:
            return store.claim_many(
                scope,
                self.worker,
                limit=self.limit,
                queue=self.queue,
                lease_seconds=self.lease,
            )
        return store.claim_next(
            scope, self.worker, queue=self.queue, lease_seconds=self.lease
        )


def _failure(exc):
    """Render a per-item failure of a batch: its status, code and detail."""
    if isinstance(exc, ValueError):
        # The store refused an item's arguments (the views check them first).
        exc = bad_request(str(exc))
    error = exc if isinstance(exc, ApiError) else api_error_for(exc)
    if error is None:
        raise exc
    if error.status == 503:
        # The database went away mid-batch: the whole request answers 503.
        raise error
    return {"status": error.status, "error": error.code, "detail": error.detail}


def create_batch(scope, fields, *, actor):
    """Enqueue 1..100 todos (``{"todos": [...]}``); return the results body.

    Every item is validated before any is created: a bad field answers 400 for
    the whole batch (naming ``todos[i].field``) and creates nothing. Each valid
    item is then created and deduplicated on its own (CONTRACT §10); what the
    store refuses for one item (a queue outside the grant, a held key) is that
    item's result.
    """
    items, replacing = [], set()
    for index, item in enumerate(fields.items("todos", store.MAX_CREATE_BATCH)):
        item_fields = Fields(item, prefix=f"todos[{index}].")
        items.append(create_arguments(item_fields))
        if replace_requested(item_fields):
            replacing.add(index)
    plain = [item for i, item in enumerate(items) if i not in replacing]
    ordered = iter(store.create_many(scope, plain, actor=actor) if plain else ())
    results = []
    for index, item in enumerate(items):
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


def _action_fields(fields):
    """Check every field a batch action may carry, whatever its op (a bad one is
    refused even where the op would not use it); return them by name."""
    return {
        "id": fields.text("id", required=True, max_length=store.MAX_NAME_CHARS),
        "worker": fields.text("worker"),
        "result": fields.json("result"),
        "error": fields.text("error", max_length=store.MAX_ERROR_CHARS, empty=True)
        or "",
        "lease_seconds": fields.lease_seconds(),
        "progress": fields.progress(),
        "checkpoint": fields.checkpoint(),
        "assignee": fields.handoff(),
        "note": fields.text("note", max_length=store.MAX_NOTE_CHARS, empty=True),
        "reason": fields.text("reason", max_length=store.MAX_REASON_CHARS, empty=True)
        or "",
    }


def _ack(op, fields, default_worker):
    """Return the store.Ack of one owner action from its validated fields."""
    checked = _action_fields(fields)
    worker, token = fields.owner(default_worker)
    uses = {
        "complete": ("result",),
        "fail": ("error",),
        "heartbeat": ("lease_seconds", "progress", "checkpoint"),
        "release": ("assignee", "note", "checkpoint"),
    }[op]
    extra = {name: checked[name] for name in uses}
    return store.Ack(op, checked["id"], worker=worker, lease_token=token, **extra)


def _cancel_action(fields):
    """Return (id, reason) of a batch ``"op": "cancel"`` (no owner needed)."""
    checked = _action_fields(fields)
    fields.lease_token()
    return checked["id"], checked["reason"]


def cancel_status(todo):
    """200 when the todo ended canceled now; 202 when its owner was asked."""
    return 202 if todo.state == "claimed" else 200


def acknowledge_batch(scope, fields, *, default_worker=None):
    """Apply 1..100 owner transitions (``POST /api/v1/todos/batch``).

    Every action is validated before any is applied: an unknown ``op``, a bad
    field, or an action with neither worker nor lease_token answers 400 for the
    whole batch (naming ``actions[i].field``) and applies nothing. Each action
    is then applied on its own and answers the status the single call would
    have had (200, 404, 409; 400 for what the store refuses).
    """
    default_worker = fields.text("worker") or default_worker
    actions = fields.items("actions", store.MAX_ACK_BATCH)
    acks, cancels = {}, {}
    for index, action in enumerate(actions):
        op = action.get("op")
        if op not in ACK_OPS:
            raise bad_request(
                f"actions[{index}].op: must be one of {', '.join(ACK_OPS)}"
            )
        action_fields = Fields(action, prefix=f"actions[{index}].")
        if op == "cancel":
            cancels[index] = _cancel_action(action_fields)
        else:
            acks[index] = _ack(op, action_fields, default_worker)
    outcomes = {}
    if acks:
        moved = store.acknowledge_many(scope, list(acks.values()))
        outcomes.update(zip(acks, moved, strict=True))
    if cancels:
        by = f"agent:{default_worker}" if default_worker else "agent"
        moved = store.cancel_many(scope, list(cancels.values()), by=by)
        outcomes.update(zip(cancels, moved, strict=True))
    results = []
    for index in range(len(actions)):
        # The id as the caller sent it: a foreign id and a never-minted one
        # answer alike.
        todo_id = acks[index].todo_id if index in acks else cancels[index][0]
        outcome = outcomes[index]
        if isinstance(outcome, Exception):
            results.append({"id": todo_id, **_failure(outcome)})
            continue
        status = cancel_status(outcome) if index in cancels else 200
        results.append({"id": todo_id, "status": status, "todo": outcome.to_dict()})
    return {"results": results}
