"""Webhook ingestion: read a verified delivery, then fan it out to its routes.

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

import logging
import re
import string
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qs

from django.db import IntegrityError, transaction

from todos import store
from todos.models import (
    WebhookDelivery,
    WebhookRoute,
    WebhookSignatureSeen,
)
from todos.telemetry import tracing
from todos.web import http
from todos.webhooks.signatures import SCHEMES, Replayed, headers_of, tolerance

logger = logging.getLogger("switchboard.webhooks")

# Deliveries kept in the log per source; older ones are pruned as new ones land.
DELIVERY_LOG_KEEP = 200
MAX_EVENT_LENGTH = 100
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
    """A verified delivery: the provider's id, its event and its decoded body;
    and the W3C trace context its headers carried (todos.telemetry.tracing)."""

    delivery_id: str
    event: str
    payload: object
    trace_context: tracing.TraceContext | None = None

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
        return cls(delivery_id, event, payload, tracing.from_headers(headers))


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


# --- Groups ---------------------------------------------------------------------

# A group template's placeholders: a dotted path into the payload, e.g.
# {repository.full_name}; a list is indexed by a number ({commits.0.id}).
GROUP_PATH = re.compile(r"\{([^{}]*)\}")
PATH_STEP = re.compile(r"[A-Za-z0-9_-]+")


def group_template_error(template):
    """Return why a group template is unusable, or None when it is fine."""
    literal = GROUP_PATH.sub("", template)
    if "{" in literal or "}" in literal:
        return "the group template has a stray brace"
    paths = GROUP_PATH.findall(template)
    if template and not paths:
        return (
            "a group template names a payload path in braces, e.g. "
            "{repository.full_name}"
        )
    for path in paths:
        if not all(PATH_STEP.fullmatch(step) for step in path.split(".")):
            return (
                f"{{{path}}} is not a payload path: names of letters, digits, "
                "'_' and '-' joined by dots"
            )
    return None


def _at(payload, path):
    """The scalar at a dotted path of the payload, as text; None when a step is
    missing or the value is no string or number."""
    value = payload
    for step in path.split("."):
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return " ".join(str(value).split()) or None


def derive_group(template, payload):
    """Return a todo's group from a route's template over the delivery's payload:
    None when the template is blank or a path it names is missing (the todo
    then has no group), else the text, at most the store's group length."""
    if not template:
        return None
    missing = False

    def value(match):
        nonlocal missing
        found = _at(payload, match.group(1))
        missing = missing or found is None
        return found or ""

    group = GROUP_PATH.sub(value, template).strip()
    if missing or not group:
        return None
    return group[: store.MAX_GROUP_CHARS]


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
    A target a reject_new budget at its limit refuses (``store.BudgetExhausted``,
    raised) refuses the whole delivery: nothing is applied, and the log says
    which target refused it (status ``refused``).
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
    try:
        outcome = _apply(source, delivery, verified, routes)
    except Refused as refused:
        target = Target(
            str(refused.route.endpoint_id),
            refused.route.queue,
            None,
            False,
            "budget exhausted: nothing applied, redeliver",
        )
        _log(source, delivery, Outcome("refused", [target]))
        raise refused.exhausted from None
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


class Refused(Exception):
    """A route's create a budget refused (CONTRACT §18): the delivery rolls back."""

    def __init__(self, route, exhausted):
        super().__init__(exhausted.detail)
        self.route = route
        self.exhausted = exhausted


def _apply(source, delivery, verified, routes):
    """The delivery's transaction: remember its signature, create each
    route's todo, log the outcome."""
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
                try:
                    targets.append(_deliver(source, route, delivery))
                except store.BudgetExhausted as exc:
                    raise Refused(route, exc) from exc
            outcome = Outcome(_status(targets), targets)
        _log(source, delivery, outcome)
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
            priority=route.priority,
            group=derive_group(route.group_template, delivery.payload),
            actor=f"webhook:{source.slug}",
            trace_context=delivery.trace_context,
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
