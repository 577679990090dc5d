"""The agent API's schedules (CONTRACT §20): thin views over ``store.schedules``.

A schedule of another endpoint, one outside the grant and a malformed id all
answer the same 404; a field the store refuses (a cron it cannot read, an
unknown time zone, a bad todo template) answers 400 naming the field; a name
taken in this endpoint answers 409.
"""

from django.http import HttpResponse

from todos import store
from todos.api import fields as table
from todos.api.fields import Fields
from todos.api.operations import checked, create_schedule, schedule_page
from todos.api.plumbing import ApiRequest, api_view
from todos.web.http import JsonResponse


def _schedule(schedule: store.Schedule, status: int = 200) -> JsonResponse:
    return JsonResponse({"schedule": schedule.to_dict()}, status=status)


@api_view("GET", "POST")
def schedules(request: ApiRequest) -> JsonResponse:
    """List this endpoint's schedules by name (GET) or create one (POST)."""
    if request.method == "POST":
        schedule = create_schedule(request.scope, request.body_fields)
        return _schedule(schedule, status=201)
    query = Fields(request.GET, from_query=True)
    return JsonResponse(schedule_page(request.scope, query))


@api_view("GET", "PUT", "DELETE")
def schedule(request: ApiRequest, schedule_id: str) -> HttpResponse:
    """Return (GET), change the fields given (PUT) or delete (DELETE) a schedule."""
    if request.method == "PUT":
        changes = request.body_fields.read(table.UPDATE_SCHEDULE)
        return _schedule(
            checked(store.update_schedule, request.scope, schedule_id, **changes)
        )
    if request.method == "DELETE":
        store.delete_schedule(request.scope, schedule_id)
        return HttpResponse(status=204)
    return _schedule(store.get_schedule(request.scope, schedule_id))


@api_view("POST")
def pause(request: ApiRequest, schedule_id: str) -> JsonResponse:
    """Pause a schedule: no slot fires until it is resumed."""
    return _schedule(store.pause_schedule(request.scope, schedule_id))


@api_view("POST")
def resume(request: ApiRequest, schedule_id: str) -> JsonResponse:
    """Resume a schedule; the slots of the pause follow its missed policy."""
    return _schedule(store.resume_schedule(request.scope, schedule_id))


@api_view("POST")
def fire(request: ApiRequest, schedule_id: str) -> JsonResponse:
    """Fire a schedule now: one todo per call (201), or with an
    idempotency_key the live todo an earlier call made (200)."""
    key = request.body_fields.read(table.FIRE_SCHEDULE)["idempotency_key"]
    todo, created = store.fire_schedule(request.scope, schedule_id, idempotency_key=key)
    return JsonResponse(
        {"todo": todo.to_dict(), "created": created}, status=201 if created else 200
    )


@api_view("GET")
def next_slots(request: ApiRequest, schedule_id: str) -> JsonResponse:
    """List the schedule's next n slots (UTC)."""
    count = Fields(request.GET, from_query=True).read(table.NEXT_SLOTS)["n"]
    slots = store.next_slots(request.scope, schedule_id, count)
    return JsonResponse(
        {"slots": [slot.isoformat().replace("+00:00", "Z") for slot in slots]}
    )
