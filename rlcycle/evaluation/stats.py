"""The statistics behind the eval gate: pass@k, pass^k, paired cluster bootstrap, McNemar.

In: per-(task, attempt) outcomes of two policies on the same tasks. Out: plain numbers and
dataclasses; no I/O. Every random draw comes from a seeded `random.Random`, so a verdict is
reproducible.

Why these:
- pass@k (Chen et al. 2021, the unbiased estimator): with n attempts of which c passed,
  pass@k = 1 − C(n−c, k) / C(n, k) — the chance that at least one of k attempts drawn without
  replacement passes. Averaged over tasks.
- pass^k (all k attempts pass; reliability, as in tau-bench): C(c, k) / C(n, k).
- Paired differences: the same tasks run under both policies, so the comparison is per task
  (candidate pass rate − baseline pass rate), which removes task difficulty from the variance.
- Cluster bootstrap: tasks from one repository are correlated (one broken fixture fails them
  all), so the bootstrap resamples whole clusters with replacement, not single tasks; a CI that
  ignored clustering would be too narrow and the gate too eager.
- McNemar's exact test on discordant (task, attempt) pairs: b = candidate passes where the
  baseline fails, c = the reverse; under H0 b ~ Binomial(b + c, 1/2). Two-sided exact p-value.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


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
    level: float = 0.95,
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


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with a normal-approximation CI (for rates and latencies in reports)."""
    n = len(values)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), level)
    m = sum(values) / n
    if n == 1:
        return Interval(m, m, m, level)
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    z = _z(level)
    half = z * math.sqrt(var / n)
    return Interval(m, m - half, m + half, level)


def _z(level: float) -> float:
    """The two-sided normal quantile for `level` (bisection on erf; no scipy needed)."""
    target = level
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
