"""The agent JSON API (CONTRACT §5): thin views over the endpoint-scoped store.

Each view reads its validated fields, calls one store function with the
caller's scope, and renders the todo; ``todos.api.api_view`` does the token
auth, the body parsing and the error mapping.
"""

from django.conf import settings
from django.http import JsonResponse

from todos import store
from todos.api import (
    MAX_ATTEMPTS_CAP,
    MAX_ERROR_LENGTH,
    MAX_KEY_LENGTH,
    MAX_TITLE_LENGTH,
    Fields,
    api_view,
    bad_request,
    todo_response,
)
from todos.doorbell import claim_when_ready


@api_view("GET", "POST")
def todos(request):
    """List this endpoint's todos (GET) or enqueue one (POST)."""
    if request.method == "POST":
        return create(request)
    query = Fields(request.GET, from_query=True)
    state = query.text("state")
    if state is not None and state not in store.STATE_FILTERS:
        raise bad_request(f"state: must be one of {', '.join(store.STATE_FILTERS)}")
    limit = query.integer("limit", minimum=1, maximum=200, default=50)
    cursor = query.text("cursor", max_length=500, empty=True) or None
    queue = query.text("queue")
    if queue is not None and not request.scope.covers(queue):
        raise store.QueueNotGranted(queue)
    try:
        page = store.list_todos(
            request.scope,
            queue=queue,
            state=state,
            limit=limit,
            cursor=cursor,
        )
    except ValueError as exc:
        raise bad_request(f"cursor: {exc}") from exc
    return JsonResponse(
        {
            "todos": [todo.to_dict() for todo in page.todos],
            "next_cursor": page.next_cursor,
        }
    )


def create(request):
    """Enqueue a todo: 201, or 200 when it collapsed onto a live duplicate."""
    body = request.body_fields
    todo, created = store.create_todo(
        request.scope,
        queue=body.text("queue", required=True),
        title=body.text("title", max_length=MAX_TITLE_LENGTH, empty=True) or "",
        payload=body.json("payload"),
        idempotency_key=body.text("idempotency_key", max_length=MAX_KEY_LENGTH),
        assignee=body.text("assignee"),
        max_attempts=body.integer(
            "max_attempts",
            minimum=1,
            maximum=MAX_ATTEMPTS_CAP,
            default=settings.SWITCHBOARD_MAX_ATTEMPTS,
        ),
        actor=f"agent:{request.endpoint.name}",
    )
    return todo_response(todo, status=201 if created else 200, created=created)


@api_view("GET")
def detail(request, todo_id):
    """Return one todo of this endpoint."""
    return todo_response(store.get_todo(request.scope, todo_id))


@api_view("POST")
def claim_next(request):
    """Claim the next claimable todo, waiting up to wait_seconds for one."""
    body = request.body_fields
    worker = body.worker()
    queue = body.text("queue")
    lease, wait = body.lease_seconds(), body.wait_seconds()

    def attempt():
        return store.claim_next(request.scope, worker, queue=queue, lease_seconds=lease)

    return todo_response(claim_when_ready(request.scope, queue, wait, attempt))


@api_view("POST")
def claim(request, todo_id):
    """Claim one specific todo."""
    body = request.body_fields
    worker, lease = body.worker(), body.lease_seconds()
    return todo_response(
        store.claim_todo(request.scope, todo_id, worker, lease_seconds=lease)
    )


@api_view("POST")
def heartbeat(request, todo_id):
    """Extend the caller's lease on a claimed todo."""
    body = request.body_fields
    worker, lease = body.worker(), body.lease_seconds()
    return todo_response(
        store.heartbeat(request.scope, todo_id, worker, lease_seconds=lease)
    )


@api_view("POST")
def complete(request, todo_id):
    """Mark the caller's claimed todo done with its result."""
    body = request.body_fields
    worker, result = body.worker(), body.json("result")
    return todo_response(
        store.complete_todo(request.scope, todo_id, worker, result=result)
    )


@api_view("POST")
def fail(request, todo_id):
    """Fail the caller's claimed todo: a retry is scheduled, or it dead-letters."""
    body = request.body_fields
    worker = body.worker()
    error = body.text("error", max_length=MAX_ERROR_LENGTH, empty=True) or ""
    return todo_response(store.fail_todo(request.scope, todo_id, worker, error=error))


@api_view("POST")
def release(request, todo_id):
    """Give the caller's lease back now."""
    worker = request.body_fields.worker()
    return todo_response(store.release_todo(request.scope, todo_id, worker))


@api_view("POST")
def retry(request, todo_id):
    """Requeue a failed todo of this endpoint now."""
    return todo_response(
        store.retry_todo(request.scope, todo_id, actor=f"agent:{request.endpoint.name}")
    )
