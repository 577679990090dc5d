"""The agent API's budgets (CONTRACT §18): thin views over ``store.budgets``.

A budget of another endpoint, one of a queue outside the grant and a malformed
id all answer the same 404; a field the store refuses answers 400 naming it.
The owner's decision on a budget at its limit is ``POST …/decision``.
"""

from django.http import HttpResponse

from todos import store
from todos.api import fields as table
from todos.api.operations import checked
from todos.api.plumbing import ApiRequest, api_view
from todos.web.http import JsonResponse


def _budget(budget: store.Budget, status: int = 200) -> JsonResponse:
    return JsonResponse({"budget": budget.to_dict()}, status=status)


@api_view("GET", "POST")
def budgets(request: ApiRequest) -> JsonResponse:
    """List this endpoint's budgets with their spend (GET) or create one (POST)."""
    if request.method == "POST":
        given = request.body_fields.read(table.CREATE_BUDGET)
        return _budget(checked(store.create_budget, request.scope, **given), 201)
    listed = store.list_budgets(request.scope)
    return JsonResponse({"budgets": [budget.to_dict() for budget in listed]})


@api_view("GET", "PUT", "DELETE")
def budget(request: ApiRequest, budget_id: str) -> HttpResponse:
    """Return (GET), change the fields given (PUT) or delete (DELETE) a budget."""
    if request.method == "PUT":
        changes = request.body_fields.read(table.UPDATE_BUDGET)
        return _budget(
            checked(store.update_budget, request.scope, budget_id, **changes)
        )
    if request.method == "DELETE":
        store.delete_budget(request.scope, budget_id)
        return HttpResponse(status=204)
    return _budget(store.get_budget(request.scope, budget_id))


@api_view("POST")
def decision(request: ApiRequest, budget_id: str) -> JsonResponse:
    """Answer a budget at its limit: raise it for this window, resume, or
    keep paused; recorded as this endpoint's (``agent:<name>``) decision."""
    given = request.body_fields.read(table.DECIDE_BUDGET)
    decided = checked(
        store.decide_budget,
        request.scope,
        budget_id,
        given["decision"],
        given["amount_usd"],
        given["amount_tokens"],
        actor=f"agent:{request.endpoint.name}",
    )
    return _budget(decided)
