"""Encryption at rest for the secrets Switchboard must be able to read back.

Endpoint tokens are stored as hashes, but an SQS secret access key (SigV4 signs
with the secret itself) and a webhook signing secret (an HMAC key) must be
recoverable, so they are stored encrypted with Fernet (AES-128-CBC plus
HMAC-SHA256, from the ``cryptography`` library).

The keys follow Django's own recipe for ``SECRET_KEY`` rotation:

- ``SWITCHBOARD_ENCRYPTION_KEY``: one or more Fernet keys, comma-separated.
  When set, its first key encrypts.
- Otherwise the key derived from ``SECRET_KEY`` (HKDF-SHA256) encrypts.
- Every one of them decrypts, and so do the keys derived from ``SECRET_KEY``
  and from each of ``SECRET_KEY_FALLBACKS``: moving the old ``SECRET_KEY`` to
  the fallbacks, or setting ``SWITCHBOARD_ENCRYPTION_KEY`` for the first time,
  keeps every stored secret readable. ``manage.py reencrypt_secrets`` then
  rewrites them under the key that encrypts, after which the old key can go
  (docs/operations.md, "Rotating keys").
"""

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

HKDF_INFO = b"switchboard secrets at rest v1"
MALFORMED_KEY = (
    "SWITCHBOARD_ENCRYPTION_KEY must be Fernet keys (32 url-safe base64 bytes "
    "each), comma-separated"
)


class DecryptionFailed(Exception):
    """A stored ciphertext does not open with any configured key."""


def derived_key(secret_key: str | None = None) -> str:
    """Return the Fernet key derived from SECRET_KEY (the default key)."""
    material = (secret_key or settings.SECRET_KEY).encode("utf-8")
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(
        material
    )
    return base64.urlsafe_b64encode(raw).decode("ascii")


def configured_keys(configured: str | None = None) -> list[str]:
    """Return the keys of SWITCHBOARD_ENCRYPTION_KEY, in order (maybe none)."""
    if configured is None:
        configured = settings.SWITCHBOARD_ENCRYPTION_KEY
    return [key.strip() for key in configured.split(",") if key.strip()]


def configuration_error() -> str | None:
    """Return why SWITCHBOARD_ENCRYPTION_KEY is unusable, or None when it is fine."""
    for key in configured_keys():
        try:
            Fernet(key)
        except ValueError:
            return MALFORMED_KEY
    return None


@functools.lru_cache(maxsize=4)
def _keyring(
    configured: str, secret_key: str, fallbacks: tuple[str, ...]
) -> tuple[MultiFernet, Fernet]:
    """Return (the MultiFernet of every key, the Fernet of the key that encrypts)."""
    keys = configured_keys(configured)
    for secret in (secret_key, *fallbacks):
        derived = derived_key(secret)
        if derived not in keys:
            keys.append(derived)
    try:
        fernets = [Fernet(key) for key in keys]
    except ValueError as exc:
        raise ImproperlyConfigured(MALFORMED_KEY) from exc
    return MultiFernet(fernets), fernets[0]


def _current() -> tuple[MultiFernet, Fernet]:
    return _keyring(
        settings.SWITCHBOARD_ENCRYPTION_KEY,
        settings.SECRET_KEY,
        tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())),
    )


def fernet() -> MultiFernet:
    """Return the MultiFernet of every key: the first encrypts, all decrypt."""
    return _current()[0]


def encrypt(plaintext: str) -> str:
    """Return the ciphertext (text) of a secret string."""
    return fernet().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(ciphertext: str) -> str:
    """Return the secret string of a ciphertext, or raise DecryptionFailed."""
    return _decrypt(fernet(), ciphertext)


def is_current(ciphertext: str) -> bool:
    """Say whether a ciphertext is under the key that encrypts (no rewrite due)."""
    try:
        _current()[1].decrypt(ciphertext.encode("ascii"))
    except (InvalidToken, UnicodeError, AttributeError):
        return False
    return True


def reencrypt(ciphertext: str) -> str:
    """Return the ciphertext rewritten under the key that encrypts.

    Raises DecryptionFailed when no configured key opens it.
    """
    try:
        return fernet().rotate(ciphertext.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError, AttributeError) as exc:
        raise DecryptionFailed("the secret does not decrypt with any key") from exc


# Every SQS call decrypts its endpoint's secret (an HMAC and AES, about 3 % of
# a call's CPU): the last ones are remembered, per key set, as they would be
# in any process that holds the keys anyway. A failure is never remembered.
@functools.lru_cache(maxsize=1024)
def _decrypt(keys: MultiFernet, ciphertext: str) -> str:
    try:
        return keys.decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError, AttributeError) as exc:
        raise DecryptionFailed("the secret does not decrypt with any key") from exc
