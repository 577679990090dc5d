"""The Board's dead-letter groups and queue pages, and the overview's charts.

Dead letters are grouped by (endpoint, queue, error fingerprint): the
fingerprint is ``last_error`` with what varies between occurrences of one
cause normalized away (``todos.error_fingerprint``, computed by PostgreSQL in
the failing statement). Each group links to its members in the list and to the
same preview-then-retry as "Retry all matching…", narrowed to the group, so a
group retry runs in the same batches with the same conflict reporting.

A queue page shows a queue's live figures, its settings (default lease,
attempt cap, delay) and pause / resume when the store has queue settings,
and its charts. Everything goes through ``request.board`` (the user's scope).
"""

import threading
from urllib.parse import urlencode

from django.contrib import messages
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from todos.store.stats import RANGES
from todos.ui import charts
from todos.ui.forms import QueueSettingsForm
from todos.ui.views import (
    COUNTS_CHANGED,
    ROWS_CHANGED,
    UUID_ZERO,
    _age,
    _flash,
    _notice,
    _notices_only,
    _page,
    operator_view,
    queue_urls,
    store_uuid,
)


def chart_range(request):
    """The chart range the URL asks for ("hour" unless "day")."""
    wanted = request.GET.get("range", "hour")
    return wanted if wanted in RANGES else "hour"


# Drawn charts by what they show: a series changes once a sweep pass (or a
# minute) at most, while every open Board reloads its overview every 10 s.
DRAWN_PAIRS = 256
_drawn = {}
_drawn_lock = threading.Lock()


def chart_pair(series, label, small=False):
    """Both charts of one series: transitions, then depth (drawn once per
    series, label and size: the markup depends on nothing else)."""
    key = (series.key(), label, small)
    with _drawn_lock:
        pair = _drawn.get(key)
    if pair is None:
        pair = _draw_pair(series, label, small)
        with _drawn_lock:
            _drawn[key] = pair
            if len(_drawn) > DRAWN_PAIRS:
                del _drawn[next(iter(_drawn))]
    return dict(pair)  # the caller's own: the kept one stays as drawn


def _draw_pair(series, label, small):
    wide, narrow = (
        (charts.WIDE_SMALL, charts.NARROW_SMALL)
        if small
        else (charts.WIDE, charts.NARROW)
    )
    return {
        "transitions": charts.transitions_chart(series, f"Transitions: {label}", wide),
        "depth": charts.depth_chart(series, f"Queue depth: {label}", narrow),
    }


def overview_charts(request, endpoint_ids):
    """The overview's charts: everything in scope, then one pair per endpoint."""
    range_name = chart_range(request)
    per_endpoint = request.board.chart(range_name, by="endpoint")
    return {
        "range": range_name,
        "total": chart_pair(per_endpoint[None], "every endpoint in view"),
        "endpoints": {
            endpoint_id: chart_pair(
                per_endpoint[endpoint_id], "this endpoint", small=True
            )
            for endpoint_id in endpoint_ids
        },
    }


def _list_url(**filters):
    query = urlencode({name: value for name, value in filters.items() if value})
    return f"{reverse('board:todos')}?{query}"


@require_GET
@operator_view
def dead_letter_groups(request):
    """List the dead letters grouped by endpoint, queue and error fingerprint."""
    endpoints = {str(e.id): e for e in request.board.endpoints()}
    # Reverse each route once; a page can hold 200 groups.
    queue_url = queue_urls()
    todo_root = reverse("board:todo", args=[UUID_ZERO]).removesuffix(f"{UUID_ZERO}/")
    groups = []
    for group in request.board.dead_letter_groups():
        filters = {
            "endpoint": group.endpoint_id,
            "queue": group.queue,
            "state": "dead_letter",
            "fingerprint": group.fingerprint,
        }
        query = urlencode({name: value for name, value in filters.items() if value})
        groups.append(
            {
                "group": group,
                "endpoint": endpoints.get(group.endpoint_id),
                "list_url": _list_url(**filters),
                "retry_url": f"{reverse('board:retry_matching')}?{query}",
                "queue_url": queue_url(group.endpoint_id, group.queue),
                "example_url": f"{todo_root}{group.example_id}/",
                "first_age": _age(_seconds_ago(group.first_seen)),
                "last_age": _age(_seconds_ago(group.last_seen)),
                "first_iso": group.first_seen.isoformat(timespec="seconds"),
                "last_iso": group.last_seen.isoformat(timespec="seconds"),
            }
        )
    context = {
        "groups": groups,
        "total": sum(g["group"].count for g in groups),
        "nav": "dead_letters",
        "checked_at": timezone.now(),
    }
    return _page(
        request, "board/dead_letters.html", context, fragments=("dead-letter-groups",)
    )


@require_POST
@operator_view
def dead_letters_dismiss(request):
    """Dismiss a dead-letter group: its dead letters stay failed (and in the
    list) but leave the groups page; a retry brings one back."""
    endpoint_id = store_uuid(request.POST.get("endpoint", ""))
    queue = request.POST.get("queue", "")
    fingerprint = request.POST.get("fingerprint", "")
    if endpoint_id is None or not queue or not fingerprint:
        notices = [
            _notice("error", "Name the group to dismiss: endpoint, queue, error.")
        ]
        status = 400
    else:
        count = request.board.dismiss_matching(
            endpoint_id=endpoint_id, queue=queue, fingerprint=fingerprint
        )
        notices = [
            _notice("success", f"Dismissed {count} dead letter{pluralize(count)}.")
            if count
            else _notice("warning", "Nothing left to dismiss in that group.")
        ]
        status = 200
    if not request.htmx:
        _flash(request, notices)
        return redirect("board:dead_letters")
    return _notices_only(
        request, notices, events=(ROWS_CHANGED, COUNTS_CHANGED), status=status
    )


def _seconds_ago(moment):
    return max(0, (timezone.now() - moment).total_seconds())


QUEUE_ACTIONS = ("settings", "pause", "resume")


@require_http_methods(["GET", "POST"])
@operator_view
def queue_detail(request, endpoint_id, queue):
    """A queue's live figures, its charts and (with queue settings) its controls:
    edit the defaults, pause and resume claims (POST ``op``)."""
    endpoint = request.board.endpoint(endpoint_id)
    settings = request.board.queue(endpoint_id, queue)
    # The queue's own row carries its live figures; only without one (a store
    # without queue settings) do they come from the overview.
    counts = settings or next(
        (
            row
            for row in request.board.overview().rows
            if row.endpoint_id == str(endpoint_id) and row.queue == queue
        ),
        None,
    )
    if endpoint is None or counts is None:
        return render(request, "board/not_found.html", {"what": "queue"}, status=404)
    here = reverse("board:queue", args=[endpoint_id, queue])
    form = QueueSettingsForm(initial=QueueSettingsForm.initial_for(settings))
    status = 200
    if request.method == "POST":
        action = request.POST.get("op")
        if settings is None or action not in QUEUE_ACTIONS:
            return render(
                request, "board/not_found.html", {"what": "queue setting"}, status=404
            )
        if action == "pause":
            request.board.pause_queue(endpoint_id, queue)
            messages.success(request, f"Paused {queue}: agents claim nothing from it.")
            return redirect(here)
        if action == "resume":
            request.board.resume_queue(endpoint_id, queue)
            messages.success(request, f"Resumed {queue}: agents claim from it again.")
            return redirect(here)
        form = QueueSettingsForm(request.POST)
        if form.is_valid():
            request.board.update_queue(endpoint_id, queue, **form.cleaned_data)
            messages.success(request, f"Saved the settings of {queue}.")
            return redirect(here)
        status = 400
    range_name = chart_range(request)
    series = request.board.chart(range_name, endpoint_id=endpoint_id, queue=queue)
    context = {
        "endpoint": endpoint,
        "queue": queue,
        "counts": counts,
        "settings": settings,
        "settings_form": form,
        "age": _age(
            settings.oldest_pending_age_seconds
            if settings
            else counts.oldest_pending_seconds
        ),
        "range": range_name,
        "charts": chart_pair(series, queue),
        "list_url": _list_url(endpoint=str(endpoint_id), queue=queue),
        "nav": "overview",
        "checked_at": timezone.now(),
    }
    return _page(
        request, "board/queue.html", context, fragments=("queue-live",), status=status
    )
