#!/usr/bin/env python
"""Django's command-line utility for Switchboard."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except OperationalError as exc:
        if not is_connection_failure(exc):
            raise
        sys.exit(unreachable_database(exc))


def is_connection_failure(exc):
    """Whether the command never got a database connection (the pool timed
    out waiting for one, or connecting failed), as opposed to a failed query."""
    from psycopg_pool import PoolTimeout

    cause = exc.__cause__
    return isinstance(cause, PoolTimeout) or str(exc).startswith(
        ("connection failed", "connection to server")
    )


def unreachable_database(exc):
    """The message for a database the command could not reach: where it
    looked, and the two settings that say where to look."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    hosts = (database["HOST"] or "localhost").split(",")
    ports = (database["PORT"] or "5432").split(",")
    # libpq pairs hosts and ports one to one; one port serves every host.
    tried = ", ".join(
        f"{host}:{ports[min(i, len(ports) - 1)]}" for i, host in enumerate(hosts)
    )
    return (
        f"manage.py: cannot reach the database {database['NAME']!r} at {tried}: "
        f"{exc}\n"
        "Start the project-local cluster with `make db` (it listens on SB_PG_PORT, "
        "54329 by default), give this command the same SB_PG_PORT, or set "
        "DATABASE_URL."
    )


if __name__ == "__main__":
    main()
