"""Webhook ingestion: verify a signed delivery, then fan it out to its routes.

A source (``WebhookSource``) is one sender with a shared secret; its routes
name the (endpoint, queue) targets. One delivery becomes one todo per target,
all in one transaction, each keyed by the provider's delivery id. The dedupe
slot is per endpoint (SPEC-0003 "Per-Endpoint Idempotency and Dedup"), so a
redelivery collapses onto each target's live todo — a parked retry included —
while two endpoints never collapse onto each other.

Todos are written through ``store.create_todo_any_endpoint``: the sender is
authenticated by its signature, not by an endpoint token, and the routes were
set up by an operator.
"""

import hashlib
import hmac
import logging
import re
import secrets
import string
import uuid
from dataclasses import dataclass
from urllib.parse import parse_qs

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction

from todos import http, store
from todos.models import Endpoint, WebhookDelivery, WebhookRoute, WebhookSource

logger = logging.getLogger("switchboard.webhooks")

# Deliveries kept in the log per source; older ones are pruned as new ones land.
DELIVERY_LOG_KEEP = 200
MAX_DELIVERY_ID_LENGTH = 200
MAX_EVENT_LENGTH = 100
MAX_TITLE_LENGTH = 500
MAX_QUEUE_LENGTH = 200
MAX_SECRET_LENGTH = 200
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


@dataclass(frozen=True)
class Scheme:
    """Where a provider puts its signature, delivery id and event name."""

    signature_header: str
    delivery_header: str
    event_header: str
    # GitHub always writes "sha256=<hex>"; generic senders may omit the prefix.
    prefix_required: bool


SCHEMES = {
    "github": Scheme(
        "X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event", True
    ),
    "hmac-sha256": Scheme("X-Signature-256", "X-Delivery-Id", "X-Event", False),
}


def headers_of(source):
    """Return (signature, delivery, event) header names of a source."""
    scheme = SCHEMES[source.scheme]
    return (
        source.signature_header or scheme.signature_header,
        source.delivery_header or scheme.delivery_header,
        source.event_header or scheme.event_header,
    )


def sign(secret, body):
    """Return the signature header value of a body: ``sha256=<hex HMAC>``."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return "sha256=" + digest


def signature_valid(source, body, presented):
    """Check a presented signature against the body, in constant time."""
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
        _, delivery_header, event_header = headers_of(source)
        delivery_id = _header_text(headers, delivery_header, MAX_DELIVERY_ID_LENGTH)
        if not delivery_id:
            raise BadDelivery(
                f"the {delivery_header} header (the delivery id) is missing; it is"
                " the idempotency key that lets a redelivery collapse"
            )
        event = _header_text(headers, event_header, MAX_EVENT_LENGTH)
        return cls(delivery_id, event, _decode_body(body, content_type))


def _header_text(headers, name, limit):
    value = (headers.get(name) or "").strip()
    if len(value) > limit:
        raise BadDelivery(f"the {name} header is longer than {limit} characters")
    if not value.isprintable():
        raise BadDelivery(f"the {name} header holds control characters")
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
        return " ".join(title.split())[:MAX_TITLE_LENGTH]
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
    return title[:MAX_TITLE_LENGTH]


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


def ingest(source, delivery):
    """Create one todo per route of a verified delivery, in one transaction.

    Returns the ``Outcome``, already written to the deliveries log. GitHub's
    ``ping`` (sent when a hook is set up) is logged and creates no todo.
    """
    routes = list(
        WebhookRoute.objects.filter(source=source)
        .select_related("endpoint")
        # A fixed order, so concurrent redeliveries take dedupe slots in the
        # same order and wait on each other instead of deadlocking.
        .order_by("endpoint_id", "queue")
    )
    with transaction.atomic():
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


def _deliver(source, route, delivery):
    endpoint = route.endpoint
    endpoint_id = str(endpoint.id)
    if not endpoint.is_active:
        return Target(endpoint_id, route.queue, None, False, "endpoint revoked")
    if not endpoint.grants(route.queue):
        return Target(endpoint_id, route.queue, None, False, "queue not granted")
    try:
        todo, created = store.create_todo_any_endpoint(
            endpoint_id,
            queue=route.queue,
            title=derive_title(source, route, delivery),
            payload=delivery.payload,
            idempotency_key=delivery.delivery_id,
            assignee=route.assignee or None,
            actor=f"webhook:{source.slug}",
        )
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
):
    """Validate and save a source with its routes, all or nothing."""
    _check_source(slug, secret, scheme)
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
    taken = InvalidSource("slug", f"a source named {slug!r} already exists")
    if WebhookSource.objects.filter(slug=slug).exists():
        raise taken
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
        # Another operator took the slug between the check and the insert.
        raise taken from None
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


def new_secret():
    """Return a fresh signing secret: 256 random bits, as hex."""
    return secrets.token_hex(32)


def _check_source(slug, secret, scheme):
    try:
        validate_slug(slug)
    except ValidationError:
        raise InvalidSource(
            "slug", "use letters, digits, hyphens and underscores only"
        ) from None
    if len(slug) > 100:
        raise InvalidSource("slug", "at most 100 characters")
    if not secret or secret != secret.strip():
        raise InvalidSource("secret", "required, without surrounding spaces")
    if len(secret) > MAX_SECRET_LENGTH:
        raise InvalidSource("secret", f"at most {MAX_SECRET_LENGTH} characters")
    if scheme not in SCHEMES:
        raise InvalidSource("scheme", f"one of {', '.join(SCHEMES)}")


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
    if not route.queue or len(route.queue) > MAX_QUEUE_LENGTH:
        raise InvalidSource(
            "route", f"a queue name of 1 to {MAX_QUEUE_LENGTH} characters is required"
        )
    if not endpoint.grants(route.queue):
        raise InvalidSource(
            "route", f"endpoint {endpoint.name} is not granted queue {route.queue!r}"
        )
    if len(route.assignee) > MAX_QUEUE_LENGTH:
        raise InvalidSource(
            "route", f"an assignee is at most {MAX_QUEUE_LENGTH} characters"
        )
    problem = title_template_error(route.title_template)
    if problem:
        raise InvalidSource("title_template", problem)
    return endpoint
