"""The doorbell: wake a waiting agent when a todo of its scope becomes claimable.

The store rings it with ``pg_notify`` inside each transition that makes a todo
claimable (create, release, retry, lease-expiry requeue, due-retry requeue),
so a wakeup is sent exactly when the transition commits. The payload carries
the todo's own ``endpoint_id``, ``queue`` and ``id``.

A listener holds its own PostgreSQL connection (never the request's: LISTEN
state is per connection, and Django may reuse or close the request's one), and
filters every notification by endpoint first — the tenant boundary — and then
by the endpoint's queue grant.
"""

import json
import logging
import time

import psycopg
from django.conf import settings
from django.db import connections

from todos.store import DOORBELL_CHANNEL, NotFound, Scope

logger = logging.getLogger("switchboard.doorbell")


def _connect():
    # Behind a transaction-mode pooler LISTEN is lost between transactions, so
    # the doorbell may have a connection string of its own (session mode, or
    # PostgreSQL itself).
    url = settings.SWITCHBOARD_LISTEN_DATABASE_URL
    if url:
        return psycopg.connect(url, autocommit=True)
    params = connections["default"].get_connection_params()
    # Django's cursor class and adapters are for its own connections.
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


class Doorbell:
    """A LISTEN connection that yields the ready-todo rings of one scope.

    Use as a context manager so the connection closes when the waiter leaves::

        with Doorbell(scope) as bell:
            rings = bell.wait(timeout=20)
    """

    def __init__(self, scope):
        self.scope = scope
        self.conn = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()

    def open(self):
        self.conn = _connect()
        self.conn.execute(f"LISTEN {DOORBELL_CHANNEL}")

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None

    def matches(self, ring):
        """Say whether a ring belongs to this scope: endpoint first, then grant."""
        if ring.get("endpoint_id") != str(self.scope.endpoint_id):
            return False
        return self.scope.covers(ring.get("queue"))

    def wait(self, timeout, stop_after=1):
        """Wait up to ``timeout`` s for rings of this scope.

        Returns as soon as one has rung, together with any others already
        delivered (at most ``stop_after``), or an empty list at the timeout.
        Rings of other endpoints are dropped here and never returned.
        """
        deadline = time.monotonic() + max(timeout, 0)
        rings = []
        while not rings:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return rings
            rings.extend(self._receive(remaining, 1))
        # Drain what is already here, without waiting for more.
        while len(rings) < stop_after:
            more = self._receive(0, stop_after - len(rings))
            if not more:
                break
            rings.extend(more)
        return rings

    def _receive(self, timeout, limit):
        """Return this scope's rings among up to ``limit`` notifications."""
        received = []
        for notify in self.conn.notifies(timeout=timeout, stop_after=limit):
            ring = parse(notify.payload)
            if ring is not None and self.matches(ring):
                received.append(ring)
        return received


# How often a long poll re-tries the claim while no ring comes: a lapsed lease
# or an elapsed retry window becomes claimable without ringing.
LONG_POLL_RECHECK_SECONDS = 5


def claim_when_ready(scope, queue, wait, attempt):
    """Call ``attempt`` until it claims, waking on this scope's rings, for ``wait`` s.

    ``attempt`` raises ``store.NotFound`` while there is no claimable work; the
    last NotFound propagates at the deadline (at once when ``wait`` is 0). The
    first try needs no LISTEN; after a miss the LISTEN starts before the next
    try, so a todo that turns ready in between cannot slip by unheard.
    """
    deadline = time.monotonic() + wait
    try:
        return attempt()
    except NotFound:
        if wait <= 0:
            raise
    bell_scope = Scope(scope.endpoint_id, (queue,)) if queue else scope
    with Doorbell(bell_scope) as bell:
        while True:
            try:
                return attempt()
            except NotFound:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
            bell.wait(min(remaining, LONG_POLL_RECHECK_SECONDS))


def parse(payload):
    """Decode a ring's JSON payload, or None when it is not one of ours."""
    try:
        ring = json.loads(payload)
    except (TypeError, ValueError):
        logger.warning("doorbell: ignoring a malformed payload")
        return None
    return ring if isinstance(ring, dict) else None
