"""A small SVG line-chart writer (no plotting dependency): series of (x, y) points against a shared x axis, with
"nice" axis ticks, a legend, and markers on short series. ``data_uri`` makes a chart a markdown image.

The chart describes itself: the plot area is ``<rect class="plot" data-x-range="lo hi" data-y-range="lo hi">``
and each series a ``<polyline class="series" data-name="...">`` in pixel coordinates of that rect, so a reader
(a test, a script) can map every drawn point back to its data value.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

__all__ = ["Series", "data_uri", "line_chart", "nice_ticks", "thin"]

#: Colours of the series, in order (Tableau 10); more series repeat them dashed.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS_UP_TO = 60  # series with at most this many points get a dot on each
LEGEND_ROWS = 16  # series named in the legend at most (the rest are counted)
LEFT, RIGHT_PAD, TOP, BOTTOM = 64, 16, 34, 42
LEGEND_WIDTH = 190


@dataclass(frozen=True)
class Series:
    """One line: its legend name and its (x, y) points (non-finite y values are left out)."""

    name: str
    points: Sequence[tuple[float, float]]
    width: float = 1.5


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"axis range [{lo}, {hi}] is not finite")
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 12)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(first + len(ticks) * step, 12))
    return ticks


def thin(points: Sequence[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """At most `limit` points, evenly strided, the first and the last always kept."""
    if len(points) <= limit or limit < 2:
        return list(points)
    stride = (len(points) - 1) / (limit - 1)
    return [points[round(i * stride)] for i in range(limit)]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str = "step",
    y_label: str = "",
    width: int = 760,
    height: int = 260,
    x_range: tuple[float, float] | None = None,
    y_range: tuple[float, float] | None = None,
    max_points: int = 600,
) -> str:
    """An SVG document drawing `series` (each thinned to `max_points`) against shared axes; `x_range` / `y_range`
    widen an axis (e.g. steps 0 to the run's last, scores 0 to 1), which always covers the data."""
    drawn = [
        Series(s.name, thin([(float(x), float(y)) for x, y in s.points if _finite(x, y)], max_points), s.width)
        for s in series
    ]
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x_ticks = nice_ticks(*_cover(xs, x_range))
    y_ticks = nice_ticks(*_cover(ys, y_range))
    plot_w, plot_h = width - LEFT - RIGHT_PAD - LEGEND_WIDTH, height - TOP - BOTTOM
    box = _Box(LEFT, TOP, plot_w, plot_h, (x_ticks[0], x_ticks[-1]), (y_ticks[0], y_ticks[-1]))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
        *_axes(box, x_ticks, y_ticks, x_label, y_label),
    ]
    for number, line in enumerate(drawn):
        parts += _series(box, line, number)
    parts += _legend(drawn, LEFT + plot_w + 14, TOP)
    parts.append("</svg>")
    return "\n".join(parts)


def data_uri(svg: str) -> str:
    """The SVG as a ``data:`` URI (a markdown image's address)."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


@dataclass(frozen=True)
class _Box:
    left: float
    top: float
    width: float
    height: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def px(self, x: float) -> float:
        lo, hi = self.x_range
        return self.left + (x - lo) / (hi - lo) * self.width

    def py(self, y: float) -> float:
        lo, hi = self.y_range
        clamped = min(max(y, lo), hi)
        return self.top + self.height - (clamped - lo) / (hi - lo) * self.height


def _cover(values: list[float], wanted: tuple[float, float] | None) -> tuple[float, float]:
    lo, hi = wanted if wanted is not None else (min(values, default=0.0), max(values, default=1.0))
    return min([lo, *values]), max([hi, *values])


def _finite(x: float, y: float) -> bool:
    return x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))


def _label(value: float) -> str:
    return f"{value:.4g}"


def _axes(box: _Box, x_ticks: list[float], y_ticks: list[float], x_label: str, y_label: str) -> list[str]:
    right, bottom = box.left + box.width, box.top + box.height
    parts = [
        f'<rect class="plot" x="{box.left}" y="{box.top}" width="{box.width}" height="{box.height}" fill="#fafafa" '
        f'stroke="#999999" data-x-range="{box.x_range[0]!r} {box.x_range[1]!r}" '
        f'data-y-range="{box.y_range[0]!r} {box.y_range[1]!r}"/>'
    ]
    for tick in y_ticks:
        y = round(box.py(tick), 2)
        parts.append(f'<line x1="{box.left}" y1="{y}" x2="{right}" y2="{y}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{box.left - 6}" y="{y + 4}" text-anchor="end">{_label(tick)}</text>')
    for tick in x_ticks:
        x = round(box.px(tick), 2)
        parts.append(f'<line x1="{x}" y1="{box.top}" x2="{x}" y2="{bottom}" stroke="#eeeeee"/>')
        parts.append(f'<text x="{x}" y="{bottom + 15}" text-anchor="middle">{_label(tick)}</text>')
    parts.append(
        f'<text x="{box.left + box.width / 2}" y="{bottom + 34}" text-anchor="middle">{escape(x_label)}</text>'
    )
    if y_label:
        middle = box.top + box.height / 2
        turn = f"rotate(-90 14 {middle})"
        parts.append(f'<text x="14" y="{middle}" text-anchor="middle" transform="{turn}">{escape(y_label)}</text>')
    return parts


def _style(number: int) -> tuple[str, str]:
    colour = PALETTE[number % len(PALETTE)]
    dash = "" if number < len(PALETTE) else ' stroke-dasharray="5 3"'
    return colour, dash


def _series(box: _Box, line: Series, number: int) -> list[str]:
    if not line.points:
        return []
    colour, dash = _style(number)
    coords = " ".join(f"{round(box.px(x), 2)},{round(box.py(y), 2)}" for x, y in line.points)
    parts = [
        f'<polyline class="series" data-name={quoteattr(line.name)} points="{coords}" fill="none" '
        f'stroke="{colour}" stroke-width="{line.width}"{dash}/>'
    ]
    if len(line.points) <= MARKERS_UP_TO:
        parts += [
            f'<circle cx="{round(box.px(x), 2)}" cy="{round(box.py(y), 2)}" r="2.5" fill="{colour}"/>'
            for x, y in line.points
        ]
    return parts


def _legend(drawn: Sequence[Series], left: float, top: float) -> list[str]:
    parts = []
    for number, line in enumerate(drawn[:LEGEND_ROWS]):
        colour, dash = _style(number)
        y = top + 8 + number * 16
        name = line.name if len(line.name) <= 26 else line.name[:25] + "…"
        parts.append(f'<line x1="{left}" y1="{y}" x2="{left + 18}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{left + 24}" y="{y + 4}">{escape(name)}</text>')
    if len(drawn) > LEGEND_ROWS:
        y = top + 8 + LEGEND_ROWS * 16
        parts.append(f'<text x="{left}" y="{y + 4}">… and {len(drawn) - LEGEND_ROWS} more</text>')
    return parts
