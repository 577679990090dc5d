"""The overview's charts are drawn once per series: every open Board reloads
its overview every 10 s, while a series changes once a sweep pass at most."""

from datetime import UTC, datetime

import pytest

from todos.store.stats import TRANSITIONS, Series
from todos.ui import charts

BUCKETS = 60


def series(created_in_last_bucket=0):
    counts = {name: [0] * BUCKETS for name in TRANSITIONS}
    counts["created"][-1] = created_in_last_bucket
    depth = [None] * (BUCKETS - 1) + [created_in_last_bucket]
    return Series(datetime(2026, 12, 1, 12, tzinfo=UTC), 60, BUCKETS, counts, depth)


@pytest.fixture
def drawings(monkeypatch):
    """Count the drawings, from an empty cache."""
    drawn = []
    draw = charts.transitions_chart

    def counted(*args, **kwargs):
        drawn.append(args)
        return draw(*args, **kwargs)

    monkeypatch.setattr(charts, "transitions_chart", counted)
    monkeypatch.setattr(charts, "_drawn", {})
    return drawn


def test_a_series_is_drawn_once_and_anew_when_it_changes(drawings):
    first = charts.chart_pair(series(3), "q")
    again = charts.chart_pair(series(3), "q")
    assert len(drawings) == 1
    assert again == first
    assert "<svg" in first["transitions"] and "<svg" in first["depth"]

    changed = charts.chart_pair(series(4), "q")
    assert len(drawings) == 2
    assert changed != first
    assert changed == charts._draw_pair(series(4), "q", False)


def test_the_label_and_size_are_part_of_what_is_drawn(drawings):
    charts.chart_pair(series(3), "q")
    charts.chart_pair(series(3), "other")
    charts.chart_pair(series(3), "q", small=True)
    assert len(drawings) == 3


def test_the_drawn_charts_are_bounded(drawings, monkeypatch):
    monkeypatch.setattr(charts, "DRAWN_PAIRS", 3)
    for created in range(5):
        charts.chart_pair(series(created), "q")
    assert len(charts._drawn) == 3
    # The oldest went first: drawing it again draws it anew.
    charts.chart_pair(series(0), "q")
    assert len(drawings) == 6
