"""The front door: what a connection may send before Switchboard reads it.

Two layers, both in the served process, so they hold with no proxy in front
(docs/operations.md):

- **Bodies** (``surface_of``, ``BoundedReceive``; board/serving/asgi.py applies them
  before Django sees the request). Each path belongs to a surface with a body
  limit: the JSON API, the webhooks and MCP 256 KiB
  (``SWITCHBOARD_MAX_BODY_BYTES``), SQS its request limit
  (``SWITCHBOARD_SQS_MAX_REQUEST_BYTES``), everything else — the Board's forms,
  ``/healthz``, static files — ``SWITCHBOARD_BOARD_MAX_BODY_BYTES`` (Django's
  own ``DATA_UPLOAD_MAX_MEMORY_SIZE`` default, 2.5 MiB). A declared
  ``Content-Length`` over the limit is answered 413 in the surface's error
  format before one byte of the body is read; a chunked body is read until it
  passes the limit, then answered the same way. What follows the 413 is
  never stored: up to ``todos.web.http.DRAIN_LIMIT_BYTES`` (8 MiB, 10 s) of it is read
  and dropped, so a keep-alive client that is still sending can go on with
  the same connection; a body declared larger is answered with
  ``Connection: close``, and a chunked one that goes on past that has its
  connection closed. A body within its limit is held in memory, never
  spooled to a temporary file.
- **Heads and connections** (``FrontDoorProtocol``, the HTTP protocol
  board/serving/workers.py gives uvicorn). A request head over
  ``SWITCHBOARD_MAX_HEAD_BYTES`` (64 KiB) is answered 431 and the connection
  closed; a head that has not arrived ``SWITCHBOARD_HEAD_TIMEOUT_SECONDS``
  (10) after the connection opened, or after its first byte on a kept-alive
  connection, is closed (slow-loris); a connection past the worker's
  ``SWITCHBOARD_MAX_CONNECTIONS`` is answered 503 and closed at once.

What uvicorn and gunicorn offer, and why these are here instead:

- gunicorn's ``limit_request_line``/``limit_request_field_size`` and its
  ``timeout`` apply to its own sync workers' parser; a uvicorn worker parses
  HTTP itself and reads none of them (``worker_connections`` likewise: it is
  for the eventlet/gevent/gthread workers).
- uvicorn's ``limit_concurrency`` answers 503 to every new *request* once the
  worker holds that many connections, including requests on connections it
  already serves (a waiting agent's next poll); it refuses nothing at accept.
  Here only the connection over the cap is refused.
- uvicorn's ``h11_max_incomplete_event_size`` (16 KiB) bounds a head for the
  h11 protocol only. httptools (the parser served here, for its speed) has
  no head limit in uvicorn: a 128 MiB header is buffered whole.
- uvicorn's ``timeout_keep_alive`` (gunicorn's ``keepalive``, 75 s here)
  closes a connection idle *after* a response; nothing bounds a connection
  that never completes its first head, or a head sent a byte at a time.

The protocol also writes each response's head with its body (``OneWrite``):
uvicorn writes the status line and headers as soon as the application starts
its answer, then the body, two writes and two TCP segments for every answer.
The head now waits for the next write made in the same turn of the event
loop (the body of any answer Django holds whole) and leaves with it; when none
follows in that turn (a stream), it leaves at the start of the next turn.
Writing the head on its own was a fifth of a worker's CPU on the agent API.

uvicorn's private API used by ``FrontDoorProtocol`` (verified with uvicorn
0.55.0 and httptools 0.9.0; catalogued in board.serving): the class
``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`` and its
``__init__`` signature; its protocol methods ``connection_made``,
``connection_lost`` and
``data_received`` and parser callbacks ``on_headers_complete``, ``on_body``
and ``on_message_complete``, each extended by calling the parent; its
attributes ``url`` and ``headers`` (the head just parsed), ``connections``
(the server's set of open connections, ``self`` included once
``connection_made`` ran), ``transport``, ``loop``,
``server_state.default_headers``, ``cycle.response_complete`` (the current
request's answer is sent: what still arrives of its body is dropped by
uvicorn unread) and ``cycle.transport`` (the one a request's cycle writes
its answer to, and closes).
"""

import asyncio
import contextlib
import http as http_status
import io
import json
import logging
import resource
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from todos.web import http

# An ASGI scope and its messages, as django-stubs types them for ASGIHandler
# (board/serving/asgi.py overrides its methods): JSON-like dicts by the spec.
type Scope = dict[str, Any]
type Message = Mapping[str, Any]
type Receive = Callable[[], Awaitable[Message]]
type Send = Callable[[Message], Awaitable[None]]

logger = logging.getLogger("switchboard.serving.frontdoor")

# The JSON surfaces' paths (the agent API, webhooks); MCP is one path.
JSON_PREFIXES = ("/api/", "/hooks/")
MCP_PATH = "/mcp"

# How long a refused body's rest is read and dropped, at most (see ``refuse``).
DRAIN_SECONDS = 10

# File descriptors a worker keeps beyond its connections' (the database pool,
# the LISTEN connection, logs, the imported modules' files).
SPARE_FILES = 1024


# --- Bodies ---------------------------------------------------------------------


@dataclass(frozen=True)
class Surface:
    """A way in: its body limit and how it says a body is too large."""

    name: str
    limit: int

    def refusal(self) -> HttpResponse:
        """The 413 this surface answers (a Django response)."""
        detail = f"the body exceeds {self.limit} bytes"
        if self.name == "sqs":
            from todos.sqs import protocol

            return protocol.error_response("RequestEntityTooLarge", detail)
        if self.name == "mcp":
            # Imported here: the transport imports the API, which needs the apps.
            from todos.mcp import transport

            return transport.error_response(413, detail)
        if self.name == "json":
            return http.error_response(413, detail=detail)
        return HttpResponse(
            f"Payload too large: {detail}.\n",
            status=413,
            content_type="text/plain; charset=utf-8",
        )


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            found: bytes = value
            return found
    return None


def surface_of(scope: Scope) -> Surface:
    """The surface an HTTP scope's request is for."""
    path: str = scope["path"]
    if path.startswith(JSON_PREFIXES):
        return Surface("json", settings.SWITCHBOARD_MAX_BODY_BYTES)
    if path == MCP_PATH:
        return Surface("mcp", settings.SWITCHBOARD_MAX_BODY_BYTES)
    if (path == "/" and scope["method"] == "POST") or _header(
        scope, b"x-amz-target"
    ) is not None:
        return Surface("sqs", settings.SWITCHBOARD_SQS_MAX_REQUEST_BYTES)
    return Surface("board", settings.SWITCHBOARD_BOARD_MAX_BODY_BYTES)


def declared_length(scope: Scope) -> int:
    """The request's Content-Length, or 0 when it declares none.

    The HTTP parser has already refused a malformed or conflicting one (400).
    """
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


class BodyOverLimit(Exception):
    """The body being received passed its surface's limit (nothing answered yet).

    ``complete`` when the piece that passed it was the body's last: there is
    nothing left to drain.
    """

    def __init__(self, complete: bool) -> None:
        super().__init__()
        self.complete = complete


class BoundedReceive:
    """An ASGI ``receive`` that raises BodyOverLimit once the body passes ``limit``.

    The server hands the body over in pieces of at most 64 KiB and reads no
    further until they are taken (uvicorn's flow control), so no more than
    the limit and one piece is ever held.
    """

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive = receive
        self.limit = limit
        self.received = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise BodyOverLimit(complete=not message.get("more_body", False))
        return message


async def refuse(
    surface: Surface,
    scope: Scope,
    receive: Receive,
    send: Send,
    declared: int | None = None,
    complete: bool = False,
) -> HttpResponse:
    """Answer 413 for ``surface`` at once; then drop what follows of the body.

    The whole answer is sent before anything more is read. Then, unless the
    body is declared larger than DRAIN_LIMIT_BYTES or its client waits for
    ``100 Continue`` (it sends no body now), what is still coming is read and
    dropped, up to DRAIN_LIMIT_BYTES or DRAIN_SECONDS, before the answer ends:
    a client that sends its whole body before it reads (urllib, requests)
    then reads the 413 instead of a reset connection, and a keep-alive one
    can go on. A body that goes on past that has its connection closed by
    FrontDoorProtocol. ``declared`` is the Content-Length, when given;
    ``complete`` says the whole body was already received (nothing to drain:
    another receive would wait for the client to leave).
    """
    response = surface.refusal()
    content = response.content
    waits_to_send = (_header(scope, b"expect") or b"").lower() == b"100-continue"
    close = waits_to_send or (declared or 0) > http.DRAIN_LIMIT_BYTES
    headers = [(k.encode("ascii"), v.encode("latin-1")) for k, v in response.items()]
    headers.append((b"content-length", str(len(content)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": headers,
        }
    )
    await send({"type": "http.response.body", "body": content, "more_body": True})
    if not close and not complete:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_SECONDS):
                await drop_body(receive, http.DRAIN_LIMIT_BYTES)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return response


async def drop_body(receive: Receive, limit: int) -> None:
    """Read and drop the rest of a body, at most ``limit`` bytes."""
    dropped = 0
    while dropped <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def read_body(receive: Receive) -> io.BytesIO:
    """Read a request body into memory; raise RequestAborted or BodyOverLimit.

    Django's own spools a body past FILE_UPLOAD_MAX_MEMORY_SIZE to a
    temporary file; here the body is bounded first (``BoundedReceive``), so
    it stays in memory and nothing is written to disk.
    """
    from django.core.exceptions import RequestAborted

    body_file = io.BytesIO()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()
        body_file.write(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body_file.seek(0)
    return body_file


# --- Heads and connections ----------------------------------------------------


def _raw_response(
    status: int,
    detail: str,
    default_headers: Iterable[tuple[bytes, bytes]],
    extra: Iterable[bytes] = (),
) -> bytes:
    """A complete HTTP/1.1 response (JSON error body) that closes the connection."""
    body = json.dumps(http.error_body(http.code_for(status), detail)).encode()
    phrase = http_status.HTTPStatus(status).phrase
    lines = [f"HTTP/1.1 {status} {phrase}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class RefusedConnections:
    """Log connections refused at the cap: at most one line per LOG_EVERY
    seconds, with the count since the last, so a flood does not flood the log."""

    LOG_EVERY = 10.0

    def __init__(self) -> None:
        self.count = 0
        self.logged_at: float | None = None

    def note(self, now: float, cap: int) -> None:
        self.count += 1
        if self.logged_at is None or now - self.logged_at >= self.LOG_EVERY:
            logger.warning(
                "connections refused: the worker holds its cap",
                extra={"fields": {"refused": self.count, "cap": cap}},
            )
            self.count = 0
            self.logged_at = now


refused_connections = RefusedConnections()


def head_size(url: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The bytes of a parsed request head (its line breaks and separators too)."""
    return len(url) + 16 + sum(len(name) + len(value) + 4 for name, value in headers)


class OneWrite:
    """A request cycle's transport: a write waits for the next one made in the
    same turn of the event loop, and the two leave in one (see above).

    Everything else is the transport's own; what waits is written before the
    transport is closed or ends its writing.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self.transport = transport
        self.loop = loop
        self.waiting = b""
        self.flushing: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self.flushing is None:
            self.waiting = data
            self.flushing = self.loop.call_soon(self.flush)
            return
        self.flushing.cancel()
        self.flushing = None
        waiting, self.waiting = self.waiting, b""
        self.transport.write(waiting + data)

    def writelines(self, lines: Iterable[bytes]) -> None:
        self.write(b"".join(lines))

    def flush(self) -> None:
        """Write what waits, now."""
        if self.flushing is not None:
            self.flushing.cancel()
            self.flushing = None
            waiting, self.waiting = self.waiting, b""
            if not self.transport.is_closing():
                self.transport.write(waiting)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class FrontDoorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the head size and time bounded and
    the worker's connections capped (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes: int = settings.SWITCHBOARD_MAX_HEAD_BYTES
        self.head_timeout: float = settings.SWITCHBOARD_HEAD_TIMEOUT_SECONDS
        self.max_connections: int = settings.SWITCHBOARD_MAX_CONNECTIONS
        # Between a message's end (or the connection's start) and the next
        # head's end, whatever arrives is a head.
        self.reading_head = True
        self.head_bytes = 0
        self.heads_completed = 0
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's own
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            refused_connections.note(self.loop.time(), self.max_connections)
            self.refuse(
                503,
                "the server holds as many connections as it may; retry shortly",
                extra=(b"retry-after: 1",),
            )
            return
        self.start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        counting = self.reading_head
        if counting and self.head_timer is None:
            # The first byte of a kept-alive connection's next request.
            self.start_head_timer()
        if not counting and self.cycle is not None and self.cycle.response_complete:
            # More of a body already answered: a 413's body past what
            # ``refuse`` dropped (every other answer comes after its body).
            self.transport.close()
            return
        completed = self.heads_completed
        super().data_received(data)
        if self.transport.is_closing():
            return
        # A piece that began in a head and completed none is all head. (A
        # pipelined head that begins inside a piece after a body is counted
        # from the next piece: at most one read, 256 KiB, goes uncounted.)
        if counting and self.reading_head and self.heads_completed == completed:
            self.head_bytes += len(data)
            if self.head_bytes > self.max_head_bytes:
                self.refuse_head()

    def on_headers_complete(self) -> None:
        self.reading_head = False
        self.head_bytes = 0
        self.heads_completed += 1
        self.stop_head_timer()
        if self.transport.is_closing():
            return
        if head_size(self.url, self.headers) > self.max_head_bytes:
            # A whole head that came in one read: measured once parsed.
            self.refuse_head()
            return
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = OneWrite(self.transport, self.loop)  # type: ignore[assignment]  # a transport to the cycle: it writes and closes it

    def on_body(self, body: bytes) -> None:
        if not self.transport.is_closing():
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self.transport.is_closing():
            super().on_message_complete()
        self.reading_head = True

    def refuse_head(self) -> None:
        self.refuse(431, f"the request head exceeds {self.max_head_bytes} bytes")

    def start_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.head_timeout, self.head_timed_out)

    def stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_timed_out(self) -> None:
        self.head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def refuse(self, status: int, detail: str, extra: Iterable[bytes] = ()) -> None:
        """Answer before any request was read, and close the connection."""
        self.stop_head_timer()
        self.transport.write(
            _raw_response(status, detail, self.server_state.default_headers, extra)
        )
        self.transport.close()


def raise_open_files_limit() -> int:
    """Let the process open the connections its cap allows.

    The soft limit on open files is often 1 024, under the default cap: the
    worker's accept would fail at that limit instead. Raised towards the
    hard limit (which only root can raise); returns the soft limit now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = settings.SWITCHBOARD_MAX_CONNECTIONS + SPARE_FILES
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    needed = settings.SWITCHBOARD_MAX_CONNECTIONS + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning(
            "the open-files limit is under the connection cap: accepts fail first",
            extra={"fields": {"open_files": soft, "cap": needed - SPARE_FILES}},
        )
    return soft
