"""Django's PostgreSQL backend: the health check runs only after idleness.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` before the first query of
every request that reuses a connection: one round trip more for each agent call,
a third of a claim's queries. A connection that finished a
request a moment ago is as good as proven: this backend skips the check when the
connection's last request ended less than ``CHECK_AFTER_IDLE_SECONDS`` ago
(todos.db.idle) and keeps it otherwise, so a connection that sat idle across a
PostgreSQL restart is still replaced before it is used. One that breaks mid-burst fails
its request (503) and Django closes it at the request's end, as it does for any
connection that breaks during a request.

A commit the synchronous standby did not confirm raises
``UnreplicatedCommit`` (todos.db.replication).

psycopg parses a statement (finds and splits out its placeholders) once and
keeps the parse, but only for statements up to 4096 bytes: longer ones, which
it takes for generated ORM queries of many VALUES, it parses again on every
call. The store's claim and acknowledgement are fixed statements of about
5,000 bytes, parsed in about 40 µs each, a claim and complete pair's
85 µs of CPU out of 2.2 ms (served in-process); this
backend raises psycopg's bound to ``PARSED_STATEMENT_BYTES``, and the store's
few dozen statements fit psycopg's cache of 128 parses.
"""

import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import _queries
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
