"""Routes of the todos app, one module per surface."""

from django.urls import include, path

from todos import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("api/v1/", include("todos.api_urls")),
    path("board/", include("todos.board_urls")),
    path("hooks/", include("todos.hooks_urls")),
    path("", include("todos.mcp_urls")),
]
