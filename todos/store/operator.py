"""The operator Board's queries: counts per queue and bulk retries."""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Unpack

from django.db import IntegrityError, transaction

from .lifecycle import _retry, is_dedupe_violation
from .questions import OPEN_QUESTION
from .reads import STATE_FILTERS, Filters, _filter_conditions
from .rows import Conflict, NotFound, Todo
from .sql import DOORBELL, EVENT_INSERT, _run, _uuid

# Terminal rows (done, dead letters) can number millions; the Board never
# counts them exactly. Each terminal count stops at this cap and the Board
# shows "10 000+" past it.
TERMINAL_COUNT_CAP = 10_000
BULK_RETRY_BATCH = 500
BULK_RETRY_LIMIT = 10_000


@dataclass(frozen=True)
class QueueCounts:
    """One (endpoint, queue) line of the overview."""

    endpoint_id: str
    queue: str
    # Pending todos a claim may take (now or once delayed): not ``held``.
    pending: int = 0
    # Pending todos held for an answer (CONTRACT §14), as the queues API
    # counts them: no claim takes one until it is answered.
    held: int = 0
    claimed: int = 0
    lapsed: int = 0
    retry_scheduled: int = 0
    dead_letter: int = 0
    done: int = 0
    # The oldest pending todo that is not held.
    oldest_pending_seconds: float | None = None


@dataclass(frozen=True)
class Overview:
    """Counts per (endpoint, queue); terminal counts are capped (see ``capped``)."""

    rows: list[QueueCounts]
    totals: dict[str, int]
    capped: dict[str, bool]
    cap: int


# The overview is one statement of five parts, each planned as if alone: one
# round trip instead of five.
#
# Live rows by endpoint, queue and state. The WHERE is exactly the predicate of
# todos_live_overview_idx, so the counts are an index-only scan that never
# reads the terminal backlog. The oldest pending todo that is not held is one
# ordered probe per queue of the same index (a held todo waits for a person,
# not for a worker: its age is the open question's, on the inbox).
LIVE_OVERVIEW_SQL = f"""
SELECT 'live', l.endpoint_id, l.queue, l.pending, l.claimed, l.failed,
       EXTRACT(EPOCH FROM now() - oldest.created_at)
  FROM (
    SELECT endpoint_id, queue,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'claimed') AS claimed,
           count(*) FILTER (WHERE state = 'failed') AS failed
      FROM todos
     WHERE (state IN ('pending', 'claimed')
            OR (state = 'failed' AND next_retry_at IS NOT NULL))
       AND {{scope}}
     GROUP BY endpoint_id, queue
  ) l
  LEFT JOIN LATERAL (
    SELECT t.created_at FROM todos t
     WHERE t.endpoint_id = l.endpoint_id AND t.queue = l.queue
       AND t.state = 'pending' AND NOT COALESCE({OPEN_QUESTION}, FALSE)
     ORDER BY t.created_at
     LIMIT 1
  ) oldest ON l.pending > 0"""

# Held todos (open questions), through todos_open_question_idx: few rows. The
# live part counts them as pending; board_overview moves them to ``held``.
HELD_OVERVIEW_SQL = f"""
SELECT 'held', endpoint_id, queue, count(*), NULL, NULL, NULL FROM todos
 WHERE {OPEN_QUESTION} AND {{scope}}
 GROUP BY endpoint_id, queue"""

# Claims whose lease has lapsed but that no reaper has moved yet: few rows,
# served by todos_claimed_lease_idx.
LAPSED_OVERVIEW_SQL = """
SELECT 'lapsed', endpoint_id, queue, count(*), NULL, NULL, NULL FROM todos
 WHERE state = 'claimed' AND lease_expires_at < now() AND {scope}
 GROUP BY endpoint_id, queue"""

# A terminal state, counted only up to the cap: the inner LIMIT stops the scan
# after cap + 1 rows, so a million done rows cost the same as ten thousand.
TERMINAL_OVERVIEW_SQL = """
SELECT '{name}', endpoint_id, queue, count(*), NULL, NULL, NULL FROM (
    SELECT endpoint_id, queue FROM todos WHERE {state} AND {scope}
     LIMIT %(cap)s + 1
) {name}
 GROUP BY endpoint_id, queue"""


def overview_sql(scope: str) -> str:
    """The overview's statement: its five parts, as one."""
    return "\nUNION ALL".join(
        [
            LIVE_OVERVIEW_SQL.format(scope=scope),
            HELD_OVERVIEW_SQL.format(scope=scope),
            LAPSED_OVERVIEW_SQL.format(scope=scope),
        ]
        + [
            TERMINAL_OVERVIEW_SQL.format(
                name=name, state=STATE_FILTERS[name], scope=scope
            )
            for name in ("dead_letter", "done")
        ]
    )


# The Board's owner scope: only these endpoints (None = every endpoint).
BOARD_SCOPE = "endpoint_id = ANY(%(scope_endpoints)s::uuid[])"
ANY_ENDPOINT = "TRUE"


def _board_scope(
    endpoint_ids: Iterable[object] | None,
) -> tuple[str, dict[str, list[str]]]:
    """Return (predicate, params) of the Board's owner scope."""
    if endpoint_ids is None:
        return ANY_ENDPOINT, {}
    ids = [parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None]
    return BOARD_SCOPE, {"scope_endpoints": ids}


def board_overview(
    *, cap: int = TERMINAL_COUNT_CAP, endpoint_ids: Iterable[object] | None = None
) -> Overview:
    """Return counts per endpoint and queue; terminal counts stop at ``cap``.

    ``endpoint_ids`` limits it to those endpoints (the Board's owner scope).
    """
    counts: dict[tuple[str, str], dict[str, Any]] = {}
    scope, scope_params = _board_scope(endpoint_ids)

    def line(endpoint_id: object, queue: str) -> dict[str, Any]:
        key = (str(endpoint_id), queue)
        return counts.setdefault(key, {"endpoint_id": key[0], "queue": queue})

    fetched = _run("board_overview", overview_sql(scope), {**scope_params, "cap": cap})
    for part, endpoint_id, queue, count, claimed, retry, age in fetched:
        if part == "live":
            line(endpoint_id, queue).update(
                pending=count,
                claimed=claimed,
                retry_scheduled=retry,
                oldest_pending_seconds=None if age is None else float(age),
            )
        else:
            line(endpoint_id, queue)[part] = count
    # A held todo is pending in the table; the Board shows it apart, as the
    # queues API does.
    for values in counts.values():
        values["pending"] = values.get("pending", 0) - values.get("held", 0)
    rows = sorted(
        (QueueCounts(**values) for values in counts.values()),
        key=lambda row: (row.endpoint_id, row.queue),
    )
    totals = {
        name: sum(getattr(row, name) for row in rows)
        for name in (
            "pending",
            "held",
            "claimed",
            "lapsed",
            "retry_scheduled",
            "dead_letter",
            "done",
        )
    }
    # A terminal total past the cap reads as the cap ("10 000+").
    capped = {name: totals[name] > cap for name in ("dead_letter", "done")}
    for name, over in capped.items():
        if over:
            totals[name] = cap
    return Overview(rows, totals, capped, cap)


# A dead letter whose idempotency key another live todo holds: its requeue
# would collide in todos_dedupe_idx, so a bulk retry leaves it (and says so).
KEY_HELD_ELSEWHERE = """EXISTS (
    SELECT 1 FROM todos l
     WHERE c.next_retry_at IS NULL AND c.idempotency_key IS NOT NULL
       AND l.endpoint_id = c.endpoint_id
       AND l.idempotency_key = c.idempotency_key
       AND l.id <> c.id AND l.state <> 'done'
       AND (l.state <> 'failed' OR l.next_retry_at IS NOT NULL))"""

RETRYABLE_COUNT_SQL = """
SELECT count(*) FROM (
    SELECT 1 FROM todos c WHERE c.state = 'failed' AND {where} AND {held}
     LIMIT %(cap)s + 1
) capped
"""


def _count_failed(held: str, cap: int, filters: Filters) -> int:
    found = _filter_conditions(**filters)
    if found is None:
        return 0
    conditions, params = found
    sql = RETRYABLE_COUNT_SQL.format(
        where=" AND ".join(conditions) or "TRUE", held=held
    )
    row = _run("count_retryable", sql, {**params, "cap": int(cap)}, fetch="one")
    assert row is not None  # a count returns one row
    count: int = row[0]
    return count


def count_retryable_any_endpoint(
    *, cap: int = BULK_RETRY_LIMIT, **filters: Unpack[Filters]
) -> int:
    """Count the failed todos a bulk retry of this filter would move, up to cap + 1."""
    return _count_failed(f"NOT {KEY_HELD_ELSEWHERE}", cap, filters)


def count_key_held_any_endpoint(
    *, cap: int = BULK_RETRY_LIMIT, **filters: Unpack[Filters]
) -> int:
    """Count the matching dead letters a bulk retry must leave, up to cap + 1:
    another live todo holds their idempotency key."""
    return _count_failed(KEY_HELD_ELSEWHERE, cap, filters)


# The bulk retry's preview looks at no more matching failed todos than this:
# past it the Board says "more than 1 000" rather than count a million (and
# probe each one's idempotency key) on every look.
PREVIEW_LIMIT = 1_000


@dataclass(frozen=True)
class RetryPreview:
    """What a bulk retry of a filter would do, from its first matches."""

    # Of the matches looked at (all of them, or limit + 1): those a retry
    # moves, and the dead letters it must leave because another live todo
    # holds their idempotency key.
    retryable: int
    key_held: int
    # More failed todos match than the preview looked at (``PREVIEW_LIMIT``).
    more: bool


# One pass over at most limit + 1 matching failed todos, each marked by
# whether a live todo holds its key: both figures from one bounded scan.
RETRY_PREVIEW_SQL = """
SELECT count(*) FILTER (WHERE NOT key_held), count(*) FILTER (WHERE key_held),
       count(*)
  FROM (
    SELECT {held} AS key_held FROM todos c WHERE c.state = 'failed' AND {where}
     LIMIT %(limit)s + 1
  ) looked
"""


def preview_retry_any_endpoint(
    *, limit: int = PREVIEW_LIMIT, **filters: Unpack[Filters]
) -> RetryPreview:
    """Preview a bulk retry of this filter from its first ``limit`` matches."""
    found = _filter_conditions(**filters)
    if found is None:
        return RetryPreview(0, 0, more=False)
    conditions, params = found
    sql = RETRY_PREVIEW_SQL.format(
        where=" AND ".join(conditions) or "TRUE", held=KEY_HELD_ELSEWHERE
    )
    row = _run("preview_retry", sql, {**params, "limit": int(limit)}, fetch="one")
    assert row is not None  # a count returns one row
    retryable, key_held, looked = row
    return RetryPreview(retryable, key_held, more=looked > limit)


@dataclass(frozen=True)
class BulkRetry:
    """What a bulk retry did: how many moved, which were refused, and whether
    more matching todos are left for another pass."""

    retried: int
    conflicts: list[Conflict]
    more: bool
    # Matching dead letters left failed because a live todo holds their key.
    key_held: int = 0


# One batch of a bulk retry, in keyset order after the last batch. A dead
# letter whose idempotency key another live todo holds is left alone (its
# requeue would collide in todos_dedupe_idx); rows another transaction holds
# are skipped rather than waited for.
RETRY_BATCH_SQL = f"""
WITH candidate AS (
    SELECT c.id FROM todos c
     WHERE c.state = 'failed' AND {{where}}
       AND (c.created_at, c.id) > (%(after_created)s, %(after_id)s::uuid)
       AND NOT {KEY_HELD_ELSEWHERE}
     ORDER BY c.created_at, c.id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE todos t
       SET state = 'pending', owner = NULL, lease_expires_at = NULL,
           next_retry_at = NULL, dismissed_at = NULL, updated_at = now()
      FROM candidate
     WHERE t.id = candidate.id AND t.state = 'failed'
 RETURNING t.id, t.endpoint_id, t.queue, t.state, t.attempt, t.created_at,
           'failed'::text AS from_state
), history AS ({EVENT_INSERT})
SELECT created_at, id, {DOORBELL} FROM moved ORDER BY created_at, id
"""

RETRY_BATCH_IDS_SQL = """
SELECT c.created_at, c.id FROM todos c
 WHERE c.state = 'failed' AND {where}
   AND (c.created_at, c.id) > (%(after_created)s, %(after_id)s::uuid)
 ORDER BY c.created_at, c.id
 LIMIT %(batch)s
"""

KEYSET_START = (
    datetime.fromisoformat("0001-01-01T00:00:00+00:00"),
    str(uuid.UUID(int=0)),
)


def retry_matching_any_endpoint(
    *,
    actor: str = "operator",
    limit: int = BULK_RETRY_LIMIT,
    batch: int = BULK_RETRY_BATCH,
    **filters: Unpack[Filters],
) -> BulkRetry:
    """Requeue every failed todo a filter matches, batch by batch (operator Board).

    Each batch commits on its own, so a large retry never holds thousands of
    row locks at once. At most ``limit`` todos move per call; ``more`` says
    whether matching failed todos remain.
    """
    found = _filter_conditions(**filters)
    if found is None:
        return BulkRetry(0, [], False)
    conditions, params = found
    where = " AND ".join(conditions) or "TRUE"
    batch_sql = RETRY_BATCH_SQL.format(where=where)
    ids_sql = RETRY_BATCH_IDS_SQL.format(where=where)
    params = {**params, "actor": actor, "event_error": ""}
    after = KEYSET_START
    retried, conflicts = 0, list[Conflict]()
    while retried < limit:
        size = min(int(batch), limit - retried)
        bound = {
            **params,
            "batch": size,
            "after_created": after[0],
            "after_id": after[1],
        }
        try:
            with transaction.atomic():
                rows = _run("retry_matching", batch_sql, bound)
        except IntegrityError as exc:
            if not is_dedupe_violation(exc):
                raise
            # Two dead letters of one batch share a key: retry that batch one by
            # one, so the first takes the key and the rest report a conflict.
            rows = _run("retry_matching", ids_sql, bound)
            for _, todo_id in rows:
                try:
                    _retry(None, todo_id, actor)
                    retried += 1
                except Conflict as exc:
                    conflicts.append(exc)
                except NotFound:
                    pass
        else:
            retried += len(rows)
        if len(rows) < size:
            break
        after = (rows[-1][0], str(rows[-1][1]))
    more = retried >= limit and count_retryable_any_endpoint(cap=1, **filters) > 0
    # The dead letters that lost their key to another one of this retry are
    # already in ``conflicts``: count each held-back dead letter once.
    held = count_key_held_any_endpoint(**filters) - len(conflicts)
    return BulkRetry(retried, conflicts, more, max(held, 0))


def retry_many_any_endpoint(
    todo_ids: Iterable[str], *, actor: str = "operator"
) -> tuple[list[Todo], list[Conflict], list[NotFound]]:
    """Requeue each of the given failed todos; return (retried, conflicts, missing)."""
    retried: list[Todo] = []
    conflicts: list[Conflict] = []
    missing: list[NotFound] = []
    for todo_id in todo_ids:
        try:
            retried.append(_retry(None, todo_id, actor))
        except Conflict as exc:
            conflicts.append(exc)
        except NotFound as exc:
            missing.append(exc)
    return retried, conflicts, missing
