"""The MCP endpoint (CONTRACT §9): the Streamable HTTP transport at ``/mcp``.

One path speaks JSON-RPC 2.0, in the MCP revisions of the ``initialize``
handshake that the official SDKs' clients negotiate (2025-11-25, 2025-06-18,
2025-03-26):

- ``POST`` carries one client message. ``initialize`` mints a session and
  returns its id in ``Mcp-Session-Id``; every later message must carry it. A
  request gets one JSON response; a notification or a response gets 202.
- ``GET`` opens the session's event stream: the endpoint's doorbell, as
  ``notifications/message`` (see ``doorbell_notification``).
- ``DELETE`` ends the session.

Every request needs the endpoint's bearer token, and a session belongs to the
endpoint that minted it: another endpoint's token cannot use it. Sessions live
in PostgreSQL (``McpSession``), so any gunicorn process serves any request of
any session, and a DELETE ends a session everywhere.

Three kinds of failure, three shapes: a message the transport cannot take (bad
token, bad body, no session) is an HTTP error whose JSON-RPC error body has the
CONTRACT's ``{"error", "detail"}`` as ``data``; a well-formed request that is
wrong (unknown method, bad params) is a JSON-RPC error at 200; a tool whose
work fails is a result with ``isError`` (``todos.mcp.tools``).
"""

import functools
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import split_domain_port, validate_host
from django.views.decorators.csrf import csrf_exempt

from todos import store
from todos.api.events import same_access
from todos.api.operations import ClaimNext
from todos.api.plumbing import aauthenticate, api_error_for, authenticate
from todos.mcp import listen, sessions, stateless
from todos.mcp import tools as mcp_tools
from todos.mcp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSIONS,
    SESSION_HEADER,
    VERSION_HEADER,
    Pending,
    RpcError,
    accepts,
    call_tool,
    error_body,
    server_version,
    storable,
)
from todos.mcp.tasks import Json
from todos.models import Endpoint, McpSession
from todos.waiting import longpoll, results, streams
from todos.waiting.doorbell import Ring, Waiter
from todos.web import http, sse, threads
from todos.web.http import JsonResponse
from todos.web.sse import EventStreamResponse

logger = logging.getLogger("switchboard.mcp")

# A session unused for SWITCHBOARD_MCP_SESSION_IDLE_SECONDS is gone; its
# client initializes a new one (todos.mcp.sessions).
# last_seen_at is refreshed at most this often, so a request rarely writes.
TOUCH_EVERY = timedelta(minutes=1)
LOG_LEVELS = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
DOORBELL_LEVEL = "info"


class McpRequest(HttpRequest):
    """What the transport adds to a request: its endpoint, the session of a
    GET stream, and the POST's message and kind (read once)."""

    endpoint: Endpoint
    mcp_session: McpSession
    mcp_message: "tuple[Json, str] | TransportError"


# What the transport answers a message: a response, or the wait or the stream
# that ``endpoint`` goes on to (a claim_next or wait_for_todo, a listen).
type Answer = HttpResponse | Pending | listen.Listen


INSTRUCTIONS = (
    "Switchboard is a durable work queue. Take work with claim_next: it leases one "
    "todo to you. If the work takes long, call heartbeat before the lease lapses. "
    "Finish with complete_todo, or fail_todo when it cannot be done; release_todo "
    "hands it back unfinished. When a todo says cancel_requested, stop and end it. "
    "To ask a person before going on (an approval, a choice), call ask: claim_next "
    "later returns the todo with its question, the answer and your checkpoint. "
    "Your worker name defaults to this session's id, so "
    "finish a todo in the session that claimed it, or pass the same worker name. "
    "The session's event stream announces todos that become claimable as "
    "notifications/message whose data.event is 'todo.ready'."
)


class TransportError(Exception):
    """A message the transport refuses: an HTTP status and a JSON-RPC error body."""

    def __init__(
        self,
        status: int,
        code: int,
        detail: str,
        *,
        error: str = "bad_request",
        message_id: object = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.error = error
        self.message_id = message_id
        self.headers = headers or {}

    def response(self) -> http.ErrorResponse:
        body = error_body(
            self.message_id,
            self.code,
            f"{self.error}: {self.detail}",
            http.error_body(self.error, self.detail),
        )
        response = http.ErrorResponse(body, status=self.status, headers=self.headers)
        response.error_code = self.error
        return response


def error_response(status: int, detail: str | None = None) -> http.ErrorResponse:
    """A transport error of an HTTP status, for the request middleware."""
    code = http.code_for(status)
    return TransportError(
        status,
        INTERNAL_ERROR if status >= 500 else INVALID_REQUEST,
        detail or code.replace("_", " "),
        error=code,
    ).response()


def _check_origin(request: HttpRequest) -> None:
    """Refuse a browser page of another site (DNS rebinding): 403."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        # Not a URL at all (e.g. "http://[::1", an unclosed IPv6 bracket).
        netloc = ""
    domain, _ = split_domain_port(netloc)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        raise TransportError(
            403, INVALID_REQUEST, f"origin {origin!r} is not allowed", error="forbidden"
        )


# --- Sessions -------------------------------------------------------------------


def _session(
    request: HttpRequest, endpoint: Endpoint, message_id: object = None
) -> McpSession:
    """Return the live session named by the request, of this endpoint."""
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version not in PROTOCOL_VERSIONS:
        raise TransportError(
            400,
            INVALID_REQUEST,
            f"{VERSION_HEADER} {version!r} is not supported; "
            f"this server speaks {', '.join(PROTOCOL_VERSIONS)}",
            message_id=message_id,
        )
    raw = request.headers.get(SESSION_HEADER)
    if not raw:
        raise TransportError(
            400,
            INVALID_REQUEST,
            f"the {SESSION_HEADER} header is required; call initialize first",
            message_id=message_id,
        )
    try:
        session = sessions.live().filter(pk=uuid.UUID(raw), endpoint=endpoint).first()
    except ValueError:
        session = None
    # An ended, expired, malformed or foreign session id: all the same 404,
    # which tells an MCP client to initialize a new session.
    if session is None:
        raise TransportError(
            404,
            INVALID_REQUEST,
            "no such session (it ended or expired); initialize a new one",
            error="not_found",
            message_id=message_id,
        )
    McpSession.objects.filter(
        pk=session.pk, last_seen_at__lt=Now() - TOUCH_EVERY
    ).update(last_seen_at=Now())
    return session


def _initialize(endpoint: Endpoint, message: Json) -> tuple[McpSession, Json]:
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(
        params.get("protocolVersion"), str
    ):
        raise RpcError(INVALID_PARAMS, "params.protocolVersion: is required")
    client = params.get("clientInfo")
    if not isinstance(client, dict):
        client = {}
    requested = params["protocolVersion"]
    version = requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
    # Forget this endpoint's long-idle sessions while minting a new one.
    sessions.forget_expired(endpoint)
    session = McpSession.objects.create(
        endpoint=endpoint,
        protocol_version=version,
        client_name=storable(client.get("name", ""), 200),
        client_version=storable(client.get("version", ""), 100),
    )
    result = {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}, "logging": {}},
        "serverInfo": {
            "name": "switchboard",
            "title": "Switchboard",
            "version": server_version(),
        },
        "instructions": INSTRUCTIONS,
    }
    return session, result


# --- Requests -------------------------------------------------------------------


def _is_id(value: object) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _parse(request: McpRequest) -> tuple[Json, str]:
    """Return the one JSON-RPC message of a POST and its kind (read once)."""
    parsed = getattr(request, "mcp_message", None)
    if parsed is None:
        try:
            parsed = _read_message(request)
        except TransportError as refused:
            parsed = refused
        request.mcp_message = parsed
    if isinstance(parsed, TransportError):
        raise parsed
    return parsed


def _read_message(request: HttpRequest) -> tuple[Json, str]:
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise TransportError(
            415,
            INVALID_REQUEST,
            "Content-Type must be application/json",
            error="unsupported_media_type",
        )
    try:
        body = http.read_body(request)
    except (http.BodyTooLarge, http.BadBody) as exc:
        raise TransportError(
            exc.status, INVALID_REQUEST, exc.detail, error=exc.code
        ) from None
    try:
        message = http.loads(body)
    except (ValueError, RecursionError):
        raise TransportError(400, PARSE_ERROR, "the body is not valid JSON") from None
    if isinstance(message, list):
        raise TransportError(
            400, INVALID_REQUEST, "JSON-RPC batches are not supported; send one message"
        )
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise TransportError(
            400,
            INVALID_REQUEST,
            'the body must be a JSON-RPC 2.0 object ("jsonrpc": "2.0")',
        )
    message_id = message.get("id")
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            raise TransportError(
                400,
                INVALID_REQUEST,
                "method: must be a string",
                message_id=message_id if _is_id(message_id) else None,
            )
        if "id" not in message:
            return message, "notification"
        if not _is_id(message_id):
            raise TransportError(
                400, INVALID_REQUEST, "id: must be a string or an integer"
            )
        return message, "request"
    if _is_id(message_id) and ("result" in message or "error" in message):
        return message, "response"
    raise TransportError(
        400,
        INVALID_REQUEST,
        "the body is neither a request, a notification nor a response",
    )


def _dispatch(
    method: str, params: Json, caller: mcp_tools.Caller, session: McpSession
) -> mcp_tools.Outcome:
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": mcp_tools.tool_list()}
    if method == "tools/call":
        return call_tool(params, caller)
    if method == "logging/setLevel":
        level = params.get("level")
        if level not in LOG_LEVELS:
            raise RpcError(
                INVALID_PARAMS, f"params.level: must be one of {', '.join(LOG_LEVELS)}"
            )
        McpSession.objects.filter(pk=session.pk).update(log_level=level)
        return {}
    raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")


def _check_accepts(request: McpRequest) -> None:
    if not accepts(request, "application/json"):
        raise TransportError(
            406,
            INVALID_REQUEST,
            "the client must accept application/json",
            error="not_acceptable",
        )


def _post(request: McpRequest, endpoint: Endpoint) -> Answer:
    _check_accepts(request)
    message, kind = _parse(request)
    if stateless.speaks_stateless(request, message):
        return stateless.answer(request, endpoint, message, kind)
    message_id = message.get("id")
    params = message.get("params", {})
    if kind == "request" and message["method"] == "initialize":
        try:
            session, initialized = _initialize(endpoint, message)
        except RpcError as exc:
            return JsonResponse(error_body(message_id, exc.code, exc.message))
        return JsonResponse(
            {"jsonrpc": "2.0", "id": message_id, "result": initialized},
            headers={SESSION_HEADER: str(session.id)},
        )
    session = _session(request, endpoint, message_id if kind == "request" else None)
    headers = {SESSION_HEADER: str(session.id)}
    if kind != "request":
        # Notifications (initialized, cancelled, …) need no answer; a response
        # would answer a server request, and this server sends none.
        return HttpResponse(status=202, headers=headers)
    caller = mcp_tools.Caller(
        endpoint, store.Scope.for_endpoint(endpoint), str(session.id)
    )
    try:
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params: must be an object")
        result = _dispatch(message["method"], params, caller, session)
        if isinstance(result, ClaimNext | results.ResultWait):
            # claim_next, wait_for_todo: the POST goes on waiting (``Post``).
            return Pending(result, message_id, headers, caller.scope)
        body = {"jsonrpc": "2.0", "id": message_id, "result": result}
    except RpcError as exc:
        body = error_body(message_id, exc.code, exc.message)
    return JsonResponse(body, headers=headers)


class Post(longpoll.LongPoll):
    """An MCP POST: any message is answered in ``start`` (``_aanswer``), but
    a tools/call of claim_next, which claims as a long poll, and one of
    wait_for_todo, which ``_post_waiting`` then awaits (``todos.waiting.results``)."""

    def __init__(self, request: McpRequest) -> None:
        self.request = request
        self.pending: Pending | None = None
        self.response: HttpResponseBase | listen.Listen | None = None

    async def start(self) -> store.Scope | None:
        answer = await _aanswer(self.request)
        if not isinstance(answer, Pending):
            self.response = answer
            return None
        self.pending, work = answer, answer.work
        work.request = self.request
        if not isinstance(work, ClaimNext):
            return None
        self.queue, self.wait = work.queue, work.wait
        return answer.scope

    def _claim(self) -> ClaimNext:
        work = self.pending.work if self.pending is not None else None
        assert isinstance(work, ClaimNext)  # start gave a scope for a claim only
        return work

    async def revalidate(self) -> store.Scope:
        return await self._claim().revalidate()

    async def attempt(self, scope: store.Scope) -> longpoll.Claimed:
        return await self._claim().attempt(scope)


async def _post_waiting(request: McpRequest) -> HttpResponseBase:
    post = Post(request)
    try:
        outcome = await longpoll.claim(post)
        work = post.pending.work if post.pending is not None else None
        if isinstance(work, results.ResultWait):
            outcome = await results.wait(work)
    except Exception as exc:
        if post.pending is None:
            raise
        result = mcp_tools.failure(post.pending.tool, exc)
    else:
        if isinstance(post.response, listen.Listen):
            return await listen.listen_stream(post.response, stateless.completed)
        if post.pending is None:
            assert post.response is not None  # start answered the message
            return post.response
        assert outcome is not None  # the claim or the wait answered
        result = mcp_tools.finished(outcome)
    result = post.pending.finish(result)
    body = {"jsonrpc": "2.0", "id": post.pending.message_id, "result": result}
    return JsonResponse(body, headers=post.pending.headers)


# --- The session's event stream -------------------------------------------------


def doorbell_notification(ring: Ring) -> Json:
    """Return the notifications/message that announces a claimable todo (or
    another event of a todo: ``todo.done``, ``todo.asked``, …).

    A standard logging notification, so that every MCP client accepts it
    (an unknown method would be dropped by the official SDK's client).
    """
    return {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {
            "level": DOORBELL_LEVEL,
            "logger": "switchboard.doorbell",
            "data": {
                "event": ring.get("event", "todo.ready"),
                "id": str(ring["id"]),
                "endpoint_id": str(ring["endpoint_id"]),
                "queue": ring["queue"],
            },
        },
    }


def _doorbell_event(ring: Ring) -> str:
    return _doorbell_text(
        str(ring["id"]),
        str(ring["endpoint_id"]),
        ring["queue"],
        ring.get("event", "todo.ready"),
    )


@functools.lru_cache(maxsize=4096)
def _doorbell_text(todo_id: str, endpoint_id: str, queue: str, event: str) -> str:
    # One ring reaches every open stream of its scope: its text is made once.
    ring: Ring = {
        "id": todo_id,
        "endpoint_id": endpoint_id,
        "queue": queue,
        "event": event,
    }
    return _event(doorbell_notification(ring))


def _wants_doorbell(log_level: str) -> bool:
    return LOG_LEVELS.index(log_level) <= LOG_LEVELS.index(DOORBELL_LEVEL)


def session_level(session_id: uuid.UUID) -> str | None:
    """Return the session's log level, or None when the session has ended."""
    return (
        McpSession.objects.filter(pk=session_id)
        .values_list("log_level", flat=True)
        .first()
    )


def _event(message: Json) -> str:
    return f"event: message\ndata: {json.dumps(message)}\n\n"


async def _authorize_stream(request: McpRequest) -> tuple[store.Scope, uuid.UUID]:
    if not accepts(request, "text/event-stream"):
        raise TransportError(
            406,
            INVALID_REQUEST,
            "the client must accept text/event-stream",
            error="not_acceptable",
        )
    _check_origin(request)
    request.endpoint = await aauthenticate(request)
    request.mcp_session = await threads.run_pooled(_session, request, request.endpoint)
    return store.Scope.for_endpoint(request.endpoint), request.mcp_session.pk


async def session_stream(
    request: McpRequest, waiter: Waiter, first: list[Ring]
) -> AsyncGenerator[str]:
    """The body of a session's GET stream (``todos.waiting.streams`` waits for it).

    Besides the streams' own ends, it ends when its session ends (a DELETE,
    possibly in another process, or the endpoint's revocation); the hub's
    control channel says when the session changed, so it reads its row only
    then.
    """
    scope, session = waiter.scope, request.mcp_session
    level = [session.log_level]

    async def refresh(notices: set[str]) -> bool:
        if not await same_access(request, scope):
            return False
        now = await threads.run_pooled(session_level, session.pk)
        if now is None:
            return False
        level[0] = now
        return True

    yield ": connected\n\n"
    async for said in streams.watch(
        waiter, first, refresh, settings.SWITCHBOARD_SSE_KEEPALIVE_SECONDS
    ):
        if isinstance(said, streams.Ended):
            return
        if said and _wants_doorbell(level[0]):
            yield "".join(_doorbell_event(ring) for ring in said)
        else:
            yield ": keep-alive\n\n"


async def _stream(request: McpRequest) -> EventStreamResponse:
    waiter, first = await streams.open_stream(_authorize_stream, request)
    response = sse.event_stream(session_stream(request, waiter, first), waiter.close)
    response[SESSION_HEADER] = str(request.mcp_session.id)
    return response


def _delete(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    session = _session(request, endpoint)
    McpSession.objects.filter(pk=session.pk).delete()
    return HttpResponse(status=204)


HANDLERS: dict[str, Callable[[McpRequest, Endpoint], Answer]] = {
    "POST": _post,
    "DELETE": _delete,
}


@csrf_exempt
async def endpoint(request: McpRequest) -> HttpResponseBase:
    """Serve the MCP Streamable HTTP transport for the token's endpoint.

    An async view: the GET stream and a waiting claim_next wait in the event
    loop without a thread or a connection, and every other message is
    answered in one pooled database call.
    """
    try:
        if request.method == "GET":
            return await _stream(request)
        if request.method == "POST":
            return await _post_waiting(request)
        answered = await threads.run_pooled(_answer, request)
        assert isinstance(answered, HttpResponseBase)  # only a POST waits or listens
        return answered
    except Exception as exc:
        return _failure(exc)


async def _aanswer(request: McpRequest) -> Answer:
    """Answer a POST: a 2026-07-28 tools/call of a tool with an async handler
    (the acknowledgements) awaited here, in the event loop; any other message
    in one pooled call (``_answer``)."""
    try:
        message, kind = _parse(request)
    except TransportError:
        message, kind = {}, ""  # _answer refuses it, after the token
    if not stateless.awaits_tool(request, message, kind):
        return await threads.run_pooled(_answer, request)
    try:
        _check_origin(request)
        # The request log names the endpoint, as it does for the JSON API.
        request.endpoint = await aauthenticate(request)
        _check_accepts(request)
        return await stateless.aanswer_tool(request, request.endpoint, message)
    except Exception as exc:
        return _failure(exc)


def _answer(request: McpRequest) -> Answer:
    try:
        handler = HANDLERS.get(request.method or "")
        if handler is None:
            raise TransportError(
                405,
                INVALID_REQUEST,
                "use POST, GET or DELETE on /mcp",
                error="method_not_allowed",
                headers={"Allow": "GET, POST, DELETE"},
            )
        _check_origin(request)
        # The request log names the endpoint, as it does for the JSON API.
        request.endpoint = authenticate(request)
        return handler(request, request.endpoint)
    except Exception as exc:
        return _failure(exc)


def _failure(exc: Exception) -> http.ErrorResponse:
    """Answer a known failure as the transport does; re-raise an unknown one."""
    if isinstance(exc, TransportError):
        return exc.response()
    error = api_error_for(exc)
    if error is None:
        raise exc
    code = INTERNAL_ERROR if error.status >= 500 else INVALID_REQUEST
    return TransportError(
        error.status, code, error.detail, error=error.code, headers=error.headers
    ).response()
