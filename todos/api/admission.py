"""The agent API's admission control (CONTRACT §17): a queue's settings, its
groups, a pending todo's priority. Thin views over ``todos.api.operations``
(which the MCP tools share) and ``store.admission``."""

from collections.abc import Mapping
from typing import Any

from todos import store
from todos.api import fields as table
from todos.api import operations as api
from todos.api.plumbing import ApiRequest, api_view, bad_request, todo_response
from todos.store import admission
from todos.web.http import JsonResponse


def _known(data: Mapping[str, Any], operation: table.Operation) -> None:
    unknown = sorted(set(data) - {field.name for field in operation})
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown setting")


@api_view("GET", "PATCH")
def queue(request: ApiRequest, name: str) -> JsonResponse:
    """Read a queue (GET), or change its settings, making it on first use
    (PATCH): 200 {"queue"}; 403 outside the grant."""
    if request.method == "PATCH":
        _known(request.body_fields.data, table.QUEUE_SETTINGS)
        found = api.update_queue(request.scope, name, request.body_fields)
    else:
        found = store.get_queue(request.scope, name)
    return JsonResponse({"queue": found.to_dict()})


@api_view("GET")
def groups(request: ApiRequest, name: str) -> JsonResponse:
    """A page of a queue's groups by name: in flight, pending, oldest wait,
    limit, weight, paused; ``next_after`` reads the next page."""
    page = table.Fields(request.GET, from_query=True)
    return JsonResponse(api.groups_page(request.scope, name, page))


@api_view("GET", "PUT")
def group(request: ApiRequest, name: str, group: str) -> JsonResponse:
    """Read a group (GET) or set its override (PUT: concurrency, null for the
    queue's; weight; paused): 200 {"group"}."""
    if request.method == "PUT":
        _known(request.body_fields.data, table.GROUP_SETTINGS)
        found = api.set_group(request.scope, name, group, request.body_fields)
    else:
        store.get_queue(request.scope, name)
        found = api.checked(admission.get_group, request.scope, name, group)
    return JsonResponse({"group": found.to_dict()})


@api_view("POST")
def priority(request: ApiRequest, todo_id: str) -> JsonResponse:
    """Change a pending todo's priority (409 once it is claimed or finished)."""
    values = request.body_fields.read(table.SET_PRIORITY)
    return todo_response(
        admission.set_priority(request.scope, todo_id, values["priority"])
    )
