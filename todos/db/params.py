"""Connection parameters, derived from Django's settings in one place."""

from typing import Any

import psycopg
from django.db import connections

# Django's own: its cursor class, its adapters (the time zone its loaders give
# timestamps) and its prepared-statement threshold.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def django_params() -> dict[str, Any]:
    """psycopg's keyword arguments for a connection as Django makes its own."""
    params: dict[str, Any] = connections["default"].get_connection_params()
    return params


def async_params() -> dict[str, Any]:
    """Django's parameters for an async connection that runs the store's
    statements: the same adapters and binding (server-side unless Django's
    settings ask for client-side), in autocommit."""
    params = django_params()
    server_binding = params.pop("cursor_factory", None) is not psycopg.ClientCursor
    params["cursor_factory"] = (
        psycopg.AsyncCursor if server_binding else psycopg.AsyncClientCursor
    )
    params["autocommit"] = True
    return params


def listen_params() -> dict[str, Any]:
    """Django's parameters for a connection that only listens: the server,
    credentials and options, without what is for Django's own cursors."""
    params = django_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    return params
