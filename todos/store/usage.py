"""Usage (CONTRACT §18): what agents report they spent, in ``usage_ledger``.

A todo's usage rides on its acknowledgements (heartbeat, complete, fail): the
report is the attempt's running total, and the acknowledgement's own
statement writes it (``lifecycle._ack_sql``'s ``ledger`` step), so a report
counts exactly when its acknowledgement does. Usage outside a todo (an
agent's planning calls) is reported here, against a queue, and made safe to
repeat by an idempotency key.
"""

import json
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

from .rows import (
    MAX_GROUP_CHARS,
    MAX_KEY_CHARS,
    MAX_MODEL_CHARS,
    MAX_USAGE_COST_USD,
    MAX_USAGE_TOKENS,
    JSONObject,
    NotFound,
    QueueNotGranted,
    Scope,
    _iso,
)
from .sql import Statement, Steps, _scope_params, on_django, on_pool

USAGE_FIELDS = ("input_tokens", "output_tokens", "cost_usd", "model")
TOKEN_FIELDS = ("input_tokens", "output_tokens")


def validate_usage(usage: object, field: str = "usage") -> JSONObject | None:
    """Return a usage report's given fields (None: no report); ValueError
    names the bad field. Tokens are integers ≥ 0, ``cost_usd`` a number ≥ 0
    (dollars), ``model`` a name."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ValueError(f"{field} must be an object with {', '.join(USAGE_FIELDS)}")
    unknown = sorted(set(usage) - set(USAGE_FIELDS))
    if unknown:
        raise ValueError(
            f"{field}.{unknown[0]} is not a usage field "
            f"(they are {', '.join(USAGE_FIELDS)})"
        )
    report: JSONObject = {}
    for name in TOKEN_FIELDS:
        value = usage.get(name)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{field}.{name} must be an integer of at least 0")
        if not 0 <= value <= MAX_USAGE_TOKENS:
            raise ValueError(f"{field}.{name} must be from 0 to {MAX_USAGE_TOKENS}")
        report[name] = value
    cost = usage.get("cost_usd")
    if cost is not None:
        if isinstance(cost, bool) or not isinstance(cost, int | float):
            raise ValueError(f"{field}.cost_usd must be a number of at least 0")
        if not 0 <= cost <= MAX_USAGE_COST_USD:
            raise ValueError(f"{field}.cost_usd must be from 0 to {MAX_USAGE_COST_USD}")
        report["cost_usd"] = cost
    model = usage.get("model")
    if model is not None:
        if not isinstance(model, str) or not 1 <= len(model) <= MAX_MODEL_CHARS:
            raise ValueError(
                f"{field}.model must be a string of 1 to {MAX_MODEL_CHARS} characters"
            )
        if "\x00" in model:
            raise ValueError(f"{field}.model must not contain NUL characters")
        report["model"] = model
    return report


def usage_json(usage: object, field: str = "usage") -> str | None:
    """Validate a report and return it as the JSON the statements bind."""
    report = validate_usage(usage, field)
    return None if report is None else json.dumps(report)


@dataclass(frozen=True)
class UsageReport:
    """One ledger row: an attempt's usage, or a report made outside a todo."""

    id: int
    queue: str
    group: str | None
    todo_id: str | None
    attempt: int | None
    input_tokens: int
    output_tokens: int
    cost_usd: Decimal
    model: str
    idempotency_key: str | None
    reported_at: datetime

    def to_dict(self) -> JSONObject:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["cost_usd"] = float(self.cost_usd)
        out["reported_at"] = _iso(self.reported_at)
        return out


REPORT_COLUMNS = (
    "id, queue, group_key, todo_id, attempt, input_tokens, output_tokens, "
    "cost_usd, model, idempotency_key, reported_at"
)


def _report(row: Any) -> UsageReport:
    values = list(row)
    values[3] = None if values[3] is None else str(values[3])
    return UsageReport(*values)


# What a statement that writes ledger rows (a CTE named ``ledger``) returns
# of each, for BUDGET_SPEND: its scope, its figures, and its figures and time
# before this write (prev_*: NULL for a new row).
LEDGER_WRITTEN = (
    "endpoint_id, queue, group_key, cost_usd, input_tokens + output_tokens AS tokens,"
    " prev_cost_usd, prev_tokens, prev_reported_at"
)

# Count the rows ``ledger`` wrote against their budgets (CONTRACT §18), in
# the same statement, so a report counts exactly when its row is written:
# switchboard_budget_spend locks each budget the rows fall under, adds the
# difference each row made, and returns the events of the limits reached,
# which go into budget_events (a data-modifying step always runs). No row
# written (an acknowledgement without usage), or no budget on the rows'
# endpoints (a probe of budgets_endpoint_idx), no call.
BUDGET_SPEND = """, spend AS (
    INSERT INTO budget_events (budget_id, endpoint_id, event, actor, detail)
    SELECT s.budget_id, s.endpoint_id, s.event, s.actor, s.detail
      FROM (SELECT array_agg(endpoint_id) AS endpoints, array_agg(queue) AS queues,
                   array_agg(group_key) AS groups, array_agg(cost_usd) AS usd,
                   array_agg(tokens) AS tokens, array_agg(prev_cost_usd) AS prev_usd,
                   array_agg(prev_tokens) AS prev_tokens,
                   array_agg(prev_reported_at) AS prev_at
              FROM ledger
             WHERE EXISTS (SELECT 1 FROM budgets b
                            WHERE b.endpoint_id = ledger.endpoint_id)
            HAVING count(*) > 0) w
     CROSS JOIN LATERAL switchboard_budget_spend(
           w.endpoints, w.queues, w.groups, w.usd, w.tokens, w.prev_usd,
           w.prev_tokens, w.prev_at) s
)"""

# A report outside a todo: one row, unless its idempotency key already made
# one (NULL keys never conflict): then nothing is written and the first
# report is read back. The row counts against its budgets (BUDGET_SPEND).
REPORT_USAGE_SQL = f"""
WITH ledger AS (
    INSERT INTO usage_ledger (endpoint_id, queue, group_key, input_tokens,
                              output_tokens, cost_usd, model, idempotency_key,
                              reported_at)
    SELECT e.id, %(queue)s, %(group)s, coalesce((r->>'input_tokens')::bigint, 0),
           coalesce((r->>'output_tokens')::bigint, 0),
           coalesce((r->>'cost_usd')::numeric, 0), coalesce(r->>'model', ''),
           %(idempotency_key)s, now()
      FROM endpoints e, (SELECT %(usage)s::jsonb AS r) report
     WHERE e.id = %(endpoint_id)s
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING {REPORT_COLUMNS}, endpoint_id, input_tokens + output_tokens AS tokens,
              prev_cost_usd, prev_tokens, prev_reported_at
){BUDGET_SPEND}
SELECT {REPORT_COLUMNS} FROM ledger
"""

REPORTED_SQL = f"""
SELECT {REPORT_COLUMNS} FROM usage_ledger
 WHERE endpoint_id = %(endpoint_id)s AND idempotency_key = %(idempotency_key)s
"""


def report_usage_steps(
    scope: Scope,
    *,
    queue: str,
    usage: object,
    group: str | None = None,
    idempotency_key: str | None = None,
) -> Steps[tuple[UsageReport, bool]]:
    """Record usage spent outside a todo, against a queue of the grant; return
    (report, created). A repeated ``idempotency_key`` returns the first
    report with created=False and counts nothing again."""
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue must be a non-empty string")
    if not scope.covers(queue):
        raise QueueNotGranted(queue)
    if group is not None and (
        not isinstance(group, str) or not 1 <= len(group) <= MAX_GROUP_CHARS
    ):
        raise ValueError(
            f"group must be null or a string of 1 to {MAX_GROUP_CHARS} characters"
        )
    if idempotency_key is not None and len(idempotency_key) > MAX_KEY_CHARS:
        raise ValueError(f"idempotency_key must be at most {MAX_KEY_CHARS} characters")
    report = validate_usage(usage)
    if not report:
        raise ValueError(f"usage must give at least one of {', '.join(USAGE_FIELDS)}")
    params = {
        **_scope_params(scope),
        "queue": queue,
        "group": group,
        "idempotency_key": idempotency_key,
        "usage": json.dumps(report),
    }
    row = yield Statement("report_usage", REPORT_USAGE_SQL, params, "one")
    if row is not None:
        return _report(row), True
    row = yield Statement("report_usage", REPORTED_SQL, params, "one")
    if row is None:
        raise NotFound("no such endpoint")
    return _report(row), False


report_usage = on_django(report_usage_steps)
areport_usage = on_pool(report_usage_steps)


LEDGER_SQL = f"""
SELECT {REPORT_COLUMNS} FROM usage_ledger
 WHERE endpoint_id = %(endpoint_id)s
   AND (%(todo_id)s::uuid IS NULL OR todo_id = %(todo_id)s::uuid)
 ORDER BY id
"""


def usage_ledger_steps(
    scope: Scope, *, todo_id: str | None = None
) -> Steps[list[UsageReport]]:
    """Return an endpoint's ledger rows (a todo's, with ``todo_id``), oldest first."""
    params = {**_scope_params(scope), "todo_id": todo_id}
    rows = yield Statement("usage_ledger", LEDGER_SQL, params)
    return [_report(row) for row in rows]


usage_ledger = on_django(usage_ledger_steps)
