"""The todo store: every todo read and write, as parameterized SQL.

This package is the only place that writes todo SQL. Each lifecycle transition is
one conditional statement (``UPDATE … WHERE id = … AND state = … AND owner = …``)
that also appends its ``todo_events`` row and, when the todo becomes claimable,
rings the doorbell with ``pg_notify`` — all in the statement's own transaction,
so a transition, its history and its wakeup commit or vanish together. When the
conditional statement matches no row, one lookup classifies the miss:
``NotFound`` when the todo is absent, foreign or the id is malformed;
``Conflict`` when it exists in the caller's scope but not in the needed state.

Caller-facing functions take a ``Scope`` (the authenticated endpoint and its
queue grant) and predicate every query on it. The ``*_any_endpoint`` twins are
for the operator Board only. The sweeps (``reap_expired``,
``requeue_due_retries``, ``purge_terminal``) are system-wide by design
(SPEC-0003 "Background sweeps are exempt").

Time always comes from PostgreSQL's clock (``now()``), never from Python, so
every process agrees on when a lease lapses, and tests move time by editing
timestamps in the database.

Layout: ``rows`` (values and errors), ``sql`` (shared plumbing), ``lifecycle``
(create, claim, owner transitions, retry), ``reads``, ``sweeps``, ``board``
(operator queries), ``queues`` (queue settings). ``from todos import store`` and
``store.<name>`` keep working: every public name is re-exported here.
"""

from .board import (  # noqa: F401
    BULK_RETRY_BATCH,
    BULK_RETRY_LIMIT,
    KEY_HELD_ELSEWHERE,
    KEYSET_START,
    LAPSED_OVERVIEW_SQL,
    LIVE_OVERVIEW_SQL,
    RETRY_BATCH_IDS_SQL,
    RETRY_BATCH_SQL,
    RETRYABLE_COUNT_SQL,
    TERMINAL_COUNT_CAP,
    TERMINAL_OVERVIEW_SQL,
    BulkRetry,
    Overview,
    QueueCounts,
    board_overview,
    count_key_held_any_endpoint,
    count_retryable_any_endpoint,
    overview_sql,
    retry_many_any_endpoint,
    retry_matching_any_endpoint,
)
from .lifecycle import (  # noqa: F401
    ACK_SQL,
    CLAIM_ONE_SQL,
    CLAIM_SQL,
    CLAIMABLE,
    CREATE_FIELDS,
    CREATE_MANY_SQL,
    CREATE_SQL,
    DEDUPE_INDEX,
    DUPLICATE_ON_RETRY,
    ENDPOINT_EXISTS_SQL,
    KEY_HELD_OUTSIDE_GRANT,
    LIVE_DUPLICATE_SQL,
    LIVE_DUPLICATES_SQL,
    LOOKUP_SQL,
    OPS,
    OWNED,
    RELEASE_ANY_SQL,
    RETRY_SQL,
    T_COLUMNS,
    Ack,
    acknowledge_many,
    bind_acks,
    bind_claim,
    bind_create,
    claim_many,
    claim_next,
    claim_todo,
    claim_todo_any_endpoint,
    complete_todo,
    create_many,
    create_todo,
    create_todo_any_endpoint,
    fail_todo,
    heartbeat,
    is_dedupe_violation,
    release_todo,
    release_todo_any_endpoint,
    retry_todo,
    retry_todo_any_endpoint,
)
from .queues import (  # noqa: F401
    DELETE_QUEUE_SQL,
    ENSURE_SQL,
    KEEP,
    MAX_ATTEMPTS_CAP,
    PURGE_SQL,
    QUEUE_EXISTS_SQL,
    QUEUES_SQL,
    RESUME_RING_SQL,
    UPDATE_SQL,
    QueueInfo,
    delete_queue,
    ensure_queue,
    get_queue,
    get_queue_any_endpoint,
    list_queues,
    list_queues_any_endpoint,
    pause_queue,
    pause_queue_any_endpoint,
    purge_queue,
    queue_exists,
    resume_queue,
    resume_queue_any_endpoint,
    update_queue,
    update_queue_any_endpoint,
)
from .reads import (  # noqa: F401
    EVENTS_SQL,
    GET_SQL,
    NO_ERROR_GROUP,
    PENDING_DOORBELL_SQL,
    STATE_FILTERS,
    Page,
    decode_cursor,
    encode_cursor,
    get_todo,
    get_todo_any_endpoint,
    list_todos,
    list_todos_any_endpoint,
    pending_doorbell_todos,
    todo_events_any_endpoint,
)
from .rows import (  # noqa: F401
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DOORBELL_CHANNEL,
    MAX_ACK_BATCH,
    MAX_CLAIM_BATCH,
    MAX_CREATE_BATCH,
    MAX_DELAY_SECONDS,
    MAX_LEASE_SECONDS,
    TERMINAL_FIGURE_CAP,
    TODO_COLUMN_COUNT,
    TODO_COLUMNS,
    Conflict,
    Event,
    KeyHeld,
    LeaseSuperseded,
    Moved,
    NotFound,
    QueueNotGranted,
    Scope,
    StoreError,
    Todo,
    Unavailable,
)
from .sql import (  # noqa: F401
    DOORBELL,
    EVENT_INSERT,
    LIVE_ROW,
    OUTAGES,
    REDELIVERABLE,
    SCOPED,
    _run,
    is_outage,
    ping,
)
from .sweeps import (  # noqa: F401
    LOOK_BACK_SQL,
    PURGE_TERMINAL_SQL,
    REAP_EXPIRED_SQL,
    REQUEUE_DUE_SQL,
    RING_DUE_DELAYED_SQL,
    SWEEP_BATCH,
    purge_terminal,
    reap_expired,
    requeue_due_retries,
    ring_due_delayed,
)
