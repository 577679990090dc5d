"""The Board's dead-letter groups: a queue's dead letters grouped by cause.

Dead letters are grouped by (endpoint, queue, error fingerprint): the
fingerprint is ``last_error`` with what varies between occurrences of one
cause normalized away (``todos.error_fingerprint``, computed by PostgreSQL in
the failing statement). Each group links to its members in the list and to the
same preview-then-retry as "Retry all matching…", narrowed to the group, so a
group retry runs in the same batches with the same conflict reporting.
"""

from urllib.parse import urlencode

from django.shortcuts import redirect
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from todos.ui.core import (
    COUNTS_CHANGED,
    ROWS_CHANGED,
    UUID_ZERO,
    _age,
    _flash,
    _list_url,
    _notice,
    _notices_only,
    _page,
    _seconds_ago,
    operator_view,
    queue_urls,
    store_uuid,
)


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
