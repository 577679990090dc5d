"""The operator Board: pages and htmx fragments over the store's operator twins.

Every view needs a staff login. A view renders its whole page, or, when htmx
asks, only the fragment named after the target element (a ``{% partialdef %}``
of the page's template). Actions answer htmx with the changed fragment plus an
out-of-band notice, and a plain form post with a redirect and a message, so the
Board works without JavaScript too. A ``Conflict`` is a notice, never an error
page; an unreachable database is a 503 page.
"""

import html
import json
from urllib.parse import quote_plus

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat, pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from todos import store
from todos.access import endpoints
from todos.sqs import messages as sqs_messages
from todos.store.rows import MAX_PRIORITY, MIN_PRIORITY
from todos.telemetry import tracing
from todos.ui.budgets import budget_banners
from todos.ui.charts import money, overview_charts, tokens
from todos.ui.core import (
    COUNTS_CHANGED,
    ROWS_CHANGED,
    SELECTION_CLEARED,
    _age,
    _conflict_text,
    _endpoint_missing,
    _endpoint_or_none,
    _endpoints_by_id,
    _flash,
    _fragments,
    _next_url,
    _notice,
    _notices_only,
    _page,
    _posted,
    action_page,
    operator_view,
    queue_urls,
)
from todos.ui.forms import (
    EndpointCreateForm,
    GrantsForm,
    OperatorLoginForm,
    TodoCreateForm,
    TodoFilterForm,
)

PAGE_SIZE = 50


class LoginView(auth_views.LoginView):
    authentication_form = OperatorLoginForm
    redirect_authenticated_user = True

    def head(self, request, *args, **kwargs):
        # Django's View.setup would otherwise set ``self.head = self.get``:
        # the view and its bound method refer to each other, and keep the
        # request, for the garbage collector (tests/system/test_garbage.py).
        return self.get(request, *args, **kwargs)


logout_view = auth_views.LogoutView.as_view()


# --- Overview -------------------------------------------------------------------


@require_GET
@operator_view
def overview(request):
    """Show counts per endpoint and queue, with stuck and failed work first."""
    data = request.board.overview()
    by_id = _endpoints_by_id(request)
    # Each row links to its queue and to its list per state: reversed once.
    queue_url = queue_urls()
    todos_url = reverse("board:todos")
    groups = {}
    for row in data.rows:
        groups.setdefault(row.endpoint_id, []).append(
            counts_row(
                row, queue_url(row.endpoint_id, row.queue), todos_url, data.capped
            )
        )
    sections = [
        {
            "endpoint": endpoint,
            "endpoint_id": endpoint_id,
            "queues": groups.get(endpoint_id, []),
        }
        for endpoint_id, endpoint in by_id.items()
        if endpoint.is_active or endpoint_id in groups
    ]
    sections += [
        {"endpoint": None, "endpoint_id": endpoint_id, "queues": queues}
        for endpoint_id, queues in groups.items()
        if endpoint_id not in by_id
    ]
    # Endpoints with no todos yet share one short list: an operator may see
    # hundreds of them, and a section each buried the ones with work.
    idle = [s for s in sections if not s["queues"]]
    sections = [s for s in sections if s["queues"]]
    context = {
        "overview": data,
        "sections": sections,
        "idle": idle,
        "idle_items": idle_items(idle, todos_url, request.user.pk),
        "oldest_pending": _age(
            max((r.oldest_pending_seconds or 0 for r in data.rows), default=0) or None
        ),
        "checked_at": timezone.now(),
        "todos_url": todos_url,
        "cap": f"{data.cap:,}".replace(",", " "),
        "budget_banners": budget_banners(request),
        "nav": "overview",
    }
    charts = overview_charts(request, [s["endpoint_id"] for s in sections])
    for section in sections:
        section["charts"] = charts["endpoints"].get(section["endpoint_id"])
    context["charts"] = charts
    return _page(request, "board/overview.html", context, fragments=("counts",))


def counts_row(counts, queue_url, todos_url, capped):
    """One queue's row of the overview's counts table, as HTML.

    Made here rather than in the template: an overview may show hundreds of
    queues, and the template engine's two dozen lookups per row were most of
    the page's rendering time (docs/scaling.md). Every text is escaped, by
    ``html.escape`` as Django's ``escape`` does, less its lazy-text checks.
    """
    query = f"endpoint={counts.endpoint_id}&queue={quote_plus(counts.queue)}"
    link = f"{html.escape(todos_url)}?{html.escape(query)}"

    def cell(label, count, state=None, plus="", css=""):
        style = f' class="{css}"' if css else ""
        if not count:
            inner = f'<span class="zero">0{plus}</span>'
        elif state is None:
            inner = f"<span{style}>{count}</span>"
        else:
            inner = f'<a{style} href="{link}&amp;state={state}">{count}{plus}</a>'
        return f'<td class="num" data-label="{label}">{inner}</td>'

    dead_plus = "+" if capped.get("dead_letter") else ""
    done_plus = "+" if capped.get("done") else ""
    age = _age(counts.oldest_pending_seconds) or "\u2014"
    return mark_safe(
        "<tr>"
        f'<th scope="row"><a href="{html.escape(queue_url)}">'
        f"{html.escape(counts.queue)}</a></th>"
        + cell("Pending", counts.pending, "pending")
        + cell("Held", counts.held)
        + cell("Claimed", counts.claimed, "claimed")
        + cell("Lapsed", counts.lapsed, css="warn-text")
        + cell("Retry scheduled", counts.retry_scheduled, "retry_scheduled")
        + cell("Dead letter", counts.dead_letter, "dead_letter", dead_plus, "bad-text")
        + cell("Done", counts.done, "done", done_plus)
        + f'<td class="num" data-label="Oldest pending">{html.escape(age)}</td>'
        "</tr>"
    )


def idle_items(idle, todos_url, user_pk):
    """The overview's endpoints without todos, as list items (HTML, escaped):
    each links to its list and names its owner when that is someone else.
    Made here for the reason of ``counts_row``: an operator may see hundreds."""
    items = []
    todos_link = html.escape(todos_url)
    for section in idle:
        endpoint = section["endpoint"]
        owner = ""
        if endpoint.owner_id != user_pk:
            username = html.escape(endpoint.owner.get_username())
            owner = f' <span class="muted">({username})</span>'
        # An endpoint's id is a UUID: nothing in it needs escaping.
        link = f"{todos_link}?endpoint={section['endpoint_id']}"
        name = html.escape(endpoint.name)
        items.append(f'<li><a href="{link}">{name}</a>{owner}</li>')
    return mark_safe("".join(items))


# --- Todo list ------------------------------------------------------------------


def _query(form, **overrides):
    """Return the list's query string for these filters (and page)."""
    values = {
        name: form.cleaned_data.get(name) or ""
        for name in (
            "endpoint",
            "queue",
            "state",
            "assignee",
            "owner",
            "q",
            "fingerprint",
        )
    }
    values.update(overrides)
    query = QueryDict(mutable=True)
    query.update({name: value for name, value in values.items() if value})
    return query.urlencode()


@require_GET
@operator_view
def todo_list(request):
    """List todos newest first with the filters in the URL; htmx polls the rows."""
    form = TodoFilterForm(request.GET, in_scope=request.board.endpoints())
    status, page, filters = 200, store.Page([], None), {}
    if form.is_valid():
        filters = form.store_filters()
        page = request.board.list_todos(
            **filters, cursor=form.cleaned_data["after"] or None, limit=PAGE_SIZE
        )
    else:
        status = 400
    by_id = _endpoints_by_id(request)
    context = {
        "form": form,
        "rows": [
            {"todo": todo, "endpoint": by_id.get(todo.endpoint_id)}
            for todo in page.todos
        ],
        "filtered": bool(filters) and any(filters.values()),
        "first_query": _query(form) if form.is_valid() else "",
        "next_query": (
            _query(form, after=page.next_cursor) if page.next_cursor else None
        ),
        "paged": form.is_valid() and bool(form.cleaned_data["after"]),
        "here": request.get_full_path(),
        "nav": "todos",
        "now": timezone.now(),
    }
    return _page(
        request,
        "board/todo_list.html",
        context,
        fragments=("results", "rows"),
        status=status,
    )


# --- Todo detail and actions ----------------------------------------------------


def _detail_context(request, todo):
    from todos.ui.inbox import card_context, link_url

    checkpoint = (
        None
        if todo.checkpoint is None
        else json.dumps(todo.checkpoint, indent=2, sort_keys=True)
    )
    return {
        "question_card": card_context(request, todo) if todo.question else None,
        "answer_link": (
            link_url(request, todo) if todo.is_held and request.board.can_act else None
        ),
        "checkpoint_json": checkpoint,
        "checkpoint_size": filesizeformat(len(checkpoint.encode()))
        if checkpoint
        else "",
        "todo": todo,
        "endpoint": request.board.endpoint(todo.endpoint_id),
        "events": request.board.todo_events(todo.id),
        "payload_json": json.dumps(todo.payload, indent=2, sort_keys=True),
        # A message sent over SQS: its body as sent (pretty when it is JSON).
        "sqs_body": sqs_messages.readable_body(todo.payload),
        "result_json": (
            None
            if todo.result is None
            else json.dumps(todo.result, indent=2, sort_keys=True)
        ),
        "priority_levels": range(MIN_PRIORITY, MAX_PRIORITY + 1),
        "usage_rows": _usage_rows(request, todo),
        **_trace_context(todo),
    }


def _usage_rows(request, todo):
    """Each attempt's usage as reported (its ledger row), oldest first."""
    if not todo.usage:
        return []
    reports = request.board.todo_usage(todo)
    return [
        {
            "report": report,
            "cost": money(report.cost_usd),
            "input": tokens(report.input_tokens),
            "output": tokens(report.output_tokens),
        }
        for report in reports
    ]


def _trace_context(todo):
    """The todo's trace and its latest delivery's own, with their links."""
    template = settings.SWITCHBOARD_TRACE_URL
    trace_id = tracing.trace_id(todo)
    delivery_trace_id = tracing.delivery_trace_id(todo)
    return {
        "trace_id": trace_id,
        "trace_url": tracing.trace_link(template, trace_id),
        "delivery_trace_id": delivery_trace_id,
        "delivery_trace_url": tracing.trace_link(template, delivery_trace_id),
    }


@require_GET
@operator_view
def todo_detail(request, todo_id):
    """Show every field of a todo, its payload and result, and its history."""
    try:
        todo = request.board.get_todo(todo_id)
    except store.NotFound:
        return render(request, "board/not_found.html", {"what": "todo"}, status=404)
    return _page(
        request,
        "board/todo_detail.html",
        _detail_context(request, todo),
        fragments=("detail", "live"),
    )


def _todo_action(request, todo_id, act, verb, done_text):
    """Run one action on one todo and answer with the changed fragment."""
    notices = []
    try:
        todo = act(todo_id, actor=request.board.actor)
        text = done_text(todo) if callable(done_text) else done_text
        notices.append(_notice("success", text))
    except store.Conflict as exc:
        notices.append(_notice("warning", _conflict_text(exc, verb)))
        todo = request.board.get_todo(exc.todo_id)
    except store.NotFound:
        notices.append(_notice("error", "That todo no longer exists."))
        todo = None
    if not request.htmx:
        _flash(request, notices)
        return redirect(_next_url(request, reverse("board:todos")))
    if todo is None:
        return _notices_only(request, notices)
    events = (COUNTS_CHANGED,)
    if request.htmx.target == "detail":
        part = ("board/todo_detail.html#detail", _detail_context(request, todo))
    else:
        part = (
            "board/todo_list.html#row",
            {
                "todo": todo,
                "endpoint": _endpoint_or_none(request, todo.endpoint_id),
                "now": timezone.now(),
            },
        )
    return _fragments(request, [part], notices, events)


@require_POST
@operator_view
def todo_retry(request, todo_id):
    """Requeue a failed todo now (dead letter or parked retry)."""
    return _todo_action(
        request,
        todo_id,
        request.board.retry_todo,
        "retry",
        "Retried: the todo is pending again.",
    )


@require_POST
@operator_view
def todo_release(request, todo_id):
    """Hand a stuck claim back to the queue."""
    return _todo_action(
        request,
        todo_id,
        request.board.release_todo,
        "release",
        "Released: the claim is given back.",
    )


def bulk_selected(request, verb, act):
    """Run a bulk action on the todos ticked in the list: ``act(ids)`` answers
    its notices. Answers the notices (htmx) or redirects back to the list."""
    ids = request.POST.getlist("ids")[: store.BULK_RETRY_LIMIT]
    if ids:
        notices = act(ids)
    else:
        notices = [_notice("warning", f"Tick the todos to {verb} first.")]
    if not request.htmx:
        _flash(request, notices)
        return redirect(_next_url(request, reverse("board:todos")))
    return _notices_only(
        request, notices, events=(ROWS_CHANGED, COUNTS_CHANGED, SELECTION_CLEARED)
    )


def bulk_matching(request, template, preview, act, context=None):
    """Preview (GET), then run (POST), a bulk action on every todo the list's
    filter matches. ``preview(filters)`` answers the figures the page shows,
    ``act(filters)`` the outcome and its notices."""
    form = TodoFilterForm(
        request.GET if request.method == "GET" else request.POST,
        in_scope=request.board.endpoints(),
    )
    if not form.is_valid():
        return _page(
            request,
            template,
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
        "group": _dead_letter_group(form),
        **(context or {}),
    }
    if request.method == "GET":
        context.update(preview(filters))
        return _page(request, template, context, fragments=("bulk",))
    outcome, notices = act(filters)
    if not request.htmx:
        _flash(request, notices)
        return redirect(list_url)
    context["outcome"] = outcome
    return _fragments(
        request,
        [(f"{template}#bulk-done", context)],
        notices,
        events=(ROWS_CHANGED, COUNTS_CHANGED),
    )


def _dead_letter_group(form):
    """Name the dead-letter group a filter narrows to (the groups page's
    "Retry group…"): its confirmation opens above every group, so it says
    which one it acts on. None for any other filter."""
    data = form.cleaned_data
    if not data["fingerprint"]:
        return None
    endpoints = dict(form.fields["endpoint"].choices)
    return {
        "fingerprint": data["fingerprint"],
        "endpoint": endpoints.get(data["endpoint"]) if data["endpoint"] else None,
        "queue": data["queue"].strip(),
    }


@require_POST
@operator_view
def todos_retry_selected(request):
    """Retry the todos ticked in the list."""

    def retry(ids):
        retried, conflicts, missing = request.board.retry_many(
            ids, actor=request.board.actor
        )
        notices = [_notice("success", f"Retried {len(retried)} of {len(ids)}.")]
        if conflicts:
            notices.append(
                _notice(
                    "warning",
                    f"{len(conflicts)} could not be retried: they were no "
                    "longer failed, or a live todo holds their idempotency key.",
                )
            )
        if missing:
            notices.append(_notice("warning", f"{len(missing)} no longer exist."))
        return notices

    return bulk_selected(request, "retry", retry)


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def todos_retry_matching(request):
    """Preview, then retry, every failed todo the list's filter matches."""

    def preview(filters):
        preview = request.board.preview_retry(**filters)
        return {
            "count": preview.retryable,
            "key_held": preview.key_held,
            "more": preview.more,
            "preview_limit": f"{store.PREVIEW_LIMIT:,}".replace(",", " "),
        }

    def retry(filters):
        outcome = request.board.retry_matching(**filters, actor=request.board.actor)
        notices = [_notice("success", f"Retried {outcome.retried} matching todos.")]
        if outcome.conflicts:
            notices.append(
                _notice(
                    "warning",
                    f"{len(outcome.conflicts)} were left failed: a live todo "
                    "holds their idempotency key.",
                )
            )
        if outcome.key_held:
            notices.append(
                _notice(
                    "warning",
                    f"{outcome.key_held} dead letter{pluralize(outcome.key_held)} "
                    "left failed: another live todo holds the same idempotency key.",
                )
            )
        if outcome.more:
            notices.append(
                _notice(
                    "warning", "More failed todos still match; run the retry again."
                )
            )
        return outcome, notices

    return bulk_matching(
        request,
        "board/retry_matching.html",
        preview,
        retry,
        {"batch": store.BULK_RETRY_BATCH},
    )


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def todo_create(request):
    """Create a todo by hand for an endpoint."""
    form = TodoCreateForm(
        _posted(request),
        initial={"endpoint": request.GET.get("endpoint", "")},
        in_scope=request.board.endpoints(),
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        todo, created = request.board.create_todo(
            data["endpoint"],
            queue=data["queue"],
            title=data["title"],
            payload=data["payload"],
            idempotency_key=data["idempotency_key"] or None,
            assignee=data["assignee"] or None,
            max_attempts=data["max_attempts"],
            max_cost=data["max_cost"],
            actor=request.board.actor,
        )
        if created:
            messages.success(request, "Created the todo.")
        else:
            messages.warning(
                request,
                "A live todo already holds that idempotency "
                "key on this endpoint; here it is.",
            )
        return redirect("board:todo", todo_id=todo.id)
    status = 400 if request.method == "POST" else 200
    return render(
        request, "board/todo_create.html", {"form": form, "nav": "todos"}, status=status
    )


# --- Endpoints ------------------------------------------------------------------


@require_GET
@operator_view
def endpoint_list(request):
    """List the endpoints with their owners, grants and token prefixes."""
    listed = request.board.endpoints().order_by("revoked_at", "name", "created_at")
    return render(
        request, "board/endpoints.html", {"endpoints": listed, "nav": "endpoints"}
    )


def _token_page(request, endpoint, token, created):
    response = render(
        request,
        "board/endpoint_token.html",
        {"endpoint": endpoint, "token": token, "created": created, "nav": "endpoints"},
        status=201 if created else 200,
    )
    # The token exists only in this response: keep it out of every cache.
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def endpoint_create(request):
    """Create an endpoint and show its token, this once."""
    form = EndpointCreateForm(
        _posted(request),
        initial={"owner": request.user},
        owners=request.board.owners(),
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        endpoint, token = endpoints.create(data["name"], data["owner"], data["queues"])
        return _token_page(request, endpoint, token, created=True)
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "board/endpoint_form.html",
        {"form": form, "nav": "endpoints"},
        status=status,
    )


@require_POST
@operator_view
def endpoint_rotate(request, endpoint_id):
    """Replace an endpoint's token; the old one stops working at once."""
    endpoint = _endpoint_or_none(request, endpoint_id)
    if endpoint is None:
        return _endpoint_missing(request)
    if not endpoint.is_active:
        messages.warning(request, f"{endpoint.name} is revoked; its token stays dead.")
        return redirect("board:endpoints")
    token = endpoints.rotate_token(endpoint)
    return _token_page(request, endpoint, token, created=False)


@require_POST
@operator_view
def endpoint_revoke(request, endpoint_id):
    """Revoke an endpoint: its token stops working; its todos stay for the record."""
    endpoint = _endpoint_or_none(request, endpoint_id)
    if endpoint is None:
        return _endpoint_missing(request)
    revoked = endpoints.revoke(endpoint)
    notice = (
        _notice("success", f"Revoked {endpoint.name}; its token no longer works.")
        if revoked
        else _notice("warning", f"{endpoint.name} was already revoked.")
    )
    if not request.htmx:
        _flash(request, [notice])
        return redirect("board:endpoints")
    return _fragments(
        request,
        [("board/endpoints.html#endpoint-row", {"endpoint": endpoint})],
        [notice],
    )


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def endpoint_grants(request, endpoint_id):
    """Edit the queues an endpoint may use."""
    endpoint = _endpoint_or_none(request, endpoint_id)
    if endpoint is None:
        return _endpoint_missing(request)
    form = GrantsForm(_posted(request), initial={"queues": endpoint.queues})
    if request.method == "POST" and form.is_valid():
        endpoints.set_grant(endpoint, form.cleaned_data["queues"])
        messages.success(
            request, f"{endpoint.name} may now use: {', '.join(endpoint.queues)}."
        )
        return redirect("board:endpoints")
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "board/endpoint_grants.html",
        {"form": form, "endpoint": endpoint, "nav": "endpoints"},
        status=status,
    )
