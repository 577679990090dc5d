"""Routes of the agent API (CONTRACT §5), mounted at /api/v1/."""

from django.urls import path

from todos.api import admission, budgets, events, openapi, schedules, views

# "todos/claim" and "todos/batch" come before "todos/<todo_id>" so that neither
# is ever read as an id. A group's name may hold slashes ("org/repo").
urlpatterns = [
    path("todos", views.todos, name="api-todos"),
    path("todos/claim", views.claim_next, name="api-claim-next"),
    path("todos/batch", views.batch, name="api-batch"),
    path("todos/<str:todo_id>", views.detail, name="api-todo"),
    path("todos/<str:todo_id>/claim", views.claim, name="api-claim"),
    path("todos/<str:todo_id>/heartbeat", views.heartbeat, name="api-heartbeat"),
    path("todos/<str:todo_id>/complete", views.complete, name="api-complete"),
    path("todos/<str:todo_id>/fail", views.fail, name="api-fail"),
    path("todos/<str:todo_id>/release", views.release, name="api-release"),
    path("todos/<str:todo_id>/retry", views.retry, name="api-retry"),
    path("todos/<str:todo_id>/ask", views.ask, name="api-ask"),
    path("todos/<str:todo_id>/answer", views.answer, name="api-answer"),
    path("todos/<str:todo_id>/cancel", views.cancel, name="api-cancel"),
    path("todos/<str:todo_id>/priority", admission.priority, name="api-priority"),
    path("queues", views.queues, name="api-queues"),
    path("usage", views.usage, name="api-usage"),
    path("queues/<str:name>", admission.queue, name="api-queue"),
    path("queues/<str:name>/groups", admission.groups, name="api-queue-groups"),
    path(
        "queues/<str:name>/groups/<path:group>",
        admission.group,
        name="api-queue-group",
    ),
    path("budgets", budgets.budgets, name="api-budgets"),
    path("budgets/<str:budget_id>", budgets.budget, name="api-budget"),
    path(
        "budgets/<str:budget_id>/decision",
        budgets.decision,
        name="api-budget-decision",
    ),
    path("schedules", schedules.schedules, name="api-schedules"),
    path("schedules/<str:schedule_id>", schedules.schedule, name="api-schedule"),
    path(
        "schedules/<str:schedule_id>/pause",
        schedules.pause,
        name="api-schedule-pause",
    ),
    path(
        "schedules/<str:schedule_id>/resume",
        schedules.resume,
        name="api-schedule-resume",
    ),
    path("schedules/<str:schedule_id>/fire", schedules.fire, name="api-schedule-fire"),
    path(
        "schedules/<str:schedule_id>/next",
        schedules.next_slots,
        name="api-schedule-next",
    ),
    path("events", events.events, name="api-events"),
    path("openapi.json", openapi.openapi_json, name="api-openapi"),
]
