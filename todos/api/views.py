"""The agent JSON API (CONTRACT §5): thin views over the endpoint-scoped store.

Each view reads its validated fields, calls one store function with the
caller's scope, and renders the todo; ``todos.api.plumbing.api_view`` does the token
auth, the body parsing and the error mapping.
"""

from collections.abc import Awaitable, Callable

from todos import store
from todos.api import fields as table
from todos.api.fields import Fields, Operation
from todos.api.operations import (
    ClaimNext,
    aacknowledge_batch,
    atransition,
    cancel_status,
    checked,
    create_batch,
    create_todo,
    list_page,
    transition,
)
from todos.api.plumbing import (
    ApiRequest,
    aauthenticate,
    api_view,
    aprepare,
    todo_response,
)
from todos.telemetry import tracing
from todos.waiting import longpoll, results
from todos.web.http import JsonResponse

# An owner transition of the store (store.ask, …) and its async twin
# (store.aheartbeat, store.acomplete_todo, …).
Move = Callable[..., store.Todo]
AsyncMove = Callable[..., Awaitable[store.Todo]]


@api_view("GET", "POST")
def todos(request: ApiRequest) -> JsonResponse:
    """List this endpoint's todos (GET) or enqueue one (POST)."""
    if request.method == "POST":
        return create(request)
    return JsonResponse(list_page(request.scope, Fields(request.GET, from_query=True)))


def create(request: ApiRequest) -> JsonResponse:
    """Enqueue a todo: 201, or 200 when it collapsed onto a live duplicate.

    A body ``{"todos": [...]}`` enqueues up to 100 and answers 200 with one
    result per item, in order.
    """
    actor = f"agent:{request.endpoint.name}"
    context = tracing.from_request(request.META)
    if "todos" in request.body_fields.data:
        return JsonResponse(
            create_batch(
                request.scope, request.body_fields, actor=actor, trace_context=context
            )
        )
    todo, created = create_todo(
        request.scope, request.body_fields, actor=actor, trace_context=context
    )
    return todo_response(todo, status=201 if created else 200, created=created)


class ApiResultWait(results.ResultWait):
    request: ApiRequest

    async def start(self) -> store.Scope:
        await aprepare(self.request)
        query = Fields(self.request.GET, from_query=True)
        self.wait = query.read(table.GET_TODO)["wait_seconds"]
        return self.request.scope

    async def revalidate(self) -> store.Scope:
        # A revoked or re-keyed token ends the wait (401).
        return store.Scope.for_endpoint(await aauthenticate(self.request))


@api_view("GET")
async def detail(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Return one todo of this endpoint; with ``wait_seconds`` (≤ 20), once it
    is terminal or asking, or when the wait ends (todos.waiting.results: no
    thread and no connection while it waits)."""
    return todo_response(await results.wait(ApiResultWait(request, todo_id)))


class ApiClaim(ClaimNext):
    request: ApiRequest

    async def start(self) -> store.Scope:
        await aprepare(self.request)
        self.read(self.request.body_fields)
        return self.request.scope


@api_view("POST")
async def claim_next(request: ApiRequest) -> JsonResponse:
    """Claim the next claimable todo, waiting up to wait_seconds for one.

    A long poll (todos.waiting.longpoll): while it waits it holds no thread and no
    database connection. With ``max_todos`` (1..10) it claims up to that many
    in one statement and always answers 200 ``{"todos": [...]}``, an empty
    list after the wait.
    """
    poll = ApiClaim(request)
    claimed = await longpoll.claim(poll)
    assert claimed is not None  # ApiClaim.start always answers a scope
    if isinstance(claimed, list):  # a max_todos claim (poll.limit)
        return JsonResponse({"todos": [todo.to_dict() for todo in claimed]})
    return todo_response(claimed)


@api_view("POST")
def claim(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Claim one specific todo."""
    claim = request.body_fields.read(table.CLAIM_TODO)
    return todo_response(store.claim_todo(request.scope, todo_id, **claim))


def _transition(
    request: ApiRequest, todo_id: str, move: Move, operation: Operation
) -> JsonResponse:
    fields = request.body_fields
    todo = transition(move, operation, request.scope, todo_id, fields)
    return todo_response(todo)


async def _acknowledge(
    request: ApiRequest, todo_id: str, move: AsyncMove, operation: Operation
) -> JsonResponse:
    """An owner transition, awaited in the event loop: one statement."""
    await aprepare(request)
    fields = request.body_fields
    todo = await atransition(move, operation, request.scope, todo_id, fields)
    return todo_response(todo)


@api_view("POST")
async def heartbeat(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Extend the caller's lease on a claimed todo, with its progress and
    checkpoint; the answer says whether a cancel was requested."""
    return await _acknowledge(request, todo_id, store.aheartbeat, table.HEARTBEAT)


@api_view("POST")
async def complete(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Mark the caller's claimed todo done with its result."""
    return await _acknowledge(
        request, todo_id, store.acomplete_todo, table.COMPLETE_TODO
    )


@api_view("POST")
async def fail(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Fail the caller's claimed todo: a retry is scheduled, or it dead-letters."""
    return await _acknowledge(request, todo_id, store.afail_todo, table.FAIL_TODO)


@api_view("POST")
async def release(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Give the caller's lease back now; a handoff with assignee, note, checkpoint."""
    return await _acknowledge(request, todo_id, store.arelease_todo, table.RELEASE_TODO)


@api_view("POST")
def ask(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Ask a question as the lease holder: the lease ends, the todo is held."""
    return _transition(request, todo_id, store.ask, table.ASK)


@api_view("POST")
def answer(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Answer a held todo of this endpoint; the hold ends and the doorbell rings."""
    answer = request.body_fields.read(table.ANSWER)
    return todo_response(
        store.answer_todo(
            request.scope, todo_id, answer["answer"], worker=answer["worker"]
        )
    )


@api_view("POST")
def cancel(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Cancel a todo: 200 when it ended canceled, 202 when its owner was asked."""
    cancel = request.body_fields.read(table.CANCEL_TODO)
    todo = store.cancel_todo(
        request.scope, todo_id, reason=cancel["reason"], worker=cancel["worker"]
    )
    return todo_response(todo, status=cancel_status(todo))


@api_view("POST")
def retry(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Requeue a failed todo of this endpoint now."""
    return todo_response(
        store.retry_todo(request.scope, todo_id, actor=f"agent:{request.endpoint.name}")
    )


@api_view("POST")
async def batch(request: ApiRequest) -> JsonResponse:
    """Apply up to 100 owner transitions; one result per action, in order.

    The acknowledgements are awaited in the event loop; the cancels, which
    may take a transaction, run in a pooled thread.
    """
    await aprepare(request)
    return JsonResponse(await aacknowledge_batch(request.scope, request.body_fields))


@api_view("GET")
def queues(request: ApiRequest) -> JsonResponse:
    """List this endpoint's queues with their settings and live figures."""
    return JsonResponse(
        {"queues": [queue.to_dict() for queue in store.list_queues(request.scope)]}
    )


@api_view("POST")
def usage(request: ApiRequest) -> JsonResponse:
    """Report usage spent outside a todo, against a queue: 201, or 200 when
    its idempotency key already recorded it."""
    report = request.body_fields.read(table.REPORT_USAGE)
    recorded, created = checked(store.report_usage, request.scope, **report)
    return JsonResponse(
        {"usage": recorded.to_dict(), "created": created},
        status=201 if created else 200,
    )
