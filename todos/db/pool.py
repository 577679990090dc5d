"""The process's async connections: where the agent path's statements run.

The agent surfaces' async views await their statements here, in the event
loop, on a connection of this process's ``AsyncConnectionPool``: no thread,
and none of Django's connections. (The sync code, the Board, webhooks,
commands and sweeps, runs on Django's connection of its thread.)

The connections are made as Django makes its own (``params.async_params``:
the same parameters, adapters, prepared statements and statement timeout;
UTC; autocommit; timestamps read by psycopg's own loader, as the same
values), are checked after idleness as Django's pool's are
(``idle``), and turn a commit the synchronous standby did not confirm into
an outage as Django's do (``replication``). Errors leave as Django's
database errors, so the store maps them as it maps a sync call's.

``db`` runs each statement on a connection borrowed for it;
``async with transaction() as tx`` holds one from BEGIN to COMMIT (ROLLBACK
when the block raises), and ``tx`` runs statements as ``db`` does. The pool
opens at a worker's boot (``open_pool``), else at its first use, in the running
event loop; ``close`` closes it.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import psycopg
from django.conf import settings
from django.db import connections
from django.db.utils import DatabaseErrorWrapper
from psycopg_pool import AsyncConnectionPool

from todos.db.idle import due_for_check
from todos.db.params import async_params
from todos.db.replication import raise_if_unreplicated, watch_replication

type Row = tuple[Any, ...]
type Params = Mapping[str, Any] | Sequence[Any]
type Fetch = Literal["all", "one", "rowcount"]
type Connection = psycopg.AsyncConnection[Any]
type Pool = AsyncConnectionPool[Connection]


class Runner:
    """Runs statements: each on a connection of the pool, or all on the one
    connection of a transaction (``transaction``)."""

    def __init__(self, conn: Connection | None = None) -> None:
        self._conn = conn

    async def fetch_one(self, sql: str, params: Params) -> Row | None:
        """The statement's first row, or None."""
        row: Row | None = await self.run(sql, params, "one")
        return row

    async def fetch_all(self, sql: str, params: Params) -> list[Row]:
        """Every row of the statement."""
        rows: list[Row] = await self.run(sql, params, "all")
        return rows

    async def execute(self, sql: str, params: Params) -> int:
        """Run the statement; return its row count."""
        count: int = await self.run(sql, params, "rowcount")
        return count

    async def run(self, sql: str, params: Params, fetch: Fetch) -> Any:
        """The statement's rows as ``fetch`` says (see the methods above)."""
        if self._conn is not None:
            with _django_errors():
                return await _fetch(self._conn, sql, params, fetch)
        pool = await open_pool()
        with _django_errors():
            async with pool.connection() as conn:
                return await _fetch(conn, sql, params, fetch)


# The pool's runner: each statement on a connection borrowed for it.
db = Runner()


async def _fetch(conn: Connection, sql: str, params: Params, fetch: Fetch) -> Any:
    async with conn.cursor() as cursor:
        await cursor.execute(sql, params)
        raise_if_unreplicated(conn)  # type: ignore[arg-type]  # watched in _configure
        if fetch == "one":
            return await cursor.fetchone()
        if fetch == "all":
            return await cursor.fetchall()
        return cursor.rowcount


@contextlib.asynccontextmanager
async def transaction() -> AsyncIterator[Runner]:
    """One connection of the pool held from BEGIN to COMMIT (ROLLBACK when
    the block raises); the runner it yields makes its statements there."""
    pool = await open_pool()
    with _django_errors():
        async with pool.connection() as conn:
            async with conn.transaction():
                yield Runner(conn)
            raise_if_unreplicated(conn)  # type: ignore[arg-type]  # watched in _configure


# --- The pool ---------------------------------------------------------------------

_wrapper: DatabaseErrorWrapper | None = None
_pool: Pool | None = None
_pool_loop: asyncio.AbstractEventLoop | None = None
_opening: asyncio.Task[None] | None = None


def _django_errors() -> DatabaseErrorWrapper:
    """As Django's cursor does: psycopg's errors leave as Django's. Made
    once: ``connections["default"]`` in a task's context would make a new
    DatabaseWrapper each time (Django keeps them per context)."""
    global _wrapper
    if _wrapper is None:
        _wrapper = DatabaseErrorWrapper(connections["default"])
    return _wrapper


async def _configure(conn: Connection) -> None:
    watch_replication(conn)  # type: ignore[arg-type]  # it adds the flag
    # Django's time zone is UTC (its loaders' and the store's); set it as
    # Django's ensure_timezone does, when the server's default differs. By
    # that name: psycopg's timestamp loader (params.utc_timestamps) gives the
    # zone "UTC" as datetime.UTC, "Etc/UTC" as a ZoneInfo.
    if conn.info.parameter_status("TimeZone") != "UTC":
        await conn.execute("SELECT set_config('TimeZone', 'UTC', false)")


async def _check(conn: Connection) -> None:
    """psycopg_pool's check, only after idleness (todos.db.idle)."""
    if due_for_check(conn):
        await AsyncConnectionPool.check_connection(conn)


async def open_pool() -> Pool:
    """This process's pool, opened in the running loop at its first use."""
    global _pool_loop, _opening
    loop = asyncio.get_running_loop()
    if _pool is not None and _pool_loop is loop:
        return _pool
    if _opening is None or _pool_loop is not loop:
        _pool_loop = loop
        _opening = loop.create_task(_make_pool())
    await asyncio.shield(_opening)
    if _pool is None:  # the task failed: its error was raised above
        raise RuntimeError("the async pool did not open")
    return _pool


async def _make_pool() -> None:
    global _pool, _opening
    _django_errors()
    pool: Pool = AsyncConnectionPool(
        kwargs=async_params(),
        min_size=1,
        max_size=settings.SWITCHBOARD_DB_ASYNC_POOL_MAX,
        timeout=settings.DATABASES["default"]["OPTIONS"]["connect_timeout"],
        max_idle=120,
        name="switchboard-async",
        configure=_configure,
        check=_check,
        open=False,
    )
    try:
        await pool.open(wait=False)
    except BaseException:
        _opening = None
        raise
    _pool = pool


def current() -> Pool | None:
    """The pool, if open (tests read its connections)."""
    return _pool


async def close() -> None:
    """Close this process's pool (a worker or a test server stopping).

    A pool opened by another event loop is only forgotten: its tasks are that
    loop's, cancelled when it ended (a test's loop, where one process runs
    several), so closing it here would raise their CancelledError.
    """
    global _pool, _pool_loop, _opening
    pool, loop = _pool, _pool_loop
    _pool, _pool_loop, _opening = None, None, None
    if pool is not None and loop is asyncio.get_running_loop():
        await pool.close()
