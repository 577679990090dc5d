"""Spend as the Board and ``/metrics`` read it (CONTRACT §18).

- ``roll_up_usage`` (the sweep loop's pass): fold what the ledger gained since
  the last fold into per-queue totals and per-minute spend;
- ``spend_series``: dollars and tokens per bucket over the last hour or day,
  per endpoint, queue or group, from those minutes (a report's spend counts
  in the minute it was reported: what a running total gained, when it did);
- ``spend_figures``: the totals per endpoint and queue (the metrics' counters).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction

from .budgets import list_budgets_any_endpoint
from .operator import _board_scope
from .sql import _run
from .stats import RANGES

# --- Spend over time ------------------------------------------------------------

SPEND_BY = {
    # what a line is: the columns that name it
    "endpoint": ("m.endpoint_id", "NULL::text", "NULL::text"),
    "queue": ("m.endpoint_id", "m.queue", "NULL::text"),
    "group": ("m.endpoint_id", "m.queue", "nullif(m.group_key, '')"),
}

# The range's start from PostgreSQL's clock (as the transitions' charts), then
# the minutes the sweep loop folded since then, summed per line and bucket.
# The clock row is LEFT JOINed, so an empty range still answers its start.
SPEND_SQL = """
WITH clock AS (
    SELECT to_timestamp(floor(EXTRACT(EPOCH FROM now()) / %(step)s) * %(step)s)
           - %(span)s + make_interval(secs => %(step)s) AS start
), spent AS (
    SELECT {endpoint} AS endpoint_id, {queue} AS queue, {group} AS group_key,
           floor(EXTRACT(EPOCH FROM m.minute - clock.start)
                 / %(step)s)::int AS bucket,
           sum(m.cost_usd) AS cost_usd, sum(m.tokens) AS tokens
      FROM usage_minutes m, clock
     WHERE m.minute >= clock.start AND {scope} {narrow}
     GROUP BY 1, 2, 3, 4
)
SELECT clock.start, s.endpoint_id, s.queue, s.group_key, s.bucket, s.cost_usd,
       s.tokens
  FROM clock LEFT JOIN spent s ON TRUE
"""


@dataclass
class SpendLine:
    """One line of a spend chart: an endpoint, a queue or a group."""

    endpoint_id: str
    queue: str | None
    group: str | None
    cost_usd: list[Decimal]
    tokens: list[int]

    @property
    def total_usd(self) -> Decimal:
        return sum(self.cost_usd, Decimal(0))

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)


@dataclass
class SpendSeries:
    """A spend chart's buckets, oldest first, one line per endpoint, queue or
    group (largest spend first); ``others`` sums the lines past the first
    ``top``."""

    start: datetime
    bucket_seconds: int
    buckets: int
    by: str
    lines: list[SpendLine] = field(default_factory=list)
    others: SpendLine | None = None

    @property
    def total_usd(self) -> Decimal:
        lines = [*self.lines, *([self.others] if self.others else [])]
        return sum((line.total_usd for line in lines), Decimal(0))

    @property
    def total_tokens(self) -> int:
        lines = [*self.lines, *([self.others] if self.others else [])]
        return sum(line.total_tokens for line in lines)


def spend_series(
    *,
    range_name: str = "hour",
    by: str = "queue",
    endpoint_ids: Iterable[object] | None = None,
    endpoint_id: str | None = None,
    queue: str | None = None,
    top: int = 5,
) -> SpendSeries:
    """Return the spend per bucket ("hour": per minute, "day": per 10 minutes)
    per endpoint, queue or group (``by``) in the Board's scope; the ``top``
    lines that spent most, the rest summed in ``others``."""
    span, step = RANGES[range_name]
    buckets = int(span.total_seconds() // step)
    scope, scope_params = _board_scope(endpoint_ids)
    params: dict[str, object] = {**scope_params, "step": step, "span": span}
    narrow = ""
    if endpoint_id is not None:
        narrow += " AND m.endpoint_id = %(endpoint_id)s"
        params["endpoint_id"] = str(endpoint_id)
    if queue is not None:
        narrow += " AND m.queue = %(queue)s"
        params["queue"] = queue
    endpoint, queue_column, group = SPEND_BY[by]
    sql = SPEND_SQL.format(
        endpoint=endpoint,
        queue=queue_column,
        group=group,
        scope=scope,
        narrow=narrow,
    )
    rows = _run("spend_series", sql, params)
    series = SpendSeries(rows[0][0], step, buckets, by)
    lines: dict[tuple[Any, ...], SpendLine] = {}
    for _, line_endpoint, line_queue, line_group, bucket, cost, tokens in rows:
        if bucket is None or not 0 <= bucket < buckets:
            continue
        key = (str(line_endpoint), line_queue, line_group)
        line = lines.get(key)
        if line is None:
            line = lines[key] = SpendLine(*key, [Decimal(0)] * buckets, [0] * buckets)
        line.cost_usd[bucket] = Decimal(cost or 0)
        line.tokens[bucket] = int(tokens or 0)
    ranked = sorted(
        lines.values(),
        key=lambda line: (-line.total_usd, -line.total_tokens, line.queue or ""),
    )
    series.lines = ranked[:top]
    if len(ranked) > top:
        others = SpendLine("", None, None, [Decimal(0)] * buckets, [0] * buckets)
        for line in ranked[top:]:
            for index in range(buckets):
                others.cost_usd[index] += line.cost_usd[index]
                others.tokens[index] += line.tokens[index]
        series.others = others
    return series


# --- Metrics --------------------------------------------------------------------

# A report's row carries its transaction's start time (``now()``) and commits
# within this margin: each fold looks this far behind the last one's start.
FOLD_MARGIN = timedelta(minutes=2)

# One sweeper at a time: a second one skips the fold instead of waiting.
FOLD_STATE_INIT_SQL = """
INSERT INTO usage_rollup_state (id, folded_at) VALUES (1, NULL)
ON CONFLICT (id) DO NOTHING
"""
FOLD_LOCK_SQL = """
SELECT folded_at, statement_timestamp() FROM usage_rollup_state
 WHERE id = 1 FOR UPDATE SKIP LOCKED
"""

# The ledger rows reported since the last fold (less the margin; the BRIN
# index finds them) whose figures differ from what was folded of them: their
# difference goes into the totals and into the minute of the report (the
# charts), their figures into usage_folded. Folding a
# row twice adds nothing, so the margin never counts a report twice.
FOLD_SQL = """
WITH changed AS (
    SELECT l.id, l.endpoint_id, l.queue, l.group_key, l.reported_at, l.cost_usd,
           l.input_tokens, l.output_tokens,
           l.cost_usd - coalesce(f.cost_usd, 0) AS cost_added,
           l.input_tokens - coalesce(f.input_tokens, 0) AS input_added,
           l.output_tokens - coalesce(f.output_tokens, 0) AS output_added
      FROM usage_ledger l
      LEFT JOIN usage_folded f ON f.id = l.id
     WHERE l.reported_at >= coalesce(%(since)s::timestamptz, '-infinity')
       AND (f.id IS NULL
            OR (f.cost_usd, f.input_tokens, f.output_tokens)
               IS DISTINCT FROM (l.cost_usd, l.input_tokens, l.output_tokens))
), folded AS (
    INSERT INTO usage_folded AS f (id, cost_usd, input_tokens, output_tokens)
    SELECT id, cost_usd, input_tokens, output_tokens FROM changed
    ON CONFLICT (id) DO UPDATE
       SET cost_usd = EXCLUDED.cost_usd, input_tokens = EXCLUDED.input_tokens,
           output_tokens = EXCLUDED.output_tokens
), minutes AS (
    INSERT INTO usage_minutes AS m (endpoint_id, queue, group_key, minute,
                                    cost_usd, tokens)
    SELECT endpoint_id, queue, coalesce(group_key, ''),
           date_trunc('minute', reported_at), sum(cost_added),
           sum(input_added + output_added)
      FROM changed
     GROUP BY 1, 2, 3, 4
    ON CONFLICT (endpoint_id, queue, group_key, minute) DO UPDATE
       SET cost_usd = m.cost_usd + EXCLUDED.cost_usd,
           tokens = m.tokens + EXCLUDED.tokens
)
INSERT INTO usage_totals AS t (endpoint_id, queue, cost_usd, input_tokens,
                               output_tokens)
SELECT endpoint_id, queue, sum(cost_added), sum(input_added), sum(output_added)
  FROM changed
 GROUP BY endpoint_id, queue
ON CONFLICT (endpoint_id, queue) DO UPDATE
   SET cost_usd = t.cost_usd + EXCLUDED.cost_usd,
       input_tokens = t.input_tokens + EXCLUDED.input_tokens,
       output_tokens = t.output_tokens + EXCLUDED.output_tokens
"""

SET_FOLDED_SQL = "UPDATE usage_rollup_state SET folded_at = %(at)s WHERE id = 1"

# The charts show a day at most.
KEEP_MINUTES = timedelta(days=2)
PRUNE_SQL = "DELETE FROM usage_minutes WHERE minute < %(keep_from)s"


def roll_up_usage() -> bool:
    """Fold the ledger rows reported since the last fold into the totals and
    the charts' minutes, and drop minutes past two days (the sweep loop's
    pass); False when another sweeper is folding."""
    with transaction.atomic():
        _run("roll_up_usage", FOLD_STATE_INIT_SQL, {}, fetch=None)
        row = _run("roll_up_usage", FOLD_LOCK_SQL, {}, fetch="one")
        if row is None:
            return False
        folded_at, now = row
        since = folded_at - FOLD_MARGIN if folded_at is not None else None
        _run("roll_up_usage", FOLD_SQL, {"since": since}, None)
        _run("roll_up_usage", SET_FOLDED_SQL, {"at": now}, None)
        _run("roll_up_usage", PRUNE_SQL, {"keep_from": now - KEEP_MINUTES}, None)
    return True


@dataclass(frozen=True)
class SpendFigures:
    """One (endpoint, queue)'s spend as the sweep loop last folded it."""

    endpoint_id: str
    queue: str
    cost_usd: Decimal
    input_tokens: int
    output_tokens: int


SPEND_FIGURES_SQL = """
SELECT endpoint_id, queue, cost_usd, input_tokens, output_tokens
  FROM usage_totals
 ORDER BY endpoint_id, queue
"""


def spend_figures() -> list[SpendFigures]:
    """Return what every (endpoint, queue) spent (one row each)."""
    return [
        SpendFigures(str(endpoint_id), queue, Decimal(cost), int(inp), int(out))
        for endpoint_id, queue, cost, inp, out in _run(
            "spend_figures", SPEND_FIGURES_SQL, {}
        )
    ]


@dataclass(frozen=True)
class BudgetFigure:
    """How many of an (endpoint, queue)'s budgets are at their limit now."""

    endpoint_id: str
    queue: str
    budgets: int
    at_limit: int


def budget_figures() -> list[BudgetFigure]:
    """Count every endpoint's budgets, and those at their limit, per queue
    (an endpoint budget under the queue "")."""
    counts: dict[tuple[str, str], list[int]] = {}
    for budget in list_budgets_any_endpoint():
        key = (budget.endpoint_id, budget.queue or "")
        figure = counts.setdefault(key, [0, 0])
        figure[0] += 1
        # At its limit (dollars or tokens, plus what the owner raised it by
        # for this window), resumed or not.
        figure[1] += budget.exhausted_at is not None
    return [
        BudgetFigure(endpoint_id, queue, total, full)
        for (endpoint_id, queue), (total, full) in sorted(counts.items())
    ]
