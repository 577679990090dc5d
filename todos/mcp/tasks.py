"""Todos as MCP Tasks: the extension ``io.modelcontextprotocol/tasks``.

A client that declares the extension in its request's client capabilities
gets, from ``create_todo`` and ``delegate``, a ``CreateTaskResult`` whose
``taskId`` is the todo's id: the task is the todo, so it is durable, the same
in every server process, and survives a restart by construction (the spec
asks that a task exist before its id is answered: the create committed).

``tasks/get`` reads the todo and maps its outcome (CONTRACT §14):

- pending, claimed, retry scheduled → ``working``, the worker's last progress
  message as ``statusMessage``;
- held for an answer → ``input_required``, its question as one elicitation
  in ``inputRequests`` (keyed by the time it was asked: a new question is a
  new key, as the spec wants keys unique over a task's life);
- done → ``completed``, with what ``get_todo`` answers as the tool result;
- dead letter → ``completed`` with an error tool result (``isError``), its
  last error as the text: the extension keeps ``failed`` for JSON-RPC
  errors, and the work's failure is none;
- canceled → ``cancelled``.

``tasks/update`` answers the question (the Board, an answer link or another
agent may have answered first: a response to a question no longer open is
ignored, as the spec says); ``tasks/cancel`` cancels the todo (a claimed one
gets a cancel request its worker sees). The task ids are the endpoint's todo
ids: another endpoint's id is not found, like one never minted.
"""

from typing import Any

from todos import store
from todos.api.plumbing import api_error_for
from todos.mcp import tools as mcp_tools

EXTENSION = "io.modelcontextprotocol/tasks"
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
POLL_INTERVAL_MS = 2000
# Tools whose call starts work, answered as a task when the client can take one.
STARTS_WORK = ("create_todo", "delegate")
ANSWER_FIELD = "answer"

WORKING = ("pending", "claimed", "retry_scheduled")

# A todo, a task, a request's params or a result, as JSON: JSON values.
type Json = dict[str, Any]


class TaskError(Exception):
    """A tasks/* request that cannot be served: a JSON-RPC error at 200."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def declared(capabilities: Json) -> bool:
    """Say whether these client capabilities declare the extension."""
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(EXTENSION), dict)


def missing_capability() -> Json:
    """The data of a -32021 error naming the extension."""
    return {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


DELEGATE_DESCRIPTION = (
    "Hand work to whoever takes this queue's todos and follow it as a task: it "
    "answers a task whose taskId is the new todo's id. Poll tasks/get for its "
    "progress, answer its worker's question with tasks/update, stop it with "
    "tasks/cancel. Needs the io.modelcontextprotocol/tasks extension; without it "
    "use create_todo, then get_todo."
)


def tool_list() -> list[Json]:
    """The tools of 2026-07-28: the shared ones and ``delegate`` (create_todo's
    arguments, answered as a task)."""
    delegate = {
        **mcp_tools.TOOLS["create_todo"].to_dict(),
        "name": "delegate",
        "title": "Delegate work",
        "description": DELEGATE_DESCRIPTION,
    }
    return [*mcp_tools.tool_list(), delegate]


def call_delegate(arguments: Json, caller: mcp_tools.Caller) -> mcp_tools.Result:
    """Run ``delegate``: the create_todo tool under its own name."""
    tool = mcp_tools.TOOLS["create_todo"]
    result = mcp_tools.call(tool, arguments, caller)
    assert isinstance(result, dict)  # create_todo answers its result
    return result


def created(tool_result: mcp_tools.Result) -> mcp_tools.Result:
    """The CreateTaskResult of a create's tool result (an error stays one)."""
    if tool_result.get("isError"):
        return tool_result
    todo = tool_result["structuredContent"]["todo"]
    return {"resultType": "task", **detailed(todo)}


def detailed(todo: Json) -> Json:
    """The task of a todo (its JSON), as tasks/get and notifications/tasks
    carry it."""
    outcome = todo["outcome"]
    task = {
        "taskId": todo["id"],
        "createdAt": todo["created_at"],
        "lastUpdatedAt": todo["updated_at"],
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if outcome in WORKING:
        progress = todo.get("progress") or {}
        message = progress.get("message") or f"the todo is {outcome}"
        return {**task, "status": "working", "statusMessage": message}
    if outcome == "held":
        question = todo["question"]
        return {
            **task,
            "status": "input_required",
            "statusMessage": question["text"],
            "inputRequests": {_key(question): _elicitation(question)},
        }
    if outcome == "canceled":
        canceled = (todo.get("result") or {}).get("canceled") or {}
        message = canceled.get("reason") or "canceled"
        return {**task, "status": "cancelled", "statusMessage": message}
    if outcome == "dead_letter":
        error = todo.get("last_error") or "the todo failed"
        return {
            **task,
            "status": "completed",
            "statusMessage": error,
            "result": _dead_letter_result(todo, error),
        }
    return {**task, "status": "completed", "result": mcp_tools._ok({"todo": todo})}


def _dead_letter_result(todo: Json, error: str) -> mcp_tools.Result:
    """The tool result of work that failed for good: an error result (the
    extension keeps ``failed`` for JSON-RPC errors), the todo as its data."""
    text = f"dead_letter: {error}. retry_todo runs the todo again."
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"todo": todo},
        "isError": True,
    }


def _key(question: Json) -> str:
    return f"question-{question['asked_at']}"


def _elicitation(question: Json) -> Json:
    if question.get("answer_schema"):
        answer = question["answer_schema"]
    elif question.get("choices"):
        answer = {"type": "string", "enum": question["choices"]}
    else:
        answer = {"type": "string"}
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": question["text"],
            "requestedSchema": {
                "type": "object",
                "properties": {ANSWER_FIELD: answer},
                "required": [ANSWER_FIELD],
            },
        },
    }


def _task_id(params: Json) -> str:
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise TaskError(-32602, "params.taskId: must be a task id")
    return task_id


def _todo(scope: store.Scope, task_id: str) -> store.Todo:
    try:
        return store.get_todo(scope, task_id)
    except store.NotFound:
        raise TaskError(-32602, f"Task not found: {task_id}") from None


def get(caller: mcp_tools.Caller, params: Json) -> Json:
    return detailed(_todo(caller.scope, _task_id(params)).to_dict())


def update(caller: mcp_tools.Caller, params: Json) -> Json:
    """Answer the open question from the response to its key; ignore the rest."""
    task_id = _task_id(params)
    responses = params.get("inputResponses")
    if not isinstance(responses, dict):
        raise TaskError(-32602, "params.inputResponses: must be an object")
    todo = _todo(caller.scope, task_id).to_dict()
    if todo["outcome"] != "held":
        return {}
    response = responses.get(_key(todo["question"]))
    if not isinstance(response, dict) or response.get("action") != "accept":
        return {}
    content = response.get("content")
    if not isinstance(content, dict) or ANSWER_FIELD not in content:
        raise TaskError(
            -32602, f"inputResponses: an accepted answer needs content.{ANSWER_FIELD}"
        )
    try:
        store.answer_todo(caller.scope, task_id, content[ANSWER_FIELD])
    except store.Conflict:
        # Answered meanwhile (on the Board, by a link or another agent).
        return {}
    except Exception as exc:
        error = api_error_for(exc)
        if error is None or error.status >= 500 or error.status == 401:
            raise
        raise TaskError(-32602, f"{error.code}: {error.detail}") from None
    return {}


def cancel(caller: mcp_tools.Caller, params: Json) -> Json:
    """Cancel the todo; a terminal one is acknowledged all the same."""
    task_id = _task_id(params)
    try:
        store.cancel_todo(caller.scope, task_id, reason="tasks/cancel")
    except store.NotFound:
        raise TaskError(-32602, f"Task not found: {task_id}") from None
    except store.Conflict:
        pass
    return {}


METHODS = {"tasks/get": get, "tasks/update": update, "tasks/cancel": cancel}
