"""The secrets kept encrypted at rest, surveyed and moved to the current key.

Two tables hold them: ``sqs_credentials`` (SQS secret access keys) and
``webhook_sources`` (webhook signing secrets), each in ``secret_encrypted``.
The system checks (``todos.checks``) survey them; ``manage.py
reencrypt_secrets`` rewrites each one under the key that encrypts, so that an
old key can leave the settings (docs/operations.md, "Rotating keys").
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import models

from todos.access import crypto
from todos.models import SqsCredential, WebhookSource

# Rows read per query: a table is walked in primary-key order, a batch at a time.
BATCH = 500


@dataclass(frozen=True)
class Store:
    """One table of encrypted secrets."""

    label: str
    model: type[models.Model]

    def batches(self):
        """Yield lists of (pk, ciphertext), in primary-key order."""
        rows = self.model.objects.order_by("pk").values_list("pk", "secret_encrypted")
        last = None
        while True:
            batch = list((rows if last is None else rows.filter(pk__gt=last))[:BATCH])
            if not batch:
                return
            yield batch
            last = batch[-1][0]


STORES = (
    Store("SQS secret keys", SqsCredential),
    Store("webhook signing secrets", WebhookSource),
)


@dataclass
class Tally:
    """What a pass over one store found (and, when moving, did)."""

    label: str
    current: int = 0
    # Readable only with an older key (a fallback): moved by reencrypt_secrets.
    old_key: int = 0
    moved: int = 0
    # Primary keys of the secrets no configured key opens.
    unreadable: list = field(default_factory=list)

    @property
    def total(self):
        return self.current + self.old_key + self.moved + len(self.unreadable)


def survey(store):
    """Count a store's secrets by the key they open with; change nothing."""
    tally = Tally(store.label)
    for batch in store.batches():
        for pk, ciphertext in batch:
            if crypto.is_current(ciphertext):
                tally.current += 1
                continue
            try:
                crypto.decrypt(ciphertext)
            except crypto.DecryptionFailed:
                tally.unreadable.append(pk)
            else:
                tally.old_key += 1
    return tally


def reencrypt(store, progress: Callable[[int, "Tally"], None] | None = None):
    """Rewrite a store's secrets under the key that encrypts; return the Tally.

    Each row is rewritten only if it still holds the ciphertext read, so a
    credential rotated meanwhile keeps its new secret. A secret already under
    the current key is left alone, so a second pass moves nothing.
    """
    tally = Tally(store.label)
    seen = 0
    for batch in store.batches():
        for pk, ciphertext in batch:
            if crypto.is_current(ciphertext):
                tally.current += 1
                continue
            try:
                rewritten = crypto.reencrypt(ciphertext)
            except crypto.DecryptionFailed:
                tally.unreadable.append(pk)
                continue
            updated = store.model.objects.filter(
                pk=pk, secret_encrypted=ciphertext
            ).update(secret_encrypted=rewritten)
            if updated:
                tally.moved += 1
            else:
                # Rewritten meanwhile (a rotation): by a process holding the
                # current key, so it is current.
                tally.current += 1
        seen += len(batch)
        if progress:
            progress(seen, tally)
    return tally
