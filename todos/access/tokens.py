"""Endpoint tokens: random, prefixed, shown once, stored only as a SHA-256 hash.

A token has 256 bits of entropy, so a fast hash is enough: there is nothing to
brute-force, and the lookup by hash stays an index probe. The comparison after
the lookup is constant-time all the same.
"""

import hashlib
import hmac
import secrets

TOKEN_PREFIX = "sb_"


def generate_token() -> str:
    """Return a fresh endpoint token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Return the hex SHA-256 digest stored in place of the token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Compare a presented token with a stored hash in constant time."""
    return hmac.compare_digest(hash_token(token), stored_hash)


def display_prefix(token: str) -> str:
    """Return the part of a token safe to show to tell tokens apart."""
    return token[: len(TOKEN_PREFIX) + 6]
