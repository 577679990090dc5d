"""Django's PostgreSQL backend: the health check runs only after idleness, and
timestamps are read by psycopg's compiled loader.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` before the first query of
every request that reuses a connection: one round trip more for each agent call,
a third of a claim's queries (bench/profile_api.py). A connection that finished a
request a moment ago is as good as proven: this backend skips the check when the
connection's last request ended less than ``CHECK_AFTER_IDLE_SECONDS`` ago
(todos.db.idle) and keeps it otherwise, so a connection that sat idle across a
PostgreSQL restart is still replaced before it is used. One that breaks mid-burst fails
its request (503) and Django closes it at the request's end, as it does for any
connection that breaks during a request.

A commit the synchronous standby did not confirm raises
``UnreplicatedCommit`` (todos.db.replication).

Django reads every ``timestamptz`` through a Python subclass of psycopg's pure
Python loader, so that the value carries Django's time zone: about 5 µs a value
against 0.8 for the compiled loader of ``psycopg[binary]``, and a claimed or
acknowledged todo carries half a dozen. When Django's time zone is UTC (USE_TZ
with no per-database TIME_ZONE, as here) and the compiled loader is there,
this backend reads timestamps with it instead: the connection's own time zone
is UTC too (Django sets it so), and the compiled loader returns the same
instants in it.

psycopg parses a statement (finds and splits out its placeholders) once and
keeps the parse, but only for statements up to 4096 bytes: longer ones, which
it takes for generated ORM queries of many VALUES, it parses again on every
call. The store's claim and acknowledgement are fixed statements of about
5,000 bytes, parsed in about 40 µs each, a claim and complete pair's
85 µs of CPU out of 2.2 ms (served in-process); this
backend raises psycopg's bound to ``PARSED_STATEMENT_BYTES``, and the store's
few dozen statements fit psycopg's cache of 128 parses.
"""

import datetime
import functools
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import _queries, adapt, adapters
from psycopg.abc import AdaptContext, Loader
from psycopg.pq import Format
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from todos.db.idle import CHECK_AFTER_IDLE_SECONDS, due_for_check
from todos.db.replication import raise_if_unreplicated, watch_replication

# A connection as Django's PostgreSQL backend makes it.
type Connection = psycopg.Connection[TupleRow]

# The longest statement whose parse psycopg keeps (its own bound is 4096).
PARSED_STATEMENT_BYTES = 16384
_queries.MAX_CACHED_STATEMENT_LENGTH = max(
    _queries.MAX_CACHED_STATEMENT_LENGTH, PARSED_STATEMENT_BYTES
)

TIMESTAMPTZ_OID = adapters.types["timestamptz"].oid
# psycopg's default loader: the compiled one when psycopg's C part is installed.
_DEFAULT_TIMESTAMPTZ = adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
COMPILED_TIMESTAMPTZ = (
    _DEFAULT_TIMESTAMPTZ
    if not _DEFAULT_TIMESTAMPTZ.__module__.startswith("psycopg.")
    else None
)


class UtcTimestampLoader:
    """Makes the compiled loader; says its time zone as Django's loaders do.

    A compiled loader class cannot be subclassed; this one builds it. Django's
    ``create_cursor`` compares the connection's loader's ``timezone`` with
    its own and would register its Python loader on every cursor otherwise.
    """

    timezone = datetime.UTC
    format = Format.TEXT

    def __new__(cls, oid: int, context: AdaptContext | None = None) -> Loader:  # type: ignore[misc]  # it makes the compiled loader, not one of its own
        if COMPILED_TIMESTAMPTZ is None:  # fast_adapters registers it only with one
            raise RuntimeError("psycopg's compiled timestamptz loader is missing")
        return COMPILED_TIMESTAMPTZ(oid, context)


@functools.lru_cache
def fast_adapters(template: adapt.AdaptersMap) -> adapt.AdaptersMap:
    """Django's adapters map with the compiled timestamptz loader."""
    context = adapt.AdaptersMap(template)
    context.register_loader(TIMESTAMPTZ_OID, UtcTimestampLoader)  # type: ignore[arg-type]  # its __new__ makes a Loader
    return context


def confirm_replicated(
    execute: Callable[[str, object, bool, dict[str, Any]], object],
    sql: str,
    params: object,
    many: bool,
    context: dict[str, Any],  # Django's execute wrappers' context, as it types it
) -> object:
    """Django execute wrapper: an autocommitted statement commits as it runs."""
    result = execute(sql, params, many, context)
    raise_if_unreplicated(context["connection"].connection)
    return result


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, settings_dict: dict[str, Any], alias: str = "default") -> None:
        super().__init__(settings_dict, alias)
        self.last_request_ended: float | None = None
        self.execute_wrappers.append(confirm_replicated)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Connection:
        conn: Connection = super().get_new_connection(conn_params)
        watch_replication(conn)  # type: ignore[arg-type]  # it adds the flag
        return conn

    def _commit(self) -> None:
        super()._commit()  # type: ignore[misc]  # Django's, not in its stubs
        raise_if_unreplicated(self.connection)

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        # Django's timezone is None without USE_TZ, UTC with no per-database
        # TIME_ZONE.
        if COMPILED_TIMESTAMPTZ is not None and self.timezone is datetime.UTC:
            params["context"] = fast_adapters(params["context"])
        return params

    def close_if_health_check_failed(self) -> None:
        ended = self.last_request_ended
        if (
            self.connection is not None
            and ended is not None
            and time.monotonic() - ended < CHECK_AFTER_IDLE_SECONDS
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()

    def close_if_unusable_or_obsolete(self) -> None:
        # Django calls this when a request starts and when it ends; only at the
        # end of a request that used the connection is the check flag set.
        if self.connection is not None and self.health_check_done:
            self.last_request_ended = time.monotonic()
        super().close_if_unusable_or_obsolete()

    def close(self) -> None:
        super().close()
        self.last_request_ended = None

    @property
    def pool(self) -> ConnectionPool[Connection] | None:
        pool: ConnectionPool[Connection] | None = super().pool
        # Django hands the pool psycopg_pool's own check, a round trip on
        # every borrow; the pool serves each database call of an async view,
        # so that was one round trip more per call. Checked after idleness
        # instead, as above.
        if pool is not None and pool._check is ConnectionPool.check_connection:
            pool._check = check_after_idle
        return pool


def check_after_idle(conn: Connection) -> None:
    """psycopg_pool's check, skipped for a connection borrowed a moment ago."""
    if due_for_check(conn):
        ConnectionPool.check_connection(conn)
