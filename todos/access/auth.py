"""Endpoint authentication, shared by the API, SSE, MCP (bearer tokens) and SQS
(access keys), with a per-process cache of the credentials it found.

The cache spares a request its lookup statement, and holds only while this
process's doorbell hub (todos/waiting/doorbell.py) listens: the triggers of
migrations 0012 and 0016 send a control notice whenever an endpoint is revoked,
re-keyed, re-granted or deleted, or its SQS key rotated, and the hub forgets
that endpoint's entries before it tells the waiters. Without a listening hub (a
command, a process still connecting or reconnecting) every lookup reads the
database; each (re)connect and disconnect forgets everything, since notices
sent meanwhile are lost. A change made in this process is forgotten at once too
(``forget``), and again at its commit.

A lookup takes the cache's generation before it reads and keeps its row only
if nothing was forgotten since: a row read before a change, and returned after
the change's notice, is never kept. Only found credentials are kept, tokens by
their hash, at most ``CACHE_SIZE`` of them, least recently used first out.
"""

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable
from functools import partial
from typing import Any, cast
from uuid import UUID

from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest

from todos.access import tokens
from todos.db.pool import db
from todos.models import Endpoint, SqsCredential

Row = tuple[Any, ...]
CACHE_SIZE = 4096


def bearer_token(request: HttpRequest) -> str | None:
    """Return the bearer token of a request, or None."""
    # From META, as request.headers reads it: building request.headers maps
    # every header of the request, for this one.
    header: str = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# Every agent request needs this: one index probe on the unique token_hash (when
# not cached), as raw SQL because building the ORM query cost more CPU than the
# rest of a claim (a served claim's profile: bench/profile_served.py).
ENDPOINT_FIELDS = (
    "id",
    "name",
    "owner_id",
    "queues",
    "token_hash",
    "token_prefix",
    "created_at",
    "revoked_at",
)
ENDPOINT_BY_TOKEN_HASH_SQL = (
    f"SELECT {', '.join(ENDPOINT_FIELDS)} FROM endpoints"
    " WHERE token_hash = %s AND revoked_at IS NULL"
)


def endpoint_for_token(token: str | None) -> Endpoint | None:
    """Return the active endpoint a token belongs to, or None.

    The lookup is by the token's hash (an index probe, or the cache); the match
    is then confirmed with a constant-time comparison.
    """
    digest = _token_digest(token)
    if digest is None:
        return None
    return _token_endpoint(
        token, _row(("token", digest), ENDPOINT_BY_TOKEN_HASH_SQL, digest)
    )


async def aendpoint_for_token(token: str | None) -> Endpoint | None:
    """``endpoint_for_token`` for async code: the lookup awaited in the loop."""
    digest = _token_digest(token)
    if digest is None:
        return None
    return _token_endpoint(
        token, await _arow(("token", digest), ENDPOINT_BY_TOKEN_HASH_SQL, digest)
    )


def _token_digest(token: str | None) -> str | None:
    if not token or len(token) > 200:
        return None
    return tokens.hash_token(token)


def _token_endpoint(token: str | None, row: Row | None) -> Endpoint | None:
    if token is None or row is None or not tokens.token_matches(token, row[4]):
        return None
    return _endpoint(row)


def endpoint_for_request(request: HttpRequest) -> Endpoint | None:
    """Return the active endpoint named by the request's bearer token, or None."""
    return endpoint_for_token(bearer_token(request))


async def aendpoint_for_request(request: HttpRequest) -> Endpoint | None:
    """``endpoint_for_request`` for async code: the lookup awaited in the loop."""
    return await aendpoint_for_token(bearer_token(request))


# The SQS surface's lookup (SigV4 names the key in the clear; the signature is
# checked with its secret after): one probe on the unique access_key_id,
# joined to an active endpoint, so a revoked endpoint's key stops at once.
SQS_KEY_SQL = (
    "SELECT "
    + ", ".join(f"e.{field}" for field in ENDPOINT_FIELDS)
    + ", c.secret_encrypted, c.account_id"
    " FROM sqs_credentials c JOIN endpoints e ON e.id = c.endpoint_id"
    " WHERE c.access_key_id = %s AND e.revoked_at IS NULL"
)


def endpoint_for_access_key(
    access_key_id: str | None,
) -> tuple[Endpoint, str, str] | None:
    """Return (endpoint, secret ciphertext, account id) of an SQS key, or None.

    The ciphertext decrypts through ``crypto.decrypt``'s own cache, keyed by the
    ciphertext: a rotated key has a new one.
    """
    if not access_key_id or len(access_key_id) > 32:
        return None
    return _sqs_key(_row(("sqs", access_key_id), SQS_KEY_SQL, access_key_id))


async def aendpoint_for_access_key(
    access_key_id: str | None,
) -> tuple[Endpoint, str, str] | None:
    """``endpoint_for_access_key`` for async code: awaited in the loop."""
    if not access_key_id or len(access_key_id) > 32:
        return None
    return _sqs_key(await _arow(("sqs", access_key_id), SQS_KEY_SQL, access_key_id))


def _sqs_key(row: Row | None) -> tuple[Endpoint, str, str] | None:
    if row is None:
        return None
    width = len(ENDPOINT_FIELDS)
    return _endpoint(row[:width]), row[width], row[width + 1]


# --- The cache ----------------------------------------------------------------


class CredentialCache:
    """The credential rows this process found lately, each with its endpoint.

    Rows are kept only while at least one hub listens (``listening``); every
    change of that, and every ``forget``, moves the generation on.
    """

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._rows: OrderedDict[Hashable, tuple[str, Row]] = OrderedDict()
        self._generation = 0
        self._listeners: set[object] = set()

    def get(self, key: Hashable) -> Row | None:
        with self._lock:
            found = self._rows.get(key)
            if found is None:
                return None
            self._rows.move_to_end(key)
            return found[1]

    def generation(self) -> int | None:
        """The stamp a lookup takes before it reads (None: nothing listens)."""
        with self._lock:
            return self._generation if self._listeners else None

    def put(
        self, key: Hashable, endpoint_id: object, row: Row, generation: int | None
    ) -> None:
        """Keep ``row``, unless anything was forgotten since ``generation``."""
        with self._lock:
            if generation is None or generation != self._generation:
                return
            self._rows[key] = (str(endpoint_id), row)
            self._rows.move_to_end(key)
            if len(self._rows) > self.size:
                self._rows.popitem(last=False)

    def forget(self, endpoint_id: object) -> None:
        """Drop an endpoint's rows; lookups under way keep nothing."""
        with self._lock:
            self._generation += 1
            endpoint = str(endpoint_id)
            for key in [k for k, (owner, _) in self._rows.items() if owner == endpoint]:
                del self._rows[key]

    def listening(self, listener: object, listens: bool) -> None:
        """A hub (re)connected, or stopped listening: drop every row."""
        with self._lock:
            self._generation += 1
            self._rows.clear()
            if listens:
                self._listeners.add(listener)
            else:
                self._listeners.discard(listener)


cache = CredentialCache()


def forget(endpoint_id: UUID | str) -> None:
    """Drop an endpoint's cached credentials now and, inside a transaction,
    again at its commit: another thread may read the old row until then."""
    cache.forget(endpoint_id)
    if connection.in_atomic_block:
        transaction.on_commit(partial(cache.forget, endpoint_id))


@receiver(post_save, sender=Endpoint)
@receiver(post_delete, sender=Endpoint)
def _endpoint_changed(sender: type, instance: Endpoint, **kwargs: object) -> None:
    forget(instance.id)


@receiver(post_save, sender=SqsCredential)
@receiver(post_delete, sender=SqsCredential)
def _sqs_key_changed(sender: type, instance: SqsCredential, **kwargs: object) -> None:
    forget(instance.endpoint_id)


def _row(key: Hashable, sql: str, param: str) -> Row | None:
    """The active credential's row (endpoint fields first), cached or read."""
    cached = cache.get(key)
    if cached is not None:
        return cached
    generation = cache.generation()
    with connection.cursor() as cursor:
        cursor.execute(sql, [param])
        row = cast(Row | None, cursor.fetchone())
    # Read inside a transaction, a row may be one that never commits.
    if row is not None and not connection.in_atomic_block:
        cache.put(key, row[0], row, generation)
    return row


async def _arow(key: Hashable, sql: str, param: str) -> Row | None:
    """``_row`` awaited on the async pool (todos.db.pool): in autocommit, so a
    row found is a committed one and is kept."""
    cached = cache.get(key)
    if cached is not None:
        return cached
    generation = cache.generation()
    row = await db.fetch_one(sql, [param])
    if row is not None:
        cache.put(key, row[0], row, generation)
    return row


def _endpoint(values: Row) -> Endpoint:
    # Raw cursors hand jsonb over as text; each caller gets its own list.
    fields = list(values)
    if isinstance(fields[3], str):
        fields[3] = json.loads(fields[3])
    return Endpoint.from_db("default", ENDPOINT_FIELDS, fields)
