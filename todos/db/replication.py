"""A commit the synchronous standby did not confirm is an error, not a success.

With a synchronous standby, a commit waits until the standby has it (the
statement timeout does not end that wait). When the wait is cancelled, by an
operator's ``pg_cancel_backend`` on a commit stuck behind a stalled standby,
PostgreSQL keeps the commit on the primary only and answers success with a
warning: "canceling wait for synchronous replication". A failover then would
lose it, so a watched connection turns that warning into ``UnreplicatedCommit``
(an ``OperationalError``): the caller answers 503 and the client retries
(creates carry idempotency keys, acknowledgements with a lease token are
repeatable) instead of taking the write for one that two servers hold.

Django's connections are watched by its backend (board.serving.pgbackend), the
async pool's by its ``configure`` (todos.db.pool).
"""

import weakref
from collections.abc import Callable
from typing import Protocol

from django.db import OperationalError
from psycopg.errors import Diagnostic

# The start of PostgreSQL's warning when a commit's wait for the synchronous
# standby was cancelled (src/backend/replication/syncrep.c).
SYNC_REP_CANCELLED = "canceling wait for synchronous replication"


class UnreplicatedCommit(OperationalError):
    """A commit the synchronous standby did not confirm: kept on the primary only."""


class Watched(Protocol):
    """A connection ``watch_replication`` flags (psycopg's, with our flag)."""

    _switchboard_unreplicated: bool

    def add_notice_handler(self, callback: Callable[[Diagnostic], None]) -> None: ...


def watch_replication(conn: Watched) -> None:
    """Flag the connection when a commit's wait for the standby is cancelled."""
    if hasattr(conn, "_switchboard_unreplicated"):
        return
    conn._switchboard_unreplicated = False
    # A weak reference: the handler lives on the connection it flags.
    ref = weakref.ref(conn)

    def on_notice(diagnostic: Diagnostic) -> None:
        flagged = ref()
        if flagged is not None and (diagnostic.message_primary or "").startswith(
            SYNC_REP_CANCELLED
        ):
            flagged._switchboard_unreplicated = True

    conn.add_notice_handler(on_notice)


def raise_if_unreplicated(conn: Watched | None) -> None:
    """Raise ``UnreplicatedCommit`` once for the connection's flagged commit."""
    if conn is not None and getattr(conn, "_switchboard_unreplicated", False):
        conn._switchboard_unreplicated = False
        raise UnreplicatedCommit(
            "the commit was not confirmed by the synchronous standby"
        )
