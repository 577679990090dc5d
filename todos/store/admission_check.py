"""The admission checker: replay ``todo_events`` and find every limit exceeded.

For each group (endpoint, queue, group) it replays the history and counts the
group's claimed todos after each event; a claim that made the count exceed
the limit its admission recorded is a violation. For each token bucket (a
queue's ``rate_limit``, a group's ``group_rate_limit``) it checks every
window of claims: the cost admitted between any two claims i ≤ j of the
bucket may not exceed ``burst + count / per_seconds × (t_j − t_i)`` (the token
bucket's bound; a cost above the burst, admitted only into a full bucket,
adds its excess).

Ordering, and why it is sound. Event ids and ``now()`` are not commit order
in general: a transaction may take its id early and commit late. But every
event of a group is written while its transaction holds the group's advisory
lock until commit: a claim takes it exclusive (``switchboard_admit``) before
its history row is inserted, and every end of a grouped todo's claim takes it
shared in a BEFORE trigger on the row, before the statement's history row is
inserted. The id (a sequence, increasing in real time) of a claim's event is
therefore drawn after every conflicting earlier transaction committed, and
before any later one could draw its own: within a group, id order is commit
order for every pair of events that conflict (a claim and anything else).
Two ends may interleave, but both only lower the count, so any order of them
gives the same maxima at the claims. The rate windows are judged by the
clock each admission read once with the bucket's row lock held (``at`` in its
admission record), which is likewise monotone in the bucket's commit order.

A claim of a grouped todo carries its admission record (``admission``:
group, limit, cost, transfer, at, rate, group_rate). A cancel's composed
pending → claimed → done, which never claimed anything, carries none and is
not counted. A lapsed lease taken over (``transfer``) keeps the slot it had.
"""

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .sql import _run

# One history row as the checker reads it.
CheckedEvent = tuple[
    int, str, str, str | None, str, dict[str, Any] | None, str, str | None
]

# The events of grouped todos (and of rate-limited claims), in id order.
EVENTS_SQL = """
SELECT e.id, e.todo_id::text, e.endpoint_id::text, e.from_state, e.to_state,
       e.admission, t.queue, t.group_key
  FROM todo_events e
  JOIN todos t ON t.id = e.todo_id
 WHERE (t.group_key IS NOT NULL OR e.admission IS NOT NULL)
   AND (%(endpoint_id)s::uuid IS NULL OR e.endpoint_id = %(endpoint_id)s::uuid)
   AND e.id > %(after)s
 ORDER BY e.id
"""

# Slack for sums of float costs.
EPSILON = 1e-6


@dataclass
class Report:
    """What a check found: how much it replayed and every violation."""

    events: int = 0
    claims: int = 0
    ends: int = 0
    groups: int = 0
    rate_claims: int = 0
    max_in_flight: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def check(*, endpoint_id: str | None = None, after: int = 0) -> Report:
    """Check the stored history (of one endpoint, from event ``after``)."""
    rows = _run(
        "admission_check", EVENTS_SQL, {"endpoint_id": endpoint_id, "after": after}
    )
    return check_events(
        (r[0], r[1], r[2], r[3], r[4], _json(r[5]), r[6], r[7]) for r in rows
    )


def _json(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        loaded: dict[str, Any] = json.loads(value)
        return loaded
    assert isinstance(value, dict)
    return value


def check_events(events: Iterable[CheckedEvent]) -> Report:
    """Replay events (id, todo, endpoint, from, to, admission, queue, group),
    in id order, and report every limit exceeded."""
    report = Report()
    in_flight: dict[tuple[str, str, str], int] = defaultdict(int)
    holding: set[str] = set()
    buckets: dict[tuple[str, str, str], list[tuple[datetime, float, dict[str, Any]]]]
    buckets = defaultdict(list)
    for event in events:
        event_id, todo_id, endpoint, source, target, admitted, queue, group = event
        report.events += 1
        key = (endpoint, queue, group or "")
        if target == "claimed" and source != "claimed" and admitted is None:
            # A cancel's composed claim: nothing was claimed.
            continue
        if target == "claimed" and admitted is not None:
            report.claims += 1
            _note_rates(buckets, endpoint, queue, group, admitted)
            if group is None:
                continue
            if admitted.get("transfer"):
                if todo_id not in holding:
                    report.violations.append(
                        f"event {event_id}: {todo_id} took over a slot it did not hold"
                    )
                    holding.add(todo_id)
                    in_flight[key] += 1
                continue
            if todo_id in holding:
                report.violations.append(
                    f"event {event_id}: {todo_id} claimed twice without an end"
                )
                continue
            holding.add(todo_id)
            in_flight[key] += 1
            name = "/".join(key)
            report.max_in_flight[name] = max(
                report.max_in_flight.get(name, 0), in_flight[key]
            )
            limit = admitted.get("limit")
            if limit is not None and in_flight[key] > limit:
                report.violations.append(
                    f"event {event_id}: group {name} has {in_flight[key]} claimed,"
                    f" over its limit {limit}"
                )
        elif source == "claimed" and target != "claimed" and todo_id in holding:
            report.ends += 1
            holding.discard(todo_id)
            in_flight[key] -= 1
    report.groups = len(in_flight)
    for bucket, claims in buckets.items():
        report.rate_claims += len(claims)
        report.violations.extend(_rate_violations("/".join(bucket), claims))
    return report


def _note_rates(
    buckets: dict[tuple[str, str, str], list[tuple[datetime, float, dict[str, Any]]]],
    endpoint: str,
    queue: str,
    group: str | None,
    admitted: dict[str, Any],
) -> None:
    at = datetime.fromisoformat(admitted["at"])
    cost = float(admitted.get("cost", 1))
    if admitted.get("rate") is not None:
        buckets[(endpoint, queue, "")].append((at, cost, admitted["rate"]))
    if admitted.get("group_rate") is not None and group is not None:
        buckets[(endpoint, queue, "group:" + group)].append(
            (at, cost, admitted["group_rate"])
        )


def _rate_violations(
    name: str, claims: list[tuple[datetime, float, dict[str, Any]]]
) -> Iterator[str]:
    """Windows of one bucket's claims over burst + rate × width.

    For claims i ≤ j (in time order, one setting): sum(cost i..j) − rate ×
    (t_j − t_i) ≤ burst + excess, i.e. (S_j − rate·t_j) + max_i(rate·t_i −
    S_{i−1}) ≤ burst + excess, a running maximum: linear time.
    """
    claims.sort(key=lambda claim: claim[0])
    setting: dict[str, Any] | None = None
    total = best = excess = 0.0
    origin = claims[0][0] if claims else None
    for at, cost, rate_setting in claims:
        assert origin is not None
        if rate_setting != setting:
            # A new setting: windows start again from here.
            setting, total, best, excess = rate_setting, 0.0, float("-inf"), 0.0
        rate = setting["count"] / setting["per_seconds"]
        burst = float(setting.get("burst") or setting["count"])
        t = (at - origin).total_seconds()
        best = max(best, rate * t - total)
        total += cost
        excess = max(excess, cost - burst)
        if total - rate * t + best > burst + excess + EPSILON:
            yield (
                f"bucket {name}: {total - rate * t + best:.3f} admitted in a window"
                f" allowing {burst + excess:.3f} (at {at.isoformat()})"
            )
