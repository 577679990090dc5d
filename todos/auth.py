"""Endpoint authentication from a bearer token, shared by the API, SSE and MCP."""

from todos import tokens
from todos.models import Endpoint


def bearer_token(request):
    """Return the bearer token of a request, or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def endpoint_for_token(token):
    """Return the active endpoint a token belongs to, or None.

    The lookup is by the token's hash (an index probe); the match is then
    confirmed with a constant-time comparison.
    """
    if not token or len(token) > 200:
        return None
    digest = tokens.hash_token(token)
    endpoint = (
        Endpoint.objects.filter(token_hash=digest, revoked_at__isnull=True)
        .select_related("owner")
        .first()
    )
    if endpoint is None or not tokens.token_matches(token, endpoint.token_hash):
        return None
    return endpoint


def endpoint_for_request(request):
    """Return the active endpoint named by the request's bearer token, or None."""
    return endpoint_for_token(bearer_token(request))
