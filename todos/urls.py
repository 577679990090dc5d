"""Routes of the todos app, one module per surface."""

from django.urls import include, path

from todos.ui import inbox
from todos.web import health, metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/v1/", include("todos.api.urls")),
    path("board/", include("todos.ui.urls")),
    # A signed, single-use answer link (no login): CONTRACT §14.
    path("answer/<str:token>", inbox.answer_link, name="answer_link"),
    path("hooks/", include("todos.webhooks.urls")),
    path("", include("todos.mcp.urls")),
]
