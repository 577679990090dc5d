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
    retry_many_any_endpoint,
    retry_matching_any_endpoint,
)
from .lifecycle import (  # noqa: F401
    CLAIM_NEXT_SQL,
    CLAIM_ONE_ANY_SQL,
    CLAIM_ONE_SQL,
    CLAIM_UPDATE,
    COMPLETE_SQL,
    CREATE_SQL,
    DUPLICATE_ON_RETRY,
    ENDPOINT_EXISTS_SQL,
    FAIL_SQL,
    HEARTBEAT_SQL,
    LIVE_DUPLICATE_SQL,
    OWNED,
    RELEASE_ANY_SQL,
    RELEASE_SET,
    RELEASE_SQL,
    RETRY_ANY_SQL,
    RETRY_SQL,
    claim_next,
    claim_todo,
    claim_todo_any_endpoint,
    complete_todo,
    create_todo,
    create_todo_any_endpoint,
    fail_todo,
    heartbeat,
    release_todo,
    release_todo_any_endpoint,
    retry_todo,
    retry_todo_any_endpoint,
)
from .reads import (  # noqa: F401
    EVENTS_SQL,
    GET_ANY_SQL,
    GET_SQL,
    NOTIFY_SQL,
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
    publish_todo_ready,
    todo_events_any_endpoint,
)
from .rows import (  # noqa: F401
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DOORBELL_CHANNEL,
    MAX_LEASE_SECONDS,
    TODO_COLUMNS,
    Conflict,
    Event,
    Moved,
    NotFound,
    QueueNotGranted,
    Scope,
    StoreError,
    Todo,
    Unavailable,
)
from .sql import (  # noqa: F401
    ANY_ENDPOINT,
    DOORBELL,
    EVENT_INSERT,
    LOOKUP_STATE_ANY_SQL,
    LOOKUP_STATE_SQL,
    REDELIVERABLE,
    SCOPED,
    _run,
    ping,
)
from .sweeps import (  # noqa: F401
    PURGE_TERMINAL_SQL,
    REAP_EXPIRED_SQL,
    REQUEUE_DUE_SQL,
    SWEEP_BATCH,
    purge_terminal,
    reap_expired,
    requeue_due_retries,
)
