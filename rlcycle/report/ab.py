"""A/B tables: online metrics per row key, and every row's difference to a chosen baseline row.

In:  `{key: {metric: Estimate}}` (rlcycle.online's per-version metrics, one entry per row), a
     baseline key, the metric names (directions come from rlcycle.online.METRICS unless given).
Out: `{key: {metric: Cell}}` for every key but the baseline: the difference key − baseline with
     its 95% CI (rlcycle.stats.difference: the rows' traffic is independent) and a call:
       better / worse        the CI excludes 0, signed by the metric's direction
       changed               the CI excludes 0, the metric has no better direction
       no change detected    the CI covers 0
       n/a                   no difference or no interval (a side without data or one session)
Plus `fmt`/`number`: one way to print an estimate, in the HTML report and in the closed-loop
experiment's text (experiments/closed_loop/text.py).

Row keys are any hashable; an experiment with arms uses `(arm, version)` tuples:

    rows = {("treatment", v): treated.metrics[v] for v in treated.versions} | {("control", v0): ...}
    cells = ab_table(rows, baseline=("control", v0), names=list(METRICS))
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from rlcycle.online import METRICS
from rlcycle.stats import Estimate, difference


@dataclass(frozen=True)
class Cell:
    diff: Estimate
    call: str


def call(d: Estimate, direction: int) -> str:
    """better / worse / changed / no change detected / n/a for a difference (module docstring)."""
    if d.value is None or d.low is None or d.high is None:
        return "n/a"
    if d.low > 0 or d.high < 0:
        return "changed" if direction == 0 else "better" if (d.value > 0) == (direction > 0) else "worse"
    return "no change detected"


def ab_table(
    rows: Mapping[Hashable, Mapping[str, Estimate]],
    baseline: Hashable,
    names: Sequence[str],
    directions: Mapping[str, int] | None = None,
) -> dict[Hashable, dict[str, Cell]]:
    """Every row but `baseline` minus `baseline`, per metric of `names` (module docstring)."""
    if baseline not in rows:
        raise KeyError(f"baseline row {baseline!r} is not among the rows {list(rows)}")
    sign = {n: METRICS[n].direction if n in METRICS else 0 for n in names} | dict(directions or {})
    base = rows[baseline]
    out: dict[Hashable, dict[str, Cell]] = {}
    for key, metrics in rows.items():
        if key == baseline:
            continue
        diffs = {n: difference(base[n], metrics[n]) for n in names if n in base and n in metrics}
        out[key] = {n: Cell(d, call(d, sign[n])) for n, d in diffs.items()}
    return out


# --- plain text -------------------------------------------------------------------------------

# unit -> (scale, format spec, suffix): one way to print a number, in the HTML report and here
FORMATS = {
    "rate": (100.0, ".1f", "%"),
    "ms": (1.0, ",.0f", ""),
    "tokens": (1.0, ".1f", ""),
    "count": (1.0, ".3f", ""),
    "value": (1.0, "+.3f", ""),
}


def number(v: float, unit: str, signed: bool = False) -> str:
    """`v` as the unit prints it: 12.5%, 1,234, 0.031, +0.500 (`signed`: always a sign)."""
    scale, spec, suffix = FORMATS.get(unit, (1.0, ".3f", ""))
    if signed and not spec.startswith("+"):
        spec = "+" + spec
    return f"{v * scale:{spec}}{suffix}"


def fmt(e: Estimate, unit: str, signed: bool = False) -> str:
    """`12.5% [3.1%, 40.2%]`, `+0.031 [-0.010, +0.072]`, `n/a`, `320 [no CI]`."""
    if e.value is None:
        return "n/a"
    text = number(e.value, unit, signed)
    if e.low is None or e.high is None:
        return text + " [no CI]"
    return text + f" [{number(e.low, unit, signed)}, {number(e.high, unit, signed)}]"
