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

from todos import auth, http, store

logger = logging.getLogger("switchboard.api")


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


def todo_response(todo, status=200, **extra):
    """Render one todo as ``{"todo": {...}, **extra}``."""
    response = JsonResponse({"todo": todo.to_dict(), **extra}, status=status)
    response.todo_id = todo.id
    return response
