"""One structured log line per request, and JSON errors from every agent surface.

The log line carries the endpoint id, the route, the todo id, the trace id
(when the request or its todo has one), the outcome (``ok`` or the API error
code), the status and the duration; never a header, so never a token.
Rendered as JSON when ``LOG_FORMAT=json`` (see todos.telemetry.logs).
"""

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string
from whitenoise.middleware import WhiteNoiseMiddleware

from todos.telemetry import tracing
from todos.web import http

logger = logging.getLogger("switchboard.request")

API_PREFIX = "/api/"

# The detail of a non-JSON error page Django or a middleware produced (an
# unknown path, a bad Host header, a crash) when it answers an API path.
DETAILS = {
    404: "no such API path",
    500: "the server failed to answer this request",
}


# The surfaces whose callers are programs: an error page there is JSON, never
# Django's HTML (MCP's in its JSON-RPC shape).
JSON_PREFIXES = (API_PREFIX, "/hooks/")
MCP_PATH = "/mcp"

# What a middleware's ``get_response`` answers: a response, or (when the
# handler is async) an awaitable of one, as django-stubs types it.
type MaybeAwaitable = HttpResponseBase | Awaitable[HttpResponseBase]
type GetResponse = Callable[[HttpRequest], MaybeAwaitable]


def _answers_json(request: HttpRequest) -> bool:
    return request.path == MCP_PATH or request.path.startswith(JSON_PREFIXES)


def _json_error(request: HttpRequest, status: int) -> HttpResponseBase:
    detail = DETAILS.get(status)
    if request.path == MCP_PATH:
        # Imported here: the transport imports the API, which imports this app.
        from todos.mcp.transport import error_response

        return error_response(status, detail)
    return http.error_response(status, detail=detail)


def _todo_id(request: HttpRequest, response: HttpResponseBase) -> str | None:
    answered = getattr(response, "todo_id", None)
    if answered is not None:
        # The todo an answer renders, as the store read it: canonical already.
        return str(answered)
    match = getattr(request, "resolver_match", None)
    todo_id = match.kwargs.get("todo_id") if match is not None else None
    if todo_id is None:
        return None
    try:
        return str(uuid.UUID(str(todo_id)))
    except ValueError:
        # A path segment is caller-controlled text: it is not logged as is.
        return "malformed"


def _trace_id(request: HttpRequest, response: HttpResponseBase) -> str | None:
    """The trace a request belongs to: its todo's (the answer names it), else
    the one its ``traceparent`` header carries, when valid."""
    answered = getattr(response, "trace_id", None)
    if answered is not None:
        return str(answered)
    carried = tracing.from_request(request.META)
    return carried.trace_id if carried is not None else None


class RequestLogMiddleware:
    """Log each request once; turn any HTML error of an agent surface into JSON.

    Sync and async capable, as every middleware here must be: one sync-only
    middleware would make Django run the async (waiting) views in a thread.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> MaybeAwaitable:
        if self.is_async:
            return self._acall(request)
        started = time.monotonic()
        response = self.get_response(request)
        # Not is_async: Django gave a sync get_response, which answers a response.
        return self._finish(request, response, started)  # type: ignore[arg-type]  # sync: a response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        started = time.monotonic()
        # is_async: Django gave an async get_response, which answers an awaitable.
        response: HttpResponseBase = await self.get_response(request)  # type: ignore[misc]  # is_async: an awaitable
        return self._finish(request, response, started)

    def _finish(
        self, request: HttpRequest, response: HttpResponseBase, started: float
    ) -> HttpResponseBase:
        if (
            _answers_json(request)
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            allow = response.get("Allow")
            response = _json_error(request, response.status_code)
            if allow:
                response["Allow"] = allow
        self._log(request, response, time.monotonic() - started)
        return response

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        if not _answers_json(request):
            return None
        logger.exception(
            "request failed",
            extra={"fields": {"path": request.path, "error": type(exception).__name__}},
        )
        return _json_error(request, 500)

    def _log(
        self, request: HttpRequest, response: HttpResponseBase, seconds: float
    ) -> None:
        endpoint = getattr(request, "endpoint", None)
        match = getattr(request, "resolver_match", None)
        status = response.status_code
        outcome = getattr(response, "error_code", None) or (
            "ok" if status < 400 else f"http_{status}"
        )
        fields: dict[str, object] = {
            "method": request.method,
            "route": match.route if match is not None else None,
            "status": status,
            "outcome": outcome,
            "endpoint_id": str(endpoint.id) if endpoint is not None else None,
            "todo_id": _todo_id(request, response),
            "duration_ms": round(seconds * 1000, 1),
        }
        if match is None and request.path.startswith(settings.STATIC_URL):
            # A static file has no route; its path names it (and holds no
            # credential, unlike an answer link's).
            fields["path"] = request.path
        trace_id = _trace_id(request, response)
        if trace_id is not None:
            fields["trace_id"] = trace_id
        if response.streaming:
            fields["streaming"] = True
        level = logging.WARNING if status >= 500 else logging.INFO
        logger.log(level, "request", extra={"fields": fields})


class StaticFilesMiddleware(WhiteNoiseMiddleware):  # type: ignore[misc]  # whitenoise ships no types
    """whitenoise, made async capable: a static file is served from a thread,
    every other request passes straight on (whitenoise itself is sync only).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse | None = None) -> None:
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> MaybeAwaitable:
        if self.is_async:
            return self._acall(request)
        response: HttpResponseBase = super().__call__(request)
        return response

    def _static_file(self, request: HttpRequest) -> object:
        """whitenoise's StaticFile for the path, or None."""
        if self.autorefresh:
            return self.find_file(request.path_info)
        return self.files.get(request.path_info)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        if self.autorefresh:
            static_file = await sync_to_async(self._static_file)(request)
        else:
            static_file = self._static_file(request)
        response: HttpResponseBase
        if static_file is not None:
            response = await sync_to_async(self.serve)(static_file, request)
        else:
            response = await self.get_response(request)
        return response


def _is_api(request: HttpRequest) -> bool:
    # POST / is the SQS surface (todos/sqs): signed per request, like the API.
    return request.path_info.startswith(API_PREFIX) or (
        request.method == "POST" and request.path_info == "/"
    )


class _Middleware(Protocol):
    """A middleware class board_only subclasses: its hooks, where it has them."""

    get_response: GetResponse

    def __call__(self, request: HttpRequest) -> MaybeAwaitable: ...

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., object],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> HttpResponseBase | None: ...

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None: ...

    def process_template_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase: ...


def board_only(dotted_path: str | type[_Middleware]) -> type:
    """Return a subclass of ``dotted_path``'s (or a class's) middleware that acts
    only off /api/.

    The agent API authenticates every request by its bearer token and answers
    JSON: sessions, CSRF, the auth user, messages, static files, frame options
    and htmx are the Board's, and cost each agent request CPU for nothing
    (bench/profile_served.py shows it). The subclass passes API requests straight on and
    keeps every hook of its parent (``process_view`` and the rest) for all other
    paths, so the Board keeps them all; being a subclass, Django's system
    checks still find the middleware they require.
    """
    parent: type[_Middleware] = (
        import_string(dotted_path) if isinstance(dotted_path, str) else dotted_path
    )

    def __call__(self: _Middleware, request: HttpRequest) -> MaybeAwaitable:
        if _is_api(request):
            return self.get_response(request)
        return parent.__call__(self, request)

    attributes: dict[str, object] = {"__call__": __call__, "__module__": __name__}
    if hasattr(parent, "process_view"):

        def process_view(
            self: _Middleware,
            request: HttpRequest,
            view: Callable[..., object],
            args: tuple[object, ...],
            kwargs: dict[str, object],
        ) -> HttpResponseBase | None:
            if _is_api(request):
                return None
            return parent.process_view(self, request, view, args, kwargs)

        attributes["process_view"] = process_view
    if hasattr(parent, "process_exception"):

        def process_exception(
            self: _Middleware, request: HttpRequest, exception: Exception
        ) -> HttpResponseBase | None:
            if _is_api(request):
                return None
            return parent.process_exception(self, request, exception)

        attributes["process_exception"] = process_exception
    if hasattr(parent, "process_template_response"):

        def process_template_response(
            self: _Middleware, request: HttpRequest, response: HttpResponseBase
        ) -> HttpResponseBase:
            if _is_api(request):
                return response
            return parent.process_template_response(self, request, response)

        attributes["process_template_response"] = process_template_response
    return type(f"Board{parent.__name__}", (parent,), attributes)


# The Board's middleware, skipped on /api/ and POST / (board/settings.py lists these).
# whitenoise made async capable first (StaticFilesMiddleware), then Board-only.
BoardWhiteNoise = board_only(StaticFilesMiddleware)
BoardSessions = board_only("django.contrib.sessions.middleware.SessionMiddleware")
BoardCsrf = board_only("django.middleware.csrf.CsrfViewMiddleware")
BoardAuthentication = board_only(
    "django.contrib.auth.middleware.AuthenticationMiddleware"
)
BoardMessages = board_only("django.contrib.messages.middleware.MessageMiddleware")
BoardFrameOptions = board_only("django.middleware.clickjacking.XFrameOptionsMiddleware")
BoardHtmx = board_only("django_htmx.middleware.HtmxMiddleware")
# The Board's and the answer link's Content-Security-Policy (settings.SECURE_CSP).
BoardCsp = board_only("django.middleware.csp.ContentSecurityPolicyMiddleware")
