"""URL routes: the agent API, the Board, webhooks, MCP, SQS and the health check."""

from django.urls import include, path

from todos.sqs import views as sqs

urlpatterns = [
    # GET / leads to the Board; POST / is the SQS endpoint (CONTRACT §11).
    path("", sqs.root, name="root"),
    path("", include("todos.urls")),
]
