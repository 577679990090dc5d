"""Routes of the agent API (CONTRACT §5), mounted at /api/v1/."""

from django.urls import path

from todos import api_views, events, openapi

# "todos/claim" comes before "todos/<todo_id>" so that it is never read as an id.
urlpatterns = [
    path("todos", api_views.todos, name="api-todos"),
    path("todos/claim", api_views.claim_next, name="api-claim-next"),
    path("todos/<str:todo_id>", api_views.detail, name="api-todo"),
    path("todos/<str:todo_id>/claim", api_views.claim, name="api-claim"),
    path("todos/<str:todo_id>/heartbeat", api_views.heartbeat, name="api-heartbeat"),
    path("todos/<str:todo_id>/complete", api_views.complete, name="api-complete"),
    path("todos/<str:todo_id>/fail", api_views.fail, name="api-fail"),
    path("todos/<str:todo_id>/release", api_views.release, name="api-release"),
    path("todos/<str:todo_id>/retry", api_views.retry, name="api-retry"),
    path("events", events.events, name="api-events"),
    path("openapi.json", openapi.openapi_json, name="api-openapi"),
]
