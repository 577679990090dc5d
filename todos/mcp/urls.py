"""Routes of the mcp surface: the Streamable HTTP transport at /mcp."""

from django.urls import path

from todos.mcp import transport

urlpatterns = [
    path("mcp", transport.endpoint, name="mcp"),
]
