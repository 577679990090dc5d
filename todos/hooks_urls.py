"""Routes of the hooks surface."""

from django.urls import path

from todos import hooks_views

urlpatterns = [
    path("<str:slug>", hooks_views.receive, name="webhook-receive"),
]
