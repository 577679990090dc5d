"""The Board's webhook pages: sources, their routes and their last deliveries.

An operator sees what arrived at each source and what it became — per target,
the todo it created or collapsed onto — creates a source with its routes (the
same validation as ``create_webhook``), adds and removes routes, rotates a
secret, and deletes a source. The login, the owner scope (an owner sees the
sources whose every route goes to their endpoints) and the outage page come
from the Board's own ``operator_view``; an owner sees, of each delivery, only
the targets at their endpoints, and names a source whose address gets a random
suffix (slugs are global: a taken name must not tell of another owner's).
"""

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from todos import store
from todos.access import crypto
from todos.models import WEBHOOK_SCHEMES, WebhookRoute, WebhookSource
from todos.ui.core import action_page, operator_view
from todos.ui.forms import BoardForm, endpoint_choices
from todos.webhooks import deliveries, signatures, sources

RECENT_DELIVERIES = 10
MAX_ROUTES = 10
SOURCE_FIELDS = (
    "slug",
    "secret",
    "scheme",
    "signature_header",
    "delivery_header",
    "event_header",
)


class SourceForm(BoardForm):
    """A new source: its slug, signature scheme, secret and header overrides."""

    slug = forms.SlugField(
        max_length=sources.MAX_SLUG_LENGTH,
        help_text="Deliveries go to /hooks/<slug>.",
    )
    scheme = forms.ChoiceField(choices=WEBHOOK_SCHEMES)
    secret = forms.CharField(
        max_length=sources.MAX_SECRET_LENGTH,
        required=False,
        strip=False,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text="The shared signing secret (Standard Webhooks: whsec_<base64>). "
        "Leave blank to generate one, shown once.",
    )
    signature_header = forms.CharField(max_length=100, required=False)
    delivery_header = forms.CharField(max_length=100, required=False)
    event_header = forms.CharField(max_length=100, required=False)

    def __init__(self, *args, public_suffix=False, **kwargs):
        super().__init__(*args, **kwargs)
        if public_suffix:
            # Slugs are global: an owner's name gets a random suffix, so that
            # naming a source never tells whether another owner has that name.
            slug = self.fields["slug"]
            slug.label = "Name"
            slug.help_text = "Deliveries go to /hooks/<name>-<random suffix>."
        for index, name in enumerate(
            ("signature_header", "delivery_header", "event_header")
        ):
            defaults = ", ".join(
                f"{scheme}: {headers[index] or 'from the body'}"
                for scheme, headers in _scheme_headers().items()
            )
            self.fields[name].help_text = f"Blank = the scheme's ({defaults})."


def _scheme_headers():
    return {
        name: (s.signature_header, s.delivery_header, s.event_header)
        for name, s in signatures.SCHEMES.items()
    }


class RouteForm(BoardForm):
    """One target of the source's deliveries; a blank row is no route."""

    endpoint = forms.ChoiceField(required=False)
    queue = forms.CharField(max_length=store.MAX_NAME_CHARS, required=False)
    assignee = forms.CharField(max_length=200, required=False)
    title_template = forms.CharField(
        max_length=500,
        required=False,
        help_text="Blank = derived, e.g. “pull_request opened acme/app#12: …”. "
        "Fields: " + ", ".join("$" + name for name in deliveries.TITLE_FIELDS),
    )

    priority = forms.TypedChoiceField(
        choices=[("", "default (3)"), *((n, str(n)) for n in range(1, 6))],
        coerce=int,
        empty_value=None,
        required=False,
        help_text="1 is claimed first, 5 last.",
    )
    group_template = forms.CharField(
        label="Group",
        max_length=sources.MAX_TEMPLATE_LENGTH,
        required=False,
        help_text="Blank = no group. Payload paths in braces, e.g. "
        "{repository.full_name}: with the queue's group concurrency 1, one agent "
        "per repository.",
    )

    def __init__(self, *args, in_scope=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].choices = endpoint_choices(
            "no route", active_only=True, in_scope=in_scope
        )

    def clean(self):
        data = super().clean()
        endpoint, queue = data.get("endpoint"), (data.get("queue") or "").strip()
        if endpoint and not queue:
            self.add_error("queue", "A route needs a queue.")
        elif queue and not endpoint:
            self.add_error("endpoint", "A route needs an endpoint.")
        elif any(ch.isspace() for ch in queue):
            self.add_error("queue", "A queue name has no spaces.")
        data["queue"] = queue
        return data

    def spec(self):
        """Return this row's RouteSpec, or None when the row is blank."""
        data = self.cleaned_data
        if not data.get("endpoint"):
            return None
        return sources.RouteSpec(
            data["endpoint"],
            data["queue"],
            data["assignee"].strip(),
            data["title_template"].strip(),
            data["priority"],
            data["group_template"].strip(),
        )


class BaseRouteFormSet(forms.BaseFormSet):
    def clean(self):
        if any(self.errors):
            return
        if not any(form.spec() for form in self.forms):
            raise ValidationError("Add at least one route.")


RouteFormSet = forms.formset_factory(
    RouteForm,
    formset=BaseRouteFormSet,
    extra=3,
    max_num=MAX_ROUTES,
    validate_max=True,
)


def _outcome_rows(delivery, endpoints, access):
    """Return a delivery's per-target outcome with endpoint names, for display.

    Only the viewer's targets: a source an owner sees now may have routed to
    other owners' endpoints when the delivery came (CONTRACT §13).
    """
    rows = []
    for target in delivery.outcome:
        if not access.covers(target.get("endpoint_id")):
            continue
        endpoint = endpoints.get(target.get("endpoint_id"))
        rows.append({**target, "endpoint_name": endpoint.name if endpoint else "gone"})
    return rows


@require_GET
@operator_view
def webhook_list(request):
    """List the sources with their routes and last deliveries."""
    listed_sources = request.board.sources().prefetch_related("routes__endpoint")
    endpoints = {str(e.id): e for e in request.board.endpoints()}
    listed = []
    for source in listed_sources:
        recent = deliveries.recent_deliveries(source, RECENT_DELIVERIES)
        listed.append(
            {
                "source": source,
                "headers": signatures.described(source),
                "routes": source.routes.all(),
                "deliveries": [
                    (d, _outcome_rows(d, endpoints, request.board)) for d in recent
                ],
            }
        )
    template = "board/webhooks.html"
    if request.htmx and request.htmx.target == "sources":
        template += "#sources"
    return render(request, template, {"nav": "webhooks", "sources": listed})


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def webhook_create(request):
    """Create a source with its routes; a generated secret is shown once."""
    public_suffix = not request.board.staff
    form = SourceForm(
        request.POST or None,
        initial={"scheme": "github"},
        public_suffix=public_suffix,
    )
    routes = RouteFormSet(
        request.POST or None,
        prefix="routes",
        form_kwargs={"in_scope": request.board.endpoints()},
    )
    if request.method == "POST" and form.is_valid() and routes.is_valid():
        data = form.cleaned_data
        generated = not data["secret"]
        secret = sources.new_secret(data["scheme"]) if generated else data["secret"]
        try:
            source = sources.create_source(
                data["slug"],
                secret,
                [spec for spec in (f.spec() for f in routes.forms) if spec],
                scheme=data["scheme"],
                signature_header=data["signature_header"],
                delivery_header=data["delivery_header"],
                event_header=data["event_header"],
                public_suffix=public_suffix,
            )
        except sources.InvalidSource as exc:
            field = exc.field if exc.field in SOURCE_FIELDS else None
            form.add_error(field, exc.detail if field else str(exc))
        else:
            if not generated:
                messages.success(request, f"Created webhook source {source.slug}.")
                return redirect("board:webhooks")
            return _secret_page(request, source, secret, created=True)
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "board/webhooks_form.html",
        {"nav": "webhooks", "form": form, "routes": routes},
        status=status,
    )


def _secret_page(request, source, secret, created):
    response = render(
        request,
        "board/webhooks_secret.html",
        {
            "nav": "webhooks",
            "source": source,
            "secret": secret,
            "created": created,
            "path": f"/hooks/{source.slug}",
        },
        status=201 if created else 200,
    )
    # The secret exists only in this response: keep it out of every cache.
    response["Cache-Control"] = "no-store"
    return response


def _source_missing(request):
    return render(
        request, "board/not_found.html", {"what": "webhook source"}, status=404
    )


@require_POST
@operator_view
def webhook_rotate(request, source_id):
    """Replace a source's secret and show it once; the old one stops at once."""
    source = WebhookSource.objects.filter(id=source_id).first()
    if source is None:
        return _source_missing(request)
    secret = sources.new_secret(source.scheme)
    WebhookSource.objects.filter(id=source.id).update(
        secret_encrypted=crypto.encrypt(secret)
    )
    return _secret_page(request, source, secret, created=False)


@require_http_methods(["GET", "POST"])
@operator_view
@action_page
def route_create(request, source_id):
    """Add a route to an existing source."""
    source = WebhookSource.objects.filter(id=source_id).first()
    if source is None:
        return _source_missing(request)
    form = RouteForm(request.POST or None, in_scope=request.board.endpoints())
    if request.method == "POST" and form.is_valid():
        spec = form.spec()
        if spec is None:
            form.add_error("endpoint", "Choose the endpoint to route to.")
        else:
            try:
                sources.add_route(source, spec)
            except sources.InvalidSource as exc:
                form.add_error(None, exc.detail)
            else:
                messages.success(
                    request, f"{source.slug} now also routes to queue {spec.queue}."
                )
                return redirect("board:webhooks")
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "board/webhooks_route_form.html",
        {"nav": "webhooks", "form": form, "source": source},
        status=status,
    )


@require_POST
@operator_view
def route_delete(request, route_id):
    """Remove one route; deliveries stop reaching it, its todos stay."""
    deleted, _ = WebhookRoute.objects.filter(id=route_id).delete()
    if deleted:
        messages.success(request, "Removed the route; its todos stay.")
    else:
        messages.warning(request, "That route was already gone.")
    return _back_to_list(request)


def _back_to_list(request):
    if request.htmx:
        return HttpResponseClientRedirect(reverse("board:webhooks"))
    return redirect("board:webhooks")


@require_POST
@operator_view
def webhook_delete(request, source_id):
    """Delete a source, its routes and its log; its todos stay."""
    deleted, _ = WebhookSource.objects.filter(id=source_id).delete()
    if deleted:
        messages.success(request, "Deleted the webhook source; its todos stay.")
    else:
        messages.warning(request, "That webhook source was already gone.")
    return _back_to_list(request)
