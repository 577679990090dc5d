"""Webhook deliveries and budgets (CONTRACT §18): a delivery a reject_new
budget at its limit refuses answers 429 with nothing applied, so the
sender's redelivery is taken once the budget allows it."""

from tests.support import exhausted_budget
from tests.webhooks.test_webhooks import deliver, source, todos_of  # noqa: F401
from todos import store
from todos.models import WebhookDelivery


def test_a_delivery_into_an_exhausted_reject_new_scope_is_429_and_redeliverable(
    client,
    source,  # noqa: F811
    endpoint,
    other_endpoint,
):
    scope = store.Scope.for_endpoint(endpoint)
    budget = exhausted_budget(scope, "github")

    refused = deliver(client)
    assert refused.status_code == 429
    assert refused.json()["error"] == "budget_exhausted"
    assert budget.id in refused.json()["detail"]
    assert int(refused["Retry-After"]) > 0
    # Nothing applied: not even the other endpoint's target. The log says so.
    assert todos_of(endpoint) == [] and todos_of(other_endpoint) == []
    logged = WebhookDelivery.objects.order_by("-id").first()
    assert logged.status == "refused"
    assert logged.outcome[0]["queue"] == "github"

    store.decide_budget(scope, budget.id, "raise", amount_usd=5)
    again = deliver(client)
    assert again.status_code == 202
    assert len(todos_of(endpoint)) == 1 and len(todos_of(other_endpoint)) == 1


def test_a_delivery_into_a_paused_scope_waits_in_it_like_a_paused_queue(
    client,
    source,  # noqa: F811
    endpoint,
):
    scope = store.Scope.for_endpoint(endpoint)
    store.create_budget(scope, scope="queue", queue="github", window="day", limit_usd=1)
    store.report_usage(scope, queue="github", usage={"cost_usd": 1})
    assert deliver(client).status_code == 202
    assert len(todos_of(endpoint)) == 1
