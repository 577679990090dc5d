"""The Board's queue page: a queue's live figures, settings and charts.

It shows a queue's live figures, its settings (default lease, attempt cap,
delay) and pause / resume when the store has queue settings, and its charts.
Everything goes through ``request.board`` (the user's scope).
"""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from todos.ui.budgets import budget_banners
from todos.ui.charts import chart_pair, chart_range
from todos.ui.core import (
    _age,
    _list_url,
    _page,
    operator_view,
)
from todos.ui.forms import QueueSettingsForm
from todos.ui.groups import AdmissionForm

QUEUE_ACTIONS = ("settings", "pause", "resume", "admission")


@require_http_methods(["GET", "POST"])
@operator_view
def queue_detail(request, endpoint_id, queue):
    """A queue's live figures, its charts and (with queue settings) its controls:
    edit the defaults and the admission settings, pause and resume claims
    (POST ``op``)."""
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
    admitting = request.board.admission(endpoint_id, queue)
    admission_form = AdmissionForm(initial=AdmissionForm.initial_for(admitting))
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
        if action == "admission":
            admission_form = AdmissionForm(request.POST)
            if admission_form.is_valid():
                try:
                    request.board.set_admission(
                        endpoint_id, queue, **admission_form.settings()
                    )
                except ValueError as exc:
                    admission_form.add_error(None, str(exc))
                else:
                    messages.success(request, f"Saved the admission of {queue}.")
                    return redirect(here)
        else:
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
        "admission": admitting,
        "admission_form": admission_form,
        "age": _age(
            settings.oldest_pending_age_seconds
            if settings
            else counts.oldest_pending_seconds
        ),
        "range": range_name,
        "charts": chart_pair(series, queue),
        "list_url": _list_url(endpoint=str(endpoint_id), queue=queue),
        "budget_banners": budget_banners(request, endpoint_id, queue),
        "nav": "overview",
        "checked_at": timezone.now(),
    }
    return _page(
        request, "board/queue.html", context, fragments=("queue-live",), status=status
    )
