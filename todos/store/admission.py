"""Admission control (CONTRACT §17): a queue's limits, its groups, a todo's priority.

The claim decides (lifecycle.CLAIM_SQL and the database's
``switchboard_admit``); this module sets what it decides by: a queue's
``group_concurrency``, ``fair``, ``rate_limit``, ``group_rate_limit`` and
``priority_aging_seconds``, a group's override (``concurrency``, ``weight``,
``paused``), and a pending todo's priority. A change that may let a waiting
claim in (a limit raised, a group resumed) rings the queue's doorbell.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Self

from .lifecycle import validate_priority
from .reads import get_todo
from .rows import (
    MAX_GROUP_CHARS,
    TODO_COLUMNS,
    Conflict,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Row,
    Scope,
    Todo,
)
from .rows import _json as _read_json
from .sql import _run, _scope_params, _todo_id, ring_due

# What "not given" means to an update (None clears a setting).
KEEP: Any = object()

MAX_GROUP_CONCURRENCY = 100_000
MAX_WEIGHT = 1000
MAX_AGING_SECONDS = 30 * 24 * 3600
MAX_RATE_COUNT = 1_000_000_000
MAX_RATE_PERIOD_SECONDS = 7 * 24 * 3600
MAX_GROUPS_PAGE = 200


@dataclass(frozen=True)
class Admission:
    """A queue's admission settings."""

    group_concurrency: int | None
    fair: bool
    rate_limit: JSONObject | None
    group_rate_limit: JSONObject | None
    priority_aging_seconds: int | None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        concurrency, fair, rate, group_rate, aging = row
        # The rate limits are jsonb: text on Django's connection (rows._json).
        return cls(
            concurrency, bool(fair), _read_json(rate), _read_json(group_rate), aging
        )

    def to_dict(self) -> JSONObject:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def _count(field: str, value: object, low: int, high: int) -> int:
    """A whole number from low to high; 30.0 is 30, as JSON Schema reads it."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be a whole number from {low} to {high}")
    if not low <= value <= high:
        raise ValueError(f"{field} must be a whole number from {low} to {high}")
    return value


def validate_rate_limit(field: str, value: object) -> JSONObject | None:
    """A rate limit: null, or {"count", "per_seconds", "burst"} (burst ≥ 1,
    default the count): at most ``count`` cost per ``per_seconds``, ``burst``
    at once."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"count", "per_seconds", "burst"}:
        raise ValueError(
            f"{field} must be null or an object of count, per_seconds, burst"
        )
    count = _count(f"{field}.count", value.get("count"), 1, MAX_RATE_COUNT)
    per = _count(
        f"{field}.per_seconds", value.get("per_seconds", 1), 1, MAX_RATE_PERIOD_SECONDS
    )
    burst = value.get("burst")
    out: JSONObject = {"count": count, "per_seconds": per}
    out["burst"] = (
        count if burst is None else _count(f"{field}.burst", burst, 1, MAX_RATE_COUNT)
    )
    return out


def _bind_admission(given: dict[str, object]) -> dict[str, object]:
    """Validate the settings given (KEEP = not given); return the statement's
    parameters."""
    params: dict[str, object] = {}
    checks: dict[str, Callable[[object], object]] = {
        "group_concurrency": lambda v: (
            None
            if v is None
            else _count("group_concurrency", v, 0, MAX_GROUP_CONCURRENCY)
        ),
        "fair": _fair,
        "rate_limit": lambda v: validate_rate_limit("rate_limit", v),
        "group_rate_limit": lambda v: validate_rate_limit("group_rate_limit", v),
        "priority_aging_seconds": lambda v: (
            None
            if v is None
            else _count("priority_aging_seconds", v, 1, MAX_AGING_SECONDS)
        ),
    }
    unknown = set(given) - set(checks)
    if unknown:
        raise ValueError(f"unknown setting {sorted(unknown)[0]!r}")
    for name, check in checks.items():
        value = given.get(name, KEEP)
        params[f"set_{name}"] = value is not KEEP
        params[name] = None if value is KEEP else check(value)
    for name in ("rate_limit", "group_rate_limit"):
        if params[name] is not None:
            params[name] = _json(params[name])
    return params


def _fair(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("fair must be true or false")
    return value


def _json(value: object) -> str:
    return json.dumps(value)


def _queue_name(scope: Scope, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("queue name must be a non-empty string")
    if not scope.covers(name):
        raise QueueNotGranted(name)
    return name


# Make the queue on first use, then change the settings named. A queue that
# turns fair stamps a start time on each pending todo without one (each
# group's todos in order, cost by cost), so they take their turns from then
# on. Every change rings (ring_due): a raised limit may admit a waiting claim.
SET_ADMISSION_SQL = """
WITH made AS (
    INSERT INTO queues (endpoint_id, name)
    SELECT e.id, %(name)s FROM endpoints e WHERE e.id = %(endpoint_id)s
    ON CONFLICT (endpoint_id, name) DO NOTHING
), changed AS (
    UPDATE queues
       SET group_concurrency = CASE WHEN %(set_group_concurrency)s
                                    THEN %(group_concurrency)s::int
                                    ELSE group_concurrency END,
           fair = CASE WHEN %(set_fair)s THEN %(fair)s::boolean ELSE fair END,
           rate_limit = CASE WHEN %(set_rate_limit)s THEN %(rate_limit)s::jsonb
                             ELSE rate_limit END,
           group_rate_limit = CASE WHEN %(set_group_rate_limit)s
                                   THEN %(group_rate_limit)s::jsonb
                                   ELSE group_rate_limit END,
           priority_aging_seconds = CASE WHEN %(set_priority_aging_seconds)s
                                         THEN %(priority_aging_seconds)s::int
                                         ELSE priority_aging_seconds END,
           updated_at = now()
     WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
 RETURNING group_concurrency, fair, rate_limit, group_rate_limit,
           priority_aging_seconds
)
SELECT * FROM changed
"""

# Stamp start times on a newly fair queue's pending todos that have none:
# per group, the running sum of cost / weight after the group's last finish.
# The groups' rows are taken in group order, the order a batch create takes
# them in: in the aggregate's order, the stamp and a transaction holding
# another of the queue's groups could each wait for the other (a deadlock).
STAMP_FAIR_SQL = """
WITH tagged AS (
    SELECT t.id, coalesce(g.finish, 0)
               + sum(t.cost / coalesce(g.weight, 1)) OVER (
                     PARTITION BY coalesce(t.group_key, '')
                     ORDER BY t.available_at, t.id)
               - t.cost / coalesce(g.weight, 1) AS tag,
           coalesce(t.group_key, '') AS grp
      FROM todos t
      LEFT JOIN queue_groups g
        ON g.endpoint_id = t.endpoint_id AND g.queue = t.queue
       AND g.group_key = coalesce(t.group_key, '')
     WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
       AND t.state = 'pending' AND t.fair_tag IS NULL
), stamped AS (
    UPDATE todos t SET fair_tag = tagged.tag FROM tagged WHERE t.id = tagged.id
 RETURNING t.id
)
INSERT INTO queue_groups AS g (endpoint_id, queue, group_key, finish)
SELECT %(endpoint_id)s, %(name)s, grp, max(tag) + 1 FROM tagged GROUP BY grp
 ORDER BY grp
ON CONFLICT (endpoint_id, queue, group_key) DO UPDATE
   SET finish = greatest(g.finish, excluded.finish)
"""


def set_admission(scope: Scope, queue: str, **given: object) -> Admission:
    """Change a queue's admission settings (making the queue on first use).

    Settings: ``group_concurrency`` (None = no limit, 0 holds every group),
    ``fair``, ``rate_limit`` and ``group_rate_limit`` (None or {"count",
    "per_seconds", "burst"}), ``priority_aging_seconds`` (None = off).
    Lowering a limit takes nothing back from the todos claimed.
    """
    name = _queue_name(scope, queue)
    endpoint_id = _scope_params(scope)["endpoint_id"]
    params = {
        **_bind_admission(dict(given)),
        "endpoint_id": endpoint_id,
        "name": name,
    }
    row = _run("set_admission", SET_ADMISSION_SQL, params, fetch="one")
    if row is None:
        # The queue was made by this statement (its update saw nothing): again.
        row = _run("set_admission", SET_ADMISSION_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such endpoint")
    settings = Admission.from_row(row[:5])
    if settings.fair:
        _run("stamp_fair", STAMP_FAIR_SQL, params, fetch=None)
    ring_due("set_admission", endpoint_id, name)
    return settings


GET_ADMISSION_SQL = """
SELECT group_concurrency, fair, rate_limit, group_rate_limit, priority_aging_seconds
  FROM queues WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
"""


def get_admission(scope: Scope, queue: str) -> Admission:
    """A queue's admission settings; NotFound for a queue never used."""
    name = _queue_name(scope, queue)
    params = {"endpoint_id": _scope_params(scope)["endpoint_id"], "name": name}
    row = _run("get_admission", GET_ADMISSION_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such queue")
    return Admission.from_row(row)


@dataclass(frozen=True)
class GroupInfo:
    """One group of a queue: its override, its figures, the limit in force."""

    group: str
    in_flight: int
    pending: int
    oldest_wait_seconds: float | None
    limit: int | None
    concurrency: int | None
    weight: int
    paused: bool

    def to_dict(self) -> JSONObject:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def _group_name(group: object) -> str:
    if not isinstance(group, str) or not 1 <= len(group) <= MAX_GROUP_CHARS:
        raise ValueError(f"group must be a string of 1 to {MAX_GROUP_CHARS} characters")
    return group


# A group's override: made on first use; the fields named change.
SET_GROUP_SQL = """
INSERT INTO queue_groups AS g (endpoint_id, queue, group_key, concurrency, weight,
                               paused)
SELECT e.id, %(name)s, %(group)s, %(concurrency)s::int,
       coalesce(%(weight)s::int, 1), coalesce(%(paused)s::boolean, FALSE)
  FROM endpoints e WHERE e.id = %(endpoint_id)s
ON CONFLICT (endpoint_id, queue, group_key) DO UPDATE
   SET concurrency = CASE WHEN %(set_concurrency)s THEN %(concurrency)s::int
                          ELSE g.concurrency END,
       weight = CASE WHEN %(set_weight)s THEN %(weight)s::int ELSE g.weight END,
       paused = CASE WHEN %(set_paused)s THEN %(paused)s::boolean ELSE g.paused END,
       updated_at = now()
RETURNING g.group_key
"""


def set_group(
    scope: Scope,
    queue: str,
    group: str,
    *,
    concurrency: object = KEEP,
    weight: object = KEEP,
    paused: object = KEEP,
) -> GroupInfo:
    """Set a group's override: ``concurrency`` (None = the queue's),
    ``weight`` (its share of fair turns, 1–1000) and ``paused``."""
    name = _queue_name(scope, queue)
    if concurrency is not KEEP and concurrency is not None:
        concurrency = _count("concurrency", concurrency, 0, MAX_GROUP_CONCURRENCY)
    if weight is not KEEP:
        weight = _count("weight", weight, 1, MAX_WEIGHT)
    if paused is not KEEP and not isinstance(paused, bool):
        raise ValueError("paused must be true or false")
    endpoint_id, group = _scope_params(scope)["endpoint_id"], _group_name(group)
    params = {
        "endpoint_id": endpoint_id,
        "name": name,
        "group": group,
        "set_concurrency": concurrency is not KEEP,
        "concurrency": None if concurrency is KEEP else concurrency,
        "set_weight": weight is not KEEP,
        "weight": None if weight is KEEP else weight,
        "set_paused": paused is not KEEP,
        "paused": None if paused is KEEP else paused,
    }
    if _run("set_group", SET_GROUP_SQL, params, fetch="one") is None:
        raise NotFound("no such endpoint")
    ring_due("set_group", endpoint_id, name, group)
    return get_group(scope, name, group)


# A queue's groups: those with todos pending or claimed, and those with an
# override, by name from ``after``; per group its figures and the limit in
# force (the override, else the queue's).
GROUPS_SQL = """
WITH named AS (
    SELECT DISTINCT t.group_key FROM todos t
     WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
       AND t.state IN ('pending', 'claimed') AND t.group_key IS NOT NULL
       AND t.group_key > %(after)s
       AND (%(group)s::text IS NULL OR t.group_key = %(group)s)
    UNION
    SELECT g.group_key FROM queue_groups g
     WHERE g.endpoint_id = %(endpoint_id)s AND g.queue = %(name)s
       AND g.group_key <> '' AND g.group_key > %(after)s
       AND (%(group)s::text IS NULL OR g.group_key = %(group)s)
), page AS (
    SELECT group_key FROM named ORDER BY group_key LIMIT %(limit)s
)
SELECT p.group_key,
       (SELECT count(*) FROM todos t
         WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
           AND t.group_key = p.group_key AND t.state = 'claimed'),
       (SELECT count(*) FROM todos t
         WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
           AND t.group_key = p.group_key AND t.state = 'pending'),
       (SELECT extract(epoch FROM statement_timestamp() - min(t.available_at))
          FROM todos t
         WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(name)s
           AND t.group_key = p.group_key AND t.state = 'pending'
           AND t.available_at <= statement_timestamp()),
       coalesce(g.concurrency, q.group_concurrency), g.concurrency,
       coalesce(g.weight, 1), coalesce(g.paused, FALSE)
  FROM page p
  LEFT JOIN queue_groups g
    ON g.endpoint_id = %(endpoint_id)s AND g.queue = %(name)s
   AND g.group_key = p.group_key
  LEFT JOIN queues q ON q.endpoint_id = %(endpoint_id)s AND q.name = %(name)s
 ORDER BY p.group_key
"""


def list_groups(
    scope: Scope, queue: str, *, after: str = "", limit: int = 50
) -> list[GroupInfo]:
    """A page of a queue's groups, by name after ``after``."""
    name = _queue_name(scope, queue)
    limit = _count("limit", limit, 1, MAX_GROUPS_PAGE)
    return _groups(scope, name, after=after, limit=limit, group=None)


def get_group(scope: Scope, queue: str, group: str) -> GroupInfo:
    """One group of a queue (an unknown one reads as empty, with no override)."""
    name = _queue_name(scope, queue)
    found = _groups(scope, name, after="", limit=1, group=_group_name(group))
    if found:
        return found[0]
    admission = get_admission(scope, name)
    return GroupInfo(group, 0, 0, None, admission.group_concurrency, None, 1, False)


def _groups(
    scope: Scope, name: str, *, after: str, limit: int, group: str | None
) -> list[GroupInfo]:
    params = {
        "endpoint_id": _scope_params(scope)["endpoint_id"],
        "name": name,
        "after": after,
        "limit": limit,
        "group": group,
    }
    return [
        GroupInfo(
            group=row[0],
            in_flight=row[1],
            pending=row[2],
            oldest_wait_seconds=None if row[3] is None else float(row[3]),
            limit=row[4],
            concurrency=row[5],
            weight=row[6],
            paused=row[7],
        )
        for row in _run("list_groups", GROUPS_SQL, params)
    ]


# A pending todo's new priority (a claimed or finished one is not changed).
SET_PRIORITY_SQL = f"""
UPDATE todos SET priority = %(priority)s::smallint, updated_at = now()
 WHERE id = %(id)s AND endpoint_id = %(endpoint_id)s
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
   AND state = 'pending'
RETURNING {TODO_COLUMNS}
"""

PRIORITY_OF_PENDING = "only a pending todo's priority can be changed"


def set_priority(scope: Scope, todo_id: str, priority: object) -> Todo:
    """Change a pending todo's priority (1 is claimed first)."""
    params = {
        **_scope_params(scope),
        "id": _todo_id(todo_id),
        "priority": validate_priority(priority),
    }
    row = _run("set_priority", SET_PRIORITY_SQL, params, fetch="one")
    if row is None:
        todo = get_todo(scope, str(params["id"]))
        raise Conflict(
            f"todo is {todo.state}; {PRIORITY_OF_PENDING}",
            todo_id=todo.id,
            state=todo.state,
        )
    return Todo.from_row(row)
