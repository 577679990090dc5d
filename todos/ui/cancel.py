"""Cancel on the Board, beside retry: one todo, the ticked ones, or every live
todo a list filter matches (previewed, then confirmed, as a bulk retry is).

A todo nobody works on ends canceled at once; a claimed one gets a cancel
request, which its worker sees, and shows "cancel requested" until it ends.
"""

from django.shortcuts import redirect
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from todos import store
from todos.ui.core import (
    COUNTS_CHANGED,
    ROWS_CHANGED,
    SELECTION_CLEARED,
    _flash,
    _fragments,
    _next_url,
    _notice,
    _notices_only,
    _page,
    action_page,
    operator_view,
)
from todos.ui.forms import TodoFilterForm
from todos.ui.views import _query, _todo_action


def _canceled_text(todo):
    if todo.state == "claimed":
        return "Cancel requested: the worker is told to stop; it ends canceled."
    return "Canceled: the todo will not run."


@require_POST
@operator_view
def todo_cancel(request, todo_id):
    """Cancel one todo (a claimed one gets a cancel request)."""
    return _todo_action(
        request, todo_id, request.board.cancel_todo, "cancel", _canceled_text
    )


@require_POST
@operator_view
def todos_cancel_selected(request):
    """Cancel the todos ticked in the list."""
    ids = request.POST.getlist("ids")[: store.BULK_RETRY_LIMIT]
    if not ids:
        notices = [_notice("warning", "Tick the todos to cancel first.")]
    else:
        results = request.board.cancel_many(ids, actor=request.board.actor)
        moved = [r for r in results if isinstance(r, store.Todo)]
        requested = sum(1 for todo in moved if todo.state == "claimed")
        text = f"Canceled {len(moved) - requested} of {len(ids)}."
        if requested:
            text += f" {requested} claimed: cancel requested."
        notices = [_notice("success", text)]
        refused = sum(1 for r in results if isinstance(r, store.Conflict))
        if refused:
            notices.append(
                _notice(
                    "warning",
                    f"{refused} could not be canceled: they had already ended.",
                )
            )
        missing = sum(1 for r in results if isinstance(r, store.NotFound))
        if missing:
            notices.append(_notice("warning", f"{missing} no longer exist."))
    if not request.htmx:
        _flash(request, notices)
        return redirect(_next_url(request, reverse("board:todos")))
    return _notices_only(
        request, notices, events=(ROWS_CHANGED, COUNTS_CHANGED, SELECTION_CLEARED)
    )


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def todos_cancel_matching(request):
    """Preview, then cancel, every live todo the list's filter matches."""
    form = TodoFilterForm(
        request.GET if request.method == "GET" else request.POST,
        in_scope=request.board.endpoints(),
    )
    if not form.is_valid():
        return _page(
            request,
            "board/cancel_matching.html",
            {"form": form, "count": None},
            fragments=("bulk",),
            status=400,
        )
    filters = form.store_filters()
    list_url = f"{reverse('board:todos')}?{_query(form)}"
    context = {
        "form": form,
        "list_url": list_url,
        "query": _query(form),
        "limit": store.BULK_RETRY_LIMIT,
    }
    if request.method == "GET":
        context["count"] = request.board.count_cancelable(**filters)
        return _page(
            request, "board/cancel_matching.html", context, fragments=("bulk",)
        )
    outcome = request.board.cancel_matching(**filters, actor=request.board.actor)
    text = f"Canceled {outcome.canceled} matching todo{pluralize(outcome.canceled)}."
    if outcome.requested:
        text += f" {outcome.requested} claimed: cancel requested."
    notices = [_notice("success", text)]
    if outcome.conflicts:
        notices.append(
            _notice(
                "warning",
                f"{len(outcome.conflicts)} had ended before the cancel reached them.",
            )
        )
    if outcome.more:
        notices.append(
            _notice("warning", "More live todos still match; run the cancel again.")
        )
    if not request.htmx:
        _flash(request, notices)
        return redirect(list_url)
    context["outcome"] = outcome
    return _fragments(
        request,
        [("board/cancel_matching.html#bulk-done", context)],
        notices,
        events=(ROWS_CHANGED, COUNTS_CHANGED),
    )
