"""An endpoint's lifecycle, written once: create, rotate its token, revoke, and
the one queue-grant syntax.

The ``create_endpoint`` command, the Board's endpoint pages, ``ensure_demo``,
the demo seed and the tests' factories all go through here, so an endpoint is
made, re-keyed and ended the same way wherever it happens.

A grant is written ``a, b`` (commas or new lines between queue names) or ``*``
alone for every queue; it is stored as the list of names (``["*"]`` for every
queue).
"""

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from todos.access import auth
from todos.models import Endpoint

EVERY_QUEUE = "*"
MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 200


class EndpointError(ValueError):
    """Input an endpoint cannot be made from; the message says what to fix."""


def parse_grant(raw):
    """Return the queue names of a grant written ``a, b`` or ``*``.

    Raises EndpointError naming the problem.
    """
    queues = []
    for name in str(raw).replace("\n", ",").split(","):
        name = name.strip()
        if name and name not in queues:
            queues.append(name)
    if not queues:
        raise EndpointError("Name at least one queue, or * for every queue.")
    if EVERY_QUEUE in queues and len(queues) > 1:
        raise EndpointError("* already grants every queue; leave it alone.")
    for name in queues:
        if len(name) > MAX_QUEUE_LENGTH or any(ch.isspace() for ch in name):
            raise EndpointError(
                f"{name!r} is not a queue name (no spaces, at most "
                f"{MAX_QUEUE_LENGTH} characters)."
            )
    return queues


def format_grant(queues):
    """Write a stored grant the way parse_grant reads it."""
    return ", ".join(queues)


def clean_name(name):
    name = str(name).strip()
    if not name or len(name) > MAX_NAME_LENGTH:
        raise EndpointError(f"An endpoint's name is 1 to {MAX_NAME_LENGTH} characters.")
    return name


def create(name, owner, queues):
    """Create an active endpoint; return (endpoint, token).

    ``owner`` is a user or a username (the user is created when missing, as
    ``endpoint.owner_created`` then says); ``queues`` is a grant's list of
    names or its text. The token is returned this once: only its hash is kept.
    """
    name = clean_name(name)
    grant = parse_grant(queues) if isinstance(queues, str) else list(queues)
    if not grant:
        raise EndpointError("Name at least one queue, or * for every queue.")
    with transaction.atomic():
        owner_created = False
        if isinstance(owner, str):
            if not owner.strip():
                raise EndpointError("The owner must name a user.")
            owner, owner_created = get_user_model().objects.get_or_create(
                username=owner
            )
        endpoint = Endpoint(name=name, owner=owner, queues=grant)
        token = endpoint.set_new_token()
        endpoint.save()
    endpoint.owner_created = owner_created
    return endpoint, token


def rotate_token(endpoint):
    """Give an endpoint a new token and return it; the old one stops at once."""
    token = endpoint.set_new_token()
    endpoint.save(update_fields=["token_hash", "token_prefix"])
    return token


def revoke(endpoint):
    """Revoke an endpoint: its token stops working; its todos stay for the record.

    Returns False when it was already revoked (nothing changes then).
    """
    revoked = Endpoint.objects.filter(id=endpoint.id, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    # An update() sends no post_save: this process's cache is told here.
    auth.forget(endpoint.id)
    endpoint.refresh_from_db(fields=["revoked_at"])
    return bool(revoked)


def set_grant(endpoint, queues):
    """Replace the queues an endpoint may use (a list of names or a grant's text)."""
    endpoint.queues = parse_grant(queues) if isinstance(queues, str) else list(queues)
    endpoint.save(update_fields=["queues"])
    return endpoint
