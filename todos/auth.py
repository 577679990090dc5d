"""Endpoint authentication from a bearer token, shared by the API, SSE and MCP."""

import json

from django.db import connection

from todos import tokens
from todos.models import Endpoint


def bearer_token(request):
    """Return the bearer token of a request, or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# Every agent request runs this: one index probe on the unique token_hash, as
# raw SQL because building the ORM query cost more CPU than the rest of a
# claim (bench/profile_api.py).
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


def endpoint_for_token(token):
    """Return the active endpoint a token belongs to, or None.

    The lookup is by the token's hash (an index probe); the match is then
    confirmed with a constant-time comparison.
    """
    if not token or len(token) > 200:
        return None
    digest = tokens.hash_token(token)
    with connection.cursor() as cursor:
        cursor.execute(ENDPOINT_BY_TOKEN_HASH_SQL, [digest])
        row = cursor.fetchone()
    if row is None or not tokens.token_matches(token, row[4]):
        return None
    values = list(row)
    # Raw cursors hand jsonb over as text.
    if isinstance(values[3], str):
        values[3] = json.loads(values[3])
    return Endpoint.from_db("default", ENDPOINT_FIELDS, values)


def endpoint_for_request(request):
    """Return the active endpoint named by the request's bearer token, or None."""
    return endpoint_for_token(bearer_token(request))


# The SQS surface's lookup (SigV4 names the key in the clear; the signature is
# checked with its secret after): one probe on the unique access_key_id,
# joined to an active endpoint, so a revoked endpoint's key stops at once.
SQS_KEY_SQL = (
    "SELECT c.secret_encrypted, c.account_id, "
    + ", ".join(f"e.{field}" for field in ENDPOINT_FIELDS)
    + " FROM sqs_credentials c JOIN endpoints e ON e.id = c.endpoint_id"
    " WHERE c.access_key_id = %s AND e.revoked_at IS NULL"
)


def endpoint_for_access_key(access_key_id):
    """Return (endpoint, secret ciphertext, account id) of an SQS key, or None."""
    if not access_key_id or len(access_key_id) > 32:
        return None
    with connection.cursor() as cursor:
        cursor.execute(SQS_KEY_SQL, [access_key_id])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row[2:])
    if isinstance(values[3], str):
        values[3] = json.loads(values[3])
    endpoint = Endpoint.from_db("default", ENDPOINT_FIELDS, values)
    return endpoint, row[0], row[1]
