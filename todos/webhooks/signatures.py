"""Webhook signatures: how each scheme signs a delivery, and verifying one.

A scheme (``SCHEMES``) names how a provider computes its signature (an HMAC of
the body as GitHub does, Stripe's timestamped ``t=,v1=``, or Standard
Webhooks'), where it puts its delivery id and event name, and how fresh a
timestamped delivery must be. Comparisons are constant-time.
"""

import base64
import binascii
import hashlib
import hmac
import time
from dataclasses import dataclass

from django.conf import settings


class BadSignature(Exception):
    """The signature is missing, wrong or stale: a 401 whose detail says which."""

    def __init__(self, detail):
        super().__init__(detail)
        self.detail = detail


class Replayed(Exception):
    """This exact signed delivery was already received inside the tolerance
    window: a 409, and nothing is applied."""

    detail = (
        "this signed delivery was already received; a replay is refused "
        "(a redelivery carries a new timestamp and signature)"
    )


@dataclass(frozen=True)
class Scheme:
    """How a provider signs, and where it puts its delivery id and event name.

    ``kind`` is how the signature is computed: ``body`` (an HMAC of the body
    alone, as GitHub does), ``stripe`` (``t=<unix time>,v1=<hex HMAC of
    "t.body">``) or ``standard`` (Standard Webhooks: ``v1,<base64 HMAC of
    "id.timestamp.body">``). A blank delivery or event header means the value
    is read from the JSON body's ``delivery_field`` / ``event_field``.
    """

    signature_header: str
    delivery_header: str
    event_header: str
    # GitHub always writes "sha256=<hex>"; generic senders may omit the prefix.
    prefix_required: bool = False
    kind: str = "body"
    delivery_field: str = ""
    event_field: str = ""

    @property
    def timestamped(self):
        return self.kind != "body"


STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SECRET_PREFIX = "whsec_"
SCHEMES = {
    "github": Scheme(
        "X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event", True
    ),
    "hmac-sha256": Scheme("X-Signature-256", "X-Delivery-Id", "X-Event"),
    # Stripe's event id and type are in the body; a retry of an event carries
    # the same id (the idempotency key) under a fresh timestamp and signature.
    "stripe": Scheme(
        "Stripe-Signature",
        "",
        "",
        kind="stripe",
        delivery_field="id",
        event_field="type",
    ),
    "standard-webhooks": Scheme(
        "webhook-signature", "webhook-id", "", kind="standard", event_field="type"
    ),
}


def headers_of(source):
    """Return (signature, delivery, event) header names of a source.

    A blank name means the value comes from the body (``described``)."""
    scheme = SCHEMES[source.scheme]
    return (
        source.signature_header or scheme.signature_header,
        source.delivery_header or scheme.delivery_header,
        source.event_header or scheme.event_header,
    )


def described(source):
    """Return where a source's signature, delivery id and event are, for people."""
    scheme = SCHEMES[source.scheme]
    signature, delivery, event = headers_of(source)
    return {
        "signature": signature,
        "delivery": delivery or f"the body's {scheme.delivery_field!r}",
        "event": event
        or (f"the body's {scheme.event_field!r}" if scheme.event_field else "none"),
        "timestamped": scheme.timestamped,
    }


def sign(secret, body):
    """Return the signature header value of a body: ``sha256=<hex HMAC>``."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return "sha256=" + digest


def sign_stripe(secret, body, timestamp):
    """Return a ``Stripe-Signature`` value: ``t=<timestamp>,v1=<hex HMAC>``."""
    return f"t={timestamp},v1={_stripe_digest(secret, body, timestamp)}"


def sign_standard(secret, delivery_id, timestamp, body):
    """Return a Standard Webhooks ``webhook-signature`` value: ``v1,<base64>``."""
    digest = _standard_digest(secret, delivery_id, timestamp, body)
    return "v1," + base64.b64encode(digest).decode("ascii")


def _stripe_digest(secret, body, timestamp):
    signed = f"{timestamp}.".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def standard_key(secret):
    """Return the HMAC key of a Standard Webhooks secret (``whsec_<base64>``)."""
    encoded = secret.removeprefix(STANDARD_SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _standard_digest(secret, delivery_id, timestamp, body):
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    return hmac.new(standard_key(secret), signed, hashlib.sha256).digest()


@dataclass(frozen=True)
class Verified:
    """A signature that holds. For a timestamped scheme, what the replay guard
    remembers: the HMAC (the same for every replay) and the signed time."""

    replay_key: str = ""
    signed_at: int | None = None


def verify(source, headers, body, *, now=None):
    """Check a delivery's signature (and timestamp) in constant time, or raise
    BadSignature; the source's secret is read here (crypto.DecryptionFailed)."""
    scheme = SCHEMES[source.scheme]
    signature_header, delivery_header, _ = headers_of(source)
    presented = headers.get(signature_header) or ""
    if scheme.kind == "stripe":
        return _verify_stripe(source, signature_header, presented, body, now)
    if scheme.kind == "standard":
        delivery_id = headers.get(delivery_header) or ""
        timestamp = headers.get(STANDARD_TIMESTAMP_HEADER) or ""
        return _verify_standard(
            source, signature_header, presented, delivery_id, timestamp, body, now
        )
    if not signature_valid(source, body, presented):
        raise BadSignature(f"missing or wrong {signature_header} signature")
    return Verified()


def signature_valid(source, body, presented):
    """Check a presented body signature against the body, in constant time."""
    if not presented:
        return False
    # Hex digits and the prefix are case-insensitive.
    presented = presented.strip().lower()
    if not presented.startswith("sha256="):
        if SCHEMES[source.scheme].prefix_required:
            return False
        presented = "sha256=" + presented
    expected = sign(source.secret, body)
    # Bytes, so a non-ASCII header compares unequal instead of raising.
    return hmac.compare_digest(
        expected.encode("ascii"), presented.encode("utf-8", "replace")
    )


def _verify_stripe(source, header, presented, body, now):
    timestamps, candidates = [], []
    for item in presented.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            timestamps.append(value)
        elif name == "v1":
            candidates.append(value.lower())
    if len(timestamps) != 1 or not candidates:
        raise BadSignature(f"missing or malformed {header} header (t=…,v1=…)")
    timestamp = _unix_time(timestamps[0], header)
    expected = _stripe_digest(source.secret, body, timestamp)
    # Stripe sends one v1 per active secret while a secret is being rolled.
    if not any(_same(expected, candidate) for candidate in candidates):
        raise BadSignature(f"wrong {header} signature")
    _check_fresh(timestamp, now)
    return Verified(expected, timestamp)


def _verify_standard(source, header, presented, delivery_id, timestamp, body, now):
    if not (presented and delivery_id and timestamp):
        raise BadSignature(
            f"a Standard Webhooks delivery needs the webhook-id, "
            f"{STANDARD_TIMESTAMP_HEADER} and {header} headers"
        )
    timestamp = _unix_time(timestamp, STANDARD_TIMESTAMP_HEADER)
    expected = _standard_digest(source.secret, delivery_id, timestamp, body)
    matched = False
    # Space-separated "v1,<base64>" entries, one per active secret; other
    # versions (v1a, asymmetric) are not this scheme's and are skipped.
    for entry in presented.split():
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise BadSignature(f"wrong {header} signature")
    _check_fresh(timestamp, now)
    return Verified(expected.hex(), timestamp)


def _same(expected, presented):
    # Bytes, so a non-ASCII header compares unequal instead of raising.
    return hmac.compare_digest(
        expected.encode("ascii"), presented.encode("utf-8", "replace")
    )


def _unix_time(text, header):
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 12):
        raise BadSignature(f"the {header} timestamp is not a Unix time in seconds")
    return int(text)


def tolerance():
    """Seconds a timestamped delivery may be from the server's clock."""
    return settings.SWITCHBOARD_WEBHOOK_TOLERANCE_SECONDS


def _check_fresh(timestamp, now):
    now = time.time() if now is None else now
    skew = int(now) - timestamp
    if abs(skew) > tolerance():
        when = f"{skew} s ago" if skew > 0 else f"{-skew} s ahead of this server"
        raise BadSignature(
            f"the delivery was signed {when}, outside the {tolerance()} s "
            "tolerance: a stale or replayed delivery, or a clock that is off"
        )
