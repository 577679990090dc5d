"""The agent API's plumbing, written once: token auth, JSON bodies, error mapping.

Views declare what they accept with ``@api_view("POST")`` and read their
fields from ``request.body_fields`` (``todos.api.fields``' validation); every
failure leaves as the CONTRACT's JSON error ``{"error": code, "detail": text}``
with its status code, never as a 500 or an HTML page. The event stream and the
MCP transport reuse the same pieces (``authenticate``, ``api_error_for``); the
error body, the body reader and strict JSON are ``todos.web.http``'s.
"""

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from todos import store
from todos.access import auth
from todos.api.fields import Fields
from todos.models import Endpoint
from todos.web import http

logger = logging.getLogger("switchboard.api")

View = Callable[..., HttpResponseBase]
AsyncView = Callable[..., Awaitable[HttpResponseBase]]


class ApiRequest(HttpRequest):
    """What ``prepare`` adds to a request: its endpoint, scope and body."""

    endpoint: Endpoint
    scope: store.Scope
    body_fields: Fields


class ApiError(Exception):
    """A failure the API answers with a JSON error of the CONTRACT's shape."""

    def __init__(
        self, status: int, code: str, detail: str, retry_after: int | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        """A 401 names the scheme to authenticate with (RFC 6750); a 503, and
        a 429 that knows it, say when to try again."""
        if self.status == 401:
            return {"WWW-Authenticate": "Bearer"}
        if self.status == 503:
            return {"Retry-After": str(store.Unavailable.retry_after)}
        if self.retry_after is not None:
            return {"Retry-After": str(self.retry_after)}
        return {}


def bad_request(detail: str) -> ApiError:
    return ApiError(400, "bad_request", detail)


def api_error_for(exc: BaseException) -> ApiError | None:
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
    if isinstance(exc, store.BudgetExhausted):
        # Refused until the budget's window ends (or its owner raises it).
        return ApiError(429, "budget_exhausted", exc.detail, exc.retry_after)
    if isinstance(exc, store.Unavailable):
        # What happened: the database is down, or a statement timed out (a
        # todo another request held, or a slow statement).
        return ApiError(503, "unavailable", exc.detail)
    if store.is_deadlock(exc):
        # A deadlock no store call mapped (an ORM statement's): busy, too.
        return api_error_for(store.Deadlocked("database", exc))
    if store.is_outage(exc):
        return ApiError(
            503, "unavailable", "the database is unavailable; try again shortly"
        )
    if isinstance(exc, http.BodyTooLarge | http.BadBody):
        return ApiError(exc.status, exc.code, exc.detail)
    if isinstance(exc, RequestDataTooBig):
        return api_error_for(http.BodyTooLarge(http.body_limit()))
    return None


def authenticate(request: HttpRequest) -> Endpoint:
    """Return the active endpoint of the request's bearer token, or raise 401."""
    try:
        endpoint = auth.endpoint_for_request(request)
    except (OperationalError, InterfaceError) as exc:
        raise _lookup_failed(exc) from exc
    return _authenticated(endpoint)


async def aauthenticate(request: HttpRequest) -> Endpoint:
    """``authenticate`` for an async view: the lookup awaited in the loop."""
    try:
        endpoint = await auth.aendpoint_for_request(request)
    except (OperationalError, InterfaceError) as exc:
        raise _lookup_failed(exc) from exc
    return _authenticated(endpoint)


def _lookup_failed(exc: Exception) -> store.Unavailable:
    logger.warning(
        "token lookup failed: database unavailable",
        extra={"fields": {"error": type(exc).__name__}},
    )
    return store.Unavailable("authenticate", exc)


def _authenticated(endpoint: Endpoint | None) -> Endpoint:
    if endpoint is None:
        raise ApiError(401, "unauthorized", "a valid endpoint bearer token is required")
    return endpoint


def read_json_body(request: HttpRequest) -> dict[str, Any]:
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


def prepare(request: HttpRequest) -> None:
    """Authenticate the bearer token (``request.endpoint``, ``request.scope``)
    and parse a JSON body into ``request.body_fields``."""
    prepared = cast(ApiRequest, request)
    prepared.endpoint = authenticate(request)
    prepared.scope = store.Scope.for_endpoint(prepared.endpoint)
    _read_fields(request)


async def aprepare(request: HttpRequest) -> None:
    """``prepare`` for an async view: the token's lookup awaited in the loop."""
    prepared = cast(ApiRequest, request)
    prepared.endpoint = await aauthenticate(request)
    prepared.scope = store.Scope.for_endpoint(prepared.endpoint)
    _read_fields(request)


def _read_fields(request: HttpRequest) -> None:
    if request.method in {"POST", "PUT", "PATCH"}:
        cast(ApiRequest, request).body_fields = Fields(read_json_body(request))


def api_view(
    *methods: str, authenticated: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a function view an agent API view.

    Answers 405 for other methods, authenticates the bearer token and parses
    a JSON body (``prepare``), and maps every known failure to its JSON error.
    An async view (served in the event loop) calls ``aprepare`` itself.
    CSRF does not apply: the API authenticates each
    request by its token, never by a cookie.
    """

    def refuse(request: HttpRequest) -> HttpResponseBase | None:
        if request.method in methods:
            return None
        return http.error_response(
            405,
            "method_not_allowed",
            f"use {' or '.join(methods)} on this path",
            {"Allow": ", ".join(methods)},
        )

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(view):
            waiting = cast(AsyncView, view)

            @csrf_exempt
            @functools.wraps(view)
            async def async_wrapper(
                request: HttpRequest, *args: Any, **kwargs: Any
            ) -> HttpResponseBase:
                refused = refuse(request)
                if refused is not None:
                    return refused
                try:
                    return await waiting(request, *args, **kwargs)
                except Exception as exc:
                    return _api_error_response(exc)

            return async_wrapper

        served = cast(View, view)

        @csrf_exempt
        @functools.wraps(view)
        def wrapper(
            request: HttpRequest, *args: Any, **kwargs: Any
        ) -> HttpResponseBase:
            refused = refuse(request)
            if refused is not None:
                return refused
            try:
                if authenticated:
                    prepare(request)
                else:
                    _read_fields(request)
                return served(request, *args, **kwargs)
            except Exception as exc:
                return _api_error_response(exc)

        return wrapper

    return decorate


def _api_error_response(exc: Exception) -> HttpResponseBase:
    """Answer a known failure with its JSON error; re-raise an unknown one."""
    error = api_error_for(exc)
    if error is None:
        raise exc
    return http.error_response(error.status, error.code, error.detail, error.headers)


def todo_response(
    todo: store.Todo, status: int = 200, **extra: Any
) -> http.JsonResponse:
    """Render one todo as ``{"todo": {...}, **extra}``."""
    body = todo.to_dict()
    response = http.JsonResponse({"todo": body, **extra}, status=status)
    response.todo_id = todo.id  # type: ignore[attr-defined]  # the request log's
    carrier = body["trace_context"]
    if carrier is not None:
        # The trace the answer belongs to, for the request log's line.
        response.trace_id = carrier["traceparent"][3:35]  # type: ignore[attr-defined]  # the request log's
    return response
