"""The schema: endpoints, todos and their history.

The models own the tables and migrations; all todo reads and writes go through
``todos.store`` as raw, parameterized SQL. The partial indexes the store relies
on are created by explicit SQL in the migrations so that their predicates are
exactly the ones the store's queries name.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from todos.access import crypto, tokens

STATES = ("pending", "claimed", "done", "failed")
# A question's life beside the todo's state: open (the todo is held), then
# answered or expired (its deadline passed with no answer).
QUESTION_STATUSES = ("open", "answered", "expired")


class Endpoint(models.Model):
    """An agent credential owned by a human: the tenant boundary of every todo."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="endpoints"
    )
    # Queue names this endpoint may use; ["*"] grants every queue.
    queues = models.JSONField(default=list)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=16, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "endpoints"
        ordering = ["name", "created_at"]

    def __str__(self):
        return self.name

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def grants_every_queue(self) -> bool:
        return "*" in self.queues

    def grants(self, queue: str) -> bool:
        """Say whether this endpoint may use the named queue."""
        return self.grants_every_queue or queue in self.queues

    def granted_queues(self) -> tuple[str, ...] | None:
        """Return the granted queue names, or None when every queue is granted."""
        return None if self.grants_every_queue else tuple(self.queues)

    def set_new_token(self):
        """Mint a token, keep only its hash, and return it (the one time it is seen)."""
        token = tokens.generate_token()
        self.token_hash = tokens.hash_token(token)
        self.token_prefix = tokens.display_prefix(token)
        return token


class SqsCredential(models.Model):
    """An endpoint's SQS identity: an access key id, its secret and an account id.

    The secret signs every SigV4 request, so it is kept encrypted (not hashed);
    the account id is the first path segment of every queue URL and stays the
    same when the key is rotated.
    """

    endpoint = models.OneToOneField(
        Endpoint, on_delete=models.CASCADE, primary_key=True, related_name="sqs"
    )
    access_key_id = models.CharField(max_length=32, unique=True)
    secret_encrypted = models.TextField()
    account_id = models.CharField(max_length=12, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "sqs_credentials"

    def __str__(self):
        return self.access_key_id

    @property
    def secret_access_key(self):
        return crypto.decrypt(self.secret_encrypted)


class Todo(models.Model):
    """A durable work item; its lifecycle is driven only by ``todos.store``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: todos_endpoint_list_idx leads with endpoint_id and
    # serves the foreign key's checks; a second index costs WAL on every write.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.PROTECT, db_column="endpoint_id", db_index=False
    )
    queue = models.TextField()
    title = models.TextField(default="", blank=True)
    payload = models.JSONField(default=dict)
    state = models.TextField(
        db_default="pending", choices=[(state, state) for state in STATES]
    )
    assignee = models.TextField(null=True, blank=True)
    owner = models.TextField(null=True, blank=True)
    attempt = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=5)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.TextField(null=True, blank=True)
    last_error = models.TextField(db_default="", blank=True)
    result = models.JSONField(null=True, blank=True)
    # Minted fresh on every claim: the fencing token of the current lease.
    lease_token = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # When a claim may take it: created_at, or later for a delayed todo.
    available_at = models.DateTimeField(db_default=Now())
    # A question the owner asked ({"text", "choices", "answer_schema",
    # "asked_by", "return_to"}), while open the todo is held: pending with
    # available_at at the deadline (or far ahead), so no claim takes it.
    question = models.JSONField(null=True, blank=True)
    question_status = models.TextField(null=True, blank=True)
    asked_at = models.DateTimeField(null=True, blank=True)
    answer_deadline = models.DateTimeField(null=True, blank=True)
    # {"value", "by", "at"}; kept after the answer, for the next claimant.
    answer = models.JSONField(null=True, blank=True)
    # The current question's answer-link nonce, cleared when a link is used.
    answer_nonce = models.TextField(null=True, blank=True)
    # {"reason", "by", "at"}: a cancel asked of a claimed todo's owner.
    cancel_request = models.JSONField(null=True, blank=True)
    # Set when the todo ended canceled (state done).
    canceled_at = models.DateTimeField(null=True, blank=True)
    # The worker's last progress ({"message", "fraction"}) and checkpoint,
    # handed to every later claimant.
    progress = models.JSONField(null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    # A release's handoff note for the next claimant.
    note = models.TextField(null=True, blank=True)
    # A dead letter an operator dismissed from its group.
    dismissed_at = models.DateTimeField(null=True, blank=True)
    # Admission (CONTRACT §17): 1 is claimed first; the group whose limit
    # and turn it shares (``group`` is an SQL keyword, hence the column's
    # name); what it counts against a rate limit; a fair queue's start time.
    priority = models.SmallIntegerField(db_default=3)
    group = models.TextField(db_column="group_key", null=True, blank=True)
    cost = models.FloatField(db_default=1.0)
    fair_tag = models.FloatField(null=True, blank=True)
    # Tracing (CONTRACT §19): the W3C context a claim hands on, how many times
    # a claim handed the todo out (never given back, unlike attempt), and the
    # span events of a delivery that happen in other requests.
    trace_context = models.JSONField(null=True, blank=True)
    deliveries = models.IntegerField(db_default=0)
    trace_events = models.JSONField(null=True, blank=True)
    # Usage (CONTRACT §18): the current delivery's figure as last reported,
    # and the sum over the todo's attempts (usage_ledger holds each attempt's).
    usage = models.JSONField(null=True, blank=True)
    attempt_usage = models.JSONField(null=True, blank=True)
    # Spend budgets (CONTRACT §18): what one attempt may cost in USD, held
    # against the todo's budgets from its claim to the attempt's end.
    max_cost = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "todos"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=STATES), name="todos_state_check"
            ),
            models.CheckConstraint(
                condition=models.Q(max_attempts__gte=1), name="todos_max_attempts_check"
            ),
            models.CheckConstraint(
                condition=models.Q(attempt__gte=0), name="todos_attempt_check"
            ),
            models.CheckConstraint(
                condition=models.Q(question_status__in=QUESTION_STATUSES),
                name="todos_question_status_check",
            ),
        ]

    def __str__(self):
        return f"{self.queue}: {self.title or self.id}"


class TodoEvent(models.Model):
    """One lifecycle transition of a todo: the audit trail the Board shows."""

    id = models.BigAutoField(primary_key=True)
    # ON DELETE CASCADE is added in SQL by the migration: purging a todo purges
    # its history with it, in one statement.
    # The (todo_id, id) primary key serves the history read and the cascade;
    # another index on todo_id would cost WAL on every history row.
    todo = models.ForeignKey(
        Todo,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="todo_id",
        db_index=False,
    )
    endpoint_id = models.UUIDField()
    from_state = models.TextField(null=True, blank=True)
    to_state = models.TextField()
    attempt = models.IntegerField(default=0)
    actor = models.TextField(default="", blank=True)
    error = models.TextField(default="", blank=True)
    at = models.DateTimeField(db_default=Now())
    # A claim admitted under a limit: the group, its limit, the cost, the
    # admission's clock and the rate limits in force (the checker reads it).
    admission = models.JSONField(null=True, blank=True)
    # An acknowledgement that reported usage: the attempt's figure after it.
    usage = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "todo_events"
        # The primary key is (todo_id, id) in the database (migration
        # 0011_history_key): it serves the history read and the cascade, so no
        # other index is needed.

    def __str__(self):
        return f"{self.todo_id}: {self.from_state or 'new'} -> {self.to_state}"


class Queue(models.Model):
    """One endpoint's queue and its settings; created on first use of a name.

    A NULL setting follows the server's default (SWITCHBOARD_LEASE_SECONDS,
    SWITCHBOARD_MAX_ATTEMPTS, no delay).
    """

    id = models.BigAutoField(primary_key=True)
    # The unique (endpoint_id, name) index serves the foreign key.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, db_column="endpoint_id", db_index=False
    )
    name = models.TextField()
    lease_seconds = models.IntegerField(null=True, blank=True)
    max_attempts = models.IntegerField(null=True, blank=True)
    delay_seconds = models.IntegerField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # Admission (CONTRACT §17): at most this many claimed todos per group
    # (NULL = no limit), groups served in turn, rate limits
    # ({"count", "per_seconds", "burst"}), a level gained per so many seconds.
    group_concurrency = models.IntegerField(null=True, blank=True)
    fair = models.BooleanField(db_default=False)
    rate_limit = models.JSONField(null=True, blank=True)
    group_rate_limit = models.JSONField(null=True, blank=True)
    priority_aging_seconds = models.IntegerField(null=True, blank=True)
    # An SQS FIFO queue's attributes ({"ContentBasedDeduplication",
    # "DeduplicationScope", "FifoThroughputLimit"}); NULL for any other queue.
    sqs_fifo = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "queues"
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "name"], name="queues_endpoint_name_key"
            ),
        ]

    def __str__(self):
        return self.name


# --- Webhooks -------------------------------------------------------------------

WEBHOOK_SCHEMES = (
    ("github", "GitHub (X-Hub-Signature-256)"),
    ("hmac-sha256", "Generic HMAC-SHA256 header"),
    ("stripe", "Stripe (Stripe-Signature t=…,v1=…, timestamped)"),
    ("standard-webhooks", "Standard Webhooks (webhook-signature, timestamped)"),
)


class WebhookSource(models.Model):
    """A sender of signed deliveries, reached at ``POST /hooks/<slug>``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=100, unique=True)
    # Encrypted, not hashed like endpoint tokens: verifying an HMAC needs the
    # shared secret itself, and a hash of it cannot sign anything. Read and set
    # it through ``secret``; it is never shown again after creation, never
    # logged, and never part of a response.
    secret_encrypted = models.TextField()
    scheme = models.CharField(max_length=20, choices=WEBHOOK_SCHEMES, default="github")
    # Where the provider puts the signature, its delivery id (the idempotency
    # key of every todo it becomes) and its event name; blank = the scheme's
    # default (see todos.webhooks.signatures.SCHEMES).
    signature_header = models.CharField(max_length=100, blank=True, default="")
    delivery_header = models.CharField(max_length=100, blank=True, default="")
    event_header = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "webhook_sources"
        ordering = ["slug"]
        constraints = [
            # Verification looks the scheme up by name: refuse unknown ones.
            models.CheckConstraint(
                condition=models.Q(scheme__in=[key for key, _ in WEBHOOK_SCHEMES]),
                name="webhook_sources_scheme_check",
            ),
        ]

    def __str__(self):
        return self.slug

    @property
    def secret(self):
        return crypto.decrypt(self.secret_encrypted)

    @secret.setter
    def secret(self, value):
        self.secret_encrypted = crypto.encrypt(value)


class WebhookRoute(models.Model):
    """One target of a source's deliveries: a todo in this endpoint's queue."""

    id = models.BigAutoField(primary_key=True)
    source = models.ForeignKey(
        WebhookSource, on_delete=models.CASCADE, related_name="routes"
    )
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="webhook_routes"
    )
    queue = models.CharField(max_length=200)
    assignee = models.CharField(max_length=200, blank=True, default="")
    # A string.Template over $event, $action, $repository, $number, $title,
    # $delivery and $source; blank = the derived default title.
    title_template = models.CharField(max_length=500, blank=True, default="")
    # Admission control (CONTRACT §17): the todos' priority (null = the
    # default, 3) and their group, derived from each delivery by a template
    # over its payload, e.g. "{repository.full_name}"; blank = no group.
    priority = models.PositiveSmallIntegerField(null=True, blank=True)
    group_template = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        db_table = "webhook_routes"
        ordering = ["id"]
        constraints = [
            # Two routes to one (endpoint, queue) would collide on the same
            # dedupe slot: the second could never hold a todo of its own.
            models.UniqueConstraint(
                fields=["source", "endpoint", "queue"],
                name="webhook_routes_one_per_target",
            ),
        ]

    def __str__(self):
        return f"{self.source.slug} → {self.endpoint_id}:{self.queue}"


class WebhookDelivery(models.Model):
    """One accepted delivery and what it became, per target (the Board's log)."""

    id = models.BigAutoField(primary_key=True)
    source = models.ForeignKey(
        WebhookSource, on_delete=models.CASCADE, related_name="deliveries"
    )
    delivery_id = models.CharField(max_length=200)
    event = models.CharField(max_length=100, blank=True, default="")
    received_at = models.DateTimeField(db_default=Now())
    # created | duplicate | ping: did any target get a new todo?
    status = models.CharField(max_length=20)
    # [{"endpoint_id", "queue", "todo_id", "created", "skipped"}, ...]
    outcome = models.JSONField(default=list)

    class Meta:
        db_table = "webhook_deliveries"
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["source", "-id"], name="webhook_deliveries_recent"),
        ]

    def __str__(self):
        return f"{self.source_id}:{self.delivery_id}"


class WebhookSignatureSeen(models.Model):
    """A timestamped delivery's signature, remembered while a replay of it
    would still be inside the tolerance window (so any process refuses it)."""

    id = models.BigAutoField(primary_key=True)
    source = models.ForeignKey(
        WebhookSource, on_delete=models.CASCADE, related_name="signatures_seen"
    )
    # The hex HMAC of the signed content (timestamp, body and, for Standard
    # Webhooks, the message id): the same for every replay of one delivery.
    signature = models.CharField(max_length=64)
    # The timestamp the sender signed; the row goes once a replay is stale.
    signed_at = models.DateTimeField()

    class Meta:
        db_table = "webhook_signatures_seen"
        constraints = [
            models.UniqueConstraint(
                fields=["source", "signature"], name="webhook_signatures_seen_once"
            ),
        ]
        indexes = [
            models.Index(
                fields=["source", "signed_at"], name="webhook_signatures_seen_age"
            ),
        ]

    def __str__(self):
        return f"{self.source_id}:{self.signature[:12]}"


class McpSession(models.Model):
    """An MCP session: minted by ``initialize``, bound to one endpoint, ended by DELETE.

    It lives in PostgreSQL, not in a worker's memory, so any gunicorn process
    can serve any request of the session, and a DELETE ends it everywhere.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="mcp_sessions"
    )
    protocol_version = models.CharField(max_length=20)
    client_name = models.CharField(max_length=200, blank=True, default="")
    client_version = models.CharField(max_length=100, blank=True, default="")
    # The minimum level of notifications/message the client asked for.
    log_level = models.CharField(max_length=20, default="info")
    created_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "mcp_sessions"
        indexes = [
            models.Index(fields=["endpoint", "last_seen_at"], name="mcp_sessions_idle"),
        ]

    def __str__(self):
        return str(self.id)


# --- Board statistics -----------------------------------------------------------


class UsageReport(models.Model):
    """What an agent spent: one row per attempt of a todo, its running total
    as last reported, or one report made outside a todo, against a queue.

    No foreign keys: a purged todo's spend stays spent (``todos.store.usage``
    writes and reads it).
    """

    id = models.BigAutoField(primary_key=True)
    endpoint_id = models.UUIDField()
    queue = models.TextField()
    group = models.TextField(db_column="group_key", null=True, blank=True)
    todo_id = models.UUIDField(null=True, blank=True)
    # The todo's deliveries at the report (never goes back, unlike attempt).
    delivery = models.IntegerField(null=True, blank=True)
    attempt = models.IntegerField(null=True, blank=True)
    input_tokens = models.BigIntegerField(db_default=0)
    output_tokens = models.BigIntegerField(db_default=0)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=6, db_default=0)
    model = models.TextField(db_default="", blank=True)
    idempotency_key = models.TextField(null=True, blank=True)
    reported_at = models.DateTimeField(db_default=Now())
    # The row's figures and report time before its last replacement (NULL
    # for a new row): what the budgets had counted of it, so a replacement
    # counts only its difference (``switchboard_budget_spend``).
    prev_cost_usd = models.DecimalField(
        max_digits=20, decimal_places=6, null=True, blank=True
    )
    prev_tokens = models.BigIntegerField(null=True, blank=True)
    prev_reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "usage_ledger"
        indexes = [
            models.Index(
                fields=["endpoint_id", "queue", "reported_at"],
                name="usage_ledger_scope_idx",
            )
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["todo_id", "delivery"], name="usage_ledger_attempt_key"
            ),
            models.UniqueConstraint(
                fields=["endpoint_id", "idempotency_key"],
                name="usage_ledger_report_key",
            ),
        ]

    def __str__(self):
        return f"{self.queue}: ${self.cost_usd}"


class Budget(models.Model):
    """A spend limit on an endpoint, a queue or a group in an hour, day or
    month of its time zone (``todos.store.budgets``).

    No foreign key to ``endpoints``, as ``queue_groups``: Django's test flush
    truncates ``endpoints``, and budgets are read by endpoint id only.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint_id = models.UUIDField()
    scope = models.TextField(
        choices=[(kind, kind) for kind in ("endpoint", "queue", "group")]
    )
    queue = models.TextField(null=True, blank=True)
    group = models.TextField(db_column="group_key", null=True, blank=True)
    # ``window`` is an SQL keyword, hence the column's name.
    window = models.TextField(
        db_column="window_unit",
        choices=[(unit, unit) for unit in ("hour", "day", "month")],
    )
    time_zone = models.TextField(db_default="UTC")
    limit_usd = models.DecimalField(
        max_digits=20, decimal_places=6, null=True, blank=True
    )
    limit_tokens = models.BigIntegerField(null=True, blank=True)
    soft_percent = models.IntegerField(db_default=80)
    action = models.TextField(
        db_default="pause",
        choices=[(action, action) for action in ("pause", "reject_new")],
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # The current window's running figures, kept by the statement that
    # writes a ledger row (``switchboard_budget_count``); a report in a later
    # window rolls them over.
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    spent_usd = models.DecimalField(max_digits=20, decimal_places=6, db_default=0)
    spent_tokens = models.BigIntegerField(db_default=0)
    # Set by the report that reached the soft threshold or the limit.
    soft_reached_at = models.DateTimeField(null=True, blank=True)
    exhausted_at = models.DateTimeField(null=True, blank=True)
    # The owner's decisions for the current window: extra allowed, resumed.
    raised_usd = models.DecimalField(max_digits=20, decimal_places=6, db_default=0)
    raised_tokens = models.BigIntegerField(db_default=0)
    resumed_at = models.DateTimeField(null=True, blank=True)
    # The action (pause or reject_new) holds until then (the window's end):
    # what a claim or a create reads, through budgets_in_force_idx.
    in_force_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "budgets"
        indexes = [
            models.Index(fields=["endpoint_id"], name="budgets_endpoint_idx"),
            models.Index(
                fields=["endpoint_id"],
                name="budgets_in_force_idx",
                condition=models.Q(in_force_until__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__in=("endpoint", "queue", "group")),
                name="budgets_scope_check",
            ),
            models.CheckConstraint(
                condition=models.Q(window__in=("hour", "day", "month")),
                name="budgets_window_check",
            ),
            models.CheckConstraint(
                condition=models.Q(action__in=("pause", "reject_new")),
                name="budgets_action_check",
            ),
        ]

    def __str__(self):
        return f"{self.scope} {self.queue or ''} {self.window}"


class BudgetEvent(models.Model):
    """A budget's history: ``budget.soft_limit``, ``budget.exhausted`` and
    ``budget.resumed`` as they happen, and each owner decision (who, when,
    what) as ``budget.decision``. No foreign key: a deleted budget's history
    goes with ``budgets_events_budget_idx``'s rows when it is deleted."""

    id = models.BigAutoField(primary_key=True)
    budget_id = models.UUIDField()
    endpoint_id = models.UUIDField()
    event = models.TextField()
    actor = models.TextField(db_default="", blank=True)
    detail = models.JSONField(null=True, blank=True)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "budget_events"
        indexes = [
            models.Index(fields=["budget_id", "id"], name="budget_events_budget_idx"),
            models.Index(
                fields=["endpoint_id", "id"], name="budget_events_endpoint_idx"
            ),
        ]

    def __str__(self):
        return self.event


class TodoMinute(models.Model):
    """Transitions per (endpoint, queue, minute), rolled up by the sweep loop.

    The Board's charts and the metrics' counters read these few rows instead of
    the history: ``todos.store`` (``roll_up_minutes``) re-counts the open
    minutes from ``todo_events`` on each sweep pass. ``pending`` is the queue's
    depth sampled at the last pass of the minute (NULL when none sampled it).
    """

    pk = models.CompositePrimaryKey("endpoint_id", "queue", "minute")
    endpoint_id = models.UUIDField()
    queue = models.TextField()
    minute = models.DateTimeField()
    created = models.IntegerField(db_default=0)
    claimed = models.IntegerField(db_default=0)
    completed = models.IntegerField(db_default=0)
    failed = models.IntegerField(db_default=0)
    dead_lettered = models.IntegerField(db_default=0)
    retried = models.IntegerField(db_default=0)
    canceled = models.IntegerField(db_default=0)
    pending = models.IntegerField(null=True)

    class Meta:
        db_table = "todo_minutes"
        indexes = [models.Index(fields=["minute"], name="todo_minutes_minute_idx")]

    def __str__(self):
        return f"{self.endpoint_id}:{self.queue}@{self.minute:%H:%M}"


class TransitionTotal(models.Model):
    """Every transition of an (endpoint, queue) in the minutes already closed and
    folded out of the open window: the base of the metrics' counters."""

    pk = models.CompositePrimaryKey("endpoint_id", "queue")
    endpoint_id = models.UUIDField()
    queue = models.TextField()
    created = models.BigIntegerField(db_default=0)
    claimed = models.BigIntegerField(db_default=0)
    completed = models.BigIntegerField(db_default=0)
    failed = models.BigIntegerField(db_default=0)
    dead_lettered = models.BigIntegerField(db_default=0)
    retried = models.BigIntegerField(db_default=0)
    canceled = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "todo_transition_totals"

    def __str__(self):
        return f"{self.endpoint_id}:{self.queue}"


class RollupState(models.Model):
    """One row: the minute up to which transitions are folded into the totals."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    folded_through = models.DateTimeField(null=True)

    class Meta:
        db_table = "todo_rollup_state"

    def __str__(self):
        return f"folded through {self.folded_through}"


class UsageTotal(models.Model):
    """What an (endpoint, queue) spent, summed over its ledger rows as the
    sweep loop last folded them: the metrics' spend counters."""

    pk = models.CompositePrimaryKey("endpoint_id", "queue")
    endpoint_id = models.UUIDField()
    queue = models.TextField()
    cost_usd = models.DecimalField(max_digits=24, decimal_places=6, db_default=0)
    input_tokens = models.BigIntegerField(db_default=0)
    output_tokens = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "usage_totals"

    def __str__(self):
        return f"{self.endpoint_id}:{self.queue}"


class UsageMinute(models.Model):
    """What agents reported spending per (endpoint, queue, group, minute), as
    the sweep loop folds the ledger: the Board's spend charts. A row's group
    is "" when its reports named none."""

    pk = models.CompositePrimaryKey("endpoint_id", "queue", "group", "minute")
    endpoint_id = models.UUIDField()
    queue = models.TextField()
    group = models.TextField(db_column="group_key", db_default="")
    minute = models.DateTimeField()
    cost_usd = models.DecimalField(max_digits=24, decimal_places=6, db_default=0)
    tokens = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "usage_minutes"
        indexes = [models.Index(fields=["minute"], name="usage_minutes_minute_idx")]

    def __str__(self):
        return f"{self.endpoint_id}:{self.queue}@{self.minute:%H:%M}"


class UsageFolded(models.Model):
    """A ledger row's figures as last folded into ``usage_totals``: a row a
    later report changed adds only its difference."""

    id = models.BigIntegerField(primary_key=True)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=6)
    input_tokens = models.BigIntegerField()
    output_tokens = models.BigIntegerField()

    class Meta:
        db_table = "usage_folded"

    def __str__(self):
        return f"ledger row {self.id}"


class UsageRollupState(models.Model):
    """One row: when the last fold of the ledger started."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    folded_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "usage_rollup_state"

    def __str__(self):
        return f"folded at {self.folded_at}"


# --- Schedules ------------------------------------------------------------------

SCHEDULE_OVERLAP = ("allow", "skip")
SCHEDULE_MISSED = ("skip", "one", "all")


class Schedule(models.Model):
    """A recurring todo of one endpoint: fired by the sweep, one todo per slot.

    ``next_slot_at`` is the next slot not yet fired or skipped (UTC); the sweep
    locks a due row, creates its slots' todos and advances it in one
    transaction (``todos.store.schedules``). ``fires``, ``skips`` and
    ``lateness_seconds`` are the /metrics counters, kept on the row so every
    sweep process adds to the same ones.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # The unique (endpoint_id, name) index serves the foreign key.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, db_column="endpoint_id", db_index=False
    )
    name = models.TextField()
    queue = models.TextField()
    # Exactly one of the two: a five-field cron expression (read in time_zone)
    # or a fixed interval counted from the Unix epoch.
    cron = models.TextField(null=True, blank=True)
    every_seconds = models.IntegerField(null=True, blank=True)
    time_zone = models.TextField(db_default="UTC")
    # The create body of each slot's todo (title, payload, max_attempts, …).
    todo = models.JSONField(default=dict)
    overlap = models.TextField(
        db_default="allow", choices=[(o, o) for o in SCHEDULE_OVERLAP]
    )
    missed = models.TextField(
        db_default="skip", choices=[(m, m) for m in SCHEDULE_MISSED]
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    next_slot_at = models.DateTimeField()
    last_slot_at = models.DateTimeField(null=True, blank=True)
    # The todo of the last slot fired (overlap "skip" asks whether it is live);
    # no foreign key: purging terminal todos leaves the schedule alone.
    last_todo_id = models.UUIDField(null=True, blank=True)
    fires = models.BigIntegerField(db_default=0)
    skips = models.BigIntegerField(db_default=0)
    # The sum, over the slots fired by the sweep, of slot time to todo created.
    lateness_seconds = models.FloatField(db_default=0)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "schedules"
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "name"], name="schedules_endpoint_name_key"
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(cron__isnull=False, every_seconds__isnull=True)
                    | models.Q(cron__isnull=True, every_seconds__isnull=False)
                ),
                name="schedules_cron_or_every_check",
            ),
            models.CheckConstraint(
                condition=models.Q(every_seconds__gte=1),
                name="schedules_every_seconds_check",
            ),
            models.CheckConstraint(
                condition=models.Q(overlap__in=SCHEDULE_OVERLAP),
                name="schedules_overlap_check",
            ),
            models.CheckConstraint(
                condition=models.Q(missed__in=SCHEDULE_MISSED),
                name="schedules_missed_check",
            ),
        ]
        indexes = [
            # The sweep's scan: the running schedules, the most overdue first.
            models.Index(
                fields=["next_slot_at"],
                condition=models.Q(paused_at__isnull=True),
                name="schedules_due_idx",
            ),
        ]

    def __str__(self):
        return self.name


class ScheduleFire(models.Model):
    """One slot of a schedule that made its todo: the unique key on
    (schedule, slot) is what makes a slot fire once, whatever runs at once."""

    id = models.BigAutoField(primary_key=True)
    # ON DELETE CASCADE is added in SQL by the migration: deleting a schedule
    # takes its fires with it, in one statement. The unique (schedule_id,
    # slot) index serves the cascade.
    schedule = models.ForeignKey(
        Schedule,
        on_delete=models.CASCADE,
        db_column="schedule_id",
        db_constraint=False,
        db_index=False,
        related_name="fire_rows",
    )
    slot = models.DateTimeField()
    # No foreign key: purging a terminal todo keeps the record of the slot.
    todo_id = models.UUIDField(null=True, blank=True)
    # A "fire now" of the API, not a slot of the recurrence.
    manual = models.BooleanField(db_default=False)
    fired_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "schedule_fires"
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "slot"], name="schedule_fires_once"
            ),
        ]

    def __str__(self):
        return f"{self.schedule_id}@{self.slot:%Y-%m-%d %H:%M}"
