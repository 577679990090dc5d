"""The usage checker: replay the reports the store accepted and compare the ledger.

A report is an attempt's running total, so what the ledger must hold for an
attempt is not a sum of reports but the last of them: for each (todo,
delivery) the field-by-field merge of the reports the store accepted for
that delivery, in the order they were made (one lease holder makes them, one
at a time; a repeated request repeats its report, so replaying it changes
nothing). A report refused (a superseded lease, a todo already ended) is not
replayed. The checker then compares, to the cent, each of the endpoint's
todo rows of ``usage_ledger`` with the replay, in both directions, and each
todo's ``usage`` (its sum over attempts) with its ledger rows. A figure
counted twice shows as a row whose figure is not the replay's, or as a row
the replay has no report for.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .rows import _json
from .sql import _run

CENT = Decimal("0.01")
FIGURES = ("input_tokens", "output_tokens", "cost_usd")

# (todo id, delivery) -> its figures.
type Figures = dict[str, Decimal]
type Attempts = dict[tuple[str, int], Figures]


@dataclass(frozen=True)
class Accepted:
    """One report the store accepted: the todo, the delivery it was made in
    (the answer's ``deliveries``), and the report as sent."""

    todo_id: str
    delivery: int
    usage: dict[str, Any]


@dataclass
class Report:
    """What the checker found: how many reports it replayed, the spend the
    replay and the ledger say, and every disagreement."""

    reports: int = 0
    replayed_usd: Decimal = Decimal(0)
    ledger_usd: Decimal = Decimal(0)
    mismatches: list[str] = field(default_factory=list)


def replay(accepted: Iterable[Accepted]) -> Attempts:
    """Each delivery's figures after its accepted reports, in order."""
    merged: dict[tuple[str, int], dict[str, Any]] = defaultdict(dict)
    for report in accepted:
        merged[(report.todo_id, report.delivery)].update(report.usage)
    return {key: _figures(usage) for key, usage in merged.items()}


def _figures(values: dict[str, Any]) -> Figures:
    return {name: _cents(values.get(name) or 0) for name in FIGURES}


def _cents(value: object) -> Decimal:
    return Decimal(str(value)).quantize(CENT)


LEDGER_ROWS_SQL = """
SELECT todo_id, delivery, input_tokens, output_tokens, cost_usd
  FROM usage_ledger
 WHERE endpoint_id = %(endpoint_id)s AND todo_id IS NOT NULL
 ORDER BY id
"""

TODO_TOTALS_SQL = """
SELECT id, usage FROM todos WHERE endpoint_id = %(endpoint_id)s
"""


def check(endpoint_id: str, accepted: Iterable[Accepted]) -> Report:
    """Compare an endpoint's ledger with the replay of its accepted reports."""
    reports = list(accepted)
    expected = replay(reports)
    report = Report(reports=len(reports))
    report.replayed_usd = sum(
        (figures["cost_usd"] for figures in expected.values()), Decimal(0)
    )
    params = {"endpoint_id": str(endpoint_id)}
    ledger: dict[tuple[str, int | None], Figures] = {}
    per_todo: dict[str, Figures] = defaultdict(lambda: _figures({}))
    for todo_id, delivery, *values in _run("usage_check", LEDGER_ROWS_SQL, params):
        figures = dict(zip(FIGURES, map(_cents, values), strict=True))
        key = (str(todo_id), delivery)
        if key in ledger:
            report.mismatches.append(f"{key}: more than one ledger row")
        ledger[key] = figures
        report.ledger_usd += figures["cost_usd"]
        for name in FIGURES:
            per_todo[str(todo_id)][name] += figures[name]
    for key, figures in ledger.items():
        want = expected.get((key[0], key[1])) if key[1] is not None else None
        if want is None:
            report.mismatches.append(f"{key}: a ledger row no accepted report made")
        elif want != figures:
            report.mismatches.append(f"{key}: ledger {figures}, replay {want}")
    for key in expected.keys() - ledger.keys():
        report.mismatches.append(f"{key}: an accepted report the ledger lacks")
    for todo_id, usage in _run("usage_check", TODO_TOTALS_SQL, params):
        total = _figures(_json(usage) or {})
        if total != per_todo.get(str(todo_id), _figures({})):
            report.mismatches.append(
                f"{todo_id}: todo usage {total}, ledger {per_todo.get(str(todo_id))}"
            )
    return report
