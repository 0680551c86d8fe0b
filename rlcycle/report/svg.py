"""Charts as inline SVG strings: grouped bars (with error bars), lines, and one interval.

No plotting library: a report must open anywhere, offline, from one file, and the charts here
are simple enough to draw by hand. Every label and tooltip is passed through `html.escape`
(the text comes from data: policy versions, reward part names). Hovering a bar or a point shows
its exact value (an SVG `<title>`), so the charts need no JavaScript.

Layout: a fixed coordinate system (`viewBox`) that the browser scales to the page width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
WIDTH = 640
LINE_STYLES = (
    'stroke-width="3.2"',
    'stroke-width="2" stroke-dasharray="7 4"',
    'stroke-width="1.4" stroke-dasharray="2 3"',
)
FONT = 'font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="11"'

Fmt = Callable[[float], str]


@dataclass
class Series:
    """One coloured series: a value per category (bars) or per x (lines); None = no value."""

    name: str
    values: Sequence[float | None]
    low: Sequence[float | None] | None = None  # error bar ends (bars only)
    high: Sequence[float | None] | None = None


def num(v: float | None) -> str:
    """A compact number: 3 significant digits, no exponent for everyday magnitudes."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2e}"
    if a >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f}%"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 × 10^k)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-12:  # a flat series: pad it, without inventing negative values for a 0
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = (lo - pad if lo < 0 or lo - pad >= 0 else 0.0), hi + pad
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    t = first
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    return ticks


def tick_labels(ticks: list[float], fmt: Fmt) -> list[str]:
    """Labels for ticks: `fmt`, unless it prints two ticks alike (7.155 and 7.16 as "7.16");
    then as many decimals as the tick step needs."""
    labels = [fmt(t + 0.0) for t in ticks]  # + 0.0: no "-0"
    if len(set(labels)) == len(labels) or len(ticks) < 2:
        return [label.replace(".0%", "%") for label in labels]
    step = ticks[1] - ticks[0]
    decimals = next(d for d in range(12) if abs(round(step, d) - step) < step * 1e-6 or d == 11)
    return [f"{t + 0.0:,.{decimals}f}" for t in ticks]


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


class _Canvas:
    """An SVG being built: a list of elements, and the plot area's position."""

    def __init__(self, title: str, height: int, left: int, top: int, bottom: int, right: int = 16):
        self.parts: list[str] = []
        self.height, self.left, self.top, self.right, self.bottom = height, left, top, WIDTH - right, height - bottom
        self.title = title

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x: float, y: float, s: str, anchor: str = "middle", extra: str = "") -> None:
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(s)}</text>')

    def done(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {self.height}" '
            f'role="img" aria-label="{escape(self.title)}" class="chart" {FONT}>'
        )
        title = f'<text x="8" y="16" font-size="13" font-weight="600">{escape(self.title)}</text>'
        return head + title + "".join(self.parts) + "</svg>"

    def legend(self, names: Sequence[str], y: float, lines: bool = False) -> None:
        """Swatches (or line samples) and names in rows from the left under the title."""
        x = 8.0
        for i, name in enumerate(names):
            w = 18 + 6.2 * len(name) + 14 + (8 if lines else 0)
            if x + w > WIDTH - 8 and x > 8:
                x, y = 8.0, y + 15
            color = PALETTE[i % len(PALETTE)]
            if lines:
                self.add(
                    f'<line x1="{x:.1f}" x2="{x + 18:.1f}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{color}" '
                    f"{LINE_STYLES[i % len(LINE_STYLES)]}/>"
                )
            else:
                self.add(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>')
            self.text(x + (22 if lines else 14), y, name, "start")
            x += w

    def y_axis(self, ticks: list[float], fmt: Fmt) -> Callable[[float], float]:
        """Gridlines and labels; returns the value -> y pixel map."""
        lo, hi = ticks[0], ticks[-1]

        def y(v: float) -> float:
            return self.bottom - (v - lo) / (hi - lo) * (self.bottom - self.top)

        for t, label in zip(ticks, tick_labels(ticks, fmt), strict=True):
            stroke = "#888" if t == 0 else "#e3e3e3"
            self.add(f'<line x1="{self.left}" x2="{self.right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="{stroke}"/>')
            self.text(self.left - 5, y(t) + 4, label, "end", 'fill="#555"')
        return y


def _legend_rows(names: Sequence[str], lines: bool = False) -> int:
    rows, x = 1, 8.0
    for name in names:
        w = 18 + 6.2 * len(name) + 14 + (8 if lines else 0)
        if x + w > WIDTH - 8 and x > 8:
            rows, x = rows + 1, 8.0
        x += w
    return rows


def no_data(title: str, why: str = "no data") -> str:
    c = _Canvas(title, 60, 8, 24, 8)
    c.text(WIDTH / 2, 42, why, "middle", 'fill="#777"')
    return c.done()


def bar_chart(
    title: str, categories: Sequence[str], series: Sequence[Series], fmt: Fmt = num, height: int = 240
) -> str:
    """Grouped bars: one group per category, one bar per series, optional error bars."""
    values = [v for s in series for v in (*s.values, *(s.low or ()), *(s.high or ()))]
    vals = _finite(values)
    if not vals or not categories:
        return no_data(title)
    ticks = nice_ticks(min(0.0, *vals), max(0.0, *vals))
    legend_rows = _legend_rows([s.name for s in series]) if len(series) > 1 else 0
    slot = (WIDTH - 76) / len(categories)
    longest = max(len(c) for c in categories)
    rotate = longest * 6.2 > slot - 4
    bottom = int(min(130, 12 + longest * 4.6)) if rotate else 26
    c = _Canvas(title, height + bottom, 60, 30 + 15 * legend_rows, bottom)
    if legend_rows:
        c.legend([s.name for s in series], 34)
    y = c.y_axis(ticks, fmt)
    bar_w = min(36.0, (slot * 0.8) / len(series))
    for i, cat in enumerate(categories):
        x0 = c.left + i * slot + (slot - bar_w * len(series)) / 2
        for j, s in enumerate(series):
            _bar(c, s, i, cat, x0 + j * bar_w, bar_w, y, fmt, PALETTE[j % len(PALETTE)], len(series) == 1)
        cx = c.left + (i + 0.5) * slot
        if rotate:
            c.text(cx, c.bottom + 12, cat, "end", f'transform="rotate(-35 {cx:.1f} {c.bottom + 12:.1f})"')
        else:
            c.text(cx, c.bottom + 16, cat)
    return c.done()


def _bar(c: _Canvas, s: Series, i: int, cat: str, x: float, w: float, y, fmt: Fmt, color: str, label: bool) -> None:
    """One bar, its error bar, and (`label`: a single series has room) its value written beside."""
    v = s.values[i]
    if v is None or not math.isfinite(v):
        return
    top, base = sorted((y(v), y(0.0)))
    lo = s.low[i] if s.low else None
    hi = s.high[i] if s.high else None
    ci = f" [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else ""
    tip = escape(f"{s.name} · {cat}: {fmt(v)}{ci}")
    c.add(
        f'<rect x="{x + 1:.1f}" y="{top:.1f}" width="{max(w - 2, 1):.1f}" height="{max(base - top, 0.5):.1f}" '
        f'fill="{color}"><title>{tip}</title></rect>'
    )
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        mid = x + w / 2
        c.add(
            f'<path d="M{mid:.1f},{y(lo):.1f}V{y(hi):.1f}M{mid - 4:.1f},{y(lo):.1f}h8M{mid - 4:.1f},{y(hi):.1f}h8" '
            f'stroke="#222" stroke-width="1.2" fill="none"/>'
        )
    if label:
        c.text(x + w + 4, (top if v >= 0 else base) + (10 if v >= 0 else -2), fmt(v), "start", 'fill="#333"')


def line_chart(
    title: str,
    x: Sequence[float],
    series: Sequence[Series],
    fmt: Fmt = num,
    x_label: str = "step",
    height: int = 220,
    marks: Sequence[float] = (),
) -> str:
    """Lines over a shared numeric x (training steps); None values break the line; `marks`
    (skipped steps) are drawn as dashed red verticals."""
    series = [s for s in series if _finite(s.values)]
    if not series or not x:
        return no_data(title, "no data (the metric was not recorded in this run)")
    vals = _finite([v for s in series for v in s.values])
    ticks = nice_ticks(min(vals), max(vals))
    x_lo, x_hi = min(x), max(x)
    span = (x_hi - x_lo) or 1.0
    legend_rows = _legend_rows([s.name for s in series], lines=True) if len(series) > 1 else 0
    c = _Canvas(title, height, 60, 30 + 15 * legend_rows, 34)
    if legend_rows:
        c.legend([s.name for s in series], 34, lines=True)
    y = c.y_axis(ticks, fmt)
    pad = 10

    def px(v: float) -> float:
        return c.left + pad + (v - x_lo) / span * (c.right - c.left - 2 * pad)

    for t in nice_ticks(x_lo, x_hi, 6) if x_hi > x_lo else [x_lo]:
        if x_lo <= t <= x_hi and float(t).is_integer():
            c.text(px(t), c.bottom + 14, f"{t:g}", extra='fill="#555"')
    c.text((c.left + c.right) / 2, c.bottom + 28, x_label, extra='fill="#555"')
    for m in marks:
        c.add(
            f'<line x1="{px(m):.1f}" x2="{px(m):.1f}" y1="{c.top}" y2="{c.bottom}" stroke="#D55E00" '
            f'stroke-dasharray="3 3"><title>{escape(f"{x_label} {m:g} skipped")}</title></line>'
        )
    for j, s in enumerate(series):
        _line(c, s, x, px, y, fmt, j, markers=len(x) <= 60)
    return c.done()


def _line(c: _Canvas, s: Series, x: Sequence[float], px, y, fmt: Fmt, j: int, markers: bool) -> None:
    # Series often coincide (loss = pg_loss without KL): each later one is thinner and dashed,
    # so the one beneath still shows.
    color = PALETTE[j % len(PALETTE)]
    style = LINE_STYLES[j % len(LINE_STYLES)]
    segments: list[list[str]] = [[]]
    for xi, v in zip(x, s.values, strict=False):
        if v is None or not math.isfinite(v):
            segments.append([])
            continue
        segments[-1].append(f"{px(xi):.1f},{y(v):.1f}")
        if markers or len(segments[-1]) == 1:
            tip = escape(f"{s.name} at {xi:g}: {fmt(v)}")
            c.add(f'<circle cx="{px(xi):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"><title>{tip}</title></circle>')
    for seg in segments:
        if len(seg) > 1:
            c.add(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" {style}/>')


def interval_chart(
    title: str,
    estimate: float,
    low: float,
    high: float,
    threshold: float | None = None,
    fmt: Fmt = num,
    label: str = "",
) -> str:
    """One estimate with its interval on a horizontal axis, with 0 and an optional gate line."""
    if threshold is not None:
        threshold += 0.0  # -0.0 (a max drop of 0) prints as "0"
    pts = _finite([estimate, low, high, 0.0, *([threshold] if threshold is not None else [])])
    lo, hi = min(pts), max(pts)
    if hi - lo < 1e-12:  # all at 0 (two policies that never differ): a symmetric axis
        lo, hi = lo - 0.5, hi + 0.5
    ticks = nice_ticks(lo, hi, 6)
    c = _Canvas(title, 110, 20, 30, 30, 20)
    lo, hi = ticks[0], ticks[-1]

    def px(v: float) -> float:
        return c.left + (v - lo) / (hi - lo) * (c.right - c.left)

    for t, text in zip(ticks, tick_labels(ticks, fmt), strict=True):
        c.add(
            f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{c.top}" y2="{c.bottom}" stroke="{"#888" if t == 0 else "#e3e3e3"}"/>'
        )
        c.text(px(t), c.bottom + 14, text, extra='fill="#555"')
    if threshold is not None:
        c.add(
            f'<line x1="{px(threshold):.1f}" x2="{px(threshold):.1f}" y1="{c.top}" y2="{c.bottom}" '
            'stroke="#D55E00" stroke-dasharray="4 3"/>'
        )
        c.text(px(threshold) + 4, c.top + 10, f"gate {fmt(threshold)}", "start", 'fill="#D55E00"')
    mid = (c.top + c.bottom) / 2
    tip = escape(f"{label or title}: {fmt(estimate)} [{fmt(low)}, {fmt(high)}]")
    c.add(
        f'<path d="M{px(low):.1f},{mid:.1f}H{px(high):.1f}M{px(low):.1f},{mid - 6:.1f}v12M{px(high):.1f},{mid - 6:.1f}v12" '
        f'stroke="#0072B2" stroke-width="2" fill="none"/>'
    )
    c.add(f'<circle cx="{px(estimate):.1f}" cy="{mid:.1f}" r="5" fill="#0072B2"><title>{tip}</title></circle>')
    return c.done()
