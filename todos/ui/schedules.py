"""The Board's schedules: each one's next slots and last runs (with how their
todos ended), pause and resume, and a page to edit it.

Everything goes through ``request.board`` (the user's scope): a schedule of
an endpoint the user does not own is a 404, like a missing one.
"""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from todos import store
from todos.ui.core import operator_view
from todos.ui.forms import ScheduleForm

SCHEDULE_ACTIONS = ("pause", "resume")


def _not_found(request):
    return render(request, "board/not_found.html", {"what": "schedule"}, status=404)


def _act(request, schedule_id, action):
    """Pause or resume a schedule; a message says what it means."""
    if action == "pause":
        schedule = request.board.pause_schedule(schedule_id)
        messages.success(request, f"Paused {schedule.name}: it makes no todos.")
    else:
        schedule = request.board.resume_schedule(schedule_id)
        messages.success(request, f"Resumed {schedule.name}.")


@require_http_methods(["GET", "POST"])
@operator_view
def schedule_list(request):
    """Every schedule in scope; POST ``op`` (pause, resume) and ``schedule``."""
    if request.method == "POST":
        action = request.POST.get("op")
        if action not in SCHEDULE_ACTIONS:
            return _not_found(request)
        try:
            _act(request, request.POST.get("schedule", ""), action)
        except store.NotFound:
            return _not_found(request)
        return redirect("board:schedules")
    return render(
        request,
        "board/schedules.html",
        {"views": request.board.schedules(), "nav": "schedules"},
    )


@require_http_methods(["GET", "POST"])
@operator_view
def schedule_detail(request, schedule_id):
    """One schedule: its slots and runs, pause and resume, and its edit form."""
    view = request.board.schedule(schedule_id)
    if view is None:
        return _not_found(request)
    here = reverse("board:schedule", args=[schedule_id])
    form = ScheduleForm(initial=ScheduleForm.initial_for(view.schedule))
    status = 200
    if request.method == "POST":
        action = request.POST.get("op")
        if action in SCHEDULE_ACTIONS:
            _act(request, schedule_id, action)
            return redirect(here)
        form = ScheduleForm(request.POST)
        endpoint = request.board.endpoint(view.schedule.endpoint_id)
        queue = form.data.get("queue", "")
        if queue and endpoint is not None and not endpoint.grants(queue):
            form.add_error("queue", "Outside the endpoint's queue grant.")
        if form.is_valid():
            try:
                request.board.update_schedule(
                    schedule_id, **form.changes(view.schedule)
                )
            except store.InvalidSchedule as exc:
                field = exc.field.removeprefix("todo.")
                field = field if field in form.fields else None
                form.add_error(field, str(exc).split(": ", 1)[-1])
            except store.Conflict as exc:
                form.add_error("name", exc.detail)
            else:
                messages.success(request, f"Saved {form.cleaned_data['name']}.")
                return redirect(here)
        status = 400
    context = {"view": view, "form": form, "nav": "schedules"}
    return render(request, "board/schedule.html", context, status=status)
