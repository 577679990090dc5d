"""Webhook sources and routes: creating them (the create_webhook command and
the Board) and checking what a source may be saved with."""

import base64
import logging
import re
import secrets
import uuid
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction

from todos import store
from todos.models import (
    Endpoint,
    WebhookRoute,
    WebhookSource,
)
from todos.webhooks.deliveries import group_template_error, title_template_error
from todos.webhooks.signatures import SCHEMES, STANDARD_SECRET_PREFIX, standard_key

logger = logging.getLogger("switchboard.webhooks")

MAX_SECRET_LENGTH = 200
MAX_SLUG_LENGTH = 100
MAX_TEMPLATE_LENGTH = 500
# The random part of a Board owner's source address (hex characters).
SUFFIX_LENGTH = 8
SUFFIX_ATTEMPTS = 5
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")

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
    priority: int | None = None
    group_template: str = ""


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
                    priority=route.priority,
                    group_template=route.group_template,
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
                priority=route.priority,
                group_template=route.group_template,
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
    if route.priority is not None and not (
        store.MIN_PRIORITY <= route.priority <= store.MAX_PRIORITY
    ):
        raise InvalidSource(
            "priority", f"from {store.MIN_PRIORITY} (first) to {store.MAX_PRIORITY}"
        )
    if len(route.group_template) > MAX_TEMPLATE_LENGTH:
        raise InvalidSource(
            "group_template", f"at most {MAX_TEMPLATE_LENGTH} characters"
        )
    problem = group_template_error(route.group_template)
    if problem:
        raise InvalidSource("group_template", problem)
    return endpoint
