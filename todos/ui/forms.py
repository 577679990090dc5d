"""Forms of the operator Board: list filters, a hand-made todo, endpoints."""

import json
import re

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from todos import store
from todos.access import endpoints
from todos.models import Endpoint
from todos.web import http

STATE_CHOICES = [
    ("", "any state"),
    ("pending", "pending"),
    ("claimed", "claimed"),
    ("retry_scheduled", "retry scheduled"),
    ("dead_letter", "dead letter"),
    ("failed", "failed (both)"),
    ("done", "done"),
]


class OperatorLoginForm(AuthenticationForm):
    """Django's login form, for Board users: staff, endpoint owners and viewers
    (``todos.ui.access``); anyone else is told the Board is not theirs."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)

    def confirm_login_allowed(self, user):
        from todos.ui.access import BoardAccess

        super().confirm_login_allowed(user)
        if BoardAccess.for_user(user) is None:
            raise ValidationError(
                "This account owns no endpoint and is not an operator (staff) "
                "account, so the Board has nothing to show it.",
                code="not_board_user",
            )


def endpoint_choices(blank_label, *, active_only=False, in_scope=None):
    """Return (id, label) choices of the endpoints (all of them, or the given
    queryset: the user's scope), revoked ones marked."""
    candidates = Endpoint.objects.select_related("owner")
    if in_scope is not None:
        candidates = in_scope
    if active_only:
        candidates = candidates.filter(revoked_at__isnull=True)
    choices = [("", blank_label)]
    for endpoint in candidates:
        label = f"{endpoint.name} ({endpoint.owner.get_username()})"
        if not endpoint.is_active:
            label += " — revoked"
        choices.append((str(endpoint.id), label))
    return choices


class BoardForm(forms.Form):
    """A form whose labels read as labels, without Django's trailing colon."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


# Three letters or digits in a row: what pg_trgm can look up in its index.
SEARCHABLE_RUN = re.compile(r"[^\W_]{3}")


class TodoFilterForm(BoardForm):
    """The list's filters; every field is optional and the URL carries them."""

    endpoint = forms.ChoiceField(required=False)
    queue = forms.CharField(required=False, max_length=200)
    state = forms.ChoiceField(required=False, choices=STATE_CHOICES)
    assignee = forms.CharField(required=False, max_length=200)
    owner = forms.CharField(required=False, max_length=200, label="Worker")
    q = forms.CharField(required=False, max_length=200, label="Text")
    after = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)
    # One dead-letter group (todos.error_fingerprint), from the groups page.
    fingerprint = forms.CharField(
        required=False, max_length=400, strip=False, widget=forms.HiddenInput
    )

    def __init__(self, *args, in_scope=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].choices = endpoint_choices(
            "any endpoint", in_scope=in_scope
        )
        self.fields["q"].widget.attrs["placeholder"] = "in a title or key"

    def clean_q(self):
        text = self.cleaned_data["q"]
        # The trigram indexes (migration 0018) find a term by its runs of three
        # letters or digits; a term without one would read every todo.
        if text.strip() and not SEARCHABLE_RUN.search(text):
            raise ValidationError(
                "Search for at least three letters or digits in a row."
            )
        return text

    def clean_after(self):
        after = self.cleaned_data["after"]
        if after:
            try:
                store.decode_cursor(after)
            except ValueError:
                raise ValidationError(
                    "This page link is not valid; start over."
                ) from None
        return after

    def store_filters(self):
        """Return the keyword filters the store's list and bulk functions take."""
        data = self.cleaned_data
        return {
            "endpoint_id": data["endpoint"] or None,
            "queue": data["queue"].strip() or None,
            "state": data["state"] or None,
            "assignee": data["assignee"].strip() or None,
            "owner": data["owner"].strip() or None,
            "text": data["q"].strip() or None,
            "fingerprint": data["fingerprint"] or None,
        }


class QueuesField(forms.CharField):
    """A comma-separated list of queue names, or *."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", 2000)
        kwargs.setdefault(
            "help_text", "Comma-separated queue names, or * for every queue."
        )
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, list):
            return endpoints.format_grant(value)
        return value

    def clean(self, value):
        try:
            return endpoints.parse_grant(super().clean(value))
        except endpoints.EndpointError as exc:
            raise ValidationError(str(exc)) from None


class EndpointCreateForm(BoardForm):
    """A new endpoint: its name, the human who owns it, and its queue grant."""

    name = forms.CharField(max_length=200)
    owner = forms.ModelChoiceField(queryset=None, empty_label=None)
    queues = QueuesField(initial="*")

    def __init__(self, *args, owners=None, **kwargs):
        super().__init__(*args, **kwargs)
        if owners is None:
            owners = get_user_model().objects.filter(is_active=True)
        self.fields["owner"].queryset = owners.order_by("username")

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError("Give the endpoint a name.")
        return name


class GrantsForm(BoardForm):
    """The queues an endpoint may use."""

    queues = QueuesField()


class TodoCreateForm(BoardForm):
    """A todo made by hand, for any endpoint whose grant covers the queue."""

    endpoint = forms.ChoiceField()
    queue = forms.CharField(max_length=store.MAX_NAME_CHARS)
    title = forms.CharField(max_length=store.MAX_TITLE_CHARS, required=False)
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        help_text="A JSON value; empty means {}.",
    )
    idempotency_key = forms.CharField(
        max_length=store.MAX_KEY_CHARS,
        required=False,
        help_text="A live todo with the same key on this endpoint is returned instead.",
    )
    assignee = forms.CharField(
        max_length=store.MAX_NAME_CHARS,
        required=False,
        help_text="Only this worker may claim it.",
    )
    max_attempts = forms.IntegerField(
        min_value=1,
        max_value=store.MAX_ATTEMPTS_CAP,
        required=False,
        help_text="Empty means the server's default (SWITCHBOARD_MAX_ATTEMPTS).",
    )
    max_cost = forms.DecimalField(
        label="Max cost ($)",
        min_value=0,
        max_value=store.MAX_USAGE_COST_USD,
        decimal_places=6,
        required=False,
        help_text="What one attempt may cost, reserved against its budgets at "
        "each claim. Empty means none.",
    )

    def __init__(self, *args, in_scope=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["max_attempts"].initial = settings.SWITCHBOARD_MAX_ATTEMPTS
        self.fields["endpoint"].choices = endpoint_choices(
            "choose an endpoint", active_only=True, in_scope=in_scope
        )

    def clean_queue(self):
        queue = self.cleaned_data["queue"].strip()
        if not queue or any(ch.isspace() for ch in queue):
            raise ValidationError("A queue name has no spaces.")
        return queue

    def clean_max_cost(self):
        max_cost = self.cleaned_data["max_cost"]
        return None if max_cost is None else float(max_cost)

    def clean_payload(self):
        raw = self.cleaned_data["payload"].strip()
        if not raw:
            return {}
        try:
            payload = http.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from None
        except (ValueError, RecursionError) as exc:
            # NaN and Infinity are not JSON; nesting too deep to decode.
            detail = str(exc) if isinstance(exc, ValueError) else "nested too deep"
            raise ValidationError(f"Not valid JSON: {detail}.") from None
        problem = http.unstorable(payload)
        if problem:
            raise ValidationError(f"The payload cannot be stored: {problem}.")
        return payload

    def clean(self):
        data = super().clean()
        endpoint_id, queue = data.get("endpoint"), data.get("queue")
        if endpoint_id and queue:
            endpoint = Endpoint.objects.filter(id=endpoint_id).first()
            if endpoint is None or not endpoint.is_active:
                self.add_error("endpoint", "This endpoint is gone or revoked.")
            elif not endpoint.grants(queue):
                self.add_error(
                    "queue",
                    f"{endpoint.name} is not granted {queue!r}; its agents could "
                    "never claim it.",
                )
        return data


class QueueSettingsForm(BoardForm):
    """A queue's defaults; a blank field means the server's default."""

    lease_seconds = forms.IntegerField(
        label="Default lease (s)",
        min_value=1,
        max_value=store.MAX_LEASE_SECONDS,
        required=False,
        help_text="A claim's lease when the agent names none.",
    )
    max_attempts = forms.IntegerField(
        label="Attempt cap",
        min_value=1,
        max_value=store.MAX_ATTEMPTS_CAP,
        required=False,
        help_text="Claims before a failure dead-letters a new todo.",
    )
    unlimited_attempts = forms.BooleanField(
        label="No attempt cap",
        required=False,
        help_text="Redeliver without limit, as an SQS queue without a RedrivePolicy.",
    )
    delay_seconds = forms.IntegerField(
        label="Delay (s)",
        min_value=0,
        max_value=900,
        required=False,
        help_text="How long a new todo waits before it can be claimed.",
    )

    def clean(self):
        data = super().clean()
        if data.pop("unlimited_attempts", False):
            data["max_attempts"] = store.UNLIMITED_ATTEMPTS
        return data

    @staticmethod
    def initial_for(settings):
        """The form's values for a queue's settings (none: the server's defaults)."""
        if settings is None:
            return {}
        unlimited = settings.max_attempts == store.UNLIMITED_ATTEMPTS
        return {
            "lease_seconds": settings.lease_seconds,
            "max_attempts": None if unlimited else settings.max_attempts,
            "unlimited_attempts": unlimited,
            "delay_seconds": settings.delay_seconds,
        }


class ScheduleForm(BoardForm):
    """A schedule's recurrence, policies and todo template, as the Board edits
    them; the store checks the cron and the time zone (its errors land on the
    field they name)."""

    name = forms.CharField(max_length=store.MAX_NAME_CHARS)
    queue = forms.CharField(
        max_length=store.MAX_NAME_CHARS,
        help_text="Each slot's todo goes to this queue of the endpoint.",
    )
    cron = forms.CharField(
        max_length=store.MAX_CRON_CHARS,
        required=False,
        help_text="Five fields (minute hour day month weekday), or @hourly, "
        "@daily, @weekly, @monthly. Leave it blank to use the interval.",
    )
    every_seconds = forms.IntegerField(
        label="Every (seconds)",
        min_value=store.MIN_EVERY_SECONDS,
        max_value=store.MAX_EVERY_SECONDS,
        required=False,
        help_text="Instead of a cron: a slot every this many seconds.",
    )
    time_zone = forms.CharField(
        max_length=64,
        help_text="The IANA time zone the cron is read in, e.g. Europe/Berlin.",
    )
    title = forms.CharField(
        max_length=store.MAX_TITLE_CHARS,
        required=False,
        help_text="Each todo's title; blank: the schedule's name.",
    )
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        required=False,
        help_text="Each todo's payload, as JSON.",
    )
    overlap = forms.ChoiceField(
        choices=[
            ("allow", "allow: every slot makes its todo"),
            ("skip", "skip a slot while the last todo is live"),
        ]
    )
    missed = forms.ChoiceField(
        label="Missed slots",
        choices=[
            ("skip", "skip: none of them"),
            ("one", "one: a todo for the latest"),
            ("all", "all: each, up to 100"),
        ],
    )

    def clean_payload(self):
        raw = self.cleaned_data["payload"].strip()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ValidationError(f"Not valid JSON: {exc}") from None

    def clean(self):
        data = super().clean()
        one_given = bool(data.get("cron")) != (data.get("every_seconds") is not None)
        if not one_given and not self.errors:
            self.add_error("cron", "Give either a cron or an interval.")
        return data

    def changes(self, schedule):
        """The store's update arguments: the recurrence, the policies, and the
        template with its other fields (max_attempts, priority, …) kept."""
        data = self.cleaned_data
        template = dict(schedule.todo)
        for name in ("title", "payload"):
            if data[name] in (None, ""):
                template.pop(name, None)
            else:
                template[name] = data[name]
        recurrence = (
            {"cron": data["cron"]}
            if data["cron"]
            else {"every_seconds": data["every_seconds"]}
        )
        return {
            "name": data["name"],
            "queue": data["queue"],
            "time_zone": data["time_zone"],
            "todo": template,
            "overlap": data["overlap"],
            "missed": data["missed"],
            **recurrence,
        }

    @staticmethod
    def initial_for(schedule):
        payload = schedule.todo.get("payload")
        return {
            "name": schedule.name,
            "queue": schedule.queue,
            "cron": schedule.cron or "",
            "every_seconds": schedule.every_seconds,
            "time_zone": schedule.time_zone,
            "title": schedule.todo.get("title", ""),
            "payload": "" if payload is None else json.dumps(payload, indent=2),
            "overlap": schedule.overlap,
            "missed": schedule.missed,
        }
