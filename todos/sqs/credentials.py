"""SQS credentials of an endpoint: minted, rotated and shown once.

An endpoint has at most one key pair. The access key id is looked up in the
clear (SigV4 sends it), the secret is kept encrypted (todos.access.crypto), and the
12-digit account id names the endpoint in every queue URL; rotation replaces
the key pair and keeps the account id, so queue URLs stay valid.
"""

import secrets
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from todos.access import crypto
from todos.models import Endpoint, SqsCredential

ACCESS_KEY_PREFIX = "SBIA"
# Uppercase letters and digits, as AWS key ids: some tools check the shape.
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


@dataclass(frozen=True)
class Issued:
    """A key pair as shown once: the secret is never readable from a listing."""

    access_key_id: str
    secret_access_key: str
    account_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "sqs_access_key_id": self.access_key_id,
            "sqs_secret_access_key": self.secret_access_key,
            "sqs_account_id": self.account_id,
        }


def _access_key_id() -> str:
    return ACCESS_KEY_PREFIX + "".join(secrets.choice(KEY_ALPHABET) for _ in range(16))


def _secret() -> str:
    return secrets.token_urlsafe(30)


def _account_id() -> str:
    return str(secrets.randbelow(9 * 10**11) + 10**11)


def issue(endpoint: Endpoint) -> Issued:
    """Give an endpoint SQS credentials (new, or rotated); return them once."""
    for _ in range(5):
        secret = _secret()
        try:
            with transaction.atomic():
                credential = (
                    SqsCredential.objects.select_for_update()
                    .filter(endpoint=endpoint)
                    .first()
                )
                if credential is None:
                    credential = SqsCredential(
                        endpoint=endpoint, account_id=_account_id()
                    )
                else:
                    credential.rotated_at = timezone.now()
                credential.access_key_id = _access_key_id()
                credential.secret_encrypted = crypto.encrypt(secret)
                credential.save()
        except IntegrityError:
            # A key id or account id collided (about 1 in 10^11): draw again.
            continue
        return Issued(credential.access_key_id, secret, credential.account_id)
    raise RuntimeError("could not mint unique SQS credentials")


def shown(endpoint: Endpoint) -> SqsCredential | None:
    """Return the endpoint's credential without its secret, or None."""
    return SqsCredential.objects.filter(endpoint=endpoint).first()
