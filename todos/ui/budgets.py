"""The Board's budgets (CONTRACT §18): what each endpoint, queue or group may
spend in its window, what it spent, and the spend over time.

- ``budget_list``: the budgets in scope with their window, limit, spent,
  left, soft threshold and state; the spend charts (per endpoint, queue or
  group, in dollars or tokens, over the last hour or day); the form that
  creates a budget;
- ``budget_detail``: one budget's figures, history and edit form;
  ``budget_delete`` removes it;
- the inbox's budget cards (``budget_cards``): a budget at its limit asks its
  owner to raise it for the window, resume anyway, or keep it paused;
  ``budget_decision`` takes the answer, which acts at once and is recorded.

Everything goes through ``request.board`` (the user's scope): a budget of an
endpoint the user does not own is a 404, like a missing one. A queue's and a
group's names are written by agents: templates render them as text.
"""

from decimal import Decimal

from django import forms
from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from todos import store
from todos.store.rows import (
    MAX_GROUP_CHARS,
    MAX_NAME_CHARS,
    MAX_USAGE_COST_USD,
    MAX_USAGE_TOKENS,
)
from todos.ui.charts import MEASURES, chart_range, money, spend_chart, tokens
from todos.ui.core import (
    COUNTS_CHANGED,
    _flash,
    _fragments,
    _next_url,
    _notice,
    operator_view,
)
from todos.ui.forms import BoardForm, endpoint_choices

WINDOW_NAMES = {"hour": "Hourly", "day": "Daily", "month": "Monthly"}
WINDOW_SPANS = {"hour": "this hour", "day": "today", "month": "this month"}
STATE_LABELS = {
    "ok": "ok",
    "soft": "past its soft threshold",
    "exhausted": "at its limit",
    "resumed": "resumed past its limit",
}
SPEND_BY = {"endpoint": "per endpoint", "queue": "per queue", "group": "per group"}


class BudgetForm(BoardForm):
    """A budget's fields; the store checks them whole (and names a bad one)."""

    endpoint = forms.ChoiceField(label="Endpoint")
    scope = forms.ChoiceField(
        label="Covers",
        choices=[
            ("queue", "a queue"),
            ("group", "a group of a queue"),
            ("endpoint", "the whole endpoint"),
        ],
    )
    queue = forms.CharField(
        label="Queue",
        max_length=MAX_NAME_CHARS,
        required=False,
        help_text="For a queue or a group.",
    )
    group = forms.CharField(
        label="Group",
        max_length=MAX_GROUP_CHARS,
        required=False,
        help_text="For a group only.",
    )
    window = forms.ChoiceField(
        label="Window",
        choices=[("day", "day"), ("hour", "hour"), ("month", "calendar month")],
    )
    time_zone = forms.CharField(
        label="Time zone",
        initial="UTC",
        max_length=64,
        help_text="Where the day or month starts (IANA name).",
    )
    limit_usd = forms.DecimalField(
        label="Limit ($)",
        required=False,
        min_value=Decimal("0.000001"),
        max_value=MAX_USAGE_COST_USD,
        decimal_places=6,
    )
    limit_tokens = forms.IntegerField(
        label="Limit (tokens)",
        required=False,
        min_value=1,
        max_value=MAX_USAGE_TOKENS,
        help_text="Input plus output.",
    )
    soft_percent = forms.IntegerField(
        label="Soft threshold (%)",
        initial=80,
        min_value=1,
        max_value=100,
        help_text="An event and a banner at this share of the limit.",
    )
    action = forms.ChoiceField(
        label="At the limit",
        choices=[
            ("pause", "pause its work and ask me"),
            ("reject_new", "refuse new todos (429)"),
        ],
    )

    def __init__(self, *args, endpoints=None, editing=None, **kwargs):
        super().__init__(*args, **kwargs)
        if editing is not None:
            # A budget stays on its endpoint; the store keeps a limit left
            # blank as it was.
            del self.fields["endpoint"]
            for name in ("limit_usd", "limit_tokens"):
                self.fields[name].help_text = "Blank: unchanged."
        else:
            choices = endpoint_choices("choose…", active_only=True, in_scope=endpoints)
            self.fields["endpoint"].choices = choices

    def clean(self):
        data = super().clean()
        if data.get("scope") in ("queue", "group") and not data.get("queue"):
            self.add_error("queue", "Name the queue.")
        if data.get("scope") == "group" and not data.get("group"):
            self.add_error("group", "Name the group.")
        return data

    def budget_fields(self):
        """The cleaned form as the store's budget fields."""
        data = self.cleaned_data
        kind = data["scope"]
        usd = data["limit_usd"]
        return {
            "scope": kind,
            "queue": data["queue"] if kind != "endpoint" else None,
            "group": data["group"] if kind == "group" else None,
            "window": data["window"],
            "time_zone": data["time_zone"],
            "limit_usd": None if usd is None else float(usd),
            "limit_tokens": data["limit_tokens"],
            "soft_percent": data["soft_percent"],
            "action": data["action"],
        }

    def store_error(self, exc):
        """Show the store's refusal beside the field it names."""
        if isinstance(exc, store.QueueNotGranted):
            self.add_error("queue", "Outside the endpoint's queue grant.")
            return
        field = getattr(exc, "field", None)
        text = str(exc).split(": ", 1)[-1]
        self.add_error(field if field in self.fields else None, text)

    @staticmethod
    def initial_for(budget):
        return {
            "scope": budget.scope,
            "queue": budget.queue or "",
            "group": budget.group or "",
            "window": budget.window,
            "time_zone": budget.time_zone,
            "limit_usd": _plain(budget.limit_usd),
            "limit_tokens": budget.limit_tokens,
            "soft_percent": budget.soft_percent,
            "action": budget.action,
        }


class DecisionForm(BoardForm):
    """The owner's answer to a budget at its limit."""

    decision = forms.ChoiceField(
        choices=[
            ("raise", "Raise"),
            ("resume", "Resume anyway"),
            ("keep_paused", "Keep paused"),
        ]
    )
    amount_usd = forms.DecimalField(
        label="By ($)",
        required=False,
        min_value=Decimal("0.000001"),
        max_value=MAX_USAGE_COST_USD,
        decimal_places=6,
    )
    amount_tokens = forms.IntegerField(
        label="By (tokens)", required=False, min_value=1, max_value=MAX_USAGE_TOKENS
    )

    def clean(self):
        data = super().clean()
        if data.get("decision") != "raise":
            # The amount matters only to a raise; a typed one is not sent.
            data["amount_usd"] = data["amount_tokens"] = None
        elif data.get("amount_usd") is None and data.get("amount_tokens") is None:
            raise forms.ValidationError("Give the amount to raise it by.")
        return data

    def amounts(self):
        usd = self.cleaned_data["amount_usd"]
        return {
            "amount_usd": None if usd is None else float(usd),
            "amount_tokens": self.cleaned_data["amount_tokens"],
        }


def limit_text(budget):
    """A budget's limit as a sentence says it: $50, 2 000 000 tokens."""
    parts = []
    if budget.limit_usd is not None:
        parts.append(_dollars(budget.limit_usd))
    if budget.limit_tokens is not None:
        parts.append(f"{tokens(budget.limit_tokens)} tokens")
    return " and ".join(parts)


def _dollars(value):
    """$50 for whole dollars, else with cents."""
    return f"${int(value)}" if value == int(value) else money(value)


def scope_text(budget, endpoint):
    """What a budget covers, as a sentence names it."""
    if budget.scope == "endpoint":
        return f"endpoint {endpoint.name if endpoint else budget.endpoint_id}"
    if budget.scope == "queue":
        return f"queue {budget.queue}"
    return f"group {budget.group} of queue {budget.queue}"


def card_context(request, budget, endpoint, form=None, decided=None):
    """What a budget card shows: the budget, its sentence, its answer form."""
    return {
        "budget": budget,
        "endpoint": endpoint,
        "row": budget_row(budget, endpoint),
        "headline": (
            f"{WINDOW_NAMES[budget.window]} budget of {limit_text(budget)} "
            f"reached on {scope_text(budget, endpoint)}"
        ),
        "form": (
            (form or (None if decided else DecisionForm()))
            if request.board.can_act
            else None
        ),
        "decided": decided,
    }


def budget_cards(request, endpoints):
    """The inbox's cards: a budget at its limit each, the longest first."""
    return [
        card_context(request, budget, endpoints.get(budget.endpoint_id))
        for budget in request.board.exhausted_budgets()
    ]


DECIDED = {
    "raise": "Raised by {amount} for {span}: its work goes on.",
    "resume": "Resumed for {span}: its work goes on past the limit.",
    "keep_paused": "Kept paused until the window ends.",
}


def _decided_text(decision, amounts, budget):
    parts = []
    if amounts["amount_usd"] is not None:
        parts.append(money(amounts["amount_usd"]))
    if amounts["amount_tokens"] is not None:
        parts.append(f"{tokens(amounts['amount_tokens'])} tokens")
    text = DECIDED[decision].format(
        amount=" and ".join(parts), span=WINDOW_SPANS[budget.window]
    )
    if decision == "keep_paused" and budget.action == "reject_new":
        text = "New todos stay refused until the window ends."
    return text


@require_POST
@operator_view
def budget_decision(request, budget_id):
    """Answer a budget card: raise for this window, resume, or keep paused."""
    budget = request.board.budget(budget_id)
    if budget is None:
        return _not_found(request)
    endpoint = request.board.endpoint(budget.endpoint_id)
    form = DecisionForm(request.POST)
    notices, status, decided = [], 200, None
    if form.is_valid():
        decision = form.cleaned_data["decision"]
        try:
            budget = request.board.decide_budget(budget.id, decision, **form.amounts())
        except store.InvalidBudget as exc:
            form.add_error(None, str(exc).split(": ", 1)[-1])
            status = 400
        except store.NotFound:
            return _not_found(request)
        else:
            decided = _decided_text(decision, form.amounts(), budget)
            notices.append(_notice("success", decided))
            # Still in force (kept paused): the card goes on asking.
            form = DecisionForm() if budget.in_force else None
    else:
        status = 400
    if not request.htmx:
        if status == 400:
            messages.error(request, _form_errors(form))
        _flash(request, notices)
        return redirect(_next_url(request, reverse("board:inbox")))
    part = (
        "board/inbox.html#budget-card",
        card_context(request, budget, endpoint, form, decided),
    )
    events = (COUNTS_CHANGED,) if status == 200 else ()
    return _fragments(request, [part], notices, events)


EVENT_LABELS = {
    "budget.soft_limit": "soft threshold reached",
    "budget.exhausted": "limit reached",
    "budget.resumed": "work resumed",
}
DECISION_LABELS = {
    "raise": "raised for the window",
    "resume": "resumed anyway",
    "keep_paused": "kept paused",
}


def history_row(event):
    """A budget event as its history lists it: what, who, by how much."""
    detail = event.detail or {}
    if event.event == "budget.decision":
        label = DECISION_LABELS.get(detail.get("decision"), "decided")
    else:
        label = EVENT_LABELS.get(event.event, event.event)
    amounts = []
    if detail.get("amount_usd") is not None:
        amounts.append(money(detail["amount_usd"]))
    if detail.get("amount_tokens") is not None:
        amounts.append(f"{tokens(detail['amount_tokens'])} tokens")
    return {"event": event, "label": label, "amount": " and ".join(amounts)}


def _form_errors(form):
    errors = [error for errors in form.errors.values() for error in errors]
    return "Not decided: " + " ".join(errors)


# A budget's state (store.Budget.state) as the Board's badges name it.
STATES = {
    "ok": "ok",
    "soft_limit": "soft",
    "exhausted": "exhausted",
    "resumed": "resumed",
}


def _plain(value):
    """A Decimal without its trailing zeros (50, 12.5), for a form's field."""
    if value is None:
        return None
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def budget_row(budget, endpoint):
    """What the list shows of a budget: its fields, spend and state."""
    return {
        "budget": budget,
        "endpoint": endpoint,
        "state": STATES[budget.state],
        "state_label": STATE_LABELS[STATES[budget.state]],
        "window_name": WINDOW_NAMES[budget.window],
        "window_span": WINDOW_SPANS[budget.window],
        "limit_usd": None if budget.limit_usd is None else money(budget.limit_usd),
        "spent_usd": money(budget.spent_usd),
        "left_usd": None if budget.left_usd is None else money(budget.left_usd),
        "limit_tokens": _tokens(budget.limit_tokens),
        "raised_usd": money(budget.raised_usd) if budget.raised_usd else None,
        "raised_tokens": _tokens(budget.raised_tokens or None),
        "spent_tokens": tokens(budget.spent_tokens),
        "left_tokens": _tokens(budget.left_tokens),
        "percent": _percent(budget),
    }


def _tokens(value):
    return None if value is None else tokens(value)


def _percent(budget):
    """The larger share of its limits the budget spent, in whole percent."""
    shares = []
    if budget.limit_usd:
        shares.append(budget.spent_usd * 100 / budget.limit_usd)
    if budget.limit_tokens:
        shares.append(Decimal(budget.spent_tokens) * 100 / budget.limit_tokens)
    return min(int(max(shares, default=0)), 100)


def budget_banners(request, endpoint_id=None, queue=None):
    """Banners for the budgets in scope past their soft threshold or at their
    limit; with ``queue``, only those over that queue of ``endpoint_id``."""
    endpoints = {}
    banners = []
    for budget in request.board.budgets():
        if budget.state not in ("soft_limit", "exhausted"):
            continue
        if queue is not None and not (
            budget.endpoint_id == str(endpoint_id) and budget.queue in (None, queue)
        ):
            continue
        if budget.endpoint_id not in endpoints:
            endpoints[budget.endpoint_id] = request.board.endpoint(budget.endpoint_id)
        where = scope_text(budget, endpoints[budget.endpoint_id])
        window = WINDOW_NAMES[budget.window].lower()
        if budget.state == "exhausted":
            level = "error"
            stops = (
                "its work is paused"
                if budget.action == "pause"
                else "new todos in it are refused"
            )
            text = (
                f"The {window} budget of {limit_text(budget)} is reached on "
                f"{where}: {stops} until you decide in the inbox or the window ends."
            )
        else:
            level = "warning"
            text = (
                f"{where[0].upper()}{where[1:]} spent {_percent(budget)}% of its "
                f"{window} budget of {limit_text(budget)} (soft threshold "
                f"{budget.soft_percent}%)."
            )
        banners.append({"level": level, "text": text, "budget": budget})
    return banners


def _not_found(request):
    return render(request, "board/not_found.html", {"what": "budget"}, status=404)


def _line_names(endpoints, several):
    """Label a chart line from its endpoint id, queue and group."""

    def name(endpoint_id, queue, group):
        endpoint = endpoints.get(endpoint_id)
        parts = [endpoint.name if endpoint else endpoint_id[:8]] if several else []
        if queue is not None:
            parts.append(queue)
        if group is not None:
            parts.append(group)
        return " / ".join(parts) or (endpoint.name if endpoint else endpoint_id[:8])

    return name


@require_http_methods(["GET", "POST"])
@operator_view
def budget_list(request):
    """The budgets in scope and the spend charts; POST creates a budget."""
    endpoints = {str(e.id): e for e in request.board.endpoints()}
    form = BudgetForm(endpoints=request.board.endpoints())
    status = 200
    if request.method == "POST":
        form = BudgetForm(request.POST, endpoints=request.board.endpoints())
        if form.is_valid():
            try:
                budget = request.board.create_budget(
                    form.cleaned_data["endpoint"], **form.budget_fields()
                )
            except (store.InvalidBudget, store.QueueNotGranted) as exc:
                form.store_error(exc)
            except store.NotFound:
                form.add_error("endpoint", "No such endpoint.")
            else:
                messages.success(request, f"Created the {_title(budget)}.")
                return redirect("board:budgets")
        status = 400
    range_name = chart_range(request)
    by = request.GET.get("by", "queue")
    by = by if by in SPEND_BY else "queue"
    measure = request.GET.get("measure", "usd")
    measure = measure if measure in MEASURES else "usd"
    series = request.board.spend(range_name, by)
    names = _line_names(endpoints, several=len(endpoints) > 1)
    context = {
        "banners": budget_banners(request),
        "rows": [
            budget_row(budget, endpoints.get(budget.endpoint_id))
            for budget in request.board.budgets()
        ],
        "form": form,
        "chart": spend_chart(
            series, names, measure, f"Spend {SPEND_BY[by]}, {MEASURES[measure]}"
        ),
        "spend_total": money(series.total_usd),
        "spend_tokens": tokens(series.total_tokens),
        "range": range_name,
        "by": by,
        "by_label": SPEND_BY[by],
        "measure": measure,
        "spend_by": SPEND_BY,
        "measures": MEASURES,
        "nav": "budgets",
    }
    return render(request, "board/budgets.html", context, status=status)


def _title(budget):
    """ "daily budget of queue reviews", as a sentence names it."""
    window = WINDOW_NAMES[budget.window].lower()
    if budget.scope == "endpoint":
        return f"{window} budget of the endpoint"
    if budget.scope == "queue":
        return f"{window} budget of queue {budget.queue}"
    return f"{window} budget of group {budget.group} in {budget.queue}"


@require_http_methods(["GET", "POST"])
@operator_view
def budget_detail(request, budget_id):
    """One budget's figures and its edit form (POST saves it)."""
    budget = request.board.budget(budget_id)
    if budget is None:
        return _not_found(request)
    form = BudgetForm(initial=BudgetForm.initial_for(budget), editing=budget)
    status = 200
    if request.method == "POST":
        form = BudgetForm(request.POST, editing=budget)
        if form.is_valid():
            try:
                budget = request.board.update_budget(budget.id, **form.budget_fields())
            except (store.InvalidBudget, store.QueueNotGranted) as exc:
                form.store_error(exc)
            except store.NotFound:
                return _not_found(request)
            else:
                messages.success(request, f"Saved the {_title(budget)}.")
                return redirect("board:budgets")
        status = 400
    endpoint = request.board.endpoint(budget.endpoint_id)
    context = {
        "row": budget_row(budget, endpoint),
        "form": form,
        "history": [
            history_row(event) for event in request.board.budget_history(budget.id)
        ],
        "title": _title(budget),
        "nav": "budgets",
    }
    return render(request, "board/budget.html", context, status=status)


@require_POST
@operator_view
def budget_delete(request, budget_id):
    """Delete a budget: its scope spends without a limit from now on."""
    budget = request.board.budget(budget_id)
    if budget is None:
        return _not_found(request)
    try:
        request.board.delete_budget(budget.id)
    except store.NotFound:
        return _not_found(request)
    messages.success(request, f"Deleted the {_title(budget)}.")
    return redirect(reverse("board:budgets"))
