"""What both MCP transports share: JSON-RPC framing, error codes and tool calls.

The session transport (``todos.mcp.transport``) and the stateless revision
(``todos.mcp.stateless``) read and answer the same JSON-RPC 2.0 messages and
call the same tools; this module holds that once, below both, so neither
imports the other for it.
"""

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from todos import store
from todos.api.operations import ClaimNext
from todos.mcp import tools as mcp_tools
from todos.waiting import results

# A JSON-RPC message or its parts: JSON values.
type Message = dict[str, Any]

# Newest first: offered when a client asks for a revision we do not speak.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class RpcError(Exception):
    """A well-formed request that cannot be served: a JSON-RPC error at 200."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_body(
    message_id: object, code: int, message: str, data: object = None
) -> Message:
    """A JSON-RPC error response."""
    error: Message = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": message_id, "error": error}


def accepts(request: HttpRequest, media_type: str) -> bool:
    """Whether the request's Accept takes ``media_type`` (no Accept takes all)."""
    accept = request.headers.get("Accept", "")
    return not accept or media_type in accept or "*/*" in accept


@functools.cache
def server_version() -> str:
    # Read once: the installed version does not change while the process runs,
    # and reading the package metadata cost a third of an MCP call's CPU.
    try:
        return importlib.metadata.version("switchboard")
    except importlib.metadata.PackageNotFoundError:
        # Run from a checkout that was never pip-installed.
        return "dev"


def storable(value: object, max_length: int) -> str:
    """Return a client-given label as text PostgreSQL stores (no NUL, no lone
    surrogates), cut to length: it is only shown, never matched."""
    text = str(value)[:max_length].replace("\x00", "")
    return text.encode("utf-8", "replace").decode("utf-8")


def call_tool(params: Message, caller: mcp_tools.Caller) -> mcp_tools.Outcome:
    """Run a tools/call's tool, its name and arguments checked first."""
    return mcp_tools.call(*tool_call(params), caller.traced(params))


async def acall_tool(params: Message, caller: mcp_tools.Caller) -> mcp_tools.Outcome:
    """``call_tool`` of a tool with an async handler, awaited in the loop."""
    return await mcp_tools.acall(*tool_call(params), caller.traced(params))


def tool_call(params: Message) -> tuple[mcp_tools.Tool, dict[str, Any]]:
    """A tools/call's tool and arguments, checked."""
    name = params.get("name")
    if not isinstance(name, str):
        raise RpcError(INVALID_PARAMS, "params.name: must be the name of a tool")
    tool = mcp_tools.TOOLS.get(name)
    if tool is None:
        raise RpcError(INVALID_PARAMS, f"unknown tool {name!r}; tools/list names them")
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "params.arguments: must be an object")
    return tool, arguments


class Pending:
    """A tools/call, read and checked, that is yet to wait: claim_next's long
    poll (a ``ClaimNext``) or wait_for_todo's wait (a ``ResultWait``)."""

    def __init__(
        self,
        work: ClaimNext | results.ResultWait,
        message_id: object,
        headers: dict[str, str],
        scope: store.Scope,
        finish: Callable[[mcp_tools.Result], mcp_tools.Result] | None = None,
    ) -> None:
        self.work, self.message_id = work, message_id
        self.headers, self.scope = headers, scope
        # The revision's last touch on the tool result (2026-07-28 types it).
        self.finish = finish or (lambda result: result)

    @property
    def tool(self) -> mcp_tools.Tool:
        waiting = "claim_next" if isinstance(self.work, ClaimNext) else "wait_for_todo"
        return mcp_tools.TOOLS[waiting]
