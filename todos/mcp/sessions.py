"""How long an MCP session lives: the idle limit, and forgetting idle sessions.

A session unused for ``SWITCHBOARD_MCP_SESSION_IDLE_SECONDS`` (default a week)
has expired: its id answers 404, the MCP spec's answer for a session that is
gone, and its client initializes a new one. Expired sessions are deleted by
the endpoint's next ``initialize`` and by every sweep pass (``manage.py sweep``),
so the table does not keep the sessions of endpoints that never come back; an
open event stream of a deleted session ends.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.db.models.functions import Now

from todos.models import Endpoint, McpSession


def idle_limit() -> timedelta:
    return timedelta(seconds=settings.SWITCHBOARD_MCP_SESSION_IDLE_SECONDS)


def live() -> QuerySet[McpSession]:
    """The sessions that have not expired."""
    return McpSession.objects.filter(last_seen_at__gte=Now() - idle_limit())


def expired() -> QuerySet[McpSession]:
    """The sessions idle past the limit (gone for their clients already)."""
    return McpSession.objects.filter(last_seen_at__lt=Now() - idle_limit())


def forget_expired(endpoint: Endpoint | None = None) -> int:
    """Delete the expired sessions (of one endpoint, or of all); return how many."""
    sessions = expired() if endpoint is None else expired().filter(endpoint=endpoint)
    deleted, _ = sessions.delete()
    return deleted
