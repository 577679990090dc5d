"""One structured log line per request, and JSON errors everywhere under /api/.

The log line carries the endpoint id, the route, the todo id, the outcome
(``ok`` or the API error code), the status and the duration; never a header,
so never a token. Rendered as JSON when ``LOG_FORMAT=json`` (see todos.logs).
"""

import logging
import time
import uuid

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
    """Log each request once; turn any HTML error under /api/ into JSON."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.monotonic()
        response = self.get_response(request)
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
