"""What a command says when it cannot reach the database: where it looked
(host and port, from DATABASE_URL or SB_PG_PORT) and what sets that."""

from django.conf import settings
from django.core.management import CommandError
from psycopg_pool import PoolTimeout

HINT = (
    "Start the project-local cluster with `make db` (it listens on SB_PG_PORT, "
    "54329 by default), give this command the same SB_PG_PORT, or set "
    "DATABASE_URL."
)


def address():
    """The database the settings name: ``'switchboard' at 127.0.0.1:54329``."""
    database = settings.DATABASES["default"]
    hosts = (database["HOST"] or "localhost").split(",")
    ports = (database["PORT"] or "5432").split(",")
    # libpq pairs hosts and ports one to one; one port serves every host.
    tried = ", ".join(
        f"{host}:{ports[min(i, len(ports) - 1)]}" for i, host in enumerate(hosts)
    )
    return f"{database['NAME']!r} at {tried}"


def is_connection_failure(exc):
    """Whether no connection was had (the pool waited for one in vain, or
    connecting failed), as opposed to a statement that failed."""
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, PoolTimeout):
        if str(cause).startswith(("connection failed", "connection to server")):
            return True
        cause = cause.__cause__
    return isinstance(cause, PoolTimeout) or str(exc).startswith(
        ("connection failed", "connection to server")
    )


def unreachable(command, exc):
    """The CommandError for a database the command could not use."""
    if is_connection_failure(exc):
        return CommandError(
            f"{command}: database unavailable: cannot reach the database "
            f"{address()}: {exc.__cause__ or exc}\n{HINT}"
        )
    return CommandError(f"{command}: {exc}")
