"""The agent API's admission control (CONTRACT §17): a queue's settings, its
groups, a pending todo's priority. Thin views over ``store.admission``."""

from collections.abc import Mapping
from typing import Any

from todos import store
from todos.api import fields as table
from todos.api.plumbing import ApiRequest, api_view, bad_request, todo_response
from todos.http import JsonResponse
from todos.store import admission

# The settings PATCH /queues/<name> takes: §10's and admission's.
BASIC_SETTINGS = ("lease_seconds", "max_attempts", "delay_seconds")
ADMISSION_SETTINGS = (
    "group_concurrency",
    "fair",
    "rate_limit",
    "group_rate_limit",
    "priority_aging_seconds",
)
GROUP_SETTINGS = ("concurrency", "weight", "paused")


def _given(data: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown setting")
    return dict(data)


@api_view("GET", "PATCH")
def queue(request: ApiRequest, name: str) -> JsonResponse:
    """Read a queue (GET), or change its settings, making it on first use
    (PATCH): 200 {"queue"}; 403 outside the grant."""
    if request.method == "PATCH":
        data = _given(request.body_fields.data, BASIC_SETTINGS + ADMISSION_SETTINGS)
        try:
            store.ensure_queue(request.scope, name)
            basic = {key: data[key] for key in BASIC_SETTINGS if key in data}
            if basic:
                store.update_queue(request.scope, name, **basic)
            admission.set_admission(
                request.scope,
                name,
                **{key: data[key] for key in ADMISSION_SETTINGS if key in data},
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
    return JsonResponse({"queue": store.get_queue(request.scope, name).to_dict()})


@api_view("GET")
def groups(request: ApiRequest, name: str) -> JsonResponse:
    """A page of a queue's groups by name: in flight, pending, oldest wait,
    limit, weight, paused; ``next_after`` reads the next page."""
    page = table.Fields(request.GET, from_query=True).read(table.GROUPS_PAGE)
    store.get_queue(request.scope, name)
    found = admission.list_groups(
        request.scope, name, after=page["after"] or "", limit=page["limit"]
    )
    more = len(found) == page["limit"]
    return JsonResponse(
        {
            "groups": [group.to_dict() for group in found],
            "next_after": found[-1].group if more else None,
        }
    )


@api_view("GET", "PUT")
def group(request: ApiRequest, name: str, group: str) -> JsonResponse:
    """Read a group (GET) or set its override (PUT: concurrency, null for the
    queue's; weight; paused): 200 {"group"}."""
    if request.method == "PUT":
        data = _given(request.body_fields.data, GROUP_SETTINGS)
        try:
            store.ensure_queue(request.scope, name)
            found = admission.set_group(request.scope, name, group, **data)
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
    else:
        store.get_queue(request.scope, name)
        try:
            found = admission.get_group(request.scope, name, group)
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
    return JsonResponse({"group": found.to_dict()})


@api_view("POST")
def priority(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Change a pending todo's priority (409 once it is claimed or finished)."""
    values = request.body_fields.read(table.SET_PRIORITY)
    return todo_response(
        admission.set_priority(request.scope, todo_id, values["priority"])
    )
