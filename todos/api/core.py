"""The agent API's plumbing, written once: token auth, JSON bodies, validation,
error mapping.

Views declare what they accept with ``@api_view("POST")`` and read validated
fields from ``request.body_fields``; every failure leaves as the CONTRACT's
JSON error ``{"error": code, "detail": text}`` with its status code, never as a
500 or an HTML page. The event stream and the MCP transport reuse the same
pieces (``authenticate``, ``api_error_for``, ``Fields``); the error body, the
body reader and strict JSON are ``todos.http``'s.
"""

import functools
import inspect
import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from todos import auth, http, longpoll, store

logger = logging.getLogger("switchboard.api")

ACK_OPS = ("complete", "fail", "heartbeat", "release", "cancel")


class ApiError(Exception):
    """A failure the API answers with a JSON error of the CONTRACT's shape."""

    def __init__(self, status, code, detail):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail

    @property
    def headers(self):
        """A 401 names the scheme to authenticate with (RFC 6750)."""
        return {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}


def bad_request(detail):
    return ApiError(400, "bad_request", detail)


def api_error_for(exc):
    """Map a store or database failure to its ApiError, or None when unknown."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, store.NotFound):
        return ApiError(404, "not_found", exc.detail)
    if isinstance(exc, store.TooLarge):
        return ApiError(413, "payload_too_large", str(exc))
    if isinstance(exc, store.InvalidAnswer):
        return ApiError(400, "bad_request", str(exc))
    if isinstance(exc, store.Conflict):
        return ApiError(409, "conflict", exc.detail)
    if isinstance(exc, store.QueueNotGranted):
        return ApiError(403, "forbidden", exc.detail)
    if store.is_outage(exc):
        return ApiError(
            503, "unavailable", "the database is unavailable; try again shortly"
        )
    if isinstance(exc, http.BodyTooLarge | http.BadBody):
        return ApiError(exc.status, exc.code, exc.detail)
    if isinstance(exc, RequestDataTooBig):
        return api_error_for(http.BodyTooLarge(http.body_limit()))
    return None


def authenticate(request):
    """Return the active endpoint of the request's bearer token, or raise 401."""
    try:
        endpoint = auth.endpoint_for_request(request)
    except (OperationalError, InterfaceError) as exc:
        logger.warning(
            "token lookup failed: database unavailable",
            extra={"fields": {"error": type(exc).__name__}},
        )
        raise store.Unavailable("authenticate", exc) from exc
    if endpoint is None:
        raise ApiError(401, "unauthorized", "a valid endpoint bearer token is required")
    return endpoint


def read_json_body(request):
    """Return the request's JSON object body ({} when empty), or raise 400/413."""
    raw = http.read_body(request)
    if not raw.strip():
        return {}
    try:
        data = http.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request("body: not valid JSON") from exc
    if not isinstance(data, dict):
        raise bad_request("body: must be a JSON object")
    return data


def check_storable_json(name, value):
    """Raise 400 unless PostgreSQL's jsonb can store the value as it is."""
    problem = http.unstorable(value)
    if problem:
        raise bad_request(f"{name}: {problem}")
    return value


class Fields:
    """Typed, validated access to a mapping of input fields.

    Every error names the field, so an agent can fix its call.
    """

    def __init__(self, data, *, from_query=False, prefix=""):
        self.data = data
        # A query string carries every value as text; a JSON body has types.
        self.from_query = from_query
        # Where these fields sit in a batch body, e.g. "actions[3].": errors
        # name the field as the caller wrote it.
        self.prefix = prefix

    def text(
        self, name, *, required=False, max_length=store.MAX_NAME_CHARS, empty=False
    ):
        value = self.data.get(name)
        if value is None:
            if required:
                raise bad_request(f"{self.prefix}{name}: is required")
            return None
        if not isinstance(value, str):
            raise bad_request(f"{self.prefix}{name}: must be a string")
        if not value and not empty:
            raise bad_request(f"{self.prefix}{name}: must not be empty")
        if len(value) > max_length:
            raise bad_request(
                f"{self.prefix}{name}: must be at most {max_length} characters"
            )
        problem = http.text_problem(value)
        if problem:
            raise bad_request(f"{self.prefix}{name}: {problem}")
        return value

    def integer(self, name, *, minimum, maximum, default=None):
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, str) and self.from_query:
            try:
                value = int(value, 10)
            except ValueError:
                raise bad_request(f"{self.prefix}{name}: must be an integer") from None
        if isinstance(value, float) and value.is_integer():
            # JSON has one number type: 30.0 is the integer 30 to JSON Schema.
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"{self.prefix}{name}: must be an integer")
        if not minimum <= value <= maximum:
            raise bad_request(
                f"{self.prefix}{name}: must be between {minimum} and {maximum}"
            )
        return value

    def json(self, name):
        return check_storable_json(self.prefix + name, self.data.get(name))

    def lease_seconds(self):
        return self.integer("lease_seconds", minimum=1, maximum=store.MAX_LEASE_SECONDS)

    def wait_seconds(self):
        return self.integer(
            "wait_seconds",
            minimum=0,
            maximum=settings.SWITCHBOARD_MAX_WAIT_SECONDS,
            default=0,
        )

    def worker(self):
        return self.text("worker", required=True)

    def lease_token(self):
        return self.text("lease_token", max_length=store.MAX_LEASE_TOKEN_CHARS)

    def owner(self, default_worker=None):
        """Return (worker, lease_token) of an owner transition.

        The lease token alone authorizes (CONTRACT §10); without it the worker
        is required, as in §5.
        """
        token = self.lease_token()
        worker = self.text("worker") or default_worker
        if worker is None and token is None:
            raise bad_request(f"{self.prefix}worker: is required without lease_token")
        return worker, token

    def progress(self):
        """A heartbeat's ``progress``: {"message" ≤ 500 chars, "fraction" 0–1}."""
        value = self.data.get("progress")
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) - {"message", "fraction"}:
            raise bad_request(
                f"{self.prefix}progress: must be an object with message and fraction"
            )
        nested = Fields(value, prefix=f"{self.prefix}progress.")
        message = nested.text(
            "message", max_length=store.MAX_PROGRESS_MESSAGE_CHARS, empty=True
        )
        fraction = value.get("fraction")
        if fraction is not None and (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 <= fraction <= 1
        ):
            raise bad_request(f"{self.prefix}progress.fraction: must be from 0 to 1")
        return {"message": message or "", "fraction": fraction}

    def choices(self):
        """An ask's ``choices``: 1–10 distinct non-empty strings, or None."""
        value = self.data.get("choices")
        if value is None:
            return None
        if not isinstance(value, list) or not 1 <= len(value) <= store.MAX_CHOICES:
            raise bad_request(
                f"{self.prefix}choices: must be a list of 1 to {store.MAX_CHOICES}"
                " strings"
            )
        listed = Fields(
            {f"[{i}]": choice for i, choice in enumerate(value)},
            prefix=f"{self.prefix}choices",
        )
        for index in range(len(value)):
            listed.text(f"[{index}]", required=True, max_length=store.MAX_CHOICE_CHARS)
        return value

    def checkpoint(self):
        """A ``checkpoint``: any JSON (413 over 64 KiB, in the store)."""
        return self.json("checkpoint")

    def handoff(self):
        """A release's ``assignee`` (a name; null = the pool; absent = as it was)."""
        if "assignee" not in self.data:
            return store.KEEP_ASSIGNEE
        if self.data["assignee"] is None:
            return None
        return self.text("assignee")

    def items(self, name, maximum):
        """Return a list field of 1..maximum JSON objects, or raise 400."""
        value = self.data.get(name)
        if not isinstance(value, list):
            raise bad_request(f"{self.prefix}{name}: must be a list of objects")
        if not 1 <= len(value) <= maximum:
            raise bad_request(
                f"{self.prefix}{name}: must hold 1 to {maximum} items, not {len(value)}"
            )
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise bad_request(f"{self.prefix}{name}[{index}]: must be an object")
        return value


def prepare(request):
    """Authenticate the bearer token (``request.endpoint``, ``request.scope``)
    and parse a JSON body into ``request.body_fields``."""
    request.endpoint = authenticate(request)
    request.scope = store.Scope.for_endpoint(request.endpoint)
    _read_fields(request)


def _read_fields(request):
    if request.method in {"POST", "PUT", "PATCH"}:
        request.body_fields = Fields(read_json_body(request))


def api_view(*methods, authenticated=True):
    """Make a function view an agent API view.

    Answers 405 for other methods, authenticates the bearer token and parses
    a JSON body (``prepare``), and maps every known failure to its JSON error.
    An async view (one that waits) calls ``prepare`` itself, in its first
    pooled database call. CSRF does not apply: the API authenticates each
    request by its token, never by a cookie.
    """

    def refuse(request):
        if request.method in methods:
            return None
        return http.error_response(
            405,
            "method_not_allowed",
            f"use {' or '.join(methods)} on this path",
            {"Allow": ", ".join(methods)},
        )

    def decorate(view):
        if inspect.iscoroutinefunction(view):

            @csrf_exempt
            @functools.wraps(view)
            async def async_wrapper(request, *args, **kwargs):
                refused = refuse(request)
                if refused is not None:
                    return refused
                try:
                    return await view(request, *args, **kwargs)
                except Exception as exc:
                    return _api_error_response(exc)

            async_wrapper.waits = True
            return async_wrapper

        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            refused = refuse(request)
            if refused is not None:
                return refused
            try:
                if authenticated:
                    prepare(request)
                else:
                    _read_fields(request)
                return view(request, *args, **kwargs)
            except Exception as exc:
                return _api_error_response(exc)

        return wrapper

    return decorate


def _api_error_response(exc):
    """Answer a known failure with its JSON error; re-raise an unknown one."""
    error = api_error_for(exc)
    if error is None:
        raise exc
    return http.error_response(error.status, error.code, error.detail, error.headers)


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


def todo_response(todo, status=200, **extra):
    """Render one todo as ``{"todo": {...}, **extra}``."""
    response = JsonResponse({"todo": todo.to_dict(), **extra}, status=status)
    response.todo_id = todo.id
    return response
