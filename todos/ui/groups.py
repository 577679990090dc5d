"""The Board's admission pages (CONTRACT §17): a queue's groups, a queue's
admission settings, a pending todo's priority.

- ``queue_groups``: a page of a queue's groups by name (in flight, pending,
  the limit in force, oldest wait, weight, paused), each with a form that
  sets its override (concurrency, weight, pause);
- ``AdmissionForm``: the queue page's admission settings (group limit, fair
  turns, rate limits, priority aging);
- ``todo_priority``: a pending todo's new priority.

Everything goes through ``request.board`` (the user's scope): a queue of an
endpoint the user does not own is a 404, like a missing one. A group's name is
written by agents: templates render it as text, and it travels in forms and
query strings, never in a path.
"""

from django import forms
from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods, require_POST

from todos import store
from todos.store import admission
from todos.store.rows import MAX_GROUP_CHARS
from todos.ui.core import _age, operator_view
from todos.ui.forms import BoardForm

GROUPS_PAGE = 50


class AdmissionForm(BoardForm):
    """A queue's admission settings; a blank field turns its rule off."""

    group_concurrency = forms.IntegerField(
        label="Per-group limit",
        min_value=0,
        max_value=admission.MAX_GROUP_CONCURRENCY,
        required=False,
        help_text="Claimed todos per group at once; 0 holds every group, blank: none.",
    )
    fair = forms.BooleanField(
        label="Fair turns",
        required=False,
        help_text="Serve the groups in turn (by weight) instead of oldest first.",
    )
    priority_aging_seconds = forms.IntegerField(
        label="Priority aging (s)",
        min_value=1,
        max_value=admission.MAX_AGING_SECONDS,
        required=False,
        help_text="A waiting todo gains a level per this many seconds; blank: off.",
    )
    rate_count = forms.IntegerField(
        label="Rate limit: claims",
        min_value=1,
        max_value=admission.MAX_RATE_COUNT,
        required=False,
        help_text="Cost claimed per period across every server; blank: none.",
    )
    rate_per_seconds = forms.IntegerField(
        label="Rate limit: per (s)",
        min_value=1,
        max_value=admission.MAX_RATE_PERIOD_SECONDS,
        required=False,
    )
    rate_burst = forms.IntegerField(
        label="Rate limit: burst",
        min_value=1,
        max_value=admission.MAX_RATE_COUNT,
        required=False,
        help_text="At once; blank: the count.",
    )
    group_rate_count = forms.IntegerField(
        label="Per-group rate: claims",
        min_value=1,
        max_value=admission.MAX_RATE_COUNT,
        required=False,
        help_text="The same, for each group apart; blank: none.",
    )
    group_rate_per_seconds = forms.IntegerField(
        label="Per-group rate: per (s)",
        min_value=1,
        max_value=admission.MAX_RATE_PERIOD_SECONDS,
        required=False,
    )
    group_rate_burst = forms.IntegerField(
        label="Per-group rate: burst",
        min_value=1,
        max_value=admission.MAX_RATE_COUNT,
        required=False,
    )

    def settings(self):
        """The cleaned form as store.admission.set_admission's settings."""
        data = self.cleaned_data
        return {
            "group_concurrency": data["group_concurrency"],
            "fair": data["fair"],
            "priority_aging_seconds": data["priority_aging_seconds"],
            "rate_limit": _rate(data, "rate"),
            "group_rate_limit": _rate(data, "group_rate"),
        }

    @staticmethod
    def initial_for(settings):
        """The form's values for a queue's admission settings (None: none)."""
        if settings is None:
            return {}
        initial = {
            "group_concurrency": settings.group_concurrency,
            "fair": settings.fair,
            "priority_aging_seconds": settings.priority_aging_seconds,
        }
        for prefix, limit in (
            ("rate", settings.rate_limit),
            ("group_rate", settings.group_rate_limit),
        ):
            limit = limit or {}
            initial[f"{prefix}_count"] = limit.get("count")
            initial[f"{prefix}_per_seconds"] = limit.get("per_seconds")
            initial[f"{prefix}_burst"] = limit.get("burst")
        return initial


def _rate(data, prefix):
    """A rate limit from its three fields: none without a count."""
    count = data[f"{prefix}_count"]
    if count is None:
        return None
    limit = {"count": count, "per_seconds": data[f"{prefix}_per_seconds"] or 1}
    if data[f"{prefix}_burst"] is not None:
        limit["burst"] = data[f"{prefix}_burst"]
    return limit


class GroupForm(BoardForm):
    """One group's override of its queue's settings."""

    group = forms.CharField(max_length=MAX_GROUP_CHARS, widget=forms.HiddenInput)
    concurrency = forms.IntegerField(
        label="Limit",
        min_value=0,
        max_value=admission.MAX_GROUP_CONCURRENCY,
        required=False,
        help_text="Blank: the queue's.",
    )
    weight = forms.IntegerField(
        label="Weight", min_value=1, max_value=admission.MAX_WEIGHT
    )
    paused = forms.BooleanField(label="Paused", required=False)


class PriorityForm(BoardForm):
    priority = forms.TypedChoiceField(
        label="Priority",
        coerce=int,
        choices=[(level, str(level)) for level in range(1, 6)],
    )


def _not_found(request, what="queue"):
    return render(request, "board/not_found.html", {"what": what}, status=404)


@require_http_methods(["GET", "POST"])
@operator_view
def queue_groups(request, endpoint_id, queue):
    """A page of a queue's groups (``?after=`` the last group of the page
    before); POST sets one group's override."""
    endpoint = request.board.endpoint(endpoint_id)
    settings = request.board.admission(endpoint_id, queue)
    if endpoint is None or settings is None:
        return _not_found(request)
    here = reverse("board:queue_groups", args=[endpoint_id, queue])
    after = request.GET.get("after", "")
    status = 200
    failed = None
    if request.method == "POST":
        form = GroupForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            request.board.set_group(
                endpoint_id,
                queue,
                data["group"],
                concurrency=data["concurrency"],
                weight=data["weight"],
                paused=data["paused"],
            )
            messages.success(request, f"Saved group {data['group']}.")
            back = request.POST.get("after", "")
            return redirect(f"{here}?{urlencode({'after': back})}" if back else here)
        failed = form
        status = 400
    page = request.board.groups(endpoint_id, queue, after=after, limit=GROUPS_PAGE)
    rows = []
    for info in page:
        form = GroupForm(
            initial={
                "group": info.group,
                "concurrency": info.concurrency,
                "weight": info.weight,
                "paused": info.paused,
            },
            auto_id=f"id_g{len(rows)}_%s",
        )
        if failed is not None and failed.data.get("group") == info.group:
            form = failed
        rows.append(
            {"info": info, "form": form, "wait": _age(info.oldest_wait_seconds)}
        )
    more = len(page) == GROUPS_PAGE
    context = {
        "endpoint": endpoint,
        "queue": queue,
        "settings": settings,
        "rows": rows,
        "after": after,
        "next_url": f"{here}?{urlencode({'after': page[-1].group})}" if more else None,
        "failed": failed,
        "nav": "overview",
    }
    return render(request, "board/queue_groups.html", context, status=status)


@require_POST
@operator_view
def todo_priority(request, todo_id):
    """Give a pending todo a new priority (1 is claimed first)."""
    here = reverse("board:todo", args=[todo_id])
    form = PriorityForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Pick a priority from 1 (first) to 5.")
        return redirect(here)
    try:
        todo = request.board.set_priority(todo_id, form.cleaned_data["priority"])
    except store.NotFound:
        return _not_found(request, "todo")
    except store.Conflict as exc:
        messages.warning(request, exc.detail)
    else:
        messages.success(request, f"Priority {todo.priority}: claimed in that turn.")
    return redirect(here)
