"""Store calls served in the event loop: no thread, on an async connection.

A served agent call that only claims or acknowledges (``claim_many``,
``claim_next``, ``acknowledge_many`` and the single transitions) runs its
store function here instead of in todos.aio's thread pool. The function is
the same sync code: it runs in a greenlet of the loop's own thread, and each
statement it makes (``todos.store.sql._run``) switches back to the loop,
which awaits the statement on a connection of this process's
``AsyncConnectionPool``, then resumes the function with the rows. A thread
hop cost about 50 µs of CPU on each side of every call, and each served
claim+complete pair made three (docs/benchmarks.md).

The in-loop connections are made as Django makes its own (the same
parameters, adapters, prepared statements and statement timeout, UTC,
autocommit), are checked after idleness as Django's pool's are
(todos.db.idle), and turn a commit the synchronous standby did not
confirm into an outage as Django's do. Errors leave as Django's database
errors, so the store maps them exactly as it does in a thread.

A function called here makes its statements through ``run`` (the store's
``_run`` and ``todos.auth`` do), never through the ORM:
Django refuses a sync query from the loop's thread. A transaction is
``atomic()``: in a loop call it holds one in-loop connection from BEGIN to
COMMIT, elsewhere it is Django's ``transaction.atomic()``.

Only requests the serving marks (``serving``: board.serving.asgi does, for
each HTTP request) use the loop; anywhere else (Django's test client, a
command) ``call`` is ``aio.run_pooled``.
"""

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import greenlet  # type: ignore[import-untyped]  # it ships no types
import psycopg
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.utils import DatabaseErrorWrapper
from psycopg_pool import AsyncConnectionPool

from todos import aio
from todos.db.idle import due_for_check
from todos.db.params import async_params
from todos.db.replication import raise_if_unreplicated, watch_replication

type Fetch = Literal["all", "one", "count", "rowcount"] | None
type Rows = list[tuple[Any, ...]] | tuple[Any, ...] | None | int
type Params = Mapping[str, Any] | Sequence[Any]
type Pool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]

# Set by the serving for each request it serves (board.serving.asgi).
serving: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "switchboard_inloop_serving", default=False
)


class _Call(greenlet.greenlet):  # type: ignore[misc]  # untyped base
    """A store function running for the loop; its statements switch back to it."""

    # The pool and connection of the transaction it holds open (``atomic``).
    held: tuple[Pool, psycopg.AsyncConnection[Any]] | None = None


def in_loop_call() -> bool:
    """Whether the current code runs in a store call of the loop (``call``)."""
    return isinstance(greenlet.getcurrent(), _Call)


async def call[*Ts, R](fn: Callable[[*Ts], R], *args: *Ts) -> R:
    """Run the store function ``fn`` in the loop (see above), or pooled."""
    if not serving.get() or not settings.SWITCHBOARD_DB_IN_LOOP:
        return await aio.run_pooled(fn, *args)
    run = _Call(fn)
    # The statements run in the task's context (the request's, its logging).
    run.gr_context = contextvars.copy_context()
    pending: Any = run.switch(*args)
    while not run.dead:
        try:
            value = await pending
        except BaseException as exc:  # handed to the statement that awaited it
            pending = run.throw(exc)
        else:
            pending = run.switch(value)
    result: R = pending
    return result


def in_atomic_block() -> bool:
    """Whether a statement made here now would be inside a transaction."""
    current = greenlet.getcurrent()
    if isinstance(current, _Call):
        return current.held is not None
    return connection.in_atomic_block


def run(sql: str, params: Params, fetch: Fetch) -> Rows:
    """Run one statement where its caller runs: from the loop in a loop call
    (``execute``), else on Django's connection of the thread."""
    if in_loop_call():
        return execute(sql, params, fetch)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if fetch == "one":
            row: tuple[Any, ...] | None = cursor.fetchone()
            return row
        if fetch == "all":
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return rows
        count: int = cursor.rowcount
        return count


def execute(sql: str, params: Params, fetch: Fetch) -> Rows:
    """Run one statement from inside a loop call: the loop awaits it."""
    current = greenlet.getcurrent()
    held = current.held[1] if current.held is not None else None
    rows: Rows = current.parent.switch(_execute(held, sql, params, fetch))
    return rows


async def _execute(
    held: psycopg.AsyncConnection[Any] | None, sql: str, params: Params, fetch: Fetch
) -> Rows:
    pool = await _open_pool()
    # As Django's cursor does: psycopg's errors leave as Django's.
    with _django_errors:
        if held is not None:
            return await _fetch(held, sql, params, fetch)
        async with pool.connection() as conn:
            return await _fetch(conn, sql, params, fetch)


async def _fetch(
    conn: psycopg.AsyncConnection[Any], sql: str, params: Params, fetch: Fetch
) -> Rows:
    async with conn.cursor() as cursor:
        await cursor.execute(sql, params)
        raise_if_unreplicated(conn)  # type: ignore[arg-type]  # watched in _configure
        if fetch == "one":
            return await cursor.fetchone()
        if fetch == "all":
            return await cursor.fetchall()
        return cursor.rowcount


@contextlib.contextmanager
def atomic() -> Iterator[None]:
    """A transaction around the block: in a loop call, on one in-loop
    connection held from BEGIN to COMMIT (ROLLBACK when the block raises);
    elsewhere Django's ``transaction.atomic()``. Not nested in a loop call."""
    current = greenlet.getcurrent()
    if not isinstance(current, _Call):
        with transaction.atomic():
            yield
        return
    if current.held is not None:
        raise RuntimeError("a loop call's transactions do not nest")
    current.held = current.parent.switch(_begin())
    try:
        yield
    except BaseException:
        held, current.held = current.held, None
        current.parent.switch(_end(held, commit=False))
        raise
    held, current.held = current.held, None
    current.parent.switch(_end(held, commit=True))


async def _begin() -> tuple[Pool, psycopg.AsyncConnection[Any]]:
    pool = await _open_pool()
    with _django_errors:
        conn = await pool.getconn()
        try:
            await conn.execute("BEGIN")
        except BaseException:
            await pool.putconn(conn)
            raise
    return pool, conn


async def _end(held: tuple[Pool, psycopg.AsyncConnection[Any]], commit: bool) -> None:
    pool, conn = held
    try:
        with _django_errors:
            await conn.execute("COMMIT" if commit else "ROLLBACK")
            if commit:
                raise_if_unreplicated(conn)  # type: ignore[arg-type]  # watched
    finally:
        # A connection left in a transaction (a failed ROLLBACK) is discarded.
        await pool.putconn(conn)


# --- The pool ---------------------------------------------------------------------

# Made once: ``connections["default"]`` in a store call's context would make a
# new DatabaseWrapper each time (Django keeps them per context).
_django_errors: DatabaseErrorWrapper
_pool: Pool | None = None
_pool_loop: asyncio.AbstractEventLoop | None = None
_opening: asyncio.Task[None] | None = None


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    watch_replication(conn)  # type: ignore[arg-type]  # it adds the flag
    # Django's time zone is UTC (its loaders' and the store's); set it as
    # Django's ensure_timezone does, when the server's default differs.
    if conn.info.parameter_status("TimeZone") not in {"UTC", "Etc/UTC"}:
        await conn.execute("SELECT set_config('TimeZone', 'UTC', false)")


async def _check(conn: psycopg.AsyncConnection[Any]) -> None:
    """psycopg_pool's check, only after idleness (todos.db.idle)."""
    if due_for_check(conn):
        await AsyncConnectionPool.check_connection(conn)


async def _open_pool() -> Pool:
    global _pool, _pool_loop, _opening
    loop = asyncio.get_running_loop()
    if _pool is not None and _pool_loop is loop:
        return _pool
    if _opening is None or _pool_loop is not loop:
        _pool_loop = loop
        _opening = loop.create_task(_make_pool())
    await asyncio.shield(_opening)
    if _pool is None:  # the task failed: its error was raised above
        raise RuntimeError("the in-loop pool did not open")
    return _pool


async def _make_pool() -> None:
    global _pool, _opening, _django_errors
    _django_errors = DatabaseErrorWrapper(connections["default"])
    pool: Pool = AsyncConnectionPool(
        kwargs=async_params(),
        min_size=1,
        max_size=settings.SWITCHBOARD_DB_ASYNC_POOL_MAX,
        timeout=settings.DATABASES["default"]["OPTIONS"]["connect_timeout"],
        max_idle=120,
        name="switchboard-inloop",
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


async def close() -> None:
    """Close this process's in-loop pool (a worker or a test server stopping).

    A pool opened by another event loop is only forgotten: its tasks are that
    loop's, cancelled when it ended (a test's loop, where one process runs
    several), so closing it here would raise their CancelledError.
    """
    global _pool, _pool_loop, _opening
    pool, loop = _pool, _pool_loop
    _pool, _pool_loop, _opening = None, None, None
    if pool is not None and loop is asyncio.get_running_loop():
        await pool.close()
