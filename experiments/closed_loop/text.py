"""Plain-text tables of the closed-loop experiment's report (report.py, compare.py).

In:  rows `{key: {metric: Estimate}}` or A/B cells `{key: {metric: Cell}}` (rlcycle/report/ab.py),
     labels per key, metric names -> (label, unit).
Out: lines of text: columns, the first left-aligned, the rest right-aligned, each number printed
     by rlcycle.report.ab.fmt (as the HTML report prints it).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from rlcycle.report.ab import Cell, fmt
from rlcycle.stats import Estimate


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Plain-text columns: the first left-aligned, the rest right-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *rows]
    ]


def metrics_lines(
    rows: Mapping[Hashable, Mapping[str, Estimate]],
    labels: Mapping[Hashable, str],
    names: Mapping[str, tuple[str, str]],
    extra: Sequence[Sequence[str]] = (),
) -> list[str]:
    """One line per metric (`names`: metric -> (label, unit)), one column per row key (`labels`
    order), then the `extra` rows (e.g. counts)."""
    body = [
        [label, *(fmt(rows[k][m], unit) if m in rows[k] else "n/a" for k in labels)]
        for m, (label, unit) in names.items()
    ]
    return text_table(["metric", *labels.values()], [*body, *extra])


def ab_lines(
    cells: Mapping[Hashable, Mapping[str, Cell]],
    labels: Mapping[Hashable, str],
    baseline_label: str,
    names: Mapping[str, tuple[str, str]],
) -> list[str]:
    """One line per metric, one column per compared row: the difference [CI] and its call."""

    def cell(c: Cell, unit: str) -> str:
        text = fmt(c.diff, unit, signed=True)
        return text if c.call == "n/a" else f"{text} {c.call}"

    keys = [k for k in labels if k in cells]
    body = [
        [label, *(cell(cells[k][m], unit) if m in cells[k] else "n/a" for k in keys)]
        for m, (label, unit) in names.items()
    ]
    return text_table(["metric", *(f"{labels[k]} - {baseline_label}" for k in keys)], body)
