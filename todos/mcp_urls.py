"""Routes of the mcp surface: the Streamable HTTP transport at /mcp."""

from django.urls import path

from todos import mcp

urlpatterns = [
    path("mcp", mcp.endpoint, name="mcp"),
]
