"""URL routes: the agent API, the Board, webhooks, MCP and the health check."""

from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/board/", permanent=False)),
    path("", include("todos.urls")),
]
