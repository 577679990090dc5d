"""Cancel on the Board, beside retry: one todo, the ticked ones, or every live
todo a list filter matches (previewed, then confirmed, as a bulk retry is).

A todo nobody works on ends canceled at once; a claimed one gets a cancel
request, which its worker sees, and shows "cancel requested" until it ends.
"""

from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_http_methods, require_POST

from todos import store
from todos.ui.core import _notice, action_page, operator_view
from todos.ui.views import _todo_action, bulk_matching, bulk_selected


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

    def cancel(ids):
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
        return notices

    return bulk_selected(request, "cancel", cancel)


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def todos_cancel_matching(request):
    """Preview, then cancel, every live todo the list's filter matches."""

    def preview(filters):
        return {"count": request.board.count_cancelable(**filters)}

    def cancel(filters):
        outcome = request.board.cancel_matching(**filters, actor=request.board.actor)
        text = (
            f"Canceled {outcome.canceled} matching todo{pluralize(outcome.canceled)}."
        )
        if outcome.requested:
            text += f" {outcome.requested} claimed: cancel requested."
        notices = [_notice("success", text)]
        if outcome.conflicts:
            notices.append(
                _notice(
                    "warning",
                    f"{len(outcome.conflicts)} had ended before the cancel "
                    "reached them.",
                )
            )
        if outcome.more:
            notices.append(
                _notice("warning", "More live todos still match; run the cancel again.")
            )
        return outcome, notices

    return bulk_matching(request, "board/cancel_matching.html", preview, cancel)
