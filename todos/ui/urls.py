"""Routes of the operator Board (under /board/)."""

from django.urls import path

from todos.ui import (
    budgets,
    cancel,
    dead_letters,
    groups,
    inbox,
    queues,
    schedules,
    sqs,
    views,
    webhooks,
)

app_name = "board"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("inbox/", inbox.inbox, name="inbox"),
    path("inbox/count/", inbox.inbox_count, name="inbox_count"),
    path("todos/", views.todo_list, name="todos"),
    path("todos/new/", views.todo_create, name="todo_create"),
    path("todos/retry/", views.todos_retry_selected, name="retry_selected"),
    path("todos/retry-matching/", views.todos_retry_matching, name="retry_matching"),
    path("todos/cancel/", cancel.todos_cancel_selected, name="cancel_selected"),
    path(
        "todos/cancel-matching/",
        cancel.todos_cancel_matching,
        name="cancel_matching",
    ),
    path("todos/<str:todo_id>/", views.todo_detail, name="todo"),
    path("todos/<str:todo_id>/answer/", inbox.todo_answer, name="todo_answer"),
    path("todos/<str:todo_id>/cancel/", cancel.todo_cancel, name="todo_cancel"),
    path("todos/<str:todo_id>/retry/", views.todo_retry, name="todo_retry"),
    path("todos/<str:todo_id>/release/", views.todo_release, name="todo_release"),
    path("todos/<str:todo_id>/priority/", groups.todo_priority, name="todo_priority"),
    path("dead-letters/", dead_letters.dead_letter_groups, name="dead_letters"),
    path(
        "dead-letters/dismiss/",
        dead_letters.dead_letters_dismiss,
        name="dead_letters_dismiss",
    ),
    path(
        "queue-groups/<uuid:endpoint_id>/<path:queue>/",
        groups.queue_groups,
        name="queue_groups",
    ),
    path(
        "queues/<uuid:endpoint_id>/<path:queue>/",
        queues.queue_detail,
        name="queue",
    ),
    path("budgets/", budgets.budget_list, name="budgets"),
    path("budgets/<uuid:budget_id>/", budgets.budget_detail, name="budget"),
    path(
        "budgets/<uuid:budget_id>/decision/",
        budgets.budget_decision,
        name="budget_decision",
    ),
    path(
        "budgets/<uuid:budget_id>/delete/",
        budgets.budget_delete,
        name="budget_delete",
    ),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path(
        "schedules/<str:schedule_id>/",
        schedules.schedule_detail,
        name="schedule",
    ),
    path("endpoints/", views.endpoint_list, name="endpoints"),
    path("endpoints/new/", views.endpoint_create, name="endpoint_create"),
    path(
        "endpoints/<uuid:endpoint_id>/rotate/",
        views.endpoint_rotate,
        name="endpoint_rotate",
    ),
    path(
        "endpoints/<uuid:endpoint_id>/revoke/",
        views.endpoint_revoke,
        name="endpoint_revoke",
    ),
    path("endpoints/<uuid:endpoint_id>/sqs/", sqs.endpoint_sqs, name="endpoint_sqs"),
    path(
        "endpoints/<uuid:endpoint_id>/grants/",
        views.endpoint_grants,
        name="endpoint_grants",
    ),
    path("webhooks/", webhooks.webhook_list, name="webhooks"),
    path("webhooks/new/", webhooks.webhook_create, name="webhook_create"),
    path(
        "webhooks/<uuid:source_id>/delete/",
        webhooks.webhook_delete,
        name="webhook_delete",
    ),
    path(
        "webhooks/<uuid:source_id>/rotate/",
        webhooks.webhook_rotate,
        name="webhook_rotate",
    ),
    path(
        "webhooks/<uuid:source_id>/routes/new/",
        webhooks.route_create,
        name="webhook_route_create",
    ),
    path(
        "webhooks/routes/<int:route_id>/delete/",
        webhooks.route_delete,
        name="webhook_route_delete",
    ),
]
