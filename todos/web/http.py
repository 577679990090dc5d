"""The HTTP plumbing every surface shares, written once.

- The JSON error body ``{"error": code, "detail": text}`` and its code table
  (``error_body``, ``error_response``, ``code_for``): the agent API, the
  webhooks, the request middleware and the MCP tools render their errors
  with it (MCP wraps it in a JSON-RPC error as ``data``).
- Bounded body reading (``read_body``): a Content-Length body or a chunked one
  (de-chunked by the server), never more than the limit; an oversized body is
  read and dropped (up to ``DRAIN_LIMIT_BYTES``) before the 413, so a
  keep-alive client that is still sending can go on. It raises ``BodyTooLarge``
  or ``BadBody``; each surface renders them in its own error format. Served by
  gunicorn's uvicorn workers, the front door (board/serving/frontdoor.py) has refused
  an oversized body before the view runs, in the same formats.
- Strict JSON (``loads``, ``text_problem``, ``unstorable``): JSON as
  PostgreSQL's jsonb can store it. Python's json module accepts NaN and
  Infinity (and reads 1e999 as infinity); jsonb has no form for them, nor for
  NUL characters or lone surrogates in strings. Caller input is checked here
  so that it gets a 400 naming the problem instead of a database error.
- JSON answers (``JsonResponse``, ``dumps``): Django's JsonResponse, its body
  encoded by orjson (a todo's answer in 0.4 µs rather than 9; the standard
  library's encoder when orjson refuses a value).
"""

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn, Protocol

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from django.http import JsonResponse as DjangoJsonResponse

# Every surface answers a status with this code (the CONTRACT's error codes).
ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    431: "request_header_fields_too_large",
    500: "internal_error",
    503: "unavailable",
}

# An oversized body is read and thrown away up to this bound (never stored), so
# a keep-alive client that is still sending gets its 413 and the connection
# stays usable; twice the largest limit (SQS's 4 MiB), so a body just over any
# limit is among them. Beyond it the server closes the connection rather than
# read on (board/serving/frontdoor.py).
DRAIN_LIMIT_BYTES = 8 * 1024 * 1024
_READ_SIZE = 64 * 1024
# Objects and arrays nest at most this deep in a stored value.
MAX_JSON_DEPTH = 100


def code_for(status: int) -> str:
    """The error code of an HTTP status."""
    return ERROR_CODES.get(status, "internal_error" if status >= 500 else "bad_request")


# What orjson does not encode itself goes to Django's encoder: datetimes too, in
# its form (milliseconds, "Z"), so an answer reads as JsonResponse's did.
_DJANGO_DEFAULT = DjangoJSONEncoder().default
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def dumps(data: object) -> bytes:
    """``data`` as compact JSON, as JsonResponse would encode it, by orjson.

    orjson refuses integers beyond 64 bits, lone surrogates (a caller's text
    echoed in an error) and nesting past 254 levels: those are encoded by the
    standard library, as JsonResponse did, the surrogates as escapes.
    """
    try:
        return orjson.dumps(data, default=_DJANGO_DEFAULT, option=_ORJSON_OPTIONS)
    except TypeError:
        return json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":")).encode()


class JsonResponse(DjangoJsonResponse):
    """Django's JsonResponse of a dict, encoded by ``dumps``."""

    def __init__(self, data: dict[str, Any], status: int = 200, **kwargs: Any) -> None:
        if not isinstance(data, dict):
            raise TypeError("a JSON answer is an object")
        HttpResponse.__init__(
            self, dumps(data), content_type="application/json", status=status, **kwargs
        )


def error_body(code: str, detail: object) -> dict[str, object]:
    """The CONTRACT's JSON error body."""
    return {"error": code, "detail": detail}


class ErrorResponse(JsonResponse):
    """A JSON error response; ``error_code`` is its code, for the request log."""

    error_code: str


def error_response(
    status: int,
    code: str | None = None,
    detail: object = None,
    headers: Mapping[str, str] | None = None,
) -> ErrorResponse:
    """Return the JSON error response; its code is kept for the request log."""
    code = code or code_for(status)
    if detail is None:
        detail = code.replace("_", " ")
    response = ErrorResponse(error_body(code, detail), status=status, headers=headers)
    response.error_code = code
    return response


# --- Bodies ---------------------------------------------------------------------


class BodyTooLarge(Exception):
    """The body is over the limit (413); it has been drained as far as allowed."""

    status = 413
    code = "payload_too_large"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.detail = f"the body exceeds {limit} bytes"
        super().__init__(self.detail)


class BadBody(Exception):
    """The body cannot be read as sent (400)."""

    status = 400
    code = "bad_request"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


def body_limit() -> int:
    return settings.SWITCHBOARD_MAX_BODY_BYTES


class _Stream(Protocol):
    """A WSGI request's input (``wsgi.input``)."""

    def read(self, size: int, /) -> bytes: ...


def _content_length(request: HttpRequest) -> int:
    try:
        return max(int(request.META.get("CONTENT_LENGTH") or 0), 0)
    except ValueError as exc:
        raise BadBody("the Content-Length header is not a number") from exc


def _drain(stream: _Stream | None, length: int) -> None:
    """Read and discard an oversized body, up to DRAIN_LIMIT_BYTES."""
    remaining = min(length, DRAIN_LIMIT_BYTES)
    while stream is not None and remaining > 0:
        chunk = stream.read(min(remaining, _READ_SIZE))
        if not chunk:
            break
        remaining -= len(chunk)


def read_body(request: HttpRequest, limit: int | None = None) -> bytes:
    """Return the request body's bytes; raise BodyTooLarge (drained) or BadBody."""
    limit = body_limit() if limit is None else limit
    if isinstance(request, ASGIRequest):
        # Served by ASGI: the body is already read, bounded by the surface's
        # limit in board/serving/frontdoor.py (a smaller limit is checked here).
        if _content_length(request) > limit:
            raise BodyTooLarge(limit)
        try:
            raw = request.body
        except RequestDataTooBig:
            raise BodyTooLarge(limit) from None
        if len(raw) > limit:
            raise BodyTooLarge(limit)
        return raw
    stream: _Stream | None = request.META.get("wsgi.input")
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        # Django reads only Content-Length bodies. A server that de-chunks and
        # ends wsgi.input (gunicorn) lets the body be read here, bounded;
        # elsewhere a read past the body would block on a keep-alive socket.
        if stream is None or not request.META.get("wsgi.input_terminated"):
            raise BadBody("body: send it with a Content-Length header")
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            _drain(stream, DRAIN_LIMIT_BYTES)
            raise BodyTooLarge(limit)
        return raw
    length = _content_length(request)
    if length > limit:
        _drain(stream, length)
        raise BodyTooLarge(limit)
    try:
        return request.body
    except RequestDataTooBig:
        raise BodyTooLarge(limit) from None


# --- Strict JSON ----------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# Made once: json.loads with an option builds a decoder (and its scanner) per call.
_STRICT = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text: str | bytes) -> object:
    """Decode strict JSON: NaN and Infinity are errors. Raises ValueError or
    RecursionError (nesting too deep)."""
    if isinstance(text, bytes):
        # As json.loads reads bytes: UTF-8, -16 or -32, by their first bytes.
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _STRICT.decode(text)


def text_problem(value: str) -> str | None:
    """Say why PostgreSQL cannot store a string, or None when it can."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


def unstorable(value: object) -> str | None:
    """Say why a decoded value cannot be stored and served, or None when it can.

    jsonb refuses non-finite numbers, NUL characters and lone surrogates; a
    value nested deeper than MAX_JSON_DEPTH is refused too, because rendering
    it back (an answer, a tool result, a Board page) would exhaust the stack
    after it was stored.
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"strings {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return "numbers must be finite"
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"must not nest deeper than {MAX_JSON_DEPTH} levels"
            children = [*item, *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None
