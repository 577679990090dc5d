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
