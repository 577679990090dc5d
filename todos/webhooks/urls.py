"""Routes of the hooks surface."""

from django.urls import path

from todos.webhooks import views

urlpatterns = [
    path("<str:slug>", views.receive, name="webhook-receive"),
]
