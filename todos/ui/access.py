"""Who sees what on the Board (CONTRACT §13), decided in one place.

``operator_view`` builds a ``BoardAccess`` from the logged-in user and hangs it
on ``request.board``; every Board view reads and acts through it and never
calls the store's operator twins itself:

- a staff user sees every endpoint (``endpoint_ids`` None);
- any other user sees the endpoints they own, and nothing else: each store
  call carries their endpoint ids as a filter on top of the operator twins
  (never an agent-path function), and ``operator_view`` answers 404 for a URL
  naming another endpoint, one of its todos, its queues or a webhook source
  that routes to it (a foreign object looks exactly like a missing one);
- a member of the Django group ``board-viewers`` is read-only: they see their
  scope, are offered no action (``can_act``), and every Board POST is a 403.
"""

from dataclasses import dataclass
from functools import cached_property

from django.db.models import Count, Q

from todos import store
from todos.models import Endpoint, WebhookRoute, WebhookSource
from todos.store import admission, spend
from todos.store import stats as store_stats

VIEWERS_GROUP = "board-viewers"


@dataclass(frozen=True)
class BoardAccess:
    """A Board user's scope: the endpoints they see, and whether they may act."""

    user: object
    staff: bool
    read_only: bool
    # None: every endpoint (staff). Otherwise the ids of the user's endpoints.
    endpoint_ids: frozenset | None

    @classmethod
    def for_user(cls, user):
        """Return the user's access, or None when the Board is not theirs at all
        (inactive, or neither staff, an endpoint owner nor a viewer)."""
        if not (user.is_authenticated and user.is_active):
            return None
        read_only = user.groups.filter(name=VIEWERS_GROUP).exists()
        if user.is_staff:
            return cls(user, True, read_only, None)
        owned = Endpoint.objects.filter(owner=user).values_list("pk", flat=True)
        owned = frozenset(str(pk) for pk in owned)
        if not owned and not read_only:
            return None
        return cls(user, False, read_only, owned)

    @property
    def can_act(self):
        return not self.read_only

    @property
    def actor(self):
        return f"operator:{self.user.get_username()}"

    @property
    def scope_ids(self):
        """The store's ``endpoint_ids`` argument: None, or a list."""
        return None if self.endpoint_ids is None else sorted(self.endpoint_ids)

    def covers(self, endpoint_id):
        """Say whether this endpoint id is in scope (a malformed id never is)."""
        if self.endpoint_ids is None:
            return True
        return str(endpoint_id) in self.endpoint_ids

    # --- Endpoints ----------------------------------------------------------

    def endpoints(self):
        """The endpoints in scope, as a queryset (owner loaded)."""
        endpoints = Endpoint.objects.select_related("owner")
        if self.endpoint_ids is None:
            return endpoints
        return endpoints.filter(owner=self.user)

    def endpoint(self, endpoint_id):
        return self.endpoints().filter(id=endpoint_id).first()

    def owners(self):
        """The users an endpoint created here may belong to."""
        from django.contrib.auth import get_user_model

        users = get_user_model().objects.filter(is_active=True).order_by("username")
        return users if self.staff else users.filter(pk=self.user.pk)

    # --- Schedules (the operator twins, filtered) ---------------------------

    def schedules(self):
        """The schedules in scope, with their next slots and last runs."""
        return store.list_schedules_any_endpoint(endpoint_ids=self.scope_ids)

    def schedule(self, schedule_id):
        """One schedule in scope with more of its slots and runs, or None."""
        found = store.list_schedules_any_endpoint(
            endpoint_ids=self.scope_ids, schedule_id=schedule_id, runs=10, upcoming=5
        )
        return found[0] if found else None

    def pause_schedule(self, schedule_id):
        return store.pause_schedule_any_endpoint(
            schedule_id, endpoint_ids=self.scope_ids
        )

    def resume_schedule(self, schedule_id):
        return store.resume_schedule_any_endpoint(
            schedule_id, endpoint_ids=self.scope_ids
        )

    def update_schedule(self, schedule_id, **changes):
        return store.update_schedule_any_endpoint(
            schedule_id, endpoint_ids=self.scope_ids, **changes
        )

    # --- Todos (the operator twins, filtered) -------------------------------

    def get_todo(self, todo_id):
        """Return a todo in scope; NotFound for a foreign one, like a missing one."""
        todo = store.get_todo_any_endpoint(todo_id)
        if not self.covers(todo.endpoint_id):
            raise store.NotFound(todo_id=str(todo_id))
        return todo

    def covers_todo(self, todo_id):
        try:
            self.get_todo(todo_id)
        except store.NotFound:
            return False
        return True

    def todo_events(self, todo_id):
        self.get_todo(todo_id)
        return store.todo_events_any_endpoint(todo_id)

    def todo_usage(self, todo):
        """A todo's usage ledger rows, one per attempt that reported."""
        if not self.covers(todo.endpoint_id):
            raise store.NotFound(todo_id=todo.id)
        return store.usage_ledger(store.Scope(todo.endpoint_id), todo_id=todo.id)

    def overview(self):
        return store.board_overview(endpoint_ids=self.scope_ids)

    def list_todos(self, **filters):
        return store.list_todos_any_endpoint(**filters, endpoint_ids=self.scope_ids)

    def retry_todo(self, todo_id, *, actor):
        self.get_todo(todo_id)
        return store.retry_todo_any_endpoint(todo_id, actor=actor)

    def release_todo(self, todo_id, *, actor):
        self.get_todo(todo_id)
        return store.release_todo_any_endpoint(todo_id, actor=actor)

    def retry_many(self, todo_ids, *, actor):
        """Retry the given todos; ids outside the scope count as missing."""
        inside, outside = [], []
        for todo_id in todo_ids:
            (inside if self.covers_todo(todo_id) else outside).append(todo_id)
        retried, conflicts, missing = store.retry_many_any_endpoint(inside, actor=actor)
        missing += [store.NotFound(todo_id=todo_id) for todo_id in outside]
        return retried, conflicts, missing

    def preview_retry(self, **filters):
        ids = self.scope_ids
        return store.preview_retry_any_endpoint(**filters, endpoint_ids=ids)

    def retry_matching(self, **filters):
        ids = self.scope_ids
        return store.retry_matching_any_endpoint(**filters, endpoint_ids=ids)

    def create_todo(self, endpoint_id, **fields):
        if not self.covers(endpoint_id):
            raise store.NotFound("no such endpoint")
        return store.create_todo_any_endpoint(endpoint_id, **fields)

    # --- Questions (the inbox) ----------------------------------------------

    def open_questions(self, *, order="oldest", limit=50):
        return store.open_questions_any_endpoint(
            endpoint_ids=self.scope_ids, order=order, limit=limit
        )

    @cached_property
    def open_question_count(self):
        """The open questions in scope: the navigation's count, once a request."""
        return store.count_open_questions_any_endpoint(endpoint_ids=self.scope_ids)

    def answered_questions(self, *, limit=10):
        return store.answered_questions_any_endpoint(
            endpoint_ids=self.scope_ids, limit=limit
        )

    def answer(self, todo_id, answer):
        """Answer a held todo in scope, as this user."""
        self.get_todo(todo_id)
        return store.answer_todo_any_endpoint(todo_id, answer, by=self.actor)

    def answer_link(self, todo):
        """The signed answer-link token of a held todo in scope (owners only)."""
        if not self.can_act or not self.covers(todo.endpoint_id):
            raise store.NotFound(todo_id=todo.id)
        return store.answer_link_token(todo)

    # --- Cancel and dismiss -------------------------------------------------

    def cancel_todo(self, todo_id, *, actor):
        self.get_todo(todo_id)
        return store.cancel_todo_any_endpoint(todo_id, by=actor)

    def cancel_many(self, todo_ids, *, actor):
        """Cancel the given todos: one Todo or exception per id, in order (ids
        outside the scope are NotFound)."""
        inside = [todo_id for todo_id in todo_ids if self.covers_todo(todo_id)]
        done = iter(store.cancel_many_any_endpoint(inside, by=actor) if inside else [])
        return [
            next(done) if todo_id in inside else store.NotFound(todo_id=todo_id)
            for todo_id in todo_ids
        ]

    def count_cancelable(self, **filters):
        ids = self.scope_ids
        return store.count_cancelable_any_endpoint(**filters, endpoint_ids=ids)

    def cancel_matching(self, *, actor, **filters):
        ids = self.scope_ids
        return store.cancel_matching_any_endpoint(**filters, by=actor, endpoint_ids=ids)

    def dismiss_matching(self, **filters):
        """Dismiss the dead letters of a group in scope; return how many."""
        return store.dismiss_matching_any_endpoint(
            **filters, endpoint_ids=self.scope_ids
        )

    # --- Statistics ---------------------------------------------------------

    def dead_letter_groups(self):
        return store_stats.dead_letter_groups(endpoint_ids=self.scope_ids)

    def chart(self, range_name, **narrow):
        return store_stats.chart_series(
            range_name=range_name, endpoint_ids=self.scope_ids, **narrow
        )

    # --- Queues -------------------------------------------------------------
    # Queue settings live in the store's ``queues`` table (store v2); until
    # that table exists a queue page shows figures and charts only.

    @staticmethod
    def has_queue_settings():
        return hasattr(store, "get_queue_any_endpoint")

    def queue(self, endpoint_id, name):
        """Return a queue's settings and figures (QueueInfo), or None."""
        if not (self.covers(endpoint_id) and self.has_queue_settings()):
            return None
        try:
            return store.get_queue_any_endpoint(endpoint_id, name)
        except store.NotFound:
            return None

    def update_queue(self, endpoint_id, name, **settings):
        self._queue_in_scope(endpoint_id)
        return store.update_queue_any_endpoint(endpoint_id, name, **settings)

    def pause_queue(self, endpoint_id, name):
        self._queue_in_scope(endpoint_id)
        return store.pause_queue_any_endpoint(endpoint_id, name)

    def resume_queue(self, endpoint_id, name):
        self._queue_in_scope(endpoint_id)
        return store.resume_queue_any_endpoint(endpoint_id, name)

    def _queue_in_scope(self, endpoint_id):
        if not self.covers(endpoint_id):
            raise store.NotFound("no such queue")

    # --- Admission (store.admission, through the endpoint's whole scope) ----
    # The store's admission functions take an agent's Scope; the Board hands
    # them the endpoint's (every queue) once the endpoint is known in scope.

    def _endpoint_scope(self, endpoint_id):
        self._queue_in_scope(endpoint_id)
        return store.Scope(str(endpoint_id))

    def admission(self, endpoint_id, name):
        """A queue's admission settings, or None (outside the scope, unused)."""
        if not self.covers(endpoint_id):
            return None
        try:
            return admission.get_admission(store.Scope(str(endpoint_id)), name)
        except store.NotFound:
            return None

    def set_admission(self, endpoint_id, name, **settings):
        return admission.set_admission(
            self._endpoint_scope(endpoint_id), name, **settings
        )

    def groups(self, endpoint_id, name, *, after="", limit=50):
        """A page of a queue's groups (store.admission.GroupInfo), by name."""
        return admission.list_groups(
            self._endpoint_scope(endpoint_id), name, after=after, limit=limit
        )

    def group(self, endpoint_id, name, group):
        return admission.get_group(self._endpoint_scope(endpoint_id), name, group)

    def set_group(self, endpoint_id, name, group, **override):
        return admission.set_group(
            self._endpoint_scope(endpoint_id), name, group, **override
        )

    def set_priority(self, todo_id, priority):
        """Change a pending todo's priority (NotFound outside the scope)."""
        todo = self.get_todo(todo_id)
        return admission.set_priority(
            store.Scope(str(todo.endpoint_id)), todo.id, priority
        )

    # --- Budgets (store.budgets, each through its endpoint's whole scope) ---

    def budgets(self):
        """The budgets in scope, each with its window's spend."""
        return store.list_budgets_any_endpoint(endpoint_ids=self.scope_ids)

    def budget(self, budget_id):
        """One budget in scope, or None (foreign, missing or malformed)."""
        wanted = str(budget_id)
        return next((b for b in self.budgets() if b.id == wanted), None)

    def _budget_scope(self, budget_id):
        budget = self.budget(budget_id)
        if budget is None:
            raise store.NotFound("no such budget")
        return store.Scope(budget.endpoint_id), budget.id

    def create_budget(self, endpoint_id, **fields):
        return store.create_budget(self._endpoint_scope(endpoint_id), **fields)

    def update_budget(self, budget_id, **changes):
        scope, budget_id = self._budget_scope(budget_id)
        return store.update_budget(scope, budget_id, **changes)

    def delete_budget(self, budget_id):
        scope, budget_id = self._budget_scope(budget_id)
        store.delete_budget(scope, budget_id)

    # --- Budget cards (the inbox) -------------------------------------------

    def exhausted_budgets(self):
        """The budgets in scope at their limit, their action in force."""
        return store.exhausted_budgets_any_endpoint(endpoint_ids=self.scope_ids)

    @cached_property
    def budget_card_count(self):
        return len(self.exhausted_budgets())

    @cached_property
    def inbox_count(self):
        """What waits for the user: open questions and budgets at their limit."""
        return self.open_question_count + self.budget_card_count

    def decide_budget(
        self, budget_id, decision, *, amount_usd=None, amount_tokens=None
    ):
        """Raise, resume or keep paused a budget in scope, as this user."""
        return store.decide_budget_any_endpoint(
            budget_id,
            decision,
            amount_usd,
            amount_tokens,
            endpoint_ids=self.scope_ids,
            actor=self.actor,
        )

    def budget_history(self, budget_id, *, limit=20):
        return store.budget_history_any_endpoint(
            budget_id, endpoint_ids=self.scope_ids, limit=limit
        )

    def spend(self, range_name, by, **narrow):
        """Spend over a range per endpoint, queue or group (store.spend)."""
        return spend.spend_series(
            range_name=range_name, by=by, endpoint_ids=self.scope_ids, **narrow
        )

    # --- Webhook sources ----------------------------------------------------

    def sources(self):
        """The webhook sources in scope: for an owner, those with routes, every
        one of them to an endpoint of theirs (a shared source is staff's)."""
        sources = WebhookSource.objects.all()
        if self.endpoint_ids is None:
            return sources
        foreign = ~Q(routes__endpoint__owner=self.user)
        return sources.annotate(
            routes_total=Count("routes"),
            routes_foreign=Count("routes", filter=foreign),
        ).filter(routes_total__gt=0, routes_foreign=0)

    def source(self, source_id):
        return self.sources().filter(id=source_id).first()

    def covers_source(self, source_id):
        return self.sources().filter(id=source_id).exists()

    def covers_route(self, route_id):
        route = WebhookRoute.objects.filter(id=route_id).first()
        return route is not None and self.covers_source(route.source_id)
