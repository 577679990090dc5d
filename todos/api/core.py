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

from todos import aio, auth, http, store

logger = logging.getLogger("switchboard.api")

MAX_NAME_LENGTH = 200
MAX_TITLE_LENGTH = 1000
# The dedupe index is a btree: a key must stay far below its ~2.7 kB row limit.
MAX_KEY_LENGTH = 200
MAX_ATTEMPTS_CAP = 1000
MAX_ERROR_LENGTH = 10_000


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

    def __init__(self, data, *, from_query=False):
        self.data = data
        # A query string carries every value as text; a JSON body has types.
        self.from_query = from_query

    def text(self, name, *, required=False, max_length=MAX_NAME_LENGTH, empty=False):
        value = self.data.get(name)
        if value is None:
            if required:
                raise bad_request(f"{name}: is required")
            return None
        if not isinstance(value, str):
            raise bad_request(f"{name}: must be a string")
        if not value and not empty:
            raise bad_request(f"{name}: must not be empty")
        if len(value) > max_length:
            raise bad_request(f"{name}: must be at most {max_length} characters")
        problem = http.text_problem(value)
        if problem:
            raise bad_request(f"{name}: {problem}")
        return value

    def integer(self, name, *, minimum, maximum, default=None):
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, str) and self.from_query:
            try:
                value = int(value, 10)
            except ValueError:
                raise bad_request(f"{name}: must be an integer") from None
        if isinstance(value, float) and value.is_integer():
            # JSON has one number type: 30.0 is the integer 30 to JSON Schema.
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"{name}: must be an integer")
        if not minimum <= value <= maximum:
            raise bad_request(f"{name}: must be between {minimum} and {maximum}")
        return value

    def json(self, name):
        return check_storable_json(name, self.data.get(name))

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


def api_view(*methods, authenticated=True):
    """Make a function view an agent API view.

    Answers 405 for other methods, authenticates the bearer token (setting
    ``request.endpoint`` and ``request.scope``), parses a JSON body into
    ``request.body_fields``, and maps every known failure to its JSON error.
    CSRF does not apply: the API authenticates each request by its token,
    never by a cookie.
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
            # A waiting view: its database work runs through request.db.
            @csrf_exempt
            @functools.wraps(view)
            async def async_wrapper(request, *args, **kwargs):
                refused = refuse(request)
                if refused is not None:
                    return refused
                request.db = aio.db_runner(request)
                try:
                    if authenticated:
                        request.endpoint = await request.db(authenticate, request)
                        request.scope = store.Scope.for_endpoint(request.endpoint)
                    if request.method in {"POST", "PUT", "PATCH"}:
                        request.body_fields = Fields(read_json_body(request))
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
                    request.endpoint = authenticate(request)
                    request.scope = store.Scope.for_endpoint(request.endpoint)
                if request.method in {"POST", "PUT", "PATCH"}:
                    request.body_fields = Fields(read_json_body(request))
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
    if queue is not None and not scope.covers(queue):
        # A queue outside the grant is 403, never an empty page.
        raise store.QueueNotGranted(queue)
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


def create_todo(scope, fields, *, actor):
    """Enqueue a todo from validated fields; return (todo, created).

    Shared by the JSON view and the MCP tool, so both accept the same input.
    """
    return store.create_todo(
        scope,
        queue=fields.text("queue", required=True),
        title=fields.text("title", max_length=MAX_TITLE_LENGTH, empty=True) or "",
        payload=fields.json("payload"),
        idempotency_key=fields.text("idempotency_key", max_length=MAX_KEY_LENGTH),
        assignee=fields.text("assignee"),
        max_attempts=fields.integer(
            "max_attempts",
            minimum=1,
            maximum=MAX_ATTEMPTS_CAP,
            default=settings.SWITCHBOARD_MAX_ATTEMPTS,
        ),
        actor=actor,
    )


def todo_response(todo, status=200, **extra):
    """Render one todo as ``{"todo": {...}, **extra}``."""
    response = JsonResponse({"todo": todo.to_dict(), **extra}, status=status)
    response.todo_id = todo.id
    return response
