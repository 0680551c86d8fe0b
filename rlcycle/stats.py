"""Every interval and test of rlcycle, in one place: plain numbers in, numbers and dataclasses out.

No I/O and nothing of rlcycle's above the ground floor. Every random draw comes from a seeded
`random.Random`, so a verdict is reproducible. The normal quantile is `statistics.NormalDist`.

What is here, and why:
- pass@k (Chen et al. 2021, the unbiased estimator): with n attempts of which c passed,
  pass@k = 1 − C(n−c, k) / C(n, k), the chance that at least one of k attempts drawn without
  replacement passes; pass^k (all k pass; reliability, as in tau-bench) = C(c, k) / C(n, k).
- `paired_cluster_bootstrap` (the eval gate): the same tasks run under both policies, so the
  comparison is per task, and tasks of one repository are correlated (one broken fixture fails
  them all), so the bootstrap resamples whole clusters, not single tasks.
- `mcnemar_exact` on discordant (task, attempt) pairs: b = candidate passes where the baseline
  fails, c = the reverse; under H0 b ~ Binomial(b + c, 1/2). Two-sided exact p-value.
- `ratio_estimate` (online metrics): R = Σy / Σx over clusters (sessions), with the
  cluster-robust delta-method interval  se(R) = sqrt(k/(k−1) · Σ_i (y_i − R·x_i)²) / Σx  over
  the k clusters that carry a denominator (Cochran, Sampling Techniques, 6.9): a session's
  correlated samples count once. One such cluster: no interval.
- `wilson` (k of n independent trials) and `cluster_proportion`: a share of episodes when
  sessions are the clusters. Wilson's score interval stays sane at 0/n and n/n; with clusters
  it is computed on the effective sample size n / deff, where deff is the delta-method variance
  over the binomial one (Kish's design effect, floored at 1; Korn & Graubard 1998 do the same
  for Clopper–Pearson). One episode per session gives deff = 1: the plain Wilson interval.
- `difference(a, b)`: b − a for two independent estimates (two versions' traffic): Newcombe's
  hybrid score interval (1998, method 10) for proportions, from the two Wilson intervals;
  otherwise normal with the two standard errors combined.
- `paired_difference(ya, xa, yb, xb)`: b − a when both versions served the *same* sessions
  (the same task, user and sampling seeds: the closed loop's measure runs). Each ratio is
  linearised per session, u_i = (yb_i − R_b·xb_i)/Σxb − (ya_i − R_a·xa_i)/Σxa, and
  se = sqrt(k/(k−1) · Σ u_i²) over the k matched sessions: the delta method for a difference of
  two ratios on one set of clusters, so what the sessions share (the task's difficulty) cancels.
  For a pass rate with one episode per session it is the paired (matched-pairs) normal interval.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95


def z(level: float = LEVEL) -> float:
    """The two-sided standard normal quantile of `level` (1.959964 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


# --- eval: pass@k, the paired bootstrap, McNemar ---------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n attempts, c passed (Chen et al. 2021)."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} attempts, got {n}")
    if n - c < k:  # fewer failures than draws: some draw must pass
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one task: the chance that k attempts drawn without replacement all pass."""
    if n < k:
        raise ValueError(f"pass^{k} needs at least {k} attempts, got {n}")
    return math.comb(c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    level: float

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}


def paired_cluster_bootstrap(
    diffs: dict[str, float],
    clusters: dict[str, str],
    n_boot: int = 2000,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """CI of the mean per-task difference, resampling whole clusters (percentile method).

    `diffs`: task_id -> candidate − baseline (e.g. pass rates over attempts);
    `clusters`: task_id -> cluster. Each bootstrap draw picks as many clusters as there are,
    with replacement, and averages the per-task differences of every task in the picked
    clusters (weighting by task, as the point estimate does).
    """
    if not diffs:
        raise ValueError("no paired tasks to compare")
    by_cluster: dict[str, list[float]] = defaultdict(list)
    for task, d in sorted(diffs.items()):
        by_cluster[clusters.get(task, task)].append(d)
    groups = [(sum(v), len(v)) for _, v in sorted(by_cluster.items())]
    estimate = sum(s for s, _ in groups) / sum(n for _, n in groups)
    rng = random.Random(seed)
    means = []
    for _ in range(n_boot):
        picks = [groups[rng.randrange(len(groups))] for _ in groups]
        means.append(sum(s for s, _ in picks) / sum(n for _, n in picks))
    means.sort()
    alpha = (1 - level) / 2
    lo = means[max(0, math.floor(alpha * n_boot))]
    hi = means[min(n_boot - 1, math.ceil((1 - alpha) * n_boot) - 1)]
    return Interval(estimate, lo, hi, level)


@dataclass(frozen=True)
class McNemar:
    candidate_only: int  # b: candidate passed, baseline failed
    baseline_only: int  # c: baseline passed, candidate failed
    p_value: float


def mcnemar_exact(pairs: Sequence[tuple[bool, bool]]) -> McNemar:
    """Exact two-sided McNemar test on (candidate_passed, baseline_passed) pairs."""
    b = sum(1 for cand, base in pairs if cand and not base)
    c = sum(1 for cand, base in pairs if base and not cand)
    n = b + c
    if n == 0:
        return McNemar(b, c, 1.0)
    k = min(b, c)
    # P(X <= k) for X ~ Binomial(n, 1/2), doubled for two sides, capped at 1.
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return McNemar(b, c, min(1.0, 2 * tail))


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean with a normal-approximation CI (independent values)."""
    n = len(values)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), level)
    m = sum(values) / n
    if n == 1:
        return Interval(m, m, m, level)
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    half = z(level) * math.sqrt(var / n)
    return Interval(m, m - half, m + half, level)


# --- online: ratios and proportions over clusters, and their differences ----------------------


@dataclass(frozen=True)
class Estimate:
    """A ratio or proportion with its CI and the totals behind it."""

    value: float | None  # None: nothing to measure (no denominator)
    low: float | None  # None: no interval (fewer than two clusters carry a denominator)
    high: float | None
    num: float  # Σy: lines surviving, complaints, ms, invalid calls
    den: float  # Σx: lines proposed, follow-ups, model calls
    units: int  # clusters (sessions) that carry a denominator
    se: float | None = None  # delta-method standard error, clusters as units
    kind: str = "ratio"  # "ratio" (normal interval) or "proportion" (Wilson interval)
    level: float = LEVEL

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _clusters(y: Sequence[float], x: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The (y, x) of the clusters that carry a denominator (x > 0)."""
    ya, xa = np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64)
    if ya.shape != xa.shape:
        raise ValueError(f"y and x differ in length: {ya.shape} vs {xa.shape}")
    keep = xa > 0
    return ya[keep], xa[keep]


def _cluster_se(y: np.ndarray, x: np.ndarray, r: float) -> float:
    k = y.size
    return math.sqrt(k / (k - 1) * float(np.sum((y - r * x) ** 2))) / float(x.sum())


def ratio_estimate(
    y: Sequence[float], x: Sequence[float], level: float = LEVEL, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> Estimate:
    """Σy / Σx over the clusters with x > 0, with the delta-method CI clipped to `bounds`."""
    ya, xa = _clusters(y, x)
    total_y, total_x, k = float(ya.sum()), float(xa.sum()), int(ya.size)
    if k == 0:
        return Estimate(None, None, None, total_y, total_x, 0, level=level)
    r = total_y / total_x
    if k == 1:
        return Estimate(r, None, None, total_y, total_x, 1, level=level)
    se = _cluster_se(ya, xa, r)
    half = z(level) * se
    lo, hi = max(bounds[0], r - half), min(bounds[1], r + half)
    return Estimate(r, lo, hi, total_y, total_x, k, se, level=level)


def _wilson_bounds(p: float, n: float, level: float) -> tuple[float, float]:
    zz = z(level)
    z2 = zz * zz
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = zz * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson(k: int, n: int, level: float = LEVEL) -> Estimate:
    """k of n independent trials with the Wilson score interval."""
    if n == 0:
        return Estimate(None, None, None, k, n, 0, kind="proportion", level=level)
    lo, hi = _wilson_bounds(k / n, n, level)
    return Estimate(k / n, lo, hi, k, n, n, kind="proportion", level=level)


def cluster_proportion(y: Sequence[float], x: Sequence[float], level: float = LEVEL) -> Estimate:
    """Σy of Σx trials in clusters (complaints of follow-ups, per session): Wilson on n / deff.

    deff = [Σ(y_i − p·x_i)² / (Σx)²] / [p(1 − p) / Σx], floored at 1 (clustering never makes
    the data worth more than independent trials); deff = 1 at p = 0 or 1, or with one cluster.
    """
    ya, xa = _clusters(y, x)
    total_y, total_x, k = float(ya.sum()), float(xa.sum()), int(ya.size)
    if k == 0:
        return Estimate(None, None, None, total_y, total_x, 0, kind="proportion", level=level)
    p = total_y / total_x
    n_eff, se = total_x, None
    if k >= 2:
        se = _cluster_se(ya, xa, p)
        if 0 < p < 1:
            cluster_var = float(np.sum((ya - p * xa) ** 2)) / total_x**2
            n_eff = total_x / max(1.0, cluster_var / (p * (1 - p) / total_x))
    lo, hi = _wilson_bounds(p, n_eff, level)
    return Estimate(p, lo, hi, total_y, total_x, k, se, kind="proportion", level=level)


def newcombe(a: Estimate, b: Estimate) -> Estimate:
    """b − a for two independent proportions: Newcombe's hybrid score interval (method 10)."""
    if a.value is None or b.value is None or a.low is None or b.low is None:
        return _no_difference(a, b)
    d = b.value - a.value
    lo = d - math.sqrt((b.value - b.low) ** 2 + (a.high - a.value) ** 2)
    hi = d + math.sqrt((b.high - b.value) ** 2 + (a.value - a.low) ** 2)
    return Estimate(d, lo, hi, 0, 0, a.units + b.units, kind="proportion", level=a.level)


def normal_difference(a: Estimate, b: Estimate) -> Estimate:
    """b − a for two independent estimates, normal with se = sqrt(se_a² + se_b²)."""
    if a.value is None or b.value is None or a.se is None or b.se is None:
        return _no_difference(a, b)
    d = b.value - a.value
    se = math.hypot(a.se, b.se)
    half = z(a.level) * se
    return Estimate(d, d - half, d + half, 0, 0, a.units + b.units, se, kind=a.kind, level=a.level)


def difference(a: Estimate, b: Estimate) -> Estimate:
    """b − a (b: the later version or the treatment) with a CI, the two samples independent."""
    return newcombe(a, b) if a.kind == "proportion" else normal_difference(a, b)


def _no_difference(a: Estimate, b: Estimate) -> Estimate:
    d = None if a.value is None or b.value is None else b.value - a.value
    return Estimate(d, None, None, 0, 0, a.units + b.units, kind=a.kind, level=a.level)


def paired_difference(
    ya: Sequence[float],
    xa: Sequence[float],
    yb: Sequence[float],
    xb: Sequence[float],
    level: float = LEVEL,
    kind: str = "paired",
) -> Estimate:
    """b − a of two ratios measured on the same clusters (index i is one session in both), with
    the paired delta-method interval (module docstring). Clusters where neither side has a
    denominator carry nothing; `units` counts the rest. Fewer than two: no interval."""
    arrays = [np.asarray(v, dtype=np.float64) for v in (ya, xa, yb, xb)]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"paired arrays differ in length: {[a.shape for a in arrays]}")
    ya_, xa_, yb_, xb_ = arrays
    keep = (xa_ > 0) | (xb_ > 0)
    ya_, xa_, yb_, xb_ = ya_[keep], xa_[keep], yb_[keep], xb_[keep]
    k, sa, sb = int(keep.sum()), float(xa_.sum()), float(xb_.sum())
    if sa == 0 or sb == 0:
        return Estimate(None, None, None, 0, 0, k, kind=kind, level=level)
    ra, rb = float(ya_.sum()) / sa, float(yb_.sum()) / sb
    d = rb - ra
    if k < 2:
        return Estimate(d, None, None, 0, 0, k, kind=kind, level=level)
    u = (yb_ - rb * xb_) / sb - (ya_ - ra * xa_) / sa
    se = math.sqrt(k / (k - 1) * float(np.sum(u * u)))
    half = z(level) * se
    return Estimate(d, d - half, d + half, 0, 0, k, se, kind=kind, level=level)
