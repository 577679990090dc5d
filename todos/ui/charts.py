"""Server-rendered SVG charts of the Board: no script, readable without hovering.

A chart is drawn from a ``todos.store.stats.Series``: the transitions per bucket as
lines (created, completed, failed, dead-lettered), the queue depth as an area
below them, each with its axis labels written out (the top of the scale, the
times at both ends and the middle) and a legend that states each line's total
over the range. The markup is built here, every value escaped, and marked
safe for the template.
"""

import threading
from dataclasses import dataclass
from datetime import timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from todos.store.stats import RANGES

LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 22


@dataclass(frozen=True)
class Frame:
    """A chart's drawing area in SVG units (its text scales with it)."""

    width: int
    height: int

    def x(self, index, buckets):
        inner = self.width - LEFT - RIGHT
        return LEFT + inner * (index + 0.5) / buckets

    def y(self, value, top):
        inner = self.height - TOP - BOTTOM
        return TOP + inner * (1 - value / top)


# The transitions chart takes three fifths of a row, the depth chart two.
WIDE, NARROW = Frame(600, 170), Frame(400, 170)
WIDE_SMALL, NARROW_SMALL = Frame(600, 120), Frame(400, 120)
# The phone variant of a transitions chart.
COMPACT_WIDTH = 380

LINES = (
    ("created", "created", "var(--chart-created)"),
    ("completed", "completed", "var(--chart-completed)"),
    ("failed", "failed (retry)", "var(--chart-failed)"),
    ("dead_lettered", "dead-lettered", "var(--chart-dead)"),
)


def _scale_top(peak):
    """Round the top of a scale up to 1, 2 or 5 times a power of ten."""
    if peak <= 0:
        return 1
    magnitude = 1
    while magnitude * 10 <= peak:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if peak <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _number(value):
    return f"{value:,}".replace(",", " ")


def _axes(frame, series, top, unit, top_label=None):
    bottom = frame.height - BOTTOM
    times = []
    ends = ((0, "start"), (series.buckets // 2, "middle"), (series.buckets - 1, "end"))
    for index, anchor in ends:
        at = series.start + timedelta(seconds=series.bucket_seconds * index)
        times.append((f"{frame.x(index, series.buckets):.1f}", anchor, f"{at:%H:%M}"))
    return format_html(
        '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"/>'
        '<line class="grid-line" x1="{}" y1="{}" x2="{}" y2="{}"/>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">0</text>'
        '<text class="tick unit" x="{}" y="{}" text-anchor="start">{}</text>'
        "{}",
        LEFT,
        bottom,
        frame.width - RIGHT,
        bottom,
        LEFT,
        TOP,
        frame.width - RIGHT,
        TOP,
        LEFT - 6,
        TOP + 4,
        top_label or _number(top),
        LEFT - 6,
        bottom,
        LEFT + 4,
        TOP + 10,
        unit,
        format_html_join(
            "",
            '<text class="tick" x="{}" y="{}" text-anchor="{}">{}</text>',
            ((x, frame.height - 6, anchor, label) for x, anchor, label in times),
        ),
    )


def _transitions_svg(series, label, frame, variant):
    peak = max((max(series.counts[name]) for name, _, _ in LINES), default=0)
    top = _scale_top(peak)
    xs = [f"{frame.x(i, series.buckets):.1f}" for i in range(series.buckets)]
    # Numbers and fixed names only: nothing here needs escaping.
    lines = "".join(
        f'<polyline class="series series-{name}" fill="none" stroke="{colour}" '
        'points="'
        + " ".join(
            f"{x},{frame.y(value, top):.1f}"
            for x, value in zip(xs, series.counts[name], strict=True)
        )
        + '"/>'
        for name, _, colour in LINES
    )
    return format_html(
        '<svg class="chart {}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        "<title>{}</title>{}{}</svg>",
        variant,
        frame.width,
        frame.height,
        label,
        label,
        _axes(frame, series, top, f"per {_per(series)}"),
        mark_safe(lines),
    )


def _per(series):
    return "minute" if series.bucket_seconds == 60 else "10 minutes"


def transitions_chart(series, label, frame=WIDE):
    """The transitions per bucket as four lines, with a legend of totals.

    Drawn twice: at ``frame`` for wide screens and narrower for phones (CSS
    shows one), so the axis labels stay legible at either width.
    """
    svg = _transitions_svg(series, label, frame, "chart-wide") + _transitions_svg(
        series, label, Frame(COMPACT_WIDTH, frame.height), "chart-compact"
    )
    legend = format_html_join(
        "",
        '<li><span class="swatch swatch-{}"></span>{} '
        '<strong class="series-total" data-series="{}">{}</strong></li>',
        ((name, text, name, _number(series.total(name))) for name, text, _ in LINES),
    )
    return mark_safe(
        f'<figure class="chart-box">{svg}'
        f'<figcaption><ul class="legend">{legend}</ul></figcaption></figure>'
    )


def depth_chart(series, label, frame=NARROW):
    """The queue depth (pending todos, the peak sampled per bucket) as an area;
    the latest sample is marked, so even a single one shows."""
    samples = [value for value in series.depth if value is not None]
    top = _scale_top(max(samples, default=0))
    bottom = frame.height - BOTTOM
    points = [
        (frame.x(i, series.buckets), frame.y(value, top))
        for i, value in enumerate(series.depth)
        if value is not None
    ]
    area = ""
    if points:
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        outline = f"{points[0][0]:.1f},{bottom} {line} {points[-1][0]:.1f},{bottom}"
        area = format_html(
            '<polygon class="depth-area" points="{}"/>'
            '<polyline class="depth-line" fill="none" points="{}"/>'
            '<circle class="depth-now" cx="{}" cy="{}" r="3"/>',
            outline,
            line,
            f"{points[-1][0]:.1f}",
            f"{points[-1][1]:.1f}",
        )
    now = series.depth[-1] if series.depth else None
    peak = max(samples, default=0)
    svg = format_html(
        '<svg class="chart chart-depth" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><title>{}</title>{}{}</svg>',
        frame.width,
        frame.height,
        label,
        label,
        _axes(frame, series, top, "pending todos"),
        area,
    )
    caption = format_html(
        '<ul class="legend"><li><span class="swatch swatch-depth"></span>depth now '
        '<strong data-series="depth-now">{}</strong></li>'
        '<li>peak <strong data-series="depth-peak">{}</strong></li></ul>',
        "—" if now is None else _number(now),
        _number(peak),
    )
    return mark_safe(
        f'<figure class="chart-box">{svg}<figcaption>{caption}</figcaption></figure>'
    )


def chart_range(request):
    """The chart range the URL asks for ("hour" unless "day")."""
    wanted = request.GET.get("range", "hour")
    return wanted if wanted in RANGES else "hour"


# Drawn charts by what they show: a series changes once a sweep pass (or a
# minute) at most, while every open Board reloads its overview every 10 s.
DRAWN_PAIRS = 256
_drawn = {}
_drawn_lock = threading.Lock()


def chart_pair(series, label, small=False):
    """Both charts of one series: transitions, then depth (drawn once per
    series, label and size: the markup depends on nothing else)."""
    key = (series.key(), label, small)
    with _drawn_lock:
        pair = _drawn.get(key)
    if pair is None:
        pair = _draw_pair(series, label, small)
        with _drawn_lock:
            _drawn[key] = pair
            if len(_drawn) > DRAWN_PAIRS:
                del _drawn[next(iter(_drawn))]
    return dict(pair)  # the caller's own: the kept one stays as drawn


def _draw_pair(series, label, small):
    wide, narrow = (WIDE_SMALL, NARROW_SMALL) if small else (WIDE, NARROW)
    return {
        "transitions": transitions_chart(series, f"Transitions: {label}", wide),
        "depth": depth_chart(series, f"Queue depth: {label}", narrow),
    }


def overview_charts(request, endpoint_ids):
    """The overview's charts: everything in scope, then one pair per endpoint."""
    range_name = chart_range(request)
    per_endpoint = request.board.chart(range_name, by="endpoint")
    return {
        "range": range_name,
        "total": chart_pair(per_endpoint[None], "every endpoint in view"),
        "endpoints": {
            endpoint_id: chart_pair(
                per_endpoint[endpoint_id], "this endpoint", small=True
            )
            for endpoint_id in endpoint_ids
        },
    }


# --- Spend (usage_ledger) -------------------------------------------------------

# The colours of a spend chart's lines, in order of spend; "others" is grey.
SPEND_COLOURS = 6
# A spend chart takes a whole row.
SPEND_WIDE = Frame(960, 200)
MEASURES = {"usd": "dollars", "tokens": "tokens"}


def _spend_top(peak):
    """The top of a spend scale: 1, 2 or 5 times a power of ten, cents too."""
    if peak <= 0:
        return 1
    magnitude = 0.01
    while magnitude * 10 <= peak:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if peak <= step * magnitude:
            return round(step * magnitude, 2)
    return round(10 * magnitude, 2)


def money(value):
    """Dollars as the Board writes them: cents, more digits below a cent."""
    value = float(value)
    if value and abs(value) < 0.01:
        return f"${value:.4f}".rstrip("0")
    return f"${value:,.2f}".replace(",", " ")


def _money_tick(top):
    """A scale's top in dollars, short enough for the axis: $5 000, $0.05."""
    return f"${_number(int(top))}" if top >= 1 else f"${top:g}"


def tokens(value):
    """A token count as the Board writes it: 2 000 000."""
    return _number(int(value))


def _spend_svg(series, lines, measure, label, frame, variant):
    values = [line[1] for line in lines]
    peak = max((max(points) for points in values), default=0)
    top = _spend_top(float(peak)) if measure == "usd" else _scale_top(int(peak))
    xs = [f"{frame.x(i, series.buckets):.1f}" for i in range(series.buckets)]
    # Numbers and fixed class names only: nothing here needs escaping.
    drawn = "".join(
        f'<polyline class="series spend-line spend-{slot}" fill="none" points="'
        + " ".join(
            # A running total reported lower than before gives back: drawn at 0.
            f"{x},{frame.y(max(float(value), 0), top):.1f}"
            for x, value in zip(xs, points, strict=True)
        )
        + '"/>'
        for slot, points in ((line[2], line[1]) for line in lines)
    )
    unit = "$ per " if measure == "usd" else "tokens per "
    top_label = _money_tick(top) if measure == "usd" else None
    axes = _axes(frame, series, top, unit + _per(series), top_label)
    return format_html(
        '<svg class="chart {}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        "<title>{}</title>{}{}</svg>",
        variant,
        frame.width,
        frame.height,
        label,
        label,
        axes,
        mark_safe(drawn),
    )


def spend_chart(series, names, measure="usd", label="Spend"):
    """The spend per bucket of each line of a ``store.spend.SpendSeries`` (the
    largest first, the rest as "others"), in dollars or tokens, with a legend
    of each line's total over the range. ``names`` labels a line from its
    (endpoint id, queue, group)."""
    lines = []
    for slot, line in enumerate(series.lines):
        points = line.cost_usd if measure == "usd" else line.tokens
        text = names(line.endpoint_id, line.queue, line.group)
        lines.append((text, points, slot % SPEND_COLOURS, line))
    if series.others is not None:
        points = series.others.cost_usd if measure == "usd" else series.others.tokens
        lines.append(("others", points, "others", series.others))
    svg = _spend_svg(series, lines, measure, label, SPEND_WIDE, "chart-wide")
    svg += _spend_svg(
        series,
        lines,
        measure,
        label,
        Frame(COMPACT_WIDTH, WIDE.height),
        "chart-compact",
    )
    legend = format_html_join(
        "",
        '<li><span class="swatch spend-swatch spend-{}"></span>'
        '<span class="spend-name">{}</span> '
        '<strong class="series-total">{}</strong></li>',
        (
            (
                slot,
                text,
                money(line.total_usd)
                if measure == "usd"
                else f"{_number(line.total_tokens)} tokens",
            )
            for text, _, slot, line in lines
        ),
    )
    if not lines:
        legend = format_html(
            '<li class="muted">{}</li>', "Nothing spent in this range."
        )
    return mark_safe(
        f'<figure class="chart-box spend-chart">{svg}'
        f'<figcaption><ul class="legend">{legend}</ul></figcaption></figure>'
    )
