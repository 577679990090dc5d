"""Queue settings (the ``queues`` table): defaults per queue, pause and resume,
and the SQS surface's existence check, purge and delete.

A queue row is made on the first use of its name (create_todo, ensure_queue).
A NULL setting follows the server's default; ``QueueInfo`` shows the value in
force. A paused queue accepts creates; claims pass over it. Purging a queue
deletes its live todos (SQS's PurgeQueue); deleting it removes the row and
every todo of it (SQS's DeleteQueue).
"""

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal, Self, TypedDict, Unpack

from django.conf import settings

from .rows import (
    MAX_DELAY_SECONDS,
    MAX_LEASE_SECONDS,
    TERMINAL_FIGURE_CAP,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Row,
    Scope,
    _iso,
    _json,
)
from .sql import (
    Statement,
    Steps,
    _run,
    _scope,
    _scope_params,
    _uuid,
    on_django,
    on_pool,
    ring_due,
)

MAX_ATTEMPTS_CAP = 1000
# An attempt cap no todo reaches (PostgreSQL's largest integer): a queue with
# it redelivers without limit, as an SQS queue without a RedrivePolicy does.
UNLIMITED_ATTEMPTS = 2_147_483_647


@dataclass(frozen=True)
class QueueInfo:
    """One queue of one endpoint: its settings in force and its live figures."""

    endpoint_id: str
    name: str
    lease_seconds: int
    max_attempts: int
    delay_seconds: int
    paused: bool
    paused_at: datetime | None
    created_at: datetime
    updated_at: datetime
    pending: int = 0
    delayed: int = 0
    claimed: int = 0
    retry_scheduled: int = 0
    # Counted up to TERMINAL_FIGURE_CAP + 1, like the Board's terminal counts.
    dead_letter: int = 0
    oldest_pending_age_seconds: float | None = None
    # Of ``claimed``: those whose lease has run out though no reaper has moved
    # them yet (the Board's "lapsed"). Below the attempt cap the next claim
    # takes one at once; at the cap the reaper dead-letters it.
    lapsed: int = 0
    # Pending todos held for an answer (CONTRACT §14): neither visible nor
    # delayed, as no claim takes them until they are answered.
    held: int = 0
    # Admission (CONTRACT §17): the settings, and how many groups have as
    # many claimed as their limit.
    group_concurrency: int | None = None
    fair: bool = False
    rate_limit: JSONObject | None = None
    group_rate_limit: JSONObject | None = None
    priority_aging_seconds: int | None = None
    groups_at_limit: int = 0

    @classmethod
    def from_row(cls, row: Row) -> Self:
        (
            endpoint_id,
            name,
            lease,
            attempts,
            delay,
            paused_at,
            created,
            updated,
            pending,
            delayed,
            claimed,
            retry_scheduled,
            dead_letter,
            age,
            lapsed,
            held,
            group_concurrency,
            fair,
            rate_limit,
            group_rate_limit,
            aging,
            at_limit,
        ) = row
        return cls(
            endpoint_id=str(endpoint_id),
            name=name,
            lease_seconds=(
                settings.SWITCHBOARD_LEASE_SECONDS if lease is None else lease
            ),
            max_attempts=(
                settings.SWITCHBOARD_MAX_ATTEMPTS if attempts is None else attempts
            ),
            delay_seconds=0 if delay is None else delay,
            paused=paused_at is not None,
            paused_at=paused_at,
            created_at=created,
            updated_at=updated,
            pending=pending,
            delayed=delayed,
            claimed=claimed,
            retry_scheduled=retry_scheduled,
            dead_letter=dead_letter,
            oldest_pending_age_seconds=None if age is None else float(age),
            lapsed=lapsed,
            held=held,
            group_concurrency=group_concurrency,
            fair=bool(fair),
            rate_limit=_json(rate_limit),
            group_rate_limit=_json(group_rate_limit),
            priority_aging_seconds=aging,
            groups_at_limit=at_limit,
        )

    def to_dict(self) -> JSONObject:
        out: JSONObject = {}
        for field in fields(self):
            value = getattr(self, field.name)
            out[field.name] = _iso(value) if isinstance(value, datetime) else value
        return out


# The queues in scope with their live figures. ``live`` reads the endpoint's
# live rows of one queue through todos_live_overview_idx (its WHERE is that
# index's predicate); ``dead`` counts dead letters up to the cap. The terminal
# backlog (done rows) is never read.
QUEUES_SQL = """
SELECT q.endpoint_id, q.name, q.lease_seconds, q.max_attempts, q.delay_seconds,
       q.paused_at, q.created_at, q.updated_at,
       live.pending, live.delayed, live.claimed, live.retry_scheduled, dead.n,
       live.oldest_age, live.lapsed, live.held, q.group_concurrency, q.fair,
       q.rate_limit, q.group_rate_limit, q.priority_aging_seconds, at_limit.n
  FROM queues q
 CROSS JOIN (SELECT statement_timestamp() AS at) clock
 CROSS JOIN LATERAL (
     SELECT count(*) FILTER (WHERE state = 'pending' AND available_at <= clock.at)
                AS pending,
            count(*) FILTER (WHERE state = 'pending' AND available_at > clock.at
                             AND question_status IS DISTINCT FROM 'open')
                AS delayed,
            count(*) FILTER (WHERE state = 'pending' AND available_at > clock.at
                             AND question_status = 'open') AS held,
            count(*) FILTER (WHERE state = 'claimed') AS claimed,
            -- Lapsed as the claim scan and the reaper judge it (sql.REDELIVERABLE).
            count(*) FILTER (WHERE state = 'claimed'
                             AND lease_expires_at < clock.at) AS lapsed,
            count(*) FILTER (WHERE state = 'failed') AS retry_scheduled,
            EXTRACT(EPOCH FROM clock.at - min(available_at)
                FILTER (WHERE state = 'pending' AND available_at <= clock.at))
                AS oldest_age
       FROM todos t
      WHERE t.endpoint_id = q.endpoint_id AND t.queue = q.name
        AND (t.state IN ('pending', 'claimed')
             OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))) live
 CROSS JOIN LATERAL (
     SELECT count(*) AS n FROM (
         SELECT 1 FROM todos d
          WHERE d.endpoint_id = q.endpoint_id AND d.queue = q.name
            AND d.state = 'failed' AND d.next_retry_at IS NULL
          LIMIT %(cap)s + 1) capped) dead
 CROSS JOIN LATERAL (
     SELECT count(*) AS n FROM (
         SELECT t.group_key, count(*) AS in_flight FROM todos t
          WHERE t.endpoint_id = q.endpoint_id AND t.queue = q.name
            AND t.state = 'claimed' AND t.group_key IS NOT NULL
          GROUP BY t.group_key) busy
       LEFT JOIN queue_groups g
         ON g.endpoint_id = q.endpoint_id AND g.queue = q.name
        AND g.group_key = busy.group_key
      WHERE busy.in_flight >= coalesce(g.concurrency, q.group_concurrency)) at_limit
 WHERE (%(operator)s OR (q.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR q.name = ANY(%(queues)s::text[]))))
   AND (%(endpoint_ids)s::uuid[] IS NULL OR q.endpoint_id = ANY(%(endpoint_ids)s))
   AND (%(name)s::text IS NULL OR q.name = %(name)s)
 ORDER BY q.endpoint_id, q.name
"""


def _queues(
    scope: Scope | None,
    *,
    name: str | None = None,
    endpoint_ids: list[str] | None = None,
) -> list[QueueInfo]:
    params = {
        **_scope(scope),
        "cap": TERMINAL_FIGURE_CAP,
        "name": name,
        "endpoint_ids": endpoint_ids,
    }
    return [QueueInfo.from_row(row) for row in _run("queues", QUEUES_SQL, params)]


def _one(scope: Scope, name: str) -> QueueInfo:
    found = _queues(scope, name=name)
    if not found:
        raise NotFound("no such queue")
    return found[0]


def _granted(scope: Scope, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("queue name must be a non-empty string")
    if not scope.covers(name):
        raise QueueNotGranted(name)


def list_queues(scope: Scope) -> list[QueueInfo]:
    """Return this endpoint's queues (in its grant), by name, with live figures."""
    return _queues(scope)


def get_queue(scope: Scope, name: str) -> QueueInfo:
    """Return one queue of this endpoint; NotFound when it never was used."""
    _granted(scope, name)
    return _one(scope, name)


KEEP = object()


class QueueSettings(TypedDict, total=False):
    """The settings a queue update names (None puts back the server's default)."""

    lease_seconds: int | None
    max_attempts: int | None
    delay_seconds: int | None


# What an update does to the pause: pause, resume, or leave it (None).
Pause = Literal["pause", "resume"] | None


def _settings(
    lease_seconds: object, max_attempts: object, delay_seconds: object
) -> dict[str, object]:
    """Validate the settings given (KEEP = not given, None = the server's)."""
    checks = {
        # 0: a claim that names no lease gets one that ends as it begins
        # (SQS's VisibilityTimeout 0: received, and visible again at once).
        "lease_seconds": (lease_seconds, 0, MAX_LEASE_SECONDS),
        "max_attempts": (max_attempts, 1, MAX_ATTEMPTS_CAP),
        "delay_seconds": (delay_seconds, 0, MAX_DELAY_SECONDS),
    }
    out: dict[str, object] = {}
    for field, (value, low, high) in checks.items():
        if value is KEEP:
            out[f"set_{field}"], out[field] = False, None
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 30.0 is 30, as JSON Schema reads it
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{field} must be a whole number")
            unlimited = field == "max_attempts" and value == UNLIMITED_ATTEMPTS
            if not low <= value <= high and not unlimited:
                raise ValueError(f"{field} must be between {low} and {high}")
        out[f"set_{field}"], out[field] = True, value
    return out


# Make the queue if it is missing, with the settings given; an existing queue
# keeps its own. RETURNING says whether this call made it.
ENSURE_SQL = """
INSERT INTO queues (endpoint_id, name, lease_seconds, max_attempts, delay_seconds)
SELECT e.id, %(name)s, %(lease_seconds)s, %(max_attempts)s, %(delay_seconds)s
  FROM endpoints e WHERE e.id = %(endpoint_id)s
ON CONFLICT (endpoint_id, name) DO NOTHING
RETURNING id
"""


def ensure_queue(
    scope: Scope,
    name: str,
    *,
    lease_seconds: int | None = None,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
) -> tuple[QueueInfo, bool]:
    """Make the queue if missing (with these settings); return (QueueInfo, created)."""
    _granted(scope, name)
    bound = _settings(lease_seconds, max_attempts, delay_seconds)
    params = {**bound, **_scope(scope), "name": name}
    created = _run("ensure_queue", ENSURE_SQL, params, fetch="one") is not None
    return _one(scope, name), created


# Change the settings named (set_* = TRUE); NULL puts back the server's
# default. Pausing keeps the first pause's time.
UPDATE_SQL = """
UPDATE queues
   SET lease_seconds = CASE WHEN %(set_lease_seconds)s THEN %(lease_seconds)s::int
                            ELSE lease_seconds END,
       max_attempts = CASE WHEN %(set_max_attempts)s THEN %(max_attempts)s::int
                           ELSE max_attempts END,
       delay_seconds = CASE WHEN %(set_delay_seconds)s THEN %(delay_seconds)s::int
                            ELSE delay_seconds END,
       paused_at = CASE %(pause)s::text
                        WHEN 'pause' THEN coalesce(paused_at, now())
                        WHEN 'resume' THEN NULL
                        ELSE paused_at END,
       updated_at = now()
 WHERE (%(operator)s OR (endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))))
   AND (NOT %(operator)s OR endpoint_id = %(target_endpoint)s::uuid)
   AND name = %(name)s
RETURNING endpoint_id
"""


def _update(
    scope: Scope | None,
    endpoint_id: str | None,
    name: str,
    pause: Pause = None,
    **given: Unpack[QueueSettings],
) -> QueueInfo:
    bound = _settings(
        given.get("lease_seconds", KEEP),
        given.get("max_attempts", KEEP),
        given.get("delay_seconds", KEEP),
    )
    params = {
        **bound,
        **_scope(scope),
        "target_endpoint": endpoint_id,
        "name": name,
        "pause": pause,
    }
    row = _run("update_queue", UPDATE_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such queue")
    (queue_endpoint_id,) = row
    if pause == "resume":
        # Its waiting claims look again: its due todos ring.
        ring_due("resume_queue", str(queue_endpoint_id), name)
    if scope is None:
        return get_queue_any_endpoint(str(queue_endpoint_id), name)
    return _one(scope, name)


def update_queue(
    scope: Scope, name: str, **settings_: Unpack[QueueSettings]
) -> QueueInfo:
    """Change a queue's settings (lease_seconds, max_attempts, delay_seconds).

    Only the settings given change; None puts back the server's default.
    """
    _granted(scope, name)
    _check_names(settings_)
    return _update(scope, None, name, **settings_)


def pause_queue(scope: Scope, name: str) -> QueueInfo:
    """Pause a queue: it still accepts creates; claims pass over it."""
    _granted(scope, name)
    return _update(scope, None, name, pause="pause")


def resume_queue(scope: Scope, name: str) -> QueueInfo:
    """Resume a paused queue and ring its doorbell."""
    _granted(scope, name)
    return _update(scope, None, name, pause="resume")


def _check_names(given: Iterable[str]) -> None:
    unknown = set(given) - {"lease_seconds", "max_attempts", "delay_seconds"}
    if unknown:
        raise ValueError(f"unknown queue setting {sorted(unknown)[0]!r}")


def _endpoint(endpoint_id: object) -> str:
    endpoint = _uuid(endpoint_id)
    if endpoint is None:
        raise NotFound("no such queue")
    return endpoint


# --- Operator twins (the Board) -----------------------------------------------


def list_queues_any_endpoint(
    endpoint_ids: Iterable[object] | None = None,
) -> list[QueueInfo]:
    """Return the queues of the given endpoints (None = every endpoint)."""
    scope_ids = None
    if endpoint_ids is not None:
        parsed = [_uuid(value) for value in endpoint_ids]
        scope_ids = [value for value in parsed if value is not None]
    return _queues(None, endpoint_ids=scope_ids)


def get_queue_any_endpoint(endpoint_id: str, name: str) -> QueueInfo:
    """Return one queue of any endpoint; NotFound when missing."""
    found = _queues(None, name=name, endpoint_ids=[_endpoint(endpoint_id)])
    if not found:
        raise NotFound("no such queue")
    return found[0]


def update_queue_any_endpoint(
    endpoint_id: str, name: str, **settings_: Unpack[QueueSettings]
) -> QueueInfo:
    """Change a queue's settings for any endpoint (operator Board)."""
    _check_names(settings_)
    return _update(None, _endpoint(endpoint_id), name, **settings_)


def pause_queue_any_endpoint(endpoint_id: str, name: str) -> QueueInfo:
    """Pause any endpoint's queue (operator Board)."""
    return _update(None, _endpoint(endpoint_id), name, pause="pause")


def resume_queue_any_endpoint(endpoint_id: str, name: str) -> QueueInfo:
    """Resume any endpoint's queue and ring its doorbell (operator Board)."""
    return _update(None, _endpoint(endpoint_id), name, pause="resume")


# --- Existence, purge and delete (the SQS surface's PurgeQueue, DeleteQueue) ----

QUEUE_EXISTS_SQL = """
SELECT 1 FROM queues
 WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
   AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
"""


def queue_exists_steps(scope: Scope, name: str) -> Steps[bool]:
    """Say whether this endpoint has the queue (one index probe, no figures)."""
    _granted(scope, name)
    params = {**_scope_params(scope), "name": name}
    row = yield Statement("queue_exists", QUEUE_EXISTS_SQL, params, "one")
    return row is not None


queue_exists = on_django(queue_exists_steps)
aqueue_exists = on_pool(queue_exists_steps)


@dataclass(frozen=True)
class Claimable:
    """A queue's live todos as one worker's claims see them."""

    # A claim by this worker could take them now.
    ready: int
    # Claimed, lease running (or lapsed at the attempt cap or under a cancel
    # request: the sweeps end those, no claim takes them).
    in_flight: int
    # Neither: delayed, a retry window still open, assigned to another
    # worker, or the queue is paused.
    waiting: int


# ``ready`` is the claim's own rule (CLAIM_SQL's due and fresh branches, and
# its pause and assignee checks), read through todos_live_overview_idx.
CLAIMABLE_SQL = """
SELECT count(*) FILTER (WHERE ready),
       count(*) FILTER (WHERE NOT ready AND state = 'claimed'
                        AND (lease_expires_at >= clock.at
                             OR attempt >= max_attempts
                             OR cancel_request IS NOT NULL)),
       count(*)
  FROM (SELECT statement_timestamp() AS at) clock
 CROSS JOIN LATERAL (
     SELECT t.state, t.lease_expires_at, t.attempt, t.max_attempts,
            t.cancel_request,
            NOT paused.yes
            AND (t.assignee IS NULL OR t.assignee = %(worker)s)
            AND ((t.state = 'pending' AND t.available_at <= clock.at)
                 OR (t.state = 'claimed' AND t.lease_expires_at < clock.at
                     AND t.attempt < t.max_attempts AND t.cancel_request IS NULL)
                 OR (t.state = 'failed' AND t.next_retry_at <= clock.at)) AS ready
       FROM todos t
      CROSS JOIN (SELECT EXISTS (
          SELECT 1 FROM queues p
           WHERE p.endpoint_id = %(endpoint_id)s AND p.name = %(name)s
             AND p.paused_at IS NOT NULL) AS yes) paused
      WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
        AND (t.state IN ('pending', 'claimed')
             OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))) live
"""


def claimable(scope: Scope, name: str, worker: str | None) -> Claimable:
    """Count the live todos: ready for ``worker``'s claim, in flight, waiting."""
    _granted(scope, name)
    params = {**_scope_params(scope), "name": name, "worker": worker}
    row = _run("claimable", CLAIMABLE_SQL, params, fetch="one")
    assert row is not None  # an aggregate returns one row
    ready, in_flight, live = row
    return Claimable(ready, in_flight, live - ready - in_flight)


# PurgeQueue and DeleteQueue delete in batches, each its own statement, so a
# queue of any length is emptied without one statement meeting
# statement_timeout (a million rows with their history take far longer than
# its 5 s). A batch deletes its rows by primary key only (id = ANY(...)): a
# planner without statistics of a fresh backlog would otherwise scan the
# queue's rows once per batch.
DELETE_BATCH = 5000

PURGE_START_SQL = """
SELECT statement_timestamp(),
       EXISTS (SELECT 1 FROM queues
                WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s)
"""

# Purge = SQS's PurgeQueue: the queue's live todos go (pending, delayed,
# claimed, retry-scheduled), with their history (todo_events cascades). Done
# todos and dead letters stay: they are the record, not messages in the queue.
# Only what was there when the purge began (created_at), so a busy producer
# cannot keep it going. FOR UPDATE: a row that a concurrent call moves (an
# ack completing it) is judged again once that commits, so a todo that turned
# done meanwhile stays.
PURGE_BATCH_SQL = """
DELETE FROM todos
 WHERE id = ANY(ARRAY(
           SELECT id FROM todos
            WHERE endpoint_id = %(endpoint_id)s AND queue = %(name)s
              AND (state IN ('pending', 'claimed')
                   OR (state = 'failed' AND next_retry_at IS NOT NULL))
              AND created_at <= %(before)s
            LIMIT %(batch)s
              FOR UPDATE))
"""


def purge_queue(scope: Scope, name: str) -> int:
    """Delete the queue's live todos; return how many. NotFound: no such queue."""
    _granted(scope, name)
    params: dict[str, Any] = {
        **_scope_params(scope),
        "name": name,
        "batch": DELETE_BATCH,
    }
    start = _run("purge_queue", PURGE_START_SQL, params, fetch="one")
    assert start is not None  # a SELECT without FROM returns one row
    params["before"], exists = start
    if not exists:
        raise NotFound("no such queue")
    return _delete_in_batches("purge_queue", PURGE_BATCH_SQL, params)


def _delete_in_batches(operation: str, sql: str, params: dict[str, Any]) -> int:
    total = 0
    while True:
        deleted = _run(operation, sql, params, fetch="rowcount")
        total += deleted
        if deleted < params["batch"]:
            return total


# Delete = SQS's DeleteQueue: every todo of the queue, terminal ones too, with
# their history, in batches; then the queue row with what is left, and its
# groups' overrides and rate buckets, in one statement. The next use of the
# name makes a new queue.
DELETE_QUEUE_BATCH_SQL = """
DELETE FROM todos
 WHERE id = ANY(ARRAY(
           SELECT id FROM todos
            WHERE endpoint_id = %(endpoint_id)s AND queue = %(name)s
            LIMIT %(batch)s))
"""

DELETE_QUEUE_SQL = """
WITH gone_todos AS (
    DELETE FROM todos WHERE endpoint_id = %(endpoint_id)s AND queue = %(name)s
    RETURNING 1
), gone_queue AS (
    DELETE FROM queues WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
    RETURNING 1
), gone_groups AS (
    DELETE FROM queue_groups WHERE endpoint_id = %(endpoint_id)s AND queue = %(name)s
), gone_buckets AS (
    DELETE FROM rate_buckets WHERE endpoint_id = %(endpoint_id)s AND queue = %(name)s
)
SELECT (SELECT count(*) FROM gone_queue), (SELECT count(*) FROM gone_todos)
"""


def delete_queue(scope: Scope, name: str) -> int:
    """Delete the queue and all its todos; return how many todos went."""
    _granted(scope, name)
    if not queue_exists(scope, name):
        raise NotFound("no such queue")
    params: dict[str, Any] = {
        **_scope_params(scope),
        "name": name,
        "batch": DELETE_BATCH,
    }
    batched = _delete_in_batches("delete_queue", DELETE_QUEUE_BATCH_SQL, params)
    row = _run("delete_queue", DELETE_QUEUE_SQL, params, fetch="one")
    assert row is not None  # the statement returns one row of counts
    rest: int = row[1]
    return batched + rest
