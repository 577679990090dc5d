"""Encryption at rest for the secrets Switchboard must be able to read back.

Endpoint tokens are stored as hashes, but an SQS secret access key (SigV4 signs
with the secret itself) and a webhook signing secret (an HMAC key) must be
recoverable, so they are stored encrypted with Fernet (AES-128-CBC plus
HMAC-SHA256, from the ``cryptography`` library).

The key comes from ``SWITCHBOARD_ENCRYPTION_KEY``: one or more Fernet keys,
comma-separated; the first encrypts, every one decrypts, so a key is rotated by
prepending a new one (old ciphertexts stay readable until they are rewritten,
e.g. by rotating the credential). When the setting is
empty the key is derived from ``SECRET_KEY`` with HKDF-SHA256, so a deployment
that rotates ``SECRET_KEY`` must first set ``SWITCHBOARD_ENCRYPTION_KEY`` to the
derived key (``python manage.py shell -c "from todos import crypto;
print(crypto.derived_key())"``).
"""

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

HKDF_INFO = b"switchboard secrets at rest v1"


class DecryptionFailed(Exception):
    """A stored ciphertext does not open with any configured key."""


def derived_key(secret_key=None):
    """Return the Fernet key derived from SECRET_KEY (the default key)."""
    material = (secret_key or settings.SECRET_KEY).encode("utf-8")
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(
        material
    )
    return base64.urlsafe_b64encode(raw).decode("ascii")


@functools.lru_cache(maxsize=4)
def _fernet(configured, secret_key):
    keys = [key.strip() for key in configured.split(",") if key.strip()]
    if not keys:
        keys = [derived_key(secret_key)]
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(
            "SWITCHBOARD_ENCRYPTION_KEY must be Fernet keys (32 url-safe base64 "
            "bytes each), comma-separated"
        ) from exc


def fernet():
    """Return the MultiFernet of the configured keys (read when first needed)."""
    return _fernet(settings.SWITCHBOARD_ENCRYPTION_KEY, settings.SECRET_KEY)


def encrypt(plaintext):
    """Return the ciphertext (text) of a secret string."""
    return fernet().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(ciphertext):
    """Return the secret string of a ciphertext, or raise DecryptionFailed."""
    return _decrypt(fernet(), ciphertext)


# Every SQS call decrypts its endpoint's secret (an HMAC and AES, about 3 % of
# a call's CPU): the last ones are remembered, per key set, as they would be
# in any process that holds the keys anyway. A failure is never remembered.
@functools.lru_cache(maxsize=1024)
def _decrypt(keys, ciphertext):
    try:
        return keys.decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError, AttributeError) as exc:
        raise DecryptionFailed("the secret does not decrypt with any key") from exc
