"""The Board's plumbing: the operator decorator, page and fragment rendering,
notices, and the small helpers every Board page shares.

Every view needs a staff login (``operator_view``). A view renders its whole
page, or, when htmx asks, only the fragment named after the target element (a
``{% partialdef %}`` of the page's template). Actions answer htmx with the
changed fragment plus an out-of-band notice, and a plain form post with a
redirect and a message, so the Board works without JavaScript too.
"""

import json
import uuid
from functools import wraps
from urllib.parse import quote, urlencode

from django.contrib import messages
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect

from todos import store
from todos.ui.access import BoardAccess

ROWS_CHANGED = "rows-changed"
COUNTS_CHANGED = "counts-changed"
SELECTION_CLEARED = "selection-cleared"


# A path argument for reversing a route once and filling the id in per row.
UUID_ZERO = "00000000-0000-0000-0000-000000000000"


def queue_urls():
    """Return ``url(endpoint_id, queue)`` of the queue page, reversed once
    (a page may link hundreds of queues)."""
    root = reverse("board:queue", args=[UUID_ZERO, "q"]).removesuffix(f"{UUID_ZERO}/q/")
    return lambda endpoint_id, queue: f"{root}{endpoint_id}/{quote(queue)}/"


def operator_view(view):
    """Require a Board login and enforce its scope (``todos.ui.access``); show an
    outage as a 503 page, not a traceback.

    The one place access is decided: the user's ``BoardAccess`` goes on
    ``request.board`` for the view to read and act through; a read-only user's
    POST is a 403; a URL naming an object outside the scope (an endpoint, a
    todo, a webhook source or route, an ``endpoint`` filter) is a 404.

    Every Board URL answers a whole page, or for htmx a fragment of it: the
    response says it varies on the htmx headers, so that no cache hands a
    fragment to a browser that asked for the page (or the other way round).
    """

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        response = _operator_response(request, view, args, kwargs)
        patch_vary_headers(response, HTMX_VARY)
        return response

    return wrapper


def _outside_scope(request, access, kwargs):
    """Name what this request points at outside the user's scope, or return None.

    Staff see everything; for an owner, a foreign object and a missing one are
    the same 404 (the view's own lookups then only see objects in scope).
    """
    if access.staff:
        return None
    if "endpoint_id" in kwargs and not access.covers(kwargs["endpoint_id"]):
        return "endpoint"
    if "todo_id" in kwargs and not access.covers_todo(kwargs["todo_id"]):
        return "todo"
    if "source_id" in kwargs and not access.covers_source(kwargs["source_id"]):
        return "webhook source"
    if "route_id" in kwargs and not access.covers_route(kwargs["route_id"]):
        return "webhook route"
    named = request.GET.get("endpoint") or request.POST.get("endpoint")
    if named and store_uuid(named) and not access.covers(store_uuid(named)):
        return "endpoint"
    return None


def store_uuid(value):
    """Return the canonical form of a UUID string, or None."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


def action_page(view):
    """Mark a page that exists only to act (a form): read-only users get a 403
    for it even on GET, since they are offered no action."""
    view.board_action = True
    return view


# The request headers a Board answer depends on (django-htmx reads them).
HTMX_VARY = ("HX-Request", "HX-Target")


def _operator_response(request, view, args, kwargs):
    user = request.user
    if not user.is_authenticated:
        login = f"{reverse('board:login')}?{urlencode({'next': _here(request)})}"
        if request.htmx:
            # A fragment must not swap the login page into the list.
            return HttpResponseClientRedirect(login)
        return redirect(login)
    try:
        access = BoardAccess.for_user(user)
        if access is None:
            return render(request, "board/forbidden.html", status=403)
        request.board = access
        acting = request.method == "POST" or getattr(view, "board_action", False)
        if acting and access.read_only:
            return render(
                request, "board/forbidden.html", {"read_only": True}, status=403
            )
        missing = _outside_scope(request, access, kwargs)
        if missing:
            return render(
                request, "board/not_found.html", {"what": missing}, status=404
            )
        return view(request, *args, **kwargs)
    except (store.Unavailable, OperationalError, InterfaceError) as exc:
        # The ORM's endpoint queries fail this way too; anything else is a bug
        # and should surface as one.
        return unavailable(request, exc)


def unavailable(request, exc):
    """The Board's 503 for a failed database call: a deadlock says the
    database is busy (try again), anything else that it is unavailable."""
    busy = store.is_deadlock(exc)
    if request.htmx:
        said = (
            "The database is busy and stopped this action (a deadlock with "
            "another request); nothing was changed, try again."
            if busy
            else "The database is unavailable; the page will catch up when it is back."
        )
        return _notices_only(request, [_notice("error", said)], status=503)
    return render(request, "board/unavailable.html", {"busy": busy}, status=503)


def _here(request):
    """Return the page the user is on (for htmx, the page, not the fragment)."""
    if request.htmx and request.htmx.current_url_abs_path:
        return request.htmx.current_url_abs_path
    return request.get_full_path()


def _next_url(request, default):
    target = request.POST.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def _posted(request):
    """Return the POST data to bind a form to, even when it is empty."""
    return request.POST if request.method == "POST" else None


def _notice(level, text):
    return {"level": level, "text": text}


def _page(request, template, context, fragments=(), status=200):
    """Render the page, or only the fragment htmx targets when it is one of ours."""
    target = request.htmx.target if request.htmx else None
    if target in fragments:
        template = f"{template}#{target}"
    return render(request, template, context, status=status)


def _fragments(request, parts, notices=(), events=(), status=200):
    """Answer htmx with fragments, the notices out of band, and client events."""
    html = "".join(
        render_to_string(template, context, request=request)
        for template, context in parts
    )
    html += render_to_string(
        "board/base.html#notices", {"notices": notices, "oob": True}, request=request
    )
    response = HttpResponse(html, status=status)
    if events:
        response["HX-Trigger"] = json.dumps(dict.fromkeys(events))
    return response


def _notices_only(request, notices, events=(), status=200):
    response = _fragments(request, [], notices, events, status)
    # Keep the target as it is; only the notice region changes.
    response["HX-Reswap"] = "none"
    return response


def _flash(request, notices):
    for notice in notices:
        level = {"success": messages.SUCCESS, "warning": messages.WARNING}.get(
            notice["level"], messages.ERROR
        )
        messages.add_message(request, level, notice["text"])


def _endpoints_by_id(request):
    """The endpoints in scope by id, with only what the lists show of each
    (name, owner, revoked): an operator may see hundreds."""
    endpoints = request.board.endpoints().only(
        "id", "name", "revoked_at", "owner", "owner__username"
    )
    return {str(e.id): e for e in endpoints}


def _endpoint_or_none(request, endpoint_id):
    return request.board.endpoint(endpoint_id)


def _endpoint_missing(request):
    return render(request, "board/not_found.html", {"what": "endpoint"}, status=404)


def _age(seconds):
    """Say how long ago, compactly: 42s, 5m 10s, 3h 4m, 2d 7h."""
    if seconds is None:
        return ""
    seconds = int(seconds)
    for unit, size, sub_unit, sub_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if seconds >= size:
            whole, rest = divmod(seconds, size)
            return f"{whole}{unit} {rest // sub_size}{sub_unit}"
    return f"{seconds}s"


def _conflict_text(exc, verb):
    if isinstance(exc, store.KeyHeld):
        return f"Could not {verb}: {exc.detail}."
    return f"Could not {verb}: this todo is now {exc.state or 'elsewhere'}" + (
        " (someone else got there first)." if exc.state else "."
    )


# --- Login ----------------------------------------------------------------------


def _list_url(**filters):
    query = urlencode({name: value for name, value in filters.items() if value})
    return f"{reverse('board:todos')}?{query}"


def _seconds_ago(moment):
    return max(0, (timezone.now() - moment).total_seconds())
