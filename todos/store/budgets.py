"""Spend budgets (CONTRACT §18): a limit on what a scope spends in a window.

A budget covers an endpoint, one of its queues, or one group of a queue; its
window is the current hour, day or calendar month in the budget's time zone;
its limit is in dollars and/or tokens (input plus output).

The budget row keeps its current window's running figures: the statement
that writes a ledger row counts it against every budget it falls under
(``usage.BUDGET_SPEND``, ``switchboard_budget_count``), under the budget's
row lock, so two reports that together cross a limit cannot both stay under
it. A replaced report counts its difference; a ledger row counts in the
window of its last report. The report that reaches the limit marks the
budget exhausted and puts its action in force until the window ends:
``pause`` (claims pass over the scope's todos, from the first claim that
starts after that commit) or ``reject_new`` (creates in the scope answer
``BudgetExhausted``). The owner decides (``decide_budget``): raise the limit
for this window, resume anyway for this window, or keep it paused; each
decision is recorded in ``budget_events`` and rings the scope's doorbell.

The window's bounds are computed here, with the IANA database Python ships
(the one a schedule's time zone is checked against), for what a read shows;
the counting statement computes them in PostgreSQL
(``switchboard_budget_window``), and a test holds the two equal.
"""

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction

from .rows import (
    MAX_GROUP_CHARS,
    MAX_NAME_CHARS,
    MAX_USAGE_COST_USD,
    MAX_USAGE_TOKENS,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Scope,
    StoreError,
    _iso,
    _json,
)
from .sql import Statement, Steps, _run, _scope_params, _uuid, ring_due

BUDGET_SCOPES = ("endpoint", "queue", "group")
BUDGET_WINDOWS = ("hour", "day", "month")
BUDGET_ACTIONS = ("pause", "reject_new")
BUDGET_DECISIONS = ("raise", "resume", "keep_paused")
BUDGET_EVENTS = ("budget.soft_limit", "budget.exhausted", "budget.resumed")
DEFAULT_SOFT_PERCENT = 80


class InvalidBudget(ValueError):
    """A budget field the caller must fix; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class BudgetExhausted(StoreError):
    """A create in the scope of a ``reject_new`` budget at its limit (the
    API answers 429 ``budget_exhausted`` naming the budget)."""

    def __init__(self, budget: "Budget") -> None:
        where = {
            "endpoint": "this endpoint",
            "queue": f"queue {budget.queue!r}",
            "group": f"group {budget.group!r} of queue {budget.queue!r}",
        }[budget.scope]
        super().__init__(
            f"the {budget.window} budget {budget.id} of {where} is exhausted"
            " and refuses new todos until its window ends"
            f" ({_iso(budget.window_end)}) or its owner raises it"
        )
        self.detail = str(self)
        self.budget = budget

    @property
    def retry_after(self) -> int:
        """Whole seconds until the budget's window ends (at least 1)."""
        left = self.budget.window_end - datetime.now(UTC)
        return max(1, math.ceil(left.total_seconds()))


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
    """A budget, with what its scope spent in the current window.

    ``state`` is ``ok``, ``soft_limit`` (the soft threshold reached),
    ``exhausted`` (at the limit: the action is in force until the window
    ends) or ``resumed`` (at the limit, and the owner resumed anyway).
    ``raised_usd``/``raised_tokens`` are what the owner added for this
    window; what is left counts them.
    """

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
    raised_usd: Decimal = Decimal(0)
    raised_tokens: int = 0
    soft_reached_at: datetime | None = None
    exhausted_at: datetime | None = None
    resumed_at: datetime | None = None
    in_force_until: datetime | None = None
    # What the attempts running now hold reserved (their todos' max_cost).
    reserved_usd: Decimal = Decimal(0)

    @property
    def left_usd(self) -> Decimal | None:
        if self.limit_usd is None:
            return None
        return max(self.limit_usd + self.raised_usd - self.spent_usd, Decimal(0))

    @property
    def left_tokens(self) -> int | None:
        if self.limit_tokens is None:
            return None
        return max(self.limit_tokens + self.raised_tokens - self.spent_tokens, 0)

    @property
    def in_force(self) -> bool:
        """Whether the action (pause, reject_new) holds now."""
        return self.in_force_until is not None

    @property
    def state(self) -> str:
        if self.exhausted_at is not None:
            return "resumed" if self.resumed_at is not None else "exhausted"
        return "soft_limit" if self.soft_reached_at is not None else "ok"

    def to_dict(self) -> JSONObject:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        del out["endpoint_id"]
        for name in (
            "created_at",
            "updated_at",
            "window_start",
            "window_end",
            "soft_reached_at",
            "exhausted_at",
            "resumed_at",
            "in_force_until",
        ):
            out[name] = _iso(out[name])
        for name in ("limit_usd", "spent_usd", "raised_usd", "reserved_usd"):
            out[name] = None if out[name] is None else float(out[name])
        left = self.left_usd
        out["left_usd"] = None if left is None else float(left)
        out["left_tokens"] = self.left_tokens
        out["state"] = self.state
        return out


BUDGET_COLUMNS = (
    "b.id, b.endpoint_id, b.scope, b.queue, b.group_key, b.window_unit, b.time_zone,"
    " b.limit_usd, b.limit_tokens, b.soft_percent, b.action, b.created_at,"
    " b.updated_at, b.window_start, b.spent_usd, b.spent_tokens, b.raised_usd,"
    " b.raised_tokens, b.soft_reached_at, b.exhausted_at, b.resumed_at,"
    " b.in_force_until, (SELECT coalesce(sum(r.usd), 0) FROM budget_reservations r"
    " JOIN todos t ON t.id = r.todo_id AND t.state = 'claimed'"
    " AND t.attempt = r.attempt WHERE r.budget_id = b.id)"
)


def _budget(row: Any, now: datetime | None = None) -> Budget:
    """A budget from its row, as of ``now``: a row whose window is not the
    current one has spent nothing in it yet (the next report rolls it)."""
    now = now or datetime.now(UTC)
    start, end = window_bounds(row[5], row[6], now)
    values: list[Any] = [str(row[0]), str(row[1]), *row[2:13], start, end]
    if row[13] != start:
        values += [Decimal(0), 0]
    else:
        in_force = row[21] if row[21] is not None and row[21] > now else None
        values += [*row[14:21], in_force]
    return replace(Budget(*values), reserved_usd=row[22])


# What each budget's scope spent in its window, summed from the ledger: the
# rows of the endpoint (of the queue, of the group) last reported inside the
# window. A new budget (or one whose scope or window changed) starts from it.
SPENT_SQL = """
SELECT coalesce(sum(l.cost_usd), 0), coalesce(sum(l.input_tokens + l.output_tokens), 0)
  FROM budgets b
  JOIN usage_ledger l
    ON l.endpoint_id = b.endpoint_id
   AND (b.queue IS NULL OR l.queue = b.queue)
   AND (b.group_key IS NULL OR l.group_key = b.group_key)
 WHERE b.id = %(id)s AND l.reported_at >= %(start)s AND l.reported_at < %(end)s
"""

# Count a spend against one budget and settle its state (rolling its window
# when it is behind); the events go into the budget's history.
COUNT_SQL = """
INSERT INTO budget_events (budget_id, endpoint_id, event, actor, detail)
SELECT budget_id, endpoint_id, event, actor, detail
  FROM switchboard_budget_count(%(id)s, %(usd)s::numeric, %(tokens)s::bigint)
"""

# Start a budget's figures over, from the ledger: its window made stale, so
# the count that follows rolls it and adds what the ledger holds.
RESTART_SQL = """
UPDATE budgets SET window_start = NULL, in_force_until = NULL WHERE id = %(id)s
"""


def _restart(budget_id: str, window: str, time_zone: str) -> None:
    """Recount a budget's current window from the ledger (in the caller's
    transaction): after its creation, or a change of its scope or window."""
    start, end = window_bounds(window, time_zone, datetime.now(UTC))
    params = {"id": budget_id, "start": start, "end": end}
    row = _run("budget_spend", SPENT_SQL, params, fetch="one")
    usd, tokens = (Decimal(0), 0) if row is None else row
    _run("budget_spend", RESTART_SQL, {"id": budget_id}, fetch=None)
    _run(
        "budget_spend",
        COUNT_SQL,
        {"id": budget_id, "usd": usd, "tokens": int(tokens)},
        fetch=None,
    )


def _count(budget_id: str) -> None:
    """Settle a budget's state as its figures stand (rolling a stale window)."""
    params = {"id": budget_id, "usd": 0, "tokens": 0}
    _run("budget_count", COUNT_SQL, params, fetch=None)


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
    # Imported here: schedules imports the claim, which imports budgets.
    from .schedules import _known_zone

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
    """A limit, or a raise of one: a number above 0, at most ``maximum``, in
    whole millionths (None: not given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBudget(field, "must be a number greater than 0")
    if not 0 < value <= maximum:
        raise InvalidBudget(field, f"must be greater than 0 and at most {maximum}")
    _whole_micros(field, value)
    return value


# Dollars are kept to the millionth (numeric(20, 6)): a smaller limit or raise
# would be kept as 0, so it is refused.
MIN_USD = 0.000001


def _whole_micros(field: str, value: int | float) -> None:
    if field.endswith("_usd") and value < MIN_USD:
        raise InvalidBudget(field, f"must be at least {MIN_USD:f}")


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
    is QueueNotGranted). It starts from what the ledger holds for its scope
    in the current window, and is at its limit at once if that reaches it."""
    params = {**_validated(scope, given), "id": str(uuid.uuid4())}
    with transaction.atomic():
        row = _run("create_budget", CREATE_SQL, params, fetch="one")
        if row is None:
            raise NotFound("no such endpoint")
        _restart(params["id"], params["window"], params["time_zone"])
    return get_budget(scope, params["id"])


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
    now = datetime.now(UTC)
    rows = _run("list_budgets", LIST_SQL, _scope_params(scope))
    return [_budget(row, now) for row in rows]


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
    return _budget(row)


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
    moved = any(
        params[name] != getattr(current, name)
        for name in ("scope", "queue", "group", "window", "time_zone")
    )
    with transaction.atomic():
        row = _run("update_budget", UPDATE_SQL, params, fetch="one")
        if row is None:
            raise NotFound("no such budget")
        if moved:
            _restart(current.id, params["window"], params["time_zone"])
        else:
            _count(current.id)
        changed = get_budget(scope, current.id)
        if current.in_force and not changed.in_force:
            _ring(current.endpoint_id, current.queue, current.group)
    return changed


DELETE_SQL = f"""
DELETE FROM budgets b WHERE b.id = %(id)s AND {SCOPED}
RETURNING b.endpoint_id, b.queue, b.group_key
"""


def delete_budget(scope: Scope, budget_id: str) -> None:
    """Delete a budget of this endpoint; its scope's waiting claims look again."""
    row = _run("delete_budget", DELETE_SQL, _one(scope, budget_id), fetch="one")
    if row is None:
        raise NotFound("no such budget")
    _ring(str(row[0]), row[1], row[2])


def _ring(endpoint_id: str, queue: str | None, group: str | None = None) -> None:
    """A budget's scope looks again: its due pending todos ring (sql.ring_due)."""
    ring_due("budget_ring", endpoint_id, queue, group)


# --- The owner's decisions ----------------------------------------------------

# A decision for the current window (the count before it rolls a stale
# window, so a raise is for the window it is made in): a raise adds to what
# is allowed, a resume lifts the action until the window ends, keep_paused
# changes nothing. Each is recorded with who made it.
DECIDE_SQL = """
UPDATE budgets
   SET raised_usd = raised_usd + coalesce(%(amount_usd)s::numeric, 0),
       raised_tokens = raised_tokens + coalesce(%(amount_tokens)s::bigint, 0),
       resumed_at = CASE WHEN %(decision)s = 'resume' THEN coalesce(resumed_at, now())
                         ELSE resumed_at END,
       updated_at = now()
 WHERE id = %(id)s
"""

DECISION_EVENT_SQL = """
INSERT INTO budget_events (budget_id, endpoint_id, event, actor, detail)
VALUES (%(id)s, %(endpoint_id)s, 'budget.decision', %(actor)s, %(detail)s::jsonb)
"""

# The decisions' scoping: a budget of one of these endpoints (None: any).
ANY_SCOPED = """
(%(endpoint_ids)s::uuid[] IS NULL OR b.endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
"""
GET_ANY_SQL = f"""
SELECT {BUDGET_COLUMNS} FROM budgets b WHERE b.id = %(id)s AND {ANY_SCOPED}
FOR UPDATE
"""


def decide_budget(
    scope: Scope,
    budget_id: str,
    decision: str,
    amount_usd: float | None = None,
    amount_tokens: int | None = None,
    *,
    actor: str = "",
) -> Budget:
    """Answer a budget at its limit for the current window (CONTRACT §18):
    ``raise`` it by ``amount_usd`` and/or ``amount_tokens``, ``resume``
    anyway, or ``keep_paused``. It acts at once, is recorded in the budget's
    history (who, when, what), and rings the scope's doorbell so waiting
    claims look again. A foreign budget is NotFound; a bad decision or
    amount is InvalidBudget."""
    params = _one(scope, budget_id)
    endpoint_ids = [params["endpoint_id"]]
    _check_grant(scope, budget_id)
    return _decide(
        params["id"], decision, amount_usd, amount_tokens, actor, endpoint_ids
    )


def decide_budget_any_endpoint(
    budget_id: str,
    decision: str,
    amount_usd: float | None = None,
    amount_tokens: int | None = None,
    *,
    endpoint_ids: list[str] | None = None,
    actor: str = "",
) -> Budget:
    """``decide_budget`` for the Board: a budget of one of ``endpoint_ids``
    (None: any endpoint, for staff)."""
    canonical = _uuid(budget_id)
    if canonical is None:
        raise NotFound("no such budget")
    return _decide(
        canonical,
        decision,
        amount_usd,
        amount_tokens,
        actor,
        _endpoint_ids(endpoint_ids),
    )


def _check_grant(scope: Scope, budget_id: str) -> None:
    """A budget outside a narrowed grant is not found (as GET says)."""
    get_budget(scope, budget_id)


def _endpoint_ids(endpoint_ids: list[str] | None) -> list[str] | None:
    if endpoint_ids is None:
        return None
    return [canonical for canonical in map(_uuid, endpoint_ids) if canonical]


def _decide(
    budget_id: str,
    decision: str,
    amount_usd: object,
    amount_tokens: object,
    actor: str,
    endpoint_ids: list[str] | None,
) -> Budget:
    decision = _choice("decision", decision, BUDGET_DECISIONS)
    usd = _limit("amount_usd", amount_usd, MAX_USAGE_COST_USD)
    tokens = _limit("amount_tokens", amount_tokens, MAX_USAGE_TOKENS)
    if tokens is not None and not isinstance(tokens, int):
        raise InvalidBudget("amount_tokens", "must be a whole number")
    if decision == "raise" and usd is None and tokens is None:
        raise InvalidBudget(
            "amount_usd", "a raise gives amount_usd, amount_tokens or both"
        )
    if decision != "raise" and (usd is not None or tokens is not None):
        raise InvalidBudget("decision", "only a raise takes an amount")
    if endpoint_ids == []:
        raise NotFound("no such budget")
    params = {"id": budget_id, "endpoint_ids": endpoint_ids}
    with transaction.atomic():
        row = _run("decide_budget", GET_ANY_SQL, params, fetch="one")
        if row is None:
            raise NotFound("no such budget")
        budget = _budget(row)
        if usd is not None and budget.limit_usd is None:
            raise InvalidBudget("amount_usd", "this budget has no limit in dollars")
        if tokens is not None and budget.limit_tokens is None:
            raise InvalidBudget("amount_tokens", "this budget has no limit in tokens")
        _count(budget_id)
        values = {
            "id": budget_id,
            "decision": decision,
            "amount_usd": None if usd is None else str(usd),
            "amount_tokens": tokens,
        }
        _run("decide_budget", DECIDE_SQL, values, fetch=None)
        detail = {"decision": decision, "amount_usd": usd, "amount_tokens": tokens}
        record = {
            "id": budget_id,
            "endpoint_id": budget.endpoint_id,
            "actor": actor,
            "detail": json.dumps(detail),
        }
        _run("decide_budget", DECISION_EVENT_SQL, record, fetch=None)
        _count(budget_id)
        if decision != "keep_paused":
            _ring(budget.endpoint_id, budget.queue, budget.group)
        row = _run("decide_budget", GET_ANY_SQL, params, fetch="one")
    assert row is not None
    return _budget(row)


# --- Budgets at their limit, and a budget's history ---------------------------

# The budgets whose action is in force now: what the owner's inbox asks about.
EXHAUSTED_SQL = f"""
SELECT {BUDGET_COLUMNS} FROM budgets b
 WHERE b.in_force_until IS NOT NULL AND b.in_force_until > now() AND {ANY_SCOPED}
 ORDER BY b.exhausted_at, b.id
"""


def exhausted_budgets(scope: Scope) -> list[Budget]:
    """Return this endpoint's budgets at their limit with their action in
    force (pause or reject_new), the longest exhausted first."""
    granted = {budget.id for budget in list_budgets(scope)}
    found = exhausted_budgets_any_endpoint(
        endpoint_ids=[_scope_params(scope)["endpoint_id"]]
    )
    return [budget for budget in found if budget.id in granted]


def exhausted_budgets_any_endpoint(
    *, endpoint_ids: list[str] | None = None
) -> list[Budget]:
    """``exhausted_budgets`` for the Board: of these endpoints (None: all)."""
    scoped = _endpoint_ids(endpoint_ids)
    if scoped == []:
        return []
    now = datetime.now(UTC)
    rows = _run("exhausted_budgets", EXHAUSTED_SQL, {"endpoint_ids": scoped})
    return [_budget(row, now) for row in rows]


def list_budgets_any_endpoint(*, endpoint_ids: list[str] | None = None) -> list[Budget]:
    """Every budget of these endpoints (None: all), oldest first (the Board)."""
    scoped = _endpoint_ids(endpoint_ids)
    if scoped == []:
        return []
    now = datetime.now(UTC)
    rows = _run("list_budgets", LIST_ANY_SQL, {"endpoint_ids": scoped})
    return [_budget(row, now) for row in rows]


LIST_ANY_SQL = f"""
SELECT {BUDGET_COLUMNS} FROM budgets b WHERE {ANY_SCOPED} ORDER BY b.created_at, b.id
"""


@dataclass(frozen=True)
class BudgetEvent:
    """One entry of a budget's history: a limit reached, a pause lifted, or
    an owner's decision (``detail``: decision, amount_usd, amount_tokens)."""

    id: int
    budget_id: str
    event: str
    actor: str
    detail: JSONObject | None
    at: datetime

    def to_dict(self) -> JSONObject:
        return {
            "id": self.id,
            "budget_id": self.budget_id,
            "event": self.event,
            "actor": self.actor,
            "detail": self.detail,
            "at": _iso(self.at),
        }


HISTORY_SQL = f"""
SELECT e.id, e.budget_id, e.event, e.actor, e.detail, e.at
  FROM budget_events e
  JOIN budgets b ON b.id = e.budget_id
 WHERE e.budget_id = %(id)s AND {ANY_SCOPED}
 ORDER BY e.id DESC
 LIMIT %(limit)s
"""


def budget_history(
    scope: Scope, budget_id: str, *, limit: int = 50
) -> list[BudgetEvent]:
    """A budget's latest events and decisions, newest first."""
    _check_grant(scope, budget_id)
    return budget_history_any_endpoint(
        budget_id, endpoint_ids=[_scope_params(scope)["endpoint_id"]], limit=limit
    )


def budget_history_any_endpoint(
    budget_id: str, *, endpoint_ids: list[str] | None = None, limit: int = 50
) -> list[BudgetEvent]:
    """``budget_history`` for the Board (None: any endpoint)."""
    canonical = _uuid(budget_id)
    scoped = _endpoint_ids(endpoint_ids)
    if canonical is None or scoped == []:
        return []
    params = {"id": canonical, "endpoint_ids": scoped, "limit": int(limit)}
    rows = _run("budget_history", HISTORY_SQL, params)
    return [
        BudgetEvent(row[0], str(row[1]), row[2], row[3], _json(row[4]), row[5])
        for row in rows
    ]


# --- Enforcement reads of the claim and the create ----------------------------

# A scope's todos whose claim a pause budget in force passes over, for a
# todo row ``t``: the endpoint's budget, its queue's, or its group's. Read
# through budgets_in_force_idx (only budgets in force are in it).
PAUSED_BY_BUDGET = """EXISTS (
    SELECT 1 FROM budgets bp
     WHERE bp.endpoint_id = {t}.endpoint_id AND bp.in_force_until IS NOT NULL
       AND bp.in_force_until > now() AND bp.action = 'pause'
       AND (bp.queue IS NULL OR bp.queue = {t}.queue)
       AND (bp.group_key IS NULL OR bp.group_key = {t}.group_key))"""

# A create the reject_new budgets in force refuse, for its queue and group
# expressions: the budget of its endpoint ``e``, its queue's or its group's.
REFUSED_BY_BUDGET = """EXISTS (
    SELECT 1 FROM budgets br
     WHERE br.endpoint_id = e.id AND br.in_force_until IS NOT NULL
       AND br.in_force_until > now() AND br.action = 'reject_new'
       AND (br.queue IS NULL OR br.queue = {queue})
       AND (br.group_key IS NULL OR br.group_key = {group}))"""

# The reject_new budget in force that refuses a create in (queue, group).
REFUSING_SQL = f"""
SELECT {BUDGET_COLUMNS} FROM budgets b
 WHERE b.endpoint_id = %(endpoint_id)s AND b.in_force_until IS NOT NULL
   AND b.in_force_until > now() AND b.action = 'reject_new'
   AND (b.queue IS NULL OR b.queue = %(queue)s)
   AND (b.group_key IS NULL OR b.group_key = %(group)s::text)
 ORDER BY b.created_at, b.id
 LIMIT 1
"""


def refusing_budget_steps(
    endpoint_id: str, queue: str, group: str | None
) -> Steps[Budget | None]:
    """The reject_new budget in force over (queue, group), if any."""
    params = {"endpoint_id": endpoint_id, "queue": queue, "group": group}
    row = yield Statement("create_todo", REFUSING_SQL, params, "one")
    return None if row is None else _budget(row)
