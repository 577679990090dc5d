"""The Board's inbox of agents' questions, and the signed answer-link page.

``/board/inbox/`` shows a card for each budget of the user's scope at its
limit (CONTRACT §18, ``todos.ui.budgets``: raise it, resume, keep paused),
then lists the open questions of the user's scope (CONTRACT §13),
oldest first or nearest deadline first, each as a card with the question in
the agent's words and its answer form (``todos.ui.answers``); the latest
answers stay below with who gave them and when. The same card is the
question panel of a todo's page. The navigation's count refreshes on its own.

``/answer/<token>`` needs no login: the signed, single-use link (the store's
answer links) opens one question and takes one answer.
"""

import json
from datetime import datetime

from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from todos import store
from todos.ui.answers import AnswerForm
from todos.ui.budgets import budget_cards
from todos.ui.core import (
    COUNTS_CHANGED,
    _flash,
    _fragments,
    _next_url,
    _notice,
    _page,
    operator_view,
)

ORDERS = {"oldest": "oldest first", "deadline": "nearest deadline first"}
INBOX_SIZE = 50
RECENT_ANSWERS = 10
QUESTION_CHANGED = "question-changed"


def card_context(request, todo, form=None, endpoint=None):
    """What a question card shows: the todo, its question, answer and form."""
    question = todo.question_dict() or {}
    schema = question.get("answer_schema")
    can_answer = todo.is_held and request.board.can_act
    return {
        "todo": todo,
        "endpoint": endpoint or request.board.endpoint(todo.endpoint_id),
        "question": question,
        "schema_json": None if schema is None else json.dumps(schema, indent=2),
        "form": (form or AnswerForm(todo)) if can_answer else None,
        "answered_view": answer_view(todo),
        "now": timezone.now(),
    }


def answer_view(todo):
    """How an answer reads on the Board: its value as text, who, when."""
    if not todo.answer:
        return None
    value = todo.answer.get("value")
    try:
        at = datetime.fromisoformat(todo.answer.get("at") or "")
    except ValueError:
        at = None
    return {
        "text": value if isinstance(value, str) else json.dumps(value),
        "by": todo.answer.get("by"),
        "at": at,
    }


@require_GET
@operator_view
def inbox(request):
    """List the open questions in scope, each with its answer form."""
    order = request.GET.get("order", "oldest")
    if order not in ORDERS:
        order = "oldest"
    endpoints = {str(e.id): e for e in request.board.endpoints()}
    questions = request.board.open_questions(order=order, limit=INBOX_SIZE)
    context = {
        "budget_cards": budget_cards(request, endpoints),
        "cards": [
            card_context(request, todo, endpoint=endpoints.get(todo.endpoint_id))
            for todo in questions
        ],
        "answered": [
            {
                "todo": todo,
                "endpoint": endpoints.get(todo.endpoint_id),
                "view": answer_view(todo),
            }
            for todo in request.board.answered_questions(limit=RECENT_ANSWERS)
        ],
        "order": order,
        "order_label": ORDERS[order],
        "orders": ORDERS,
        "limit": INBOX_SIZE,
        "here": request.get_full_path(),
        "nav": "inbox",
        "checked_at": timezone.now(),
    }
    return _page(
        request,
        "board/inbox.html",
        context,
        fragments=("budget-cards", "questions", "answered"),
    )


@require_GET
@operator_view
def inbox_count(request):
    """The navigation's count of open questions (htmx refreshes it)."""
    return render(request, "board/base.html#inbox-count")


@require_POST
@operator_view
def todo_answer(request, todo_id):
    """Answer a todo's question from its card (the inbox or the todo's page)."""
    try:
        todo = request.board.get_todo(todo_id)
    except store.NotFound:
        return render(request, "board/not_found.html", {"what": "todo"}, status=404)
    form = AnswerForm(todo, request.POST) if todo.is_held else None
    notices, status = [], 200
    if form is None:
        notices.append(_notice("warning", _not_open_text(todo)))
    elif form.is_valid() and form.awaits_confirmation:
        # The card asks "Send …?" in place: nothing is sent yet.
        context = {
            **card_context(request, todo, form),
            "back_url": _next_url(request, reverse("board:todo", args=[todo.id])),
        }
        if not request.htmx:
            return render(
                request, "board/answer_page.html", {**context, "nav": "inbox"}
            )
        return _fragments(request, [("board/inbox.html#card", context)])
    elif form.is_valid():
        try:
            todo = request.board.answer(todo.id, form.answer())
            form = None
            notices.append(_notice("success", "Answered: the todo goes back to work."))
        except (store.InvalidAnswer, store.TooLarge) as exc:
            form.store_error(exc)
            status = 400
        except store.Conflict:
            todo = request.board.get_todo(todo.id)
            form = None
            notices.append(_notice("warning", _not_open_text(todo)))
    else:
        status = 400
    if not request.htmx:
        if status == 400:
            context = {**card_context(request, todo, form), "nav": "inbox"}
            return render(request, "board/answer_page.html", context, status=400)
        _flash(request, notices)
        return redirect(_next_url(request, reverse("board:inbox")))
    # htmx swaps only a success: a form with its errors is one, in place.
    part = ("board/inbox.html#card", card_context(request, todo, form))
    events = (COUNTS_CHANGED, QUESTION_CHANGED) if status == 200 else ()
    return _fragments(request, [part], notices, events)


def _not_open_text(todo):
    if todo.question_status == "answered" and todo.answer:
        by = todo.answer.get("by") or "someone"
        return f"Already answered by {by}: the first answer counts."
    if todo.question_status == "expired" or todo.deadline_passed:
        return "The question's deadline passed before this answer."
    return "This todo is no longer waiting for an answer."


# --- The answer link ------------------------------------------------------------


def _link_page(request, context, status=200):
    response = render(request, "board/answer_link.html", context, status=status)
    # The token is the credential: keep it out of caches and out of the
    # Referer sent to other sites. Not "no-referrer": the browser would then
    # post the form with "Origin: null", which Django's CSRF check refuses.
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "same-origin"
    response["X-Robots-Tag"] = "noindex"
    return response


def _refused(request, exc):
    if isinstance(exc, store.StaleLink):
        return _link_page(request, {"refused": exc.detail}, status=410)
    return _link_page(request, {"refused": "This answer link is not valid."}, 404)


@require_http_methods(["GET", "POST"])
def answer_link(request, token):
    """Show the question a signed link opens, and take its one answer."""
    try:
        todo = store.todo_for_answer_link(token)
    except (store.NotFound, store.StaleLink) as exc:
        return _refused(request, exc)
    except store.Unavailable as exc:
        busy = store.is_deadlock(exc)
        return render(request, "board/unavailable.html", {"busy": busy}, status=503)
    form = AnswerForm(todo, request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        if form.is_valid() and form.awaits_confirmation:
            return _link_page(request, _link_context(todo, form))
        if form.is_valid():
            try:
                todo = store.answer_by_link(token, form.answer())
            except (store.NotFound, store.StaleLink) as exc:
                return _refused(request, exc)
            except (store.InvalidAnswer, store.TooLarge) as exc:
                form.store_error(exc)
            else:
                return _link_page(request, {"answered": todo, "todo": todo})
        status = 400
    return _link_page(request, _link_context(todo, form), status=status)


def _link_context(todo, form):
    schema = todo.question.get("answer_schema")
    return {
        "todo": todo,
        "question": todo.question_dict(),
        "form": form,
        "schema_json": None if schema is None else json.dumps(schema, indent=2),
    }


def link_url(request, todo):
    """The absolute answer link of a held todo, for the owner to copy."""
    try:
        token = request.board.answer_link(todo)
    except (store.Conflict, store.NotFound):
        return None
    return request.build_absolute_uri(reverse("answer_link", args=[token]))
