"""One structured log line per request, and JSON errors everywhere under /api/.

The log line carries the endpoint id, the route, the todo id, the outcome
(``ok`` or the API error code), the status and the duration; never a header,
so never a token. Rendered as JSON when ``LOG_FORMAT=json`` (see todos.logs).
"""

import logging
import time
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from whitenoise.middleware import WhiteNoiseMiddleware

from todos import http

logger = logging.getLogger("switchboard.request")

API_PREFIX = "/api/"

# The detail of a non-JSON error page Django or a middleware produced (an
# unknown path, a bad Host header, a crash) when it answers an API path.
DETAILS = {
    404: "no such API path",
    500: "the server failed to answer this request",
}


def _json_error(status):
    return http.error_response(status, detail=DETAILS.get(status))


def _todo_id(request, response):
    todo_id = getattr(response, "todo_id", None)
    match = getattr(request, "resolver_match", None)
    if todo_id is None and match is not None:
        todo_id = match.kwargs.get("todo_id")
    if todo_id is None:
        return None
    try:
        return str(uuid.UUID(str(todo_id)))
    except ValueError:
        # A path segment is caller-controlled text: it is not logged as is.
        return "malformed"


class RequestLogMiddleware:
    """Log each request once; turn any HTML error under /api/ into JSON.

    Sync and async capable, as every middleware here must be: one sync-only
    middleware would make Django run the async (waiting) views in a thread.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.monotonic()
        return self._finish(request, self.get_response(request), started)

    async def _acall(self, request):
        started = time.monotonic()
        return self._finish(request, await self.get_response(request), started)

    def _finish(self, request, response, started):
        is_api = request.path.startswith(API_PREFIX)
        if (
            is_api
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            allow = response.get("Allow")
            response = _json_error(response.status_code)
            if allow:
                response["Allow"] = allow
        self._log(request, response, time.monotonic() - started)
        return response

    def process_exception(self, request, exception):
        if not request.path.startswith(API_PREFIX):
            return None
        logger.exception(
            "request failed",
            extra={"fields": {"path": request.path, "error": type(exception).__name__}},
        )
        return _json_error(500)

    def _log(self, request, response, seconds):
        endpoint = getattr(request, "endpoint", None)
        match = getattr(request, "resolver_match", None)
        status = response.status_code
        outcome = getattr(response, "error_code", None) or (
            "ok" if status < 400 else f"http_{status}"
        )
        fields = {
            "method": request.method,
            "route": match.route if match is not None else None,
            "status": status,
            "outcome": outcome,
            "endpoint_id": str(endpoint.id) if endpoint is not None else None,
            "todo_id": _todo_id(request, response),
            "duration_ms": round(seconds * 1000, 1),
        }
        if response.streaming:
            fields["streaming"] = True
        level = logging.WARNING if status >= 500 else logging.INFO
        logger.log(level, "request", extra={"fields": fields})


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """whitenoise, made async capable: a static file is served from a thread,
    every other request passes straight on (whitenoise itself is sync only).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None):
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    def _static_file(self, request):
        if self.autorefresh:
            return self.find_file(request.path_info)
        return self.files.get(request.path_info)

    async def _acall(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self._static_file)(request)
        else:
            static_file = self._static_file(request)
        if static_file is not None:
            return await sync_to_async(self.serve)(static_file, request)
        return await self.get_response(request)


class WaitingViewsMiddleware:
    """Take the waiting views (async views marked ``waits``) past the
    middleware below this one.

    Django runs a sync middleware's hooks in a thread, one hop each way per
    middleware, even around an async view: a long poll would cost a dozen
    thread hops and park a thread while it waits. The views below need none
    of them (token auth, no session, no cookie, no CSRF), so they are called
    here directly; the headers the skipped middleware would add (security
    headers, Content-Length) are added here. Everything else goes down the
    chain as usual.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        from django.middleware.clickjacking import XFrameOptionsMiddleware
        from django.middleware.security import SecurityMiddleware

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        self.headers = (
            SecurityMiddleware(get_response),
            XFrameOptionsMiddleware(get_response),
        )

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return self.get_response(request)

    async def _acall(self, request):
        from django.urls import Resolver404, resolve

        try:
            match = resolve(request.path_info)
        except Resolver404:
            match = None
        if match is None or not getattr(match.func, "waits", False):
            return await self.get_response(request)
        request.resolver_match = match
        response = await match.func(request, *match.args, **match.kwargs)
        for middleware in self.headers:
            response = middleware.process_response(request, response)
        if not response.streaming and not response.has_header("Content-Length"):
            # As CommonMiddleware would: keep-alive clients need the length.
            response.headers["Content-Length"] = str(len(response.content))
        return response
