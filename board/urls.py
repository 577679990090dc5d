"""URL routes: the agent API, the Board, webhooks, MCP, SQS and the health check."""

from django.urls import include, path, re_path

from todos.sqs import views as sqs

urlpatterns = [
    # GET / leads to the Board; POST / is the SQS endpoint (CONTRACT §11).
    path("", sqs.root, name="root"),
    path("", include("todos.urls")),
    # An SQS call posted to a queue URL gets SQS's error, not an HTML 404.
    re_path(r"^(?P<account_id>[0-9]{12})/(?P<queue>[^/]+)/?$", sqs.queue_path),
]
