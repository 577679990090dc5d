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
        # A command that never got a connection says where it looked, in
        # place of a traceback; a statement that failed keeps its traceback.
        from todos.management.database import is_connection_failure, unreachable

        if not is_connection_failure(exc):
            raise
        sys.exit(f"manage.py: {unreachable(sys.argv[1], exc)}")


if __name__ == "__main__":
    main()
