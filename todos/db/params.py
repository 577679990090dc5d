"""Connection parameters, derived from Django's settings in one place."""

import datetime
import functools
from typing import Any

import psycopg
from django.db import connections
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format

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
    settings ask for client-side), in autocommit; timestamps read by
    psycopg's own loader when Django's time zone is UTC (``utc_timestamps``)."""
    params = django_params()
    server_binding = params.pop("cursor_factory", None) is not psycopg.ClientCursor
    params["cursor_factory"] = (
        psycopg.AsyncCursor if server_binding else psycopg.AsyncClientCursor
    )
    params["autocommit"] = True
    if connections["default"].timezone is datetime.UTC:
        params["context"] = utc_timestamps(params["context"])
    return params


@functools.cache
def utc_timestamps(adapters: AdaptersMap) -> AdaptersMap:
    """Django's adapters, with psycopg's own ``timestamptz`` loader.

    Django reads a timestamp through a Python subclass of psycopg's pure
    Python loader that gives the value Django's time zone: a claimed todo's
    row costs 15 µs more that way than with psycopg's compiled loader
    (``psycopg[binary]``). That loader gives the connection's time zone, which
    the pool sets to UTC by that name (todos.db.pool), so the value is the
    same aware datetime in ``datetime.UTC`` that Django's loader gives.
    """
    oid = psycopg.adapters.types["timestamptz"].oid
    loader = psycopg.adapters.get_loader(oid, Format.TEXT)
    if loader is None:
        raise RuntimeError("psycopg has no timestamptz loader")
    context = AdaptersMap(adapters)
    context.register_loader(oid, loader)
    return context


def listen_params() -> dict[str, Any]:
    """Django's parameters for a connection that only listens: the server,
    credentials and options, without what is for Django's own cursors."""
    params = django_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    return params
