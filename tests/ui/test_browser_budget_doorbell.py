"""A budget card answered on the Board wakes the agent waiting for its work,
against the real serving (gunicorn + uvicorn), as test_browser_inbox does for
a question: the queue's daily budget is spent, the agent's long-poll claim
waits, the owner resumes from the inbox at phone width, and the waiting claim
gets the todo within a second of the click (the decision rang the doorbell).
"""

import time

import pytest

from todos import store

from .test_browser_inbox import (  # noqa: F401
    PHONE,
    log_in,
    open_page,
    owner,
    pytestmark,
    server,
    waiting,
)


@pytest.fixture
def spent(owner):  # noqa: F811
    """The queue deploys spent its daily budget of $5: its todo waits."""
    scope = store.Scope.for_endpoint(owner["endpoint"])
    budget = store.create_budget(
        scope, scope="queue", queue="deploys", window="day", limit_usd=5
    )
    todo, _ = store.create_todo(scope, queue="deploys", title="Roll out api v2.15")
    store.report_usage(scope, queue="deploys", usage={"cost_usd": 5})
    assert store.get_budget(scope, budget.id).state == "exhausted"
    return {**owner, "budget": budget, "todo": todo, "scope": scope}


def test_resuming_a_budget_on_the_board_wakes_the_waiting_agent(
    browser,
    server,  # noqa: F811
    spent,
):
    context, page = open_page(browser, PHONE)
    try:
        log_in(page, server)
        card = page.locator(f"#budget-card-{spent['budget'].id}")
        card.get_by_text("Daily budget of $5 reached on queue deploys").wait_for()
        claim = waiting(server, spent, "deploy-bot")

        clicked = time.monotonic()
        card.get_by_role("button", name="Resume anyway").click()
        claim.join(timeout=5)

        assert claim.status == 200, claim.body
        assert claim.answered_at - clicked < 1.0
        assert claim.todo["id"] == spent["todo"].id
        page.locator("#notices").get_by_text("Resumed for today").wait_for()
        history = store.budget_history(spent["scope"], spent["budget"].id)
        assert [e.actor for e in history if e.event == "budget.decision"] == [
            "operator:alice"
        ]
    finally:
        context.close()
