"""The operator Board's side of questions and cancels (CONTRACT §14).

The inbox's recent answers, and the two bulk actions the Board runs over a
list filter: cancel everything matching (previewed and confirmed, as a bulk
retry is) and dismiss a dead-letter group. Both pick their todos here, in
keyset batches, and move them through the transitions ``cancel`` owns
(``CANCEL_SQL``, ``DISMISS_SQL``): the state rules stay in one place.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Unpack

from .cancel import cancel_many_any_endpoint, dismiss_dead_letters_any_endpoint
from .operator import BULK_RETRY_LIMIT, KEYSET_START
from .reads import STATE_FILTERS, Filters, RowFilters, _filter_conditions
from .rows import MAX_ACK_BATCH, TODO_COLUMNS, Conflict, Todo
from .sql import _run, _uuid

# --- Recent answers -------------------------------------------------------------

# Answered questions, the latest answer first, through todos_answered_idx. A
# todo keeps its answer once it moves on, so this is the inbox's record of
# who answered what and when.
ANSWERED_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE question_status = 'answered' AND answer IS NOT NULL
   AND (%(endpoint_ids)s::uuid[] IS NULL OR endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
 ORDER BY (answer->>'at') DESC, id
 LIMIT %(limit)s
"""


def answered_questions_any_endpoint(
    *, endpoint_ids: Iterable[object] | None = None, limit: int = 10
) -> list[Todo]:
    """Return the latest answered questions of these endpoints (None = all)."""
    scope_ids = None
    if endpoint_ids is not None:
        scope_ids = [p for p in map(_uuid, endpoint_ids) if p is not None]
        if not scope_ids:
            return []
    limit = int(limit)
    if not 1 <= limit <= 200:
        raise ValueError("limit must be between 1 and 200")
    params = {"endpoint_ids": scope_ids, "limit": limit}
    return [
        Todo.from_row(row) for row in _run("answered_questions", ANSWERED_SQL, params)
    ]


# --- Cancel everything a filter matches -----------------------------------------

# What a cancel can still change: a todo not being worked on (it ends at once),
# or a claimed one without a cancel request yet (it gets one).
CANCELABLE = (
    "(state = 'pending' OR (state = 'failed' AND next_retry_at IS NOT NULL)"
    " OR (state = 'claimed' AND cancel_request IS NULL))"
)

CANCELABLE_COUNT_SQL = f"""
SELECT count(*) FILTER (WHERE state <> 'claimed'),
       count(*) FILTER (WHERE state = 'claimed')
  FROM (SELECT state FROM todos WHERE {CANCELABLE} AND {{where}}
         LIMIT %(cap)s + 1) capped
"""

CANCEL_BATCH_IDS_SQL = f"""
SELECT created_at, id FROM todos
 WHERE {CANCELABLE} AND {{where}}
   AND (created_at, id) > (%(after_created)s, %(after_id)s::uuid)
 ORDER BY created_at, id
 LIMIT %(batch)s
"""


@dataclass(frozen=True)
class Cancelable:
    """What a cancel of a filter would do: end ``now``, ask ``requested`` to stop."""

    now: int
    requested: int

    @property
    def total(self) -> int:
        return self.now + self.requested


@dataclass(frozen=True)
class BulkCancel:
    """What a bulk cancel did, and whether matching todos are left for another pass."""

    canceled: int
    requested: int
    conflicts: list[Conflict]
    more: bool


def _where(filters: Filters) -> tuple[str, dict[str, Any]] | None:
    found = _filter_conditions(**filters)
    if found is None:
        return None
    conditions, params = found
    return " AND ".join(conditions) or "TRUE", params


def count_cancelable_any_endpoint(
    *, cap: int = BULK_RETRY_LIMIT, **filters: Unpack[Filters]
) -> Cancelable:
    """Count what a cancel of this filter would move (each count up to cap + 1)."""
    found = _where(filters)
    if found is None:
        return Cancelable(0, 0)
    where, params = found
    sql = CANCELABLE_COUNT_SQL.format(where=where)
    row = _run("count_cancelable", sql, {**params, "cap": int(cap)}, fetch="one")
    assert row is not None  # a count returns one row
    now, requested = row
    return Cancelable(now, requested)


def cancel_matching_any_endpoint(
    *,
    reason: str | None = "",
    by: str = "operator",
    limit: int = BULK_RETRY_LIMIT,
    **filters: Unpack[Filters],
) -> BulkCancel:
    """Cancel every live todo a filter matches, a batch of 100 at a time.

    Each batch is one cancel statement (atomic on its own). A claimed todo
    gets a cancel request; at most ``limit`` todos move per call, and ``more``
    says whether matching ones remain.
    """
    found = _where(filters)
    if found is None:
        return BulkCancel(0, 0, [], False)
    where, params = found
    sql = CANCEL_BATCH_IDS_SQL.format(where=where)
    after, moved, canceled, requested = KEYSET_START, 0, 0, 0
    conflicts: list[Conflict] = []
    while moved < limit:
        size = min(MAX_ACK_BATCH, limit - moved)
        bound = {
            **params,
            "batch": size,
            "after_created": after[0],
            "after_id": after[1],
        }
        rows = _run("cancel_matching", sql, bound)
        if not rows:
            break
        for result in cancel_many_any_endpoint(
            [str(todo_id) for _, todo_id in rows], reason=reason, by=by
        ):
            if isinstance(result, Conflict):
                conflicts.append(result)
            elif isinstance(result, Todo):
                moved += 1
                if result.state == "claimed":
                    requested += 1
                else:
                    canceled += 1
        if len(rows) < size:
            break
        after = (rows[-1][0], str(rows[-1][1]))
    more = moved >= limit and count_cancelable_any_endpoint(cap=1, **filters).total > 0
    return BulkCancel(canceled, requested, conflicts, more)


# --- Dismiss a dead-letter group ------------------------------------------------

DISMISS_BATCH = 1000

UNDISMISSED_IDS_SQL = f"""
SELECT id FROM todos
 WHERE {STATE_FILTERS["dead_letter"]} AND dismissed_at IS NULL AND {{where}}
 LIMIT %(batch)s
"""


def dismiss_matching_any_endpoint(
    *, endpoint_ids: Iterable[object] | None = None, **filters: Unpack[RowFilters]
) -> int:
    """Dismiss the dead letters a filter matches (a group); return how many.

    ``endpoint_ids`` is the Board's owner scope; dismissed ones leave the
    selection, so each batch reads the next ones.
    """
    found = _where(Filters(**filters, endpoint_ids=endpoint_ids))
    if found is None:
        return 0
    where, params = found
    sql = UNDISMISSED_IDS_SQL.format(where=where)
    dismissed = 0
    while dismissed < BULK_RETRY_LIMIT:
        ids = [
            row[0]
            for row in _run("dismiss_matching", sql, {**params, "batch": DISMISS_BATCH})
        ]
        if not ids:
            break
        count = dismiss_dead_letters_any_endpoint(ids, endpoint_ids=endpoint_ids)
        dismissed += count
        if len(ids) < DISMISS_BATCH or count == 0:
            break
    return dismissed
