"""MCP 2026-07-28 on ``/mcp``: stateless requests (CONTRACT §15).

The revision has no handshake and no session. Every request says in its
``params._meta`` which protocol version it speaks, what the client can do
and (optionally) who the client is; on HTTP the ``MCP-Protocol-Version``,
``Mcp-Method`` and ``Mcp-Name`` headers mirror the body, and a server must
refuse a request where they disagree (an intermediary may have routed on the
headers). Every result carries ``resultType`` and names the server in its
``_meta``.

``/mcp`` serves this revision beside 2025-11-25 (``todos.mcp.transport``),
chosen per request as the spec's dual-era server does: ``initialize`` or an
``Mcp-Session-Id`` header is the older revision; a ``_meta`` protocol version,
a modern ``MCP-Protocol-Version`` header or ``server/discover`` is this one.

Without a session there is no session id to default a worker name to: a tool
call's ``worker`` argument names it, else ``default_worker`` derives one from
the bearer token and the client's name, the same on every request of that
client (and different for another token or another client program).
"""

import base64
import binascii
import hashlib

from django.http import HttpRequest, HttpResponse

from todos import store
from todos.api.operations import ClaimNext
from todos.mcp import jsonrpc, listen, resources, tasks
from todos.mcp import tools as mcp_tools
from todos.mcp.tasks import Json
from todos.models import Endpoint
from todos.waiting import results
from todos.web.http import JsonResponse

MODERN_VERSIONS = ("2026-07-28",)
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
META_SERVER = "io.modelcontextprotocol/serverInfo"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# The methods whose Mcp-Name header mirrors a params field, and that field
# (the tasks extension names its task, for routing by task).
NAMED = {
    "tools/call": "name",
    "resources/read": "uri",
    "prompts/get": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
BASE64_PREFIX, BASE64_SUFFIX = "=?base64?", "?="

HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022

# How long a client may cache a list (SEP-2549). The tools change only with a
# deploy; the queues (resources) come and go with use.
TOOLS_TTL_MS = 300_000
RESOURCES_TTL_MS = 10_000
# A queue read is its live figures: not to be served from a cache.
READ_TTL_MS = 0


class ModernError(Exception):
    """A request this revision refuses: an HTTP status and a JSON-RPC error."""

    def __init__(
        self, status: int, code: int, message: str, data: object = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.data = status, code, message, data

    def response(self, message_id: object) -> JsonResponse:
        error: Json = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        body = {"jsonrpc": "2.0", "id": message_id, "error": error}
        return JsonResponse(body, status=self.status)


def supported_versions() -> list[str]:
    """Every revision ``/mcp`` speaks, newest first."""
    return [*MODERN_VERSIONS, *jsonrpc.PROTOCOL_VERSIONS]


def speaks_stateless(request: HttpRequest, message: Json) -> bool:
    """Say whether this message is of the stateless revision (see above).

    An ``initialize`` is the older revision's handshake unless it carries this
    revision's ``_meta``: then it asks for a method this revision removed
    (404, as the conformance suite expects of a dual-era server).
    """
    if jsonrpc.SESSION_HEADER in request.headers:
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    names_version = isinstance(meta, dict) and META_VERSION in meta
    if message.get("method") == "initialize":
        return names_version
    return (
        names_version
        or request.headers.get(jsonrpc.VERSION_HEADER) in MODERN_VERSIONS
        or message.get("method") == "server/discover"
    )


def _meta(params: Json) -> tuple[str, Json, Json]:
    """Return the request's (version, client info, capabilities), or refuse
    it; the version is judged after the headers (``_supported``)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise ModernError(
            400, jsonrpc.INVALID_PARAMS, "params._meta: is required on 2026-07-28"
        )
    version = meta.get(META_VERSION)
    if not isinstance(version, str) or not version:
        raise ModernError(
            400,
            jsonrpc.INVALID_PARAMS,
            f"params._meta[{META_VERSION!r}]: is required",
        )
    if not isinstance(meta.get(META_CAPABILITIES), dict):
        raise ModernError(
            400,
            jsonrpc.INVALID_PARAMS,
            f"params._meta[{META_CAPABILITIES!r}]: is required (an object)",
        )
    client = meta.get(META_CLIENT)
    return version, client if isinstance(client, dict) else {}, meta[META_CAPABILITIES]


def _supported(version: str) -> None:
    """Refuse a protocol version this revision does not speak."""
    if version not in MODERN_VERSIONS:
        raise ModernError(
            400,
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
            {"supported": supported_versions(), "requested": version},
        )


def _header_value(raw: str) -> str:
    """Decode a header value that may use the Base64 sentinel form."""
    if raw.startswith(BASE64_PREFIX) and raw.endswith(BASE64_SUFFIX):
        encoded = raw[len(BASE64_PREFIX) : -len(BASE64_SUFFIX)]
        try:
            return base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise _mismatch(f"{raw!r} is not valid Base64 of UTF-8 text") from None
    return raw


def _mismatch(detail: str) -> ModernError:
    return ModernError(400, HEADER_MISMATCH, f"Header mismatch: {detail}")


def _check_headers(
    request: HttpRequest, method: str, params: Json, version: str
) -> None:
    """Refuse a request whose headers are missing or disagree with its body."""
    expected = {jsonrpc.VERSION_HEADER: version, METHOD_HEADER: method}
    if method in NAMED:
        value = params.get(NAMED[method])
        if isinstance(value, str):
            expected[NAME_HEADER] = value
    for header, body_value in expected.items():
        raw = request.headers.get(header)
        if raw is None:
            raise _mismatch(f"the {header} header is required")
        value = _header_value(raw) if header == NAME_HEADER else raw
        if value != body_value:
            raise _mismatch(
                f"{header} header value {value!r} does not match body value "
                f"{body_value!r}"
            )


def default_worker(request: HttpRequest, client: Json) -> str:
    """The worker name of a sessionless client that names none (see above)."""
    token = request.headers.get("Authorization", "")
    name = jsonrpc.storable(client.get("name") or "client", 60)
    digest = hashlib.sha256(f"{token}\0{name}".encode()).hexdigest()[:12]
    return f"mcp:{name}:{digest}"[: store.MAX_NAME_CHARS]


def server_meta() -> Json:
    return {
        META_SERVER: {
            "name": "switchboard",
            "title": "Switchboard",
            "version": jsonrpc.server_version(),
        }
    }


def completed(result: Json) -> Json:
    """``result`` as this revision answers it: typed, naming the server."""
    return {
        "resultType": "complete",
        **result,
        "_meta": {**server_meta(), **result.get("_meta", {})},
    }


def capabilities() -> Json:
    return {
        "tools": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
        "extensions": {tasks.EXTENSION: {}},
    }


def discover() -> Json:
    return {
        "supportedVersions": supported_versions(),
        "capabilities": capabilities(),
        "instructions": INSTRUCTIONS,
        "ttlMs": TOOLS_TTL_MS,
        "cacheScope": "private",
    }


INSTRUCTIONS = (
    "Switchboard is a durable work queue. Take work with claim_next: it leases one "
    "todo to you. If the work takes long, call heartbeat before the lease lapses. "
    "Finish with complete_todo, or fail_todo when it cannot be done; release_todo "
    "hands it back unfinished. When a todo says cancel_requested, stop and end it. "
    "To ask a person before going on (an approval, a choice), call ask: claim_next "
    "later returns the todo with its question, the answer and your checkpoint. "
    "Pass the same worker name on every call, or the "
    "lease_token your claim returned; without either, your worker name is derived "
    "from your token and your client's name. Each queue is a resource "
    "switchboard://queues/<name>: subscriptions/listen with resourceSubscriptions "
    "tells you when a todo there becomes claimable."
)


def _needs_tasks(capabilities: Json) -> None:
    if not tasks.declared(capabilities):
        raise ModernError(
            400,
            tasks.MISSING_REQUIRED_CLIENT_CAPABILITY,
            "Missing required client capability",
            tasks.missing_capability(),
        )


def _call_tool(
    params: Json, caller: mcp_tools.Caller, capabilities: Json
) -> mcp_tools.Outcome:
    """A tools/call: a tool that starts work answers a task when it may."""
    name = params.get("name")
    if name == "delegate":
        _needs_tasks(capabilities)
        arguments = params.get("arguments")
        if not isinstance(arguments, dict):
            raise jsonrpc.RpcError(
                jsonrpc.INVALID_PARAMS, "params.arguments: must be an object"
            )
        return tasks.created(tasks.call_delegate(arguments, caller.traced(params)))
    result = jsonrpc.call_tool(params, caller)
    if name in tasks.STARTS_WORK and tasks.declared(capabilities):
        assert isinstance(result, dict)  # create_todo answers its result
        return tasks.created(result)
    return result


def _dispatch(
    request: HttpRequest,
    method: str,
    params: Json,
    caller: mcp_tools.Caller,
    message_id: object,
    capabilities: Json,
) -> mcp_tools.Outcome | listen.Listen:
    if method == "server/discover":
        return discover()
    if method == "tools/list":
        return {
            "tools": tasks.tool_list(),
            "ttlMs": TOOLS_TTL_MS,
            "cacheScope": "private",
        }
    if method == "tools/call":
        return _call_tool(params, caller, capabilities)
    if method in tasks.METHODS:
        _needs_tasks(capabilities)
        return tasks.METHODS[method](caller, params)
    if method == "resources/list":
        return {
            **resources.resource_list(caller.scope),
            "ttlMs": RESOURCES_TTL_MS,
            "cacheScope": "private",
        }
    if method == "resources/templates/list":
        return {
            "resourceTemplates": [resources.TEMPLATE],
            "ttlMs": TOOLS_TTL_MS,
            "cacheScope": "private",
        }
    if method == "resources/read":
        return {
            **resources.read(caller.scope, params),
            "ttlMs": READ_TTL_MS,
            "cacheScope": "private",
        }
    if method == "subscriptions/listen":
        if not jsonrpc.accepts(request, "text/event-stream"):
            raise ModernError(
                406,
                jsonrpc.INVALID_REQUEST,
                "subscriptions/listen answers an event stream: accept "
                "text/event-stream",
            )
        if listen.names_tasks(params):
            _needs_tasks(capabilities)
        return listen.Listen.of(request, caller.scope, params, message_id)
    raise ModernError(404, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")


def answer(
    request: HttpRequest, endpoint: Endpoint, message: Json, kind: str
) -> HttpResponse | jsonrpc.Pending | listen.Listen:
    """Answer one POSTed message of this revision.

    A JSON response, a ``jsonrpc.Pending`` claim_next or wait_for_todo (the
    transport waits for it) or a ``listen.Listen`` (the transport opens
    its stream).
    """
    if kind == "notification":
        return HttpResponse(status=202)
    message_id = message.get("id")
    if kind == "response":
        return ModernError(
            400,
            jsonrpc.INVALID_REQUEST,
            "a client sends no JSON-RPC responses on 2026-07-28",
        ).response(None)
    method, params = message["method"], message.get("params", {})
    try:
        caller, capabilities = _opened(request, endpoint, method, params)
        result = _dispatch(request, method, params, caller, message_id, capabilities)
    except Exception as exc:
        return _refused(exc, message_id)
    if isinstance(result, listen.Listen):
        return result
    if isinstance(result, ClaimNext | results.ResultWait):
        return jsonrpc.Pending(result, message_id, {}, caller.scope, completed)
    return JsonResponse(
        {"jsonrpc": "2.0", "id": message_id, "result": completed(result)}
    )


def awaits_tool(request: HttpRequest, message: Json, kind: str) -> bool:
    """Whether the message is a tools/call of this revision whose tool has an
    async handler (``aanswer_tool`` awaits it in the event loop)."""
    params = message.get("params")
    if kind != "request" or message.get("method") != "tools/call":
        return False
    if not isinstance(params, dict):
        return False
    tool = mcp_tools.TOOLS.get(params.get("name"))  # type: ignore[arg-type]  # any key
    return (
        tool is not None
        and tool.ahandler is not None
        and speaks_stateless(request, message)
    )


async def aanswer_tool(
    request: HttpRequest, endpoint: Endpoint, message: Json
) -> HttpResponse | jsonrpc.Pending:
    """``answer`` of a tools/call that ``awaits_tool``: in the event loop."""
    message_id = message.get("id")
    params = message.get("params", {})
    try:
        caller, _ = _opened(request, endpoint, "tools/call", params)
        result = await jsonrpc.acall_tool(params, caller)
    except Exception as exc:
        return _refused(exc, message_id)
    if isinstance(result, ClaimNext | results.ResultWait):
        return jsonrpc.Pending(result, message_id, {}, caller.scope, completed)
    return JsonResponse(
        {"jsonrpc": "2.0", "id": message_id, "result": completed(result)}
    )


def _opened(
    request: HttpRequest, endpoint: Endpoint, method: str, params: object
) -> tuple[mcp_tools.Caller, Json]:
    """Check a request's params, ``_meta`` and headers; its caller and the
    client's capabilities."""
    if not isinstance(params, dict):
        raise ModernError(400, jsonrpc.INVALID_PARAMS, "params: must be an object")
    version, client, capabilities = _meta(params)
    # Headers first: a version header unlike the body's is a mismatch
    # (an intermediary may have routed on it), whatever the version.
    _check_headers(request, method, params, version)
    _supported(version)
    caller = mcp_tools.Caller(
        endpoint,
        store.Scope.for_endpoint(endpoint),
        default_worker(request, client),
    )
    return caller, capabilities


def _refused(exc: Exception, message_id: object) -> HttpResponse:
    """A request this revision refuses, answered; re-raise anything else."""
    if isinstance(exc, ModernError):
        return exc.response(message_id)
    if isinstance(exc, jsonrpc.RpcError):
        return JsonResponse(jsonrpc.error_body(message_id, exc.code, exc.message))
    if isinstance(exc, tasks.TaskError):
        return JsonResponse(
            jsonrpc.error_body(message_id, exc.code, exc.message, exc.data)
        )
    if isinstance(exc, resources.BadParams):
        return JsonResponse(
            jsonrpc.error_body(message_id, jsonrpc.INVALID_PARAMS, str(exc))
        )
    if isinstance(exc, resources.ResourceNotFound):
        return JsonResponse(
            jsonrpc.error_body(
                message_id, jsonrpc.INVALID_PARAMS, str(exc), {"uri": exc.uri}
            )
        )
    raise exc
