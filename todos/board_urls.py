"""Routes of the operator Board (under /board/)."""

from django.urls import path

from todos import board_views, board_webhooks

app_name = "board"

urlpatterns = [
    path("", board_views.overview, name="overview"),
    path("login/", board_views.LoginView.as_view(), name="login"),
    path("logout/", board_views.logout_view, name="logout"),
    path("todos/", board_views.todo_list, name="todos"),
    path("todos/new/", board_views.todo_create, name="todo_create"),
    path("todos/retry/", board_views.todos_retry_selected, name="retry_selected"),
    path(
        "todos/retry-matching/", board_views.todos_retry_matching, name="retry_matching"
    ),
    path("todos/<str:todo_id>/", board_views.todo_detail, name="todo"),
    path("todos/<str:todo_id>/retry/", board_views.todo_retry, name="todo_retry"),
    path("todos/<str:todo_id>/release/", board_views.todo_release, name="todo_release"),
    path("endpoints/", board_views.endpoint_list, name="endpoints"),
    path("endpoints/new/", board_views.endpoint_create, name="endpoint_create"),
    path(
        "endpoints/<uuid:endpoint_id>/rotate/",
        board_views.endpoint_rotate,
        name="endpoint_rotate",
    ),
    path(
        "endpoints/<uuid:endpoint_id>/revoke/",
        board_views.endpoint_revoke,
        name="endpoint_revoke",
    ),
    path(
        "endpoints/<uuid:endpoint_id>/grants/",
        board_views.endpoint_grants,
        name="endpoint_grants",
    ),
    path("webhooks/", board_webhooks.webhook_list, name="webhooks"),
    path("webhooks/new/", board_webhooks.webhook_create, name="webhook_create"),
    path(
        "webhooks/<uuid:source_id>/delete/",
        board_webhooks.webhook_delete,
        name="webhook_delete",
    ),
    path(
        "webhooks/<uuid:source_id>/rotate/",
        board_webhooks.webhook_rotate,
        name="webhook_rotate",
    ),
    path(
        "webhooks/<uuid:source_id>/routes/new/",
        board_webhooks.route_create,
        name="webhook_route_create",
    ),
    path(
        "webhooks/routes/<int:route_id>/delete/",
        board_webhooks.route_delete,
        name="webhook_route_delete",
    ),
]
