"""Spend budgets (CONTRACT §18): a limit on what a scope spends in a window.

A budget covers an endpoint, one of its queues, or one group of a queue; its
window is the current hour, day or calendar month in the budget's time zone;
its limit is in dollars and/or tokens (input plus output). Reading a budget
gives what ``usage_ledger`` says the scope spent in the current window and
what is left. A ledger row counts in the window of its last report
(``reported_at``).

The window's bounds are computed here, with the IANA database Python ships
(the one a schedule's time zone is checked against), and bound as parameters:
PostgreSQL's own zone names need not agree with it.
"""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from .rows import (
    MAX_GROUP_CHARS,
    MAX_NAME_CHARS,
    MAX_USAGE_COST_USD,
    MAX_USAGE_TOKENS,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Scope,
    _iso,
)
from .schedules import _known_zone
from .sql import _run, _scope_params, _uuid

BUDGET_SCOPES = ("endpoint", "queue", "group")
BUDGET_WINDOWS = ("hour", "day", "month")
BUDGET_ACTIONS = ("pause", "reject_new")
DEFAULT_SOFT_PERCENT = 80


class InvalidBudget(ValueError):
    """A budget field the caller must fix; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def window_bounds(
    window: str, time_zone: str, now: datetime
) -> tuple[datetime, datetime]:
    """The current window's start and end (UTC): the hour, day or calendar
    month that holds ``now`` in ``time_zone``."""
    zone = ZoneInfo(time_zone)
    local = now.astimezone(zone)
    if window == "hour":
        # An hour is an hour of elapsed time, also across a DST change.
        start = local.replace(minute=0, second=0, microsecond=0)
        return start.astimezone(UTC), start.astimezone(UTC) + timedelta(hours=1)
    if window == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        day = start.date() + timedelta(days=1)
        end = datetime(day.year, day.month, day.day, tzinfo=zone)
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        year, month = divmod(start.month, 12)
        end = datetime(start.year + year, month + 1, 1, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)


@dataclass(frozen=True)
class Budget:
    """A budget, with what its scope spent in the current window."""

    id: str
    endpoint_id: str
    scope: str
    queue: str | None
    group: str | None
    window: str
    time_zone: str
    limit_usd: Decimal | None
    limit_tokens: int | None
    soft_percent: int
    action: str
    created_at: datetime
    updated_at: datetime
    window_start: datetime
    window_end: datetime
    spent_usd: Decimal
    spent_tokens: int

    @property
    def left_usd(self) -> Decimal | None:
        if self.limit_usd is None:
            return None
        return max(self.limit_usd - self.spent_usd, Decimal(0))

    @property
    def left_tokens(self) -> int | None:
        if self.limit_tokens is None:
            return None
        return max(self.limit_tokens - self.spent_tokens, 0)

    def to_dict(self) -> JSONObject:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        del out["endpoint_id"]
        for name in ("created_at", "updated_at", "window_start", "window_end"):
            out[name] = _iso(out[name])
        for name in ("limit_usd", "spent_usd"):
            out[name] = None if out[name] is None else float(out[name])
        left = self.left_usd
        out["left_usd"] = None if left is None else float(left)
        out["left_tokens"] = self.left_tokens
        return out


BUDGET_COLUMNS = (
    "b.id, b.endpoint_id, b.scope, b.queue, b.group_key, b.window_unit, b.time_zone,"
    " b.limit_usd, b.limit_tokens, b.soft_percent, b.action, b.created_at,"
    " b.updated_at"
)

# What each budget's scope spent in its window: the ledger rows of the
# endpoint (of the queue, of the group) last reported inside the window.
SPENT_SQL = """
SELECT w.id, coalesce(sum(l.cost_usd), 0),
       coalesce(sum(l.input_tokens + l.output_tokens), 0)
  FROM unnest(%(ids)s::uuid[], %(starts)s::timestamptz[], %(ends)s::timestamptz[])
       AS w (id, start_at, end_at)
  JOIN budgets b ON b.id = w.id
  LEFT JOIN usage_ledger l
    ON l.endpoint_id = b.endpoint_id
   AND (b.queue IS NULL OR l.queue = b.queue)
   AND (b.group_key IS NULL OR l.group_key = b.group_key)
   AND l.reported_at >= w.start_at AND l.reported_at < w.end_at
 GROUP BY w.id
"""


def _with_spend(rows: list[Any]) -> list[Budget]:
    """Budgets from their rows, each with its window's spend (one statement)."""
    if not rows:
        return []
    now = datetime.now(UTC)
    bounds = [window_bounds(row[5], row[6], now) for row in rows]
    params = {
        "ids": [row[0] for row in rows],
        "starts": [start for start, _ in bounds],
        "ends": [end for _, end in bounds],
    }
    spent = {
        str(budget_id): (usd, int(tokens))
        for budget_id, usd, tokens in _run("budget_spend", SPENT_SQL, params)
    }
    budgets = []
    for row, (start, end) in zip(rows, bounds, strict=True):
        usd, tokens = spent.get(str(row[0]), (Decimal(0), 0))
        values = [str(row[0]), str(row[1]), *row[2:], start, end, usd, tokens]
        budgets.append(Budget(*values))
    return budgets


def _validated(scope: Scope, given: Mapping[str, Any]) -> dict[str, Any]:
    """Check every field of a budget; return the statements' parameters."""
    kind = _choice("scope", given.get("scope"), BUDGET_SCOPES)
    queue, group = given.get("queue"), given.get("group")
    if kind == "endpoint":
        if queue is not None or group is not None:
            raise InvalidBudget("scope", "an endpoint budget takes no queue or group")
        if scope.queues is not None:
            raise QueueNotGranted("*")
    else:
        queue = _name("queue", queue, MAX_NAME_CHARS)
        if not scope.covers(queue):
            raise QueueNotGranted(queue)
        if kind == "group":
            group = _name("group", group, MAX_GROUP_CHARS)
        elif group is not None:
            raise InvalidBudget("group", "only a group budget names a group")
    time_zone = given.get("time_zone") or "UTC"
    if not isinstance(time_zone, str) or not _known_zone(time_zone):
        raise InvalidBudget("time_zone", f"unknown IANA time zone {time_zone!r}")
    limit_usd = _limit("limit_usd", given.get("limit_usd"), MAX_USAGE_COST_USD)
    limit_tokens = _limit("limit_tokens", given.get("limit_tokens"), MAX_USAGE_TOKENS)
    if limit_usd is None and limit_tokens is None:
        raise InvalidBudget("limit_usd", "give limit_usd, limit_tokens or both")
    if limit_tokens is not None and not isinstance(limit_tokens, int):
        raise InvalidBudget("limit_tokens", "must be a whole number")
    soft = given.get("soft_percent")
    soft = DEFAULT_SOFT_PERCENT if soft is None else soft
    if isinstance(soft, bool) or not isinstance(soft, int) or not 1 <= soft <= 100:
        raise InvalidBudget("soft_percent", "must be a whole number from 1 to 100")
    return {
        **_scope_params(scope),
        "scope": kind,
        "queue": queue,
        "group": group,
        "window": _choice("window", given.get("window"), BUDGET_WINDOWS),
        "time_zone": time_zone,
        "limit_usd": None if limit_usd is None else str(limit_usd),
        "limit_tokens": limit_tokens,
        "soft_percent": soft,
        "action": _choice("action", given.get("action") or "pause", BUDGET_ACTIONS),
    }


def _choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidBudget(field, f"must be one of {', '.join(choices)}")
    assert isinstance(value, str)
    return value


def _name(field: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise InvalidBudget(field, f"must be a string of 1 to {limit} characters")
    return value


def _limit(field: str, value: object, maximum: int) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBudget(field, "must be a number greater than 0")
    if not 0 < value <= maximum:
        raise InvalidBudget(field, f"must be greater than 0 and at most {maximum}")
    return value


CREATE_SQL = f"""
INSERT INTO budgets AS b (id, endpoint_id, scope, queue, group_key, window_unit,
                          time_zone, limit_usd, limit_tokens, soft_percent, action)
SELECT %(id)s, e.id, %(scope)s, %(queue)s, %(group)s, %(window)s, %(time_zone)s,
       %(limit_usd)s::numeric, %(limit_tokens)s, %(soft_percent)s, %(action)s
  FROM endpoints e WHERE e.id = %(endpoint_id)s
RETURNING {BUDGET_COLUMNS}
"""


def create_budget(scope: Scope, /, **given: Any) -> Budget:
    """Create a budget of this endpoint (InvalidBudget names a bad field; a
    queue outside the grant, or an endpoint budget under a narrowed grant,
    is QueueNotGranted)."""
    params = {**_validated(scope, given), "id": str(uuid.uuid4())}
    row = _run("create_budget", CREATE_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such endpoint")
    return _with_spend([row])[0]


# A budget in the caller's scope: its endpoint's, and for a narrowed grant
# only a budget of a granted queue. Foreign, malformed and outside the grant
# are alike: not found.
SCOPED = """
b.endpoint_id = %(endpoint_id)s
AND (%(queues)s::text[] IS NULL OR b.queue = ANY(%(queues)s::text[]))
"""

LIST_SQL = f"""
SELECT {BUDGET_COLUMNS} FROM budgets b WHERE {SCOPED} ORDER BY b.created_at, b.id
"""
GET_SQL = f"SELECT {BUDGET_COLUMNS} FROM budgets b WHERE b.id = %(id)s AND {SCOPED}"


def list_budgets(scope: Scope) -> list[Budget]:
    """Return this endpoint's budgets, oldest first, with their spend."""
    return _with_spend(_run("list_budgets", LIST_SQL, _scope_params(scope)))


def _one(scope: Scope, budget_id: object) -> dict[str, Any]:
    canonical = _uuid(budget_id)
    if canonical is None:
        raise NotFound("no such budget")
    return {**_scope_params(scope), "id": canonical}


def get_budget(scope: Scope, budget_id: str) -> Budget:
    """Return one budget of this endpoint with its spend (NotFound otherwise)."""
    row = _run("get_budget", GET_SQL, _one(scope, budget_id), fetch="one")
    if row is None:
        raise NotFound("no such budget")
    return _with_spend([row])[0]


UPDATE_SQL = f"""
UPDATE budgets b
   SET scope = %(scope)s, queue = %(queue)s, group_key = %(group)s,
       window_unit = %(window)s, time_zone = %(time_zone)s,
       limit_usd = %(limit_usd)s::numeric, limit_tokens = %(limit_tokens)s,
       soft_percent = %(soft_percent)s, action = %(action)s, updated_at = now()
 WHERE b.id = %(id)s AND {SCOPED}
RETURNING {BUDGET_COLUMNS}
"""

CHANGEABLE = (
    "scope",
    "queue",
    "group",
    "window",
    "time_zone",
    "limit_usd",
    "limit_tokens",
    "soft_percent",
    "action",
)


def update_budget(scope: Scope, budget_id: str, /, **changes: Any) -> Budget:
    """Change the fields given (others stay); the result is checked whole.

    Giving ``limit_usd`` or ``limit_tokens`` as null is leaving it as it is;
    a scope changed to ``endpoint`` drops the queue and group.
    """
    current = get_budget(scope, budget_id)
    merged: dict[str, Any] = {
        "scope": current.scope,
        "queue": current.queue,
        "group": current.group,
        "window": current.window,
        "time_zone": current.time_zone,
        "limit_usd": current.limit_usd,
        "limit_tokens": current.limit_tokens,
        "soft_percent": current.soft_percent,
        "action": current.action,
    }
    merged |= {name: value for name, value in changes.items() if value is not None}
    if merged["scope"] == "endpoint":
        merged["queue"] = merged["group"] = None
    elif merged["scope"] == "queue":
        merged["group"] = None
    if isinstance(merged["limit_usd"], Decimal):
        merged["limit_usd"] = float(merged["limit_usd"])
    params = {**_validated(scope, merged), "id": current.id}
    row = _run("update_budget", UPDATE_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such budget")
    return _with_spend([row])[0]


DELETE_SQL = f"DELETE FROM budgets b WHERE b.id = %(id)s AND {SCOPED}"


def delete_budget(scope: Scope, budget_id: str) -> None:
    """Delete a budget of this endpoint."""
    if _run("delete_budget", DELETE_SQL, _one(scope, budget_id), fetch="count") == 0:
        raise NotFound("no such budget")
