"""``GET /metrics``: Prometheus' text format, from ``prometheus-client``.

Per endpoint and queue: ``switchboard_todos{state=…}`` gauges (pending,
delayed, held = the open questions, claimed, retry_scheduled, dead_letter),
the age of the oldest pending todo and of the oldest open question, and the
counters ``switchboard_cancels_total`` and
``switchboard_transitions_total{transition=…}`` (created, claimed, completed,
failed, dead_lettered, retried). Per schedule: the counters
``switchboard_schedule_fires_total``, ``switchboard_schedule_skips_total`` and
``switchboard_schedule_lateness_seconds_total`` (slot time to todo created,
summed over the fires: divided by the fires, the mean lateness), kept on each
schedule's row by the sweep that fires it. Admission (per endpoint and
queue): ``switchboard_groups_at_limit`` and ``switchboard_todos_held_by_limit``,
the groups whose due todos a group limit or pause holds back now, and those
todos; the counters ``switchboard_claims_passed_over_total{reason=…}`` (the
todos a claim's admission passed over: limit, paused, rate_limit,
group_rate_limit) and ``switchboard_rate_limited_waits_total`` (long polls
that waited because a rate window held back their todos), which every process
adds to the database within seconds (``todos.store.limit_figures``). Spend
(per endpoint and queue): the counters ``switchboard_usage_cost_usd_total``
and ``switchboard_usage_tokens_total{direction=input|output}``, what agents
reported, folded from the ledger by the sweep loop
(``todos.store.spend.roll_up_usage``); the gauges ``switchboard_budgets`` and
``switchboard_budgets_at_limit`` (an endpoint's own budgets under queue "").
The gauges are read from
the partial indexes of live rows and of dead letters (never the done backlog);
the counters from the sweep loop's rollup (``todos.store_stats``), so they
advance once per sweep pass.

Readable by a staff Board session, or with ``Authorization: Bearer <token>``
when ``SWITCHBOARD_METRICS_TOKEN`` is set (compared in constant time). Anyone
else: 401 without credentials (or with a wrong token), 403 for a logged-in
user who is not staff.
"""

import hmac

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from todos import store
from todos.models import Endpoint
from todos.store import limit_figures, spend
from todos.store import stats as store_stats

# The classic text format every Prometheus (and Debian's 2.x) scrapes; the
# names and labels here are all legacy-safe, so its body is the same.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GAUGE_STATES = (
    "pending",
    "delayed",
    "held",
    "claimed",
    "retry_scheduled",
    "dead_letter",
)


class PerQueueCollector:
    """A collector of figures per endpoint and queue: each sample is labelled
    with the endpoint's id, its name (from ``names``, "" when gone) and the
    queue."""

    labels = ["endpoint_id", "endpoint", "queue"]

    def __init__(self, figures, names):
        self.figures = figures
        self.names = names

    def values(self, figure):
        """The label values of a figure: endpoint id, endpoint name, queue."""
        return [
            figure.endpoint_id,
            self.names.get(figure.endpoint_id, ""),
            figure.queue,
        ]


class QueueCollector(PerQueueCollector):
    """Collects the store's figures once per scrape."""

    def collect(self):
        labels = self.labels
        todos = GaugeMetricFamily(
            "switchboard_todos",
            "Todos per endpoint, queue and state (pending: claimable now; "
            "delayed: pending, not yet available; held: pending, waiting for "
            "the answer to its question (the open questions); dead_letter: "
            "failed at the attempt cap; retry_scheduled: failed, waiting for "
            "its backoff).",
            labels=[*labels, "state"],
        )
        oldest = GaugeMetricFamily(
            "switchboard_oldest_pending_age_seconds",
            "Seconds the oldest claimable pending todo has waited since it became "
            "available, per endpoint and queue (0 when none).",
            labels=labels,
        )
        oldest_question = GaugeMetricFamily(
            "switchboard_oldest_question_age_seconds",
            "Seconds the oldest open question has waited for its answer, per "
            "endpoint and queue (0 when none).",
            labels=labels,
        )
        canceled = CounterMetricFamily(
            "switchboard_cancels",
            "Todos ended canceled per endpoint and queue, counted from the "
            "history by the sweep loop's rollup.",
            labels=labels,
        )
        transitions = CounterMetricFamily(
            "switchboard_transitions",
            "Lifecycle transitions per endpoint and queue, counted from the "
            "history by the sweep loop's rollup.",
            labels=[*labels, "transition"],
        )
        for figure in self.figures:
            values = self.values(figure)
            for state in GAUGE_STATES:
                todos.add_metric([*values, state], getattr(figure, state))
            oldest.add_metric(values, figure.oldest_pending_age_seconds or 0.0)
            oldest_question.add_metric(
                values, figure.oldest_question_age_seconds or 0.0
            )
            canceled.add_metric(values, (figure.transitions or {}).get("canceled", 0))
            for name in store_stats.TRANSITIONS:
                count = (figure.transitions or {}).get(name, 0)
                transitions.add_metric([*values, name], count)
        yield todos
        yield oldest
        yield oldest_question
        yield canceled
        yield transitions


class ScheduleCollector:
    """The schedules' counters, read once per scrape."""

    def __init__(self, figures):
        self.figures = figures

    def collect(self):
        labels = ["endpoint_id", "endpoint", "schedule", "queue"]
        fires = CounterMetricFamily(
            "switchboard_schedule_fires",
            "Slots of a schedule that made their todo (fire now not counted).",
            labels=labels,
        )
        skips = CounterMetricFamily(
            "switchboard_schedule_skips",
            "Slots of a schedule skipped: missed (the missed-slot policy) or "
            "overlapping a live todo (overlap skip).",
            labels=labels,
        )
        lateness = CounterMetricFamily(
            "switchboard_schedule_lateness_seconds",
            "Seconds from each fired slot's time to its todo's creation, summed.",
            labels=labels,
        )
        for figure in self.figures:
            values = [figure.endpoint_id, figure.endpoint, figure.name, figure.queue]
            fires.add_metric(values, figure.fires)
            skips.add_metric(values, figure.skips)
            lateness.add_metric(values, figure.lateness_seconds)
        yield fires
        yield skips
        yield lateness


class LimitCollector(PerQueueCollector):
    """What admission holds back now, per queue, read once per scrape."""

    def collect(self):
        labels = self.labels
        groups = GaugeMetricFamily(
            "switchboard_groups_at_limit",
            "Groups whose due pending todos their limit (the group's, else the "
            "queue's group_concurrency) or their pause holds back now.",
            labels=labels,
        )
        todos = GaugeMetricFamily(
            "switchboard_todos_held_by_limit",
            "Due pending todos in groups at their limit or paused: claims pass "
            "them over until a slot frees.",
            labels=labels,
        )
        for figure in self.figures:
            values = self.values(figure)
            groups.add_metric(values, figure.groups)
            todos.add_metric(values, figure.todos)
        yield groups
        yield todos


class AdmissionCountCollector(PerQueueCollector):
    """The admission counters, read once per scrape."""

    def collect(self):
        labels = self.labels
        passed = CounterMetricFamily(
            "switchboard_claims_passed_over",
            "Todos a claim's admission passed over, by reason: limit (the "
            "group at its limit), paused (the group paused), rate_limit or "
            "group_rate_limit (the window had no room for its cost). A group "
            "seen at its limit before admission is skipped without counting "
            "(switchboard_todos_held_by_limit shows those).",
            labels=[*labels, "reason"],
        )
        waits = CounterMetricFamily(
            "switchboard_rate_limited_waits",
            "Waiting claims (long polls) that waited because a rate window "
            "held back a todo they could have claimed, counted once per claim.",
            labels=labels,
        )
        for count in self.figures:
            values = self.values(count)
            if count.counter == limit_figures.RATE_WAIT:
                waits.add_metric(values, count.count)
            else:
                passed.add_metric([*values, count.counter], count.count)
        yield passed
        yield waits


class SpendCollector(PerQueueCollector):
    """Spend per endpoint and queue, and the budgets at their limit."""

    def __init__(self, figures, budgets, names):
        super().__init__(figures, names)
        self.budgets = budgets

    def collect(self):
        labels = self.labels
        cost = CounterMetricFamily(
            "switchboard_usage_cost_usd",
            "Dollars agents reported spending per endpoint and queue (usage on "
            "heartbeat, complete, fail and outside a todo), folded from the "
            "ledger by the sweep loop.",
            labels=labels,
        )
        tokens = CounterMetricFamily(
            "switchboard_usage_tokens",
            "Tokens agents reported per endpoint, queue and direction (input, "
            "output), folded from the ledger by the sweep loop.",
            labels=[*labels, "direction"],
        )
        budgets = GaugeMetricFamily(
            "switchboard_budgets",
            'Budgets per endpoint and queue (an endpoint\'s own under queue "").',
            labels=labels,
        )
        at_limit = GaugeMetricFamily(
            "switchboard_budgets_at_limit",
            "Budgets whose scope spent their limit in the current window "
            '(an endpoint\'s own under queue "").',
            labels=labels,
        )
        for figure in self.figures:
            values = self.values(figure)
            cost.add_metric(values, float(figure.cost_usd))
            tokens.add_metric([*values, "input"], figure.input_tokens)
            tokens.add_metric([*values, "output"], figure.output_tokens)
        for figure in self.budgets:
            values = self.values(figure)
            budgets.add_metric(values, figure.budgets)
            at_limit.add_metric(values, figure.at_limit)
        yield cost
        yield tokens
        yield budgets
        yield at_limit


def _bearer(request):
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _allowed(request):
    """Return None when the request may read the metrics, else the status."""
    expected = settings.SWITCHBOARD_METRICS_TOKEN
    offered = _bearer(request)
    if offered is not None:
        if expected and hmac.compare_digest(offered.encode(), expected.encode()):
            return None
        return 401
    user = request.user
    if user.is_authenticated:
        return None if (user.is_active and user.is_staff) else 403
    return 401


def _refusal(status):
    text = {
        401: "metrics need a staff Board session or the metrics bearer token\n",
        403: "metrics are for staff only\n",
    }[status]
    response = HttpResponse(text, status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchboard-metrics"'
    return response


@require_GET
def metrics(request):
    """Serve the Prometheus exposition of every endpoint's queues."""
    refused = _allowed(request)
    if refused:
        return _refusal(refused)
    try:
        figures = store_stats.metrics_figures()
        schedules = store.schedule_figures()
        held = limit_figures.held_by_limit()
        spent = spend.spend_figures()
        budgets = spend.budget_figures()
        counts = limit_figures.admission_counts()
        names = {
            str(pk): name for pk, name in Endpoint.objects.values_list("id", "name")
        }
    except (store.Unavailable, OperationalError, InterfaceError) as exc:
        # A deadlock (a read stopped behind a table lock that waited for it)
        # or a timeout is a busy database, not a down one: the text says so.
        busy = store.is_deadlock(exc) or isinstance(exc, store.TimedOut)
        response = HttpResponse(
            "database busy; try again\n" if busy else "database unavailable\n",
            status=503,
            content_type="text/plain",
        )
        response["Retry-After"] = str(store.Unavailable.retry_after)
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(figures, names))
    registry.register(ScheduleCollector(schedules))
    registry.register(LimitCollector(held, names))
    registry.register(SpendCollector(spent, budgets, names))
    registry.register(AdmissionCountCollector(counts, names))
    response = HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
