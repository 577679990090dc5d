"""Webhook ingestion: verify a signed delivery, then fan it out to its routes.

A source (``WebhookSource``) is one sender with a shared secret; its routes
name the (endpoint, queue) targets. One delivery becomes one todo per target,
all in one transaction, each keyed by the provider's delivery id. The dedupe
slot is per endpoint (SPEC-0003 "Per-Endpoint Idempotency and Dedup"), so a
redelivery collapses onto each target's live todo — a parked retry included —
while two endpoints never collapse onto each other.

Todos are written through the scoped ``store.create_todo`` with the route's
endpoint's scope: the sender is authenticated by its signature, not by an
endpoint token, and the store applies the endpoint's grant as it does to the
endpoint's own creates.
"""

import base64
import binascii
import hashlib
import hmac
import logging
import re
import secrets
import string
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qs

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction

from todos import http, store
from todos.models import (
    Endpoint,
    WebhookDelivery,
    WebhookRoute,
    WebhookSignatureSeen,
    WebhookSource,
)

logger = logging.getLogger("switchboard.webhooks")

# Deliveries kept in the log per source; older ones are pruned as new ones land.
DELIVERY_LOG_KEEP = 200
MAX_EVENT_LENGTH = 100
MAX_SECRET_LENGTH = 200
MAX_SLUG_LENGTH = 100
# The random part of a Board owner's source address (hex characters).
SUFFIX_LENGTH = 8
SUFFIX_ATTEMPTS = 5
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")
TITLE_FIELDS = (
    "event",
    "action",
    "repository",
    "number",
    "ref",
    "title",
    "delivery",
    "source",
)


class BadDelivery(Exception):
    """The delivery is signed but unusable: a 400 whose detail names the cause."""

    def __init__(self, detail):
        super().__init__(detail)
        self.detail = detail


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


def title_template_error(template):
    """Return why a title template is unusable, or None when it is fine."""
    parsed = string.Template(template)
    if not parsed.is_valid():
        return "the title template has a stray '$'; write '$$' for a dollar sign"
    unknown = set(parsed.get_identifiers()) - set(TITLE_FIELDS)
    if unknown:
        return (
            f"the title template names unknown fields {', '.join(sorted(unknown))};"
            f" known: {', '.join('$' + name for name in TITLE_FIELDS)}"
        )
    return None


@dataclass(frozen=True)
class Delivery:
    """A verified delivery: the provider's id, its event and its decoded body."""

    delivery_id: str
    event: str
    payload: object

    @classmethod
    def parse(cls, source, headers, body, content_type):
        """Build a delivery from a signed request's headers and body, or raise."""
        scheme = SCHEMES[source.scheme]
        _, delivery_header, event_header = headers_of(source)
        delivery_id = event = ""
        if delivery_header:
            delivery_id = _header_text(headers, delivery_header, store.MAX_KEY_CHARS)
            if not delivery_id:
                raise BadDelivery(
                    f"the {delivery_header} header (the delivery id) is missing; it"
                    " is the idempotency key that lets a redelivery collapse"
                )
        if event_header:
            event = _header_text(headers, event_header, MAX_EVENT_LENGTH)
        payload = _decode_body(body, content_type)
        if not delivery_header:
            delivery_id = _body_text(
                payload, scheme.delivery_field, store.MAX_KEY_CHARS
            )
            if not delivery_id:
                raise BadDelivery(
                    f"the body has no {scheme.delivery_field!r} (the event id); it"
                    " is the idempotency key that lets a redelivery collapse"
                )
        if not event_header and scheme.event_field:
            event = _body_text(payload, scheme.event_field, MAX_EVENT_LENGTH)
        return cls(delivery_id, event, payload)


def _header_text(headers, name, limit):
    value = (headers.get(name) or "").strip()
    if len(value) > limit:
        raise BadDelivery(f"the {name} header is longer than {limit} characters")
    if not value.isprintable():
        raise BadDelivery(f"the {name} header holds control characters")
    return value


def _body_text(payload, key, limit):
    value = payload.get(key) if isinstance(payload, dict) else None
    if not isinstance(value, str):
        return ""
    value = value.strip()
    if len(value) > limit:
        raise BadDelivery(f"the body's {key!r} is longer than {limit} characters")
    if not value.isprintable():
        raise BadDelivery(f"the body's {key!r} holds control characters")
    return value


def _decode_body(body, content_type):
    """Decode a JSON body, or GitHub's form encoding (``payload=<json>``)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadDelivery("the body is not UTF-8") from None
    if content_type == "application/x-www-form-urlencoded":
        values = parse_qs(text).get("payload")
        if not values:
            raise BadDelivery("a form-encoded delivery needs a 'payload' field")
        text = values[0]
    try:
        payload = http.loads(text)
    except (ValueError, RecursionError):
        raise BadDelivery("the body is not valid JSON") from None
    problem = http.unstorable(payload)
    if problem:
        raise BadDelivery(f"the body cannot be stored as a payload: {problem}")
    return payload


# --- Titles ---------------------------------------------------------------------


def _text(value, limit=200):
    if isinstance(value, bool) or value is None:
        return ""
    if not isinstance(value, str | int):
        return ""
    return " ".join(str(value).split())[:limit]


def title_fields(source, delivery):
    """Return the values a title template may name, derived from the delivery."""
    payload = delivery.payload if isinstance(delivery.payload, dict) else {}
    subject = {}
    for key in ("pull_request", "issue", "discussion", "release"):
        if isinstance(payload.get(key), dict):
            subject = payload[key]
            break
    repository = payload.get("repository")
    repository = repository if isinstance(repository, dict) else {}
    number = payload.get("number", subject.get("number"))
    return {
        "event": delivery.event,
        "action": _text(payload.get("action")),
        "repository": _text(repository.get("full_name")),
        "number": _text(number),
        "ref": _text(payload.get("ref")),
        "title": _text(subject.get("title") or subject.get("name")),
        "delivery": delivery.delivery_id,
        "source": source.slug,
    }


def derive_title(source, route, delivery):
    """Return a todo's title: the route's template, or the derived default.

    The default reads like ``pull_request opened acme/app#12: Fix the login``.
    """
    values = title_fields(source, delivery)
    if route.title_template:
        title = string.Template(route.title_template).safe_substitute(values)
        return " ".join(title.split())[: store.MAX_TITLE_CHARS]
    words = [values["event"] or "delivery", values["action"]]
    where = values["repository"]
    if values["number"]:
        where = f"{where}#{values['number']}"
    elif values["ref"]:
        where = f"{where} {values['ref']}".strip()
    words.append(where or f"from {source.slug}")
    title = " ".join(word for word in words if word)
    if values["title"]:
        title = f"{title}: {values['title']}"
    return title[: store.MAX_TITLE_CHARS]


# --- Fan-out --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a delivery became at one route."""

    endpoint_id: str
    queue: str
    todo_id: str | None
    created: bool
    skipped: str = ""

    def to_dict(self):
        out = {
            "endpoint_id": self.endpoint_id,
            "queue": self.queue,
            "todo_id": self.todo_id,
            "created": self.created,
        }
        if self.skipped:
            out["skipped"] = self.skipped
        return out


@dataclass(frozen=True)
class Outcome:
    """A delivery's log entry and its answer."""

    status: str
    targets: list

    def to_dict(self, source, delivery):
        return {
            "source": source.slug,
            "delivery_id": delivery.delivery_id,
            "event": delivery.event,
            "status": self.status,
            "targets": [target.to_dict() for target in self.targets],
        }


def ingest(source, delivery, verified=None):
    """Create one todo per route of a verified delivery, in one transaction.

    Returns the ``Outcome``, already written to the deliveries log. GitHub's
    ``ping`` (sent when a hook is set up) is logged and creates no todo. A
    timestamped delivery's signature is remembered in the same transaction,
    so a replay of it raises ``Replayed`` in any process, and nothing of it is
    applied; a delivery that fails is not remembered, so it can be redelivered.
    """
    if verified is not None and verified.replay_key:
        forget_stale_signatures(source)
    routes = list(
        WebhookRoute.objects.filter(source=source)
        .select_related("endpoint")
        # A fixed order, so concurrent redeliveries take dedupe slots in the
        # same order and wait on each other instead of deadlocking.
        .order_by("endpoint_id", "queue")
    )
    with transaction.atomic():
        if verified is not None and verified.replay_key:
            _remember(source, verified)
        if source.scheme == "github" and delivery.event == "ping":
            outcome = Outcome("ping", [])
        else:
            targets = []
            for route in routes:
                if any(t.endpoint_id == str(route.endpoint_id) for t in targets):
                    # A route made before such routes were refused: say so,
                    # rather than report the first route's todo twice.
                    targets.append(
                        Target(
                            str(route.endpoint_id),
                            route.queue,
                            None,
                            False,
                            "endpoint already routed by this source",
                        )
                    )
                    continue
                targets.append(_deliver(source, route, delivery))
            outcome = Outcome(_status(targets), targets)
        _log(source, delivery, outcome)
    logger.info(
        "webhook delivery accepted",
        extra={
            "fields": {
                "source": source.slug,
                "delivery": delivery.delivery_id,
                "event": delivery.event,
                "status": outcome.status,
                "targets": len(outcome.targets),
            }
        },
    )
    return outcome


def forget_stale_signatures(source, *, now=None):
    """Drop the remembered signatures a replay of which is stale anyway.

    Its own statement, before the delivery's transaction: a failure here
    happens before anything is applied.
    """
    now = time.time() if now is None else now
    horizon = datetime.fromtimestamp(now - tolerance(), tz=UTC)
    WebhookSignatureSeen.objects.filter(source=source, signed_at__lt=horizon).delete()


def _remember(source, verified):
    """Record a timestamped delivery's signature, or raise Replayed.

    The unique (source, signature) index decides: a concurrent replay waits
    for this transaction and then finds the row (or, if it rolled back, takes
    it itself).
    """
    try:
        with transaction.atomic():
            WebhookSignatureSeen.objects.create(
                source=source,
                signature=verified.replay_key,
                signed_at=datetime.fromtimestamp(verified.signed_at, tz=UTC),
            )
    except IntegrityError:
        raise Replayed() from None


def _deliver(source, route, delivery):
    endpoint = route.endpoint
    endpoint_id = str(endpoint.id)
    if not endpoint.is_active:
        return Target(endpoint_id, route.queue, None, False, "endpoint revoked")
    try:
        todo, created = store.create_todo(
            store.Scope.for_endpoint(endpoint),
            queue=route.queue,
            title=derive_title(source, route, delivery),
            payload=delivery.payload,
            idempotency_key=delivery.delivery_id,
            assignee=route.assignee or None,
            actor=f"webhook:{source.slug}",
        )
    except store.QueueNotGranted:
        return Target(endpoint_id, route.queue, None, False, "queue not granted")
    except store.KeyHeld:
        # The delivery's todo sits in a queue the grant no longer covers.
        return Target(endpoint_id, route.queue, None, False, "queue not granted")
    except store.NotFound:
        return Target(endpoint_id, route.queue, None, False, "endpoint not found")
    return Target(endpoint_id, route.queue, todo.id, created)


def _status(targets):
    if any(target.created for target in targets):
        return "created"
    if any(target.todo_id for target in targets):
        return "duplicate"
    return "dropped"


def _log(source, delivery, outcome):
    WebhookDelivery.objects.create(
        source=source,
        delivery_id=delivery.delivery_id,
        event=delivery.event,
        status=outcome.status,
        outcome=[target.to_dict() for target in outcome.targets],
    )
    oldest_kept = list(
        WebhookDelivery.objects.filter(source=source)
        .order_by("-id")
        .values_list("id", flat=True)[DELIVERY_LOG_KEEP - 1 : DELIVERY_LOG_KEEP]
    )
    if oldest_kept:
        WebhookDelivery.objects.filter(source=source, id__lt=oldest_kept[0]).delete()


def recent_deliveries(source, limit=20):
    """Return a source's latest deliveries, newest first."""
    return list(WebhookDelivery.objects.filter(source=source).order_by("-id")[:limit])


# --- Set-up (the create_webhook command and the Board) ---------------------------


# The delivery id is the idempotency key (CONTRACT §8), and the dedupe slot is
# per endpoint: a second route to another queue of the same endpoint would
# collapse onto the first route's todo. Such a route is refused at creation.
ONE_QUEUE_PER_ENDPOINT = (
    "a source routes to one queue per endpoint (the delivery id is the "
    "idempotency key, and an endpoint holds one todo per key)"
)


class InvalidSource(Exception):
    """A source or route that cannot be saved; ``field`` names what is wrong."""

    def __init__(self, field, detail):
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


@dataclass(frozen=True)
class RouteSpec:
    """A route to create: an endpoint id, a queue and how to shape the todo."""

    endpoint_id: str
    queue: str
    assignee: str = ""
    title_template: str = ""


def parse_route(text):
    """Turn ``ENDPOINT_ID:QUEUE`` into a RouteSpec (the queue may hold colons)."""
    endpoint_id, sep, queue = text.strip().partition(":")
    if not sep or not endpoint_id or not queue:
        raise InvalidSource("route", f"{text!r} is not ENDPOINT_ID:QUEUE")
    return RouteSpec(endpoint_id.strip(), queue.strip())


def create_source(
    slug,
    secret,
    routes,
    *,
    scheme="github",
    signature_header="",
    delivery_header="",
    event_header="",
    public_suffix=False,
):
    """Validate and save a source with its routes, all or nothing.

    With ``public_suffix`` the source is reached at ``/hooks/<slug>-<random>``:
    a Board owner names a source without learning whether another owner's
    source has that name (slugs are global, like the URLs they make).
    """
    _check_source(slug, secret, scheme, SUFFIX_LENGTH + 1 if public_suffix else 0)
    headers = {
        "signature_header": signature_header,
        "delivery_header": delivery_header,
        "event_header": event_header,
    }
    for field, name in headers.items():
        if name and not HEADER_NAME.fullmatch(name):
            raise InvalidSource(field, f"{name!r} is not an HTTP header name")
    if not routes:
        raise InvalidSource("route", "a source needs at least one route")
    checked = [(_route_endpoint(route), route) for route in routes]
    targets = [(endpoint.id, route.queue) for endpoint, route in checked]
    if len(set(targets)) != len(targets):
        raise InvalidSource("route", "two routes name the same endpoint and queue")
    routed = [endpoint.id for endpoint, _ in checked]
    if len(set(routed)) != len(routed):
        raise InvalidSource("route", ONE_QUEUE_PER_ENDPOINT)
    if public_suffix:
        # A clash of 32 random bits is retried, never reported.
        for _ in range(SUFFIX_ATTEMPTS):
            source = _save_source(
                f"{slug}-{secrets.token_hex(SUFFIX_LENGTH // 2)}",
                secret,
                scheme,
                headers,
                checked,
            )
            if source is not None:
                return source
        raise InvalidSource("slug", "no free address for this name; try again")
    taken = InvalidSource("slug", f"a source named {slug!r} already exists")
    if WebhookSource.objects.filter(slug=slug).exists():
        raise taken
    source = _save_source(slug, secret, scheme, headers, checked)
    if source is None:
        # Another operator took the slug between the check and the insert.
        raise taken
    return source


def _save_source(slug, secret, scheme, headers, checked):
    """Save a source and its routes; None when the slug is taken."""
    try:
        with transaction.atomic():
            source = WebhookSource.objects.create(
                slug=slug, secret=secret, scheme=scheme, **headers
            )
            for endpoint, route in checked:
                WebhookRoute.objects.create(
                    source=source,
                    endpoint=endpoint,
                    queue=route.queue,
                    assignee=route.assignee,
                    title_template=route.title_template,
                )
    except IntegrityError:
        return None
    logger.info(
        "webhook source created",
        extra={"fields": {"source": slug, "routes": len(checked)}},
    )
    return source


def add_route(source, route):
    """Validate and add one route to an existing source."""
    endpoint = _route_endpoint(route)
    duplicate = InvalidSource(
        "route", f"{source.slug} already routes to {endpoint.name} · {route.queue}"
    )
    if source.routes.filter(endpoint=endpoint, queue=route.queue).exists():
        raise duplicate
    if source.routes.filter(endpoint=endpoint).exists():
        raise InvalidSource(
            "route",
            f"{source.slug} already routes to {endpoint.name}: "
            + ONE_QUEUE_PER_ENDPOINT,
        )
    try:
        with transaction.atomic():
            added = WebhookRoute.objects.create(
                source=source,
                endpoint=endpoint,
                queue=route.queue,
                assignee=route.assignee,
                title_template=route.title_template,
            )
    except IntegrityError:
        # Another operator added the same target between the check and the insert.
        raise duplicate from None
    logger.info(
        "webhook route added",
        extra={"fields": {"source": source.slug, "queue": route.queue}},
    )
    return added


def new_secret(scheme="github"):
    """Return a fresh signing secret of 256 random bits: hex, or for Standard
    Webhooks ``whsec_`` and base64, that scheme's convention."""
    if scheme == "standard-webhooks":
        raw = secrets.token_bytes(32)
        return STANDARD_SECRET_PREFIX + base64.b64encode(raw).decode("ascii")
    return secrets.token_hex(32)


def _check_source(slug, secret, scheme, reserved=0):
    try:
        validate_slug(slug)
    except ValidationError:
        raise InvalidSource(
            "slug", "use letters, digits, hyphens and underscores only"
        ) from None
    if len(slug) > MAX_SLUG_LENGTH - reserved:
        raise InvalidSource("slug", f"at most {MAX_SLUG_LENGTH - reserved} characters")
    if not secret or secret != secret.strip():
        raise InvalidSource("secret", "required, without surrounding spaces")
    if len(secret) > MAX_SECRET_LENGTH:
        raise InvalidSource("secret", f"at most {MAX_SECRET_LENGTH} characters")
    if scheme not in SCHEMES:
        raise InvalidSource("scheme", f"one of {', '.join(SCHEMES)}")
    if scheme == "standard-webhooks" and not 24 <= len(standard_key(secret)) <= 64:
        raise InvalidSource(
            "secret",
            "a Standard Webhooks secret is whsec_ followed by the base64 of 24 to "
            "64 random bytes",
        )


def _route_endpoint(route):
    """Return the active endpoint a route names, after checking the route."""
    try:
        endpoint_id = uuid.UUID(str(route.endpoint_id))
    except ValueError:
        raise InvalidSource(
            "route", f"{route.endpoint_id!r} is not an endpoint id"
        ) from None
    endpoint = Endpoint.objects.filter(id=endpoint_id).first()
    if endpoint is None:
        raise InvalidSource("route", f"no endpoint {endpoint_id}")
    if not endpoint.is_active:
        raise InvalidSource("route", f"endpoint {endpoint.name} is revoked")
    if not route.queue or len(route.queue) > store.MAX_NAME_CHARS:
        raise InvalidSource(
            "route",
            f"a queue name of 1 to {store.MAX_NAME_CHARS} characters is required",
        )
    if not endpoint.grants(route.queue):
        raise InvalidSource(
            "route", f"endpoint {endpoint.name} is not granted queue {route.queue!r}"
        )
    if len(route.assignee) > store.MAX_NAME_CHARS:
        raise InvalidSource(
            "route", f"an assignee is at most {store.MAX_NAME_CHARS} characters"
        )
    problem = title_template_error(route.title_template)
    if problem:
        raise InvalidSource("title_template", problem)
    return endpoint
