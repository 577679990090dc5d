"""Schedules (CONTRACT §20): recurring todos, exactly one per slot.

A schedule's *slots* are the moments its recurrence names: a five-field cron
expression read in its IANA time zone (``cronsim`` parses and walks it), or
every N seconds counted from the Unix epoch. ``next_slot_at`` is the first
slot neither fired nor skipped.

Firing (``fire_due_schedules``, run by every sweep): one transaction locks a
batch of due schedules with ``FOR UPDATE SKIP LOCKED``, so concurrent sweeps
on any number of servers take disjoint schedules, and for each one creates
its slots' todos and advances ``next_slot_at`` past them. A slot's todo and
its ``schedule_fires`` row (unique on (schedule, slot): the backstop if
anything ever hands the same slot to two transactions) commit with the
advance or not at all, so a crash, a restart or a failover never fires a
slot twice and never loses one the policy keeps.

The rules, as docs/schedules.md states them for users:

- DST: a cron time that does not exist that day (the spring gap) fires once,
  at the first valid time after it; a time that happens twice (the autumn
  repeat) fires once, the first time. A cron whose hour is ``*`` follows the
  clock instead (cronsim's reading, as Debian's cron): every real hour.
- Missed slots, when the sweep finds more than one slot due or one long
  overdue (the sweep did not run: downtime, a pause with ``one``/``all``):
  ``skip`` fires only the latest due slot, and only when it is at most
  ``MISSED_AFTER_SECONDS`` late; ``one`` fires the latest due slot; ``all``
  fires every due slot, at most ``MAX_MISSED_SLOTS`` (the latest ones).
- Overlap ``skip``: a slot is skipped while the schedule's last todo is live
  (pending, claimed or waiting for a retry).
- Paused: nothing fires. Resuming with ``missed`` ``skip`` starts from the
  next slot after now; with ``one`` or ``all`` the slots of the pause are
  missed slots, fired as that policy says.

Time is PostgreSQL's (``now()``), as everywhere in the store.
"""

import base64
import json
import logging
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from django.db import DatabaseError, IntegrityError, transaction

from .lifecycle import (
    Created,
    create_todo,
    validate_cost,
    validate_group,
    validate_max_cost,
    validate_priority,
)
from .queues import MAX_ATTEMPTS_CAP
from .rows import (
    MAX_NAME_CHARS,
    MAX_PAGE_SIZE,
    MAX_TITLE_CHARS,
    Conflict,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Row,
    Scope,
    StoreError,
    Todo,
    _iso,
    _json,
)
from .sql import LIVE_ROW, _run, _scope, _scope_params, _uuid, is_outage

logger = logging.getLogger("switchboard.schedules")

# ``all`` fires at most this many missed slots (the latest); older ones are skipped.
MAX_MISSED_SLOTS = 100
# Under ``missed: skip`` a slot this late is a missed one, and is skipped. The
# sweep runs every few seconds (a cron line: every minute), so an on-time slot
# is never this late.
MISSED_AFTER_SECONDS = 300
ON_TIME = timedelta(seconds=MISSED_AFTER_SECONDS)
# A schedule fires at most once a minute, as cron does.
MIN_EVERY_SECONDS = 60
MAX_EVERY_SECONDS = 366 * 24 * 3600
MAX_CRON_CHARS = 200
MAX_NEXT_SLOTS = 100
# Schedules locked and fired per transaction of a sweep pass.
FIRE_BATCH = 50
# The names cron knows, as five fields.
CRON_NAMES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
}
SCHEDULE_OVERLAP = ("allow", "skip")
SCHEDULE_MISSED = ("skip", "one", "all")
# What a schedule's todo template may hold.
TEMPLATE_FIELDS = (
    "title",
    "payload",
    "max_attempts",
    "priority",
    "group",
    "cost",
    "max_cost",
)
# When a recurrence has no slot left (a cron date that never comes again):
# the schedule sleeps until then, as a held todo does.
NEVER = datetime(9998, 12, 31, tzinfo=UTC)


class InvalidSchedule(ValueError):
    """A schedule field the caller must fix; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


# --- Recurrence -----------------------------------------------------------------


@dataclass(frozen=True)
class Recurrence:
    """When a schedule's slots are: a cron expression in a time zone, or an interval."""

    cron: str | None
    every_seconds: int | None
    time_zone: str = "UTC"

    @classmethod
    def parse(cls, cron: object, every_seconds: object, time_zone: object) -> Self:
        """Validate a recurrence; InvalidSchedule names the field at fault."""
        if (cron is None) == (every_seconds is None):
            raise InvalidSchedule("cron", "give either cron or every_seconds")
        zone = "UTC" if time_zone is None else time_zone
        if not isinstance(zone, str) or not _known_zone(zone):
            raise InvalidSchedule("time_zone", f"unknown IANA time zone {zone!r}")
        if every_seconds is not None:
            if isinstance(every_seconds, bool) or not isinstance(every_seconds, int):
                raise InvalidSchedule("every_seconds", "must be a whole number")
            if not MIN_EVERY_SECONDS <= every_seconds <= MAX_EVERY_SECONDS:
                raise InvalidSchedule(
                    "every_seconds",
                    f"must be between {MIN_EVERY_SECONDS} and {MAX_EVERY_SECONDS}",
                )
            return cls(None, every_seconds, zone)
        if not isinstance(cron, str) or not cron.strip():
            raise InvalidSchedule("cron", "must be a non-empty string")
        if len(cron) > MAX_CRON_CHARS:
            raise InvalidSchedule(
                "cron", f"must be at most {MAX_CRON_CHARS} characters"
            )
        recurrence = cls(" ".join(cron.split()), None, zone)
        expression = recurrence.expression
        if len(expression.split()) != 5:
            raise InvalidSchedule(
                "cron",
                "must be five fields (minute hour day month weekday) or one of "
                + ", ".join(CRON_NAMES),
            )
        try:
            first = next(recurrence.slots_after(datetime.now(UTC)), None)
        except (CronSimError, ValueError) as exc:
            raise InvalidSchedule("cron", f"not a valid expression: {exc}") from None
        if first is None:
            raise InvalidSchedule("cron", "names no date in the next fifty years")
        return recurrence

    @property
    def expression(self) -> str:
        """The cron expression as five fields (a name like @daily spelled out)."""
        assert self.cron is not None
        return CRON_NAMES.get(self.cron.lower(), self.cron)

    def slots_after(self, moment: datetime) -> Iterator[datetime]:
        """Yield the slots strictly after ``moment``, ascending, in UTC."""
        if self.every_seconds is not None:
            step = self.every_seconds
            index = math.floor(moment.timestamp() / step) + 1
            while True:
                yield datetime.fromtimestamp(index * step, UTC)
                index += 1
        zone = ZoneInfo(self.time_zone)
        # cronsim walks local wall time: in an autumn repeat a fixed-time slot
        # is the first of the two, which may lie before ``moment``.
        for local in CronSim(self.expression, moment.astimezone(zone)):
            slot = local.astimezone(UTC)
            if slot > moment:
                yield slot


_ZONES: frozenset[str] | None = None


def _known_zone(name: str) -> bool:
    global _ZONES
    if _ZONES is None:
        _ZONES = frozenset(available_timezones())
    if name not in _ZONES and name != "UTC":
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


# The admission fields of a template, checked as a create checks them.
TEMPLATE_CHECKS = {
    "priority": validate_priority,
    "group": validate_group,
    "cost": validate_cost,
    "max_cost": validate_max_cost,
}


def _template(todo: object) -> JSONObject:
    """Validate a todo template (InvalidSchedule names ``todo.<field>``)."""
    if todo is None:
        return {}
    if not isinstance(todo, dict):
        raise InvalidSchedule("todo", "must be an object")
    # 3.0 is 3, as JSON Schema (and the create_todo fields) read it.
    todo = {
        name: int(value)
        if name in ("priority", "max_attempts")
        and isinstance(value, float)
        and value.is_integer()
        else value
        for name, value in todo.items()
    }
    for name in todo:
        if name not in TEMPLATE_FIELDS:
            raise InvalidSchedule(
                f"todo.{name}",
                f"unknown; a template holds {', '.join(TEMPLATE_FIELDS)}",
            )
    title = todo.get("title")
    if title is not None:
        if not isinstance(title, str):
            raise InvalidSchedule("todo.title", "must be a string")
        if len(title) > MAX_TITLE_CHARS:
            raise InvalidSchedule(
                "todo.title", f"must be at most {MAX_TITLE_CHARS} characters"
            )
    attempts = todo.get("max_attempts")
    if attempts is not None and (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_ATTEMPTS_CAP
    ):
        raise InvalidSchedule(
            "todo.max_attempts", f"must be a whole number from 1 to {MAX_ATTEMPTS_CAP}"
        )
    for name, validate in TEMPLATE_CHECKS.items():
        try:
            validate(todo.get(name))
        except ValueError as exc:
            raise InvalidSchedule(f"todo.{name}", str(exc)) from None
    return {name: todo[name] for name in TEMPLATE_FIELDS if name in todo}


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidSchedule(field, "must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidSchedule(field, f"must be at most {MAX_NAME_CHARS} characters")
    return value


def _choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidSchedule(field, f"must be one of {', '.join(choices)}")
    assert isinstance(value, str)
    return value


# --- Rows -----------------------------------------------------------------------

SCHEDULE_COLUMNS = (
    "id, endpoint_id, name, queue, cron, every_seconds, time_zone, todo, overlap,"
    " missed, paused_at, next_slot_at, last_slot_at, last_todo_id, fires, skips,"
    " lateness_seconds, created_at, updated_at"
)
S_COLUMNS = ", ".join(f"s.{name.strip()}" for name in SCHEDULE_COLUMNS.split(","))


@dataclass(frozen=True)
class Schedule:
    """One schedule, as the API and the Board render it."""

    id: str
    endpoint_id: str
    name: str
    queue: str
    cron: str | None
    every_seconds: int | None
    time_zone: str
    todo: JSONObject
    overlap: str
    missed: str
    paused_at: datetime | None
    next_slot_at: datetime
    last_slot_at: datetime | None
    last_todo_id: str | None
    fires: int
    skips: int
    lateness_seconds: float
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Self:
        values = list(row[:19])
        values[0], values[1] = str(values[0]), str(values[1])
        if isinstance(values[7], str):
            values[7] = json.loads(values[7])
        if values[13] is not None:
            values[13] = str(values[13])
        return cls(*values)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def recurrence(self) -> Recurrence:
        return Recurrence(self.cron, self.every_seconds, self.time_zone)

    def upcoming(self, count: int, now: datetime) -> list[datetime]:
        """The next ``count`` slots: from next_slot_at, or after now when paused."""
        if self.paused:
            slots = self.recurrence.slots_after(now)
        else:
            slots = _from(self.recurrence, self.next_slot_at)
        out: list[datetime] = []
        for slot in slots:
            if len(out) >= count or slot >= NEVER:
                break
            out.append(slot)
        return out

    def to_dict(self) -> JSONObject:
        return {
            "id": self.id,
            "name": self.name,
            "queue": self.queue,
            "cron": self.cron,
            "every_seconds": self.every_seconds,
            "time_zone": self.time_zone,
            "todo": self.todo,
            "overlap": self.overlap,
            "missed": self.missed,
            "paused": self.paused,
            "paused_at": _iso(self.paused_at),
            # A paused schedule has no next slot until it is resumed.
            "next_slot_at": None if self.paused else _iso(self.next_slot_at),
            "last_slot_at": _iso(self.last_slot_at),
            "last_todo_id": self.last_todo_id,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


def _from(recurrence: Recurrence, first: datetime) -> Iterator[datetime]:
    """Yield ``first`` (a slot), then the recurrence's slots after it."""
    yield first
    yield from recurrence.slots_after(first)


def _first_after(recurrence: Recurrence, moment: datetime) -> datetime:
    return next(recurrence.slots_after(moment), NEVER)


CLOCK_SQL = "SELECT now()"


def _now() -> datetime:
    row = _run("schedule_clock", CLOCK_SQL, {}, fetch="one")
    assert row is not None  # a SELECT without FROM returns one row
    moment: datetime = row[0]
    return moment


# --- Create, read, change, delete -----------------------------------------------

CREATE_SQL = f"""
INSERT INTO schedules (id, endpoint_id, name, queue, cron, every_seconds, time_zone,
                       todo, overlap, missed, paused_at, next_slot_at)
SELECT gen_random_uuid(), e.id, %(name)s, %(queue)s, %(cron)s, %(every_seconds)s,
       %(time_zone)s, %(todo)s::jsonb, %(overlap)s, %(missed)s,
       CASE WHEN %(paused)s THEN now() END, %(next_slot_at)s
  FROM endpoints e
 WHERE e.id = %(endpoint_id)s
ON CONFLICT (endpoint_id, name) DO NOTHING
RETURNING {SCHEDULE_COLUMNS}
"""

NAME_TAKEN = "a schedule with this name exists in this endpoint"


def create_schedule(
    scope: Scope,
    *,
    name: str,
    queue: str,
    cron: str | None = None,
    every_seconds: int | None = None,
    time_zone: str | None = None,
    todo: Mapping[str, Any] | None = None,
    overlap: str = "allow",
    missed: str = "skip",
    paused: bool = False,
) -> Schedule:
    """Create a schedule; its first slot is the first one after now.

    InvalidSchedule names a bad field; a name taken in this endpoint is a
    Conflict; a queue outside the grant is QueueNotGranted.
    """
    params = _validated(
        scope,
        name=name,
        queue=queue,
        cron=cron,
        every_seconds=every_seconds,
        time_zone=time_zone,
        todo=todo,
        overlap=overlap,
        missed=missed,
    )
    recurrence: Recurrence = params.pop("recurrence")
    params["next_slot_at"] = _first_after(recurrence, _now())
    params["paused"] = bool(paused)
    row = _run("create_schedule", CREATE_SQL, params, fetch="one")
    if row is None:
        if _run("create_schedule", ENDPOINT_SQL, params, fetch="one") is None:
            raise NotFound("no such endpoint")
        raise Conflict(NAME_TAKEN)
    return Schedule.from_row(row)


ENDPOINT_SQL = "SELECT 1 FROM endpoints WHERE id = %(endpoint_id)s"


def _validated(scope: Scope | None, **given: Any) -> dict[str, Any]:
    """Validate every field of a schedule; return CREATE_SQL's parameters
    (an operator's, ``scope`` None, have no endpoint and no grant)."""
    name = _text("name", given["name"])
    queue = _text("queue", given["queue"])
    if scope is not None and not scope.covers(queue):
        raise QueueNotGranted(queue)
    recurrence = Recurrence.parse(
        given["cron"], given["every_seconds"], given["time_zone"]
    )
    return {
        **(_scope_params(scope) if scope is not None else {}),
        "name": name,
        "queue": queue,
        "cron": recurrence.cron,
        "every_seconds": recurrence.every_seconds,
        "time_zone": recurrence.time_zone,
        "todo": json.dumps(_template(given["todo"])),
        "overlap": _choice("overlap", given["overlap"], SCHEDULE_OVERLAP),
        "missed": _choice("missed", given["missed"], SCHEDULE_MISSED),
        "recurrence": recurrence,
    }


# One schedule by id, in the caller's scope: an agent's endpoint and grant, or
# the Board's (``operator``: any endpoint, narrowed to ``endpoint_ids`` when
# given). A foreign id, a malformed one and one outside the grant are alike:
# not found.
SCOPED_ONE = """
   s.id = %(id)s
   AND (%(operator)s OR (s.endpoint_id = %(endpoint_id)s
        AND (%(queues)s::text[] IS NULL OR s.queue = ANY(%(queues)s::text[]))))
   AND (%(endpoint_ids)s::uuid[] IS NULL
        OR s.endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
"""

GET_SQL = f"SELECT {S_COLUMNS} FROM schedules s WHERE {SCOPED_ONE}"
LOCK_SQL = f"{GET_SQL} FOR UPDATE"


# The Board's owner scope: the endpoints a user owns (None: every endpoint).
EndpointIds = Iterable[object] | None


def _one_params(
    scope: Scope | None, schedule_id: object, endpoint_ids: EndpointIds = None
) -> dict[str, Any]:
    canonical = _uuid(schedule_id)
    if canonical is None:
        raise NotFound("no such schedule")
    ids = None
    if endpoint_ids is not None:
        ids = [parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None]
    return {**_scope(scope), "id": canonical, "endpoint_ids": ids}


def get_schedule(scope: Scope, schedule_id: str) -> Schedule:
    """Return one schedule of this endpoint (NotFound: absent, foreign, malformed)."""
    return _get(_one_params(scope, schedule_id))


def get_schedule_any_endpoint(
    schedule_id: str, *, endpoint_ids: EndpointIds = None
) -> Schedule:
    """Return a schedule of any endpoint (the Board; ``endpoint_ids``: its scope)."""
    return _get(_one_params(None, schedule_id, endpoint_ids))


def _get(params: dict[str, Any]) -> Schedule:
    row = _run("get_schedule", GET_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such schedule")
    return Schedule.from_row(row)


LIST_SQL = f"""
SELECT {S_COLUMNS} FROM schedules s
 WHERE s.endpoint_id = %(endpoint_id)s
   AND (%(queues)s::text[] IS NULL OR s.queue = ANY(%(queues)s::text[]))
   AND (%(after)s::text IS NULL OR s.name > %(after)s)
 ORDER BY s.name
 LIMIT %(limit)s
"""


def list_schedules(
    scope: Scope, *, limit: int = 50, cursor: str | None = None
) -> tuple[list[Schedule], str | None]:
    """Return a page of this endpoint's schedules by name, and the next cursor."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE_SIZE}")
    after = None if cursor is None else _decode(cursor)
    params = {**_scope_params(scope), "after": after, "limit": limit + 1}
    rows = _run("list_schedules", LIST_SQL, params)
    schedules = [Schedule.from_row(row) for row in rows[:limit]]
    more = len(rows) > limit
    return schedules, _encode(schedules[-1].name) if more else None


def _encode(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode(cursor: str) -> str:
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("cursor is not one this API issued") from None


UPDATE_SQL = f"""
UPDATE schedules s
   SET name = %(name)s, queue = %(queue)s, cron = %(cron)s,
       every_seconds = %(every_seconds)s, time_zone = %(time_zone)s,
       todo = %(todo)s::jsonb, overlap = %(overlap)s, missed = %(missed)s,
       next_slot_at = %(next_slot_at)s, updated_at = now()
 WHERE {SCOPED_ONE}
RETURNING {SCHEDULE_COLUMNS}
"""

# The fields update_schedule may change.
CHANGEABLE = (
    "name",
    "queue",
    "cron",
    "every_seconds",
    "time_zone",
    "todo",
    "overlap",
    "missed",
)


def update_schedule(scope: Scope, schedule_id: str, **changes: Any) -> Schedule:
    """Change the fields given (others stay); a name taken is a Conflict.

    Giving ``cron`` drops ``every_seconds`` and the reverse. A new recurrence
    starts from its first slot after now (and after the last slot fired, so
    that no slot fires twice).
    """
    return _update(scope, _one_params(scope, schedule_id), changes)


def update_schedule_any_endpoint(
    schedule_id: str, *, endpoint_ids: EndpointIds = None, **changes: Any
) -> Schedule:
    """``update_schedule`` for the Board: any endpoint in ``endpoint_ids``."""
    return _update(None, _one_params(None, schedule_id, endpoint_ids), changes)


def _update(scope: Scope | None, one: dict[str, Any], changes: Any) -> Schedule:
    unknown = set(changes) - set(CHANGEABLE)
    if unknown:
        raise InvalidSchedule(sorted(unknown)[0], "cannot be changed")
    if changes.get("cron") is not None and changes.get("every_seconds") is not None:
        raise InvalidSchedule("cron", "give either cron or every_seconds")
    with transaction.atomic():
        row = _run("update_schedule", LOCK_SQL, one, fetch="one")
        if row is None:
            raise NotFound("no such schedule")
        current = Schedule.from_row(row)
        merged: dict[str, Any] = {
            name: getattr(current, name) for name in CHANGEABLE
        } | {name: value for name, value in changes.items() if value is not None}
        if changes.get("cron") is not None:
            merged["every_seconds"] = None
        elif changes.get("every_seconds") is not None:
            merged["cron"] = None
        params = _validated(scope, **merged)
        recurrence: Recurrence = params.pop("recurrence")
        next_slot = current.next_slot_at
        if recurrence != current.recurrence:
            now = _now()
            start = max(now, current.last_slot_at or now)
            next_slot = _first_after(recurrence, start)
        params.update(one, next_slot_at=next_slot)
        try:
            # A savepoint: a name taken leaves the caller's transaction usable.
            with transaction.atomic():
                row = _run("update_schedule", UPDATE_SQL, params, fetch="one")
        except IntegrityError as exc:
            if _is_name_taken(exc):
                raise Conflict(NAME_TAKEN) from exc
            raise
    assert row is not None  # the row is locked and in scope
    return Schedule.from_row(row)


def _is_name_taken(exc: BaseException) -> bool:
    diag = getattr(getattr(exc, "__cause__", None), "diag", None)
    return getattr(diag, "constraint_name", None) == "schedules_endpoint_name_key"


DELETE_SQL = f"DELETE FROM schedules s WHERE {SCOPED_ONE}"


def delete_schedule(scope: Scope, schedule_id: str) -> None:
    """Delete a schedule and its fires; the todos it made stay."""
    params = _one_params(scope, schedule_id)
    if _run("delete_schedule", DELETE_SQL, params, fetch="count") == 0:
        raise NotFound("no such schedule")


PAUSE_SQL = f"""
UPDATE schedules s SET paused_at = coalesce(s.paused_at, now()), updated_at = now()
 WHERE {SCOPED_ONE}
RETURNING {SCHEDULE_COLUMNS}
"""


def pause_schedule(scope: Scope, schedule_id: str) -> Schedule:
    """Pause a schedule: no slot fires until it is resumed (again: no change)."""
    return _pause(_one_params(scope, schedule_id))


def pause_schedule_any_endpoint(
    schedule_id: str, *, endpoint_ids: EndpointIds = None
) -> Schedule:
    """``pause_schedule`` for the Board: any endpoint in ``endpoint_ids``."""
    return _pause(_one_params(None, schedule_id, endpoint_ids))


def _pause(params: dict[str, Any]) -> Schedule:
    row = _run("pause_schedule", PAUSE_SQL, params, fetch="one")
    if row is None:
        raise NotFound("no such schedule")
    return Schedule.from_row(row)


RESUME_SQL = f"""
UPDATE schedules s SET paused_at = NULL, next_slot_at = %(next_slot_at)s,
                       updated_at = now()
 WHERE {SCOPED_ONE}
RETURNING {SCHEDULE_COLUMNS}
"""


def resume_schedule(scope: Scope, schedule_id: str) -> Schedule:
    """Resume a paused schedule (a running one is left as it is).

    With ``missed: skip`` it goes on from the first slot after now: the pause
    leaves no burst. With ``one`` or ``all`` the slots of the pause are
    missed slots, and the next sweep fires them as that policy says.
    """
    return _resume(_one_params(scope, schedule_id))


def resume_schedule_any_endpoint(
    schedule_id: str, *, endpoint_ids: EndpointIds = None
) -> Schedule:
    """``resume_schedule`` for the Board: any endpoint in ``endpoint_ids``."""
    return _resume(_one_params(None, schedule_id, endpoint_ids))


def _resume(params: dict[str, Any]) -> Schedule:
    with transaction.atomic():
        row = _run("resume_schedule", LOCK_SQL, params, fetch="one")
        if row is None:
            raise NotFound("no such schedule")
        current = Schedule.from_row(row)
        if not current.paused:
            return current
        next_slot = current.next_slot_at
        if current.missed == "skip":
            next_slot = max(next_slot, _first_after(current.recurrence, _now()))
        params["next_slot_at"] = next_slot
        row = _run("resume_schedule", RESUME_SQL, params, fetch="one")
    assert row is not None  # locked above
    return Schedule.from_row(row)


def next_slots(scope: Scope, schedule_id: str, count: int = 5) -> list[datetime]:
    """The schedule's next ``count`` (1–100) slots, in UTC."""
    if not 1 <= count <= MAX_NEXT_SLOTS:
        raise ValueError(f"n must be between 1 and {MAX_NEXT_SLOTS}")
    return get_schedule(scope, schedule_id).upcoming(count, _now())


# --- Firing ---------------------------------------------------------------------

# 1. The due schedules of live endpoints, most overdue first, through
#    schedules_due_idx. SKIP LOCKED: a schedule another sweep is firing is
#    left to it; READ COMMITTED rechecks the WHERE on a row that sweep just
#    advanced, so a slot it fired is not due here any more.
DUE_SQL = f"""
SELECT {S_COLUMNS}, now(), e.queues
  FROM schedules s
  JOIN endpoints e ON e.id = s.endpoint_id
 WHERE s.paused_at IS NULL AND s.next_slot_at <= now() AND e.revoked_at IS NULL
 ORDER BY s.next_slot_at
 LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED
"""

# 1b. In a fair queue each fired todo's tag moves its group's row
#    (queue_groups) on, and the row stays locked until the pass commits.
#    Taken in firing order (most overdue first), a pass firing groups b then
#    a and a batch create (or another pass) taking a then b waited on each
#    other until PostgreSQL broke the cycle (a deadlock: one failed). The
#    pass takes its schedules' group rows first, in (endpoint, queue, group)
#    order, the order a batch create takes them in.
FAIR_GROUPS_SQL = """
INSERT INTO queue_groups AS g (endpoint_id, queue, group_key)
SELECT DISTINCT s.endpoint_id, s.queue, coalesce(s.todo->>'group', '')
  FROM schedules s
  JOIN queues q ON q.endpoint_id = s.endpoint_id AND q.name = s.queue AND q.fair
 WHERE s.id = ANY(%(ids)s::uuid[])
 ORDER BY 1, 2, 3
ON CONFLICT (endpoint_id, queue, group_key) DO UPDATE SET finish = g.finish
"""

# 2. Claim the slot: the unique key on (schedule, slot) lets it fire once.
FIRE_SQL = """
INSERT INTO schedule_fires (schedule_id, slot, manual, fired_at)
VALUES (%(schedule_id)s, %(slot)s, %(manual)s, now())
ON CONFLICT (schedule_id, slot) DO NOTHING
RETURNING id
"""

FIRED_TODO_SQL = "UPDATE schedule_fires SET todo_id = %(todo_id)s WHERE id = %(id)s"

# 3. Overlap: is the schedule's last todo still live?
LIVE_TODO_SQL = f"SELECT 1 FROM todos WHERE id = %(id)s AND {LIVE_ROW}"

# 4. Advance past the slots handled, and count them for /metrics.
ADVANCE_SQL = """
UPDATE schedules
   SET next_slot_at = %(next_slot_at)s,
       last_slot_at = coalesce(%(last_slot_at)s, last_slot_at),
       last_todo_id = coalesce(%(last_todo_id)s, last_todo_id),
       fires = fires + %(fired)s, skips = skips + %(skipped)s,
       lateness_seconds = lateness_seconds + %(lateness)s
 WHERE id = %(id)s
"""


@dataclass(frozen=True)
class Plan:
    """What a sweep does with one due schedule: the slots to fire (oldest
    first), how many it skips as missed, and where it goes on from."""

    fire: tuple[datetime, ...]
    missed: int
    next_slot_at: datetime


def plan(schedule: Schedule, now: datetime) -> Plan:
    """Apply the missed-slot policy to the schedule's slots due by ``now``."""
    due: deque[datetime] = deque(maxlen=MAX_MISSED_SLOTS)
    count = 0
    next_slot = NEVER
    first = schedule.next_slot_at
    if schedule.every_seconds is not None and first <= now:
        # An interval's slots are counted, not walked: a year down is
        # half a million slots of a one-minute schedule.
        step = timedelta(seconds=schedule.every_seconds)
        count = (now - first) // step + 1
        last = first + (count - 1) * step
        due.extend(last - back * step for back in range(min(count, due.maxlen or 0)))
        due.reverse()
        next_slot = last + step
    else:
        for slot in _from(schedule.recurrence, first):
            if slot > now:
                next_slot = slot
                break
            due.append(slot)
            count += 1
    if not due:
        return Plan((), 0, next_slot)
    latest = due[-1]
    if schedule.missed == "all":
        fire: tuple[datetime, ...] = tuple(due)
    elif schedule.missed == "one" or now - latest <= ON_TIME:
        fire = (latest,)
    else:
        fire = ()
    return Plan(fire, count - len(fire), next_slot)


@dataclass
class FireResult:
    """What one pass of ``fire_due_schedules`` did."""

    schedules: int = 0
    fired: int = 0
    skipped: int = 0
    todos: list[Todo] | None = None

    def add(self, other: "FireResult") -> None:
        self.schedules += other.schedules
        self.fired += other.fired
        self.skipped += other.skipped


def fire_due_schedules(*, limit: int = FIRE_BATCH) -> FireResult:
    """Fire one batch of due schedules, in one transaction; return the counts.

    Run it until ``schedules`` comes back below ``limit`` (the sweep does).
    """
    result = FireResult(todos=[])
    with transaction.atomic():
        rows = _run("fire_schedules", DUE_SQL, {"limit": int(limit)})
        if rows:
            ids = [row[0] for row in rows]
            _run("fire_schedules", FAIR_GROUPS_SQL, {"ids": ids}, fetch=None)
        for row in rows:
            schedule = Schedule.from_row(row)
            # The endpoint's grant (jsonb, as text from a raw cursor).
            now, grant = row[19], _json(row[20])
            queues = None if "*" in grant else tuple(grant)
            _fire_one(schedule, now, Scope(schedule.endpoint_id, queues), result)
    return result


def _fire_one(
    schedule: Schedule, now: datetime, scope: Scope, result: FireResult
) -> None:
    steps = plan(schedule, now)
    skipped, fired, lateness = steps.missed, 0, 0.0
    last_todo = schedule.last_todo_id
    last_slot = None
    for slot in steps.fire:
        if schedule.overlap == "skip" and last_todo is not None and _live(last_todo):
            skipped += 1
            continue
        todo = _fire_slot(schedule, scope, slot, manual=False)
        if todo is None:
            skipped += 1
            continue
        fired += 1
        lateness += max((todo.created_at - slot).total_seconds(), 0.0)
        last_todo, last_slot = todo.id, slot
        assert result.todos is not None
        result.todos.append(todo)
    _run(
        "fire_schedules",
        ADVANCE_SQL,
        {
            "id": schedule.id,
            "next_slot_at": steps.next_slot_at,
            "last_slot_at": last_slot,
            "last_todo_id": last_todo if last_todo != schedule.last_todo_id else None,
            "fired": fired,
            "skipped": skipped,
            "lateness": lateness,
        },
        fetch=None,
    )
    result.schedules += 1
    result.fired += fired
    result.skipped += skipped


def _live(todo_id: str) -> bool:
    return (
        _run("fire_schedules", LIVE_TODO_SQL, {"id": todo_id}, fetch="one") is not None
    )


def _fire_slot(
    schedule: Schedule,
    scope: Scope,
    slot: datetime,
    *,
    manual: bool,
    idempotency_key: str | None = None,
) -> Todo | None:
    """Create one slot's todo with its fire row (a savepoint: a slot that
    cannot fire leaves nothing behind); None when it did not fire: fired
    already, or its todo could not be made (a fire now raises why)."""
    template = schedule.todo
    when = _iso(slot)
    try:
        with transaction.atomic():
            fire = _run(
                "fire_schedules",
                FIRE_SQL,
                {"schedule_id": schedule.id, "slot": slot, "manual": manual},
                fetch="one",
            )
            if fire is None:
                return None
            created: Created = create_todo(
                scope,
                queue=schedule.queue,
                title=template.get("title") or schedule.name,
                payload=template.get("payload"),
                max_attempts=template.get("max_attempts"),
                priority=template.get("priority"),
                group=template.get("group"),
                cost=template.get("cost"),
                max_cost=template.get("max_cost"),
                idempotency_key=idempotency_key,
                actor=f"schedule {schedule.name}, slot {when}",
            )
            todo, new = created
            if not new:
                # A repeated fire-now with the same key: its todo is there.
                raise _Collapsed(todo)
            _run(
                "fire_schedules",
                FIRED_TODO_SQL,
                {"id": fire[0], "todo_id": todo.id},
                fetch=None,
            )
    except (StoreError, ValueError, DatabaseError) as exc:
        # A slot whose todo cannot be made (a queue the grant no longer
        # covers, a template the server now refuses) is skipped: it must not
        # hold up the other schedules of the batch, pass after pass. An
        # outage is not this slot's fault: the whole pass fails and retries.
        if is_outage(exc):
            raise
        logger.warning(
            "schedule slot skipped: its todo could not be made",
            extra={
                "fields": {
                    "schedule_id": schedule.id,
                    "slot": when,
                    "error": type(exc).__name__,
                    "detail": str(exc)[:200],
                }
            },
        )
        if manual:
            raise
        return None
    return todo


class _Collapsed(Exception):
    """A fire-now collapsed onto a live todo of its key: roll the fire back."""

    def __init__(self, todo: Todo) -> None:
        super().__init__(todo.id)
        self.todo = todo


FIRE_NOW_CLOCK_SQL = "SELECT clock_timestamp()"


def fire_schedule(
    scope: Scope, schedule_id: str, *, idempotency_key: str | None = None
) -> Created:
    """Fire a schedule now, paused or not: one todo per call; return (todo, created).

    Its slot is the moment of the call; the schedule's own slots are not
    touched. With an ``idempotency_key`` a repeated call returns the live
    todo of the first (created=False), as a create does.
    """
    params = _one_params(scope, schedule_id)
    with transaction.atomic():
        row = _run("fire_schedule", LOCK_SQL, params, fetch="one")
        if row is None:
            raise NotFound("no such schedule")
        schedule = Schedule.from_row(row)
        clock = _run("fire_schedule", FIRE_NOW_CLOCK_SQL, {}, fetch="one")
        assert clock is not None
        try:
            todo = _fire_slot(
                schedule,
                scope,
                clock[0],
                manual=True,
                idempotency_key=idempotency_key,
            )
        except _Collapsed as collapsed:
            return collapsed.todo, False
        assert todo is not None  # a fire now's slot is new, its failure raised
        _run(
            "fire_schedule",
            "UPDATE schedules SET last_todo_id = %(todo)s WHERE id = %(id)s",
            {"todo": todo.id, "id": schedule.id},
            fetch=None,
        )
    return todo, True


# The next slot the sweep will fire, as DUE_SQL picks them, through
# schedules_due_idx: seconds from now (negative: due already).
NEXT_SLOT_SQL = """
SELECT EXTRACT(EPOCH FROM s.next_slot_at - now())
  FROM schedules s
  JOIN endpoints e ON e.id = s.endpoint_id
 WHERE s.paused_at IS NULL AND e.revoked_at IS NULL
 ORDER BY s.next_slot_at
 LIMIT 1
"""


def seconds_to_next_slot() -> float | None:
    """Seconds until the next running schedule's next slot (None: no schedule)."""
    row = _run("seconds_to_next_slot", NEXT_SLOT_SQL, {}, fetch="one")
    return None if row is None else float(row[0])


# --- Retention ------------------------------------------------------------------

# Fires whose slot is older than the cutoff, schedule by schedule through the
# unique (schedule_id, slot) index. A schedule's next slot is always past every
# slot it fired, so an old fire's key guards nothing any more.
PURGE_FIRES_SQL = """
WITH doomed AS (
    SELECT f.id FROM schedules s
     CROSS JOIN LATERAL (
         SELECT id FROM schedule_fires f
          WHERE f.schedule_id = s.id
            AND f.slot < now() - make_interval(days => %(days)s::int)
          ORDER BY f.slot
          LIMIT %(limit)s) f
     LIMIT %(limit)s
)
DELETE FROM schedule_fires f USING doomed d WHERE f.id = d.id
"""


def purge_fires(older_than_days: int, *, limit: int = 5000) -> int:
    """Delete one batch of schedule fires older than the given days; return how
    many (retention, beside ``purge_terminal``: the Board's last runs)."""
    days = int(older_than_days)
    if days < 0:
        raise ValueError("older_than_days must not be negative")
    params = {"days": days, "limit": int(limit)}
    return _run("purge_fires", PURGE_FIRES_SQL, params, fetch="count")


# --- Figures --------------------------------------------------------------------

FIGURES_SQL = """
SELECT s.endpoint_id, e.name, s.name, s.queue, s.fires, s.skips, s.lateness_seconds
  FROM schedules s JOIN endpoints e ON e.id = s.endpoint_id
 ORDER BY s.endpoint_id, s.name
"""


@dataclass(frozen=True)
class ScheduleFigures:
    """A schedule's /metrics counters."""

    endpoint_id: str
    endpoint: str
    name: str
    queue: str
    fires: int
    skips: int
    lateness_seconds: float


def schedule_figures() -> list[ScheduleFigures]:
    """Every schedule's counters: fires, skips and summed lateness."""
    return [
        ScheduleFigures(str(r[0]), r[1], r[2], r[3], r[4], r[5], float(r[6]))
        for r in _run("schedule_figures", FIGURES_SQL, {})
    ]


# --- The Board ------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRun:
    """One slot a schedule fired, and where its todo stands now (``purged``
    once retention deleted it)."""

    slot: datetime
    manual: bool
    fired_at: datetime
    todo_id: str | None
    outcome: str

    @property
    def label(self) -> str:
        return self.outcome.replace("_", " ")


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the Board shows it: its endpoint, next slots, last runs."""

    schedule: Schedule
    endpoint_name: str
    upcoming: list[datetime]
    runs: list[ScheduleRun]


BOARD_LIST_SQL = f"""
SELECT {S_COLUMNS}, e.name
  FROM schedules s JOIN endpoints e ON e.id = s.endpoint_id
 WHERE (%(endpoint_ids)s::uuid[] IS NULL
        OR s.endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
   AND (%(id)s::uuid IS NULL OR s.id = %(id)s::uuid)
 ORDER BY e.name, s.name
 LIMIT %(limit)s
"""

# The last fires of each schedule, newest first, through the unique
# (schedule_id, slot) index, with their todos' states.
RUNS_SQL = """
SELECT f.schedule_id, f.slot, f.manual, f.fired_at, f.todo_id,
       t.state, t.next_retry_at, t.canceled_at
  FROM unnest(%(ids)s::uuid[]) AS s(id)
 CROSS JOIN LATERAL (
     SELECT * FROM schedule_fires f
      WHERE f.schedule_id = s.id AND f.todo_id IS NOT NULL
      ORDER BY f.slot DESC
      LIMIT %(per)s) f
  LEFT JOIN todos t ON t.id = f.todo_id
 ORDER BY f.schedule_id, f.slot DESC
"""

# Schedules the Board lists at most (per page load).
BOARD_LIMIT = 500


def list_schedules_any_endpoint(
    *,
    endpoint_ids: EndpointIds = None,
    schedule_id: str | None = None,
    runs: int = 5,
    upcoming: int = 3,
) -> list[ScheduleView]:
    """The schedules of every endpoint in ``endpoint_ids`` (None: all), by
    endpoint and name, each with its next slots and its last runs."""
    ids = None
    if endpoint_ids is not None:
        ids = [parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None]
    one = None
    if schedule_id is not None:
        one = _uuid(schedule_id)
        if one is None:
            return []
    params = {"endpoint_ids": ids, "id": one, "limit": BOARD_LIMIT}
    rows = _run("list_schedules_any_endpoint", BOARD_LIST_SQL, params)
    schedules = [(Schedule.from_row(row), row[19]) for row in rows]
    if not schedules:
        return []
    fired: dict[str, list[ScheduleRun]] = {}
    run_rows = _run(
        "list_schedules_any_endpoint",
        RUNS_SQL,
        {"ids": [schedule.id for schedule, _ in schedules], "per": runs},
    )
    for row in run_rows:
        fired.setdefault(str(row[0]), []).append(
            ScheduleRun(row[1], row[2], row[3], str(row[4]), _outcome(*row[5:8]))
        )
    now = _now()
    return [
        ScheduleView(
            schedule,
            name,
            schedule.upcoming(upcoming, now),
            fired.get(schedule.id, []),
        )
        for schedule, name in schedules
    ]


def _outcome(
    state: str | None, next_retry_at: datetime | None, canceled_at: datetime | None
) -> str:
    """Where a fired todo stands, as the todo JSON's ``outcome`` names it."""
    if state is None:
        return "purged"
    if canceled_at is not None:
        return "canceled"
    if state == "failed":
        return "retry_scheduled" if next_retry_at is not None else "dead_letter"
    return state
