"""Baselines and advantages: which samples are compared with which, and how.

Groups. A sample is compared with the samples of its *group*, chosen per episode (all samples
of an episode share a group) from `group_keys`, in order:
- `prompt`: the episode's turn-0 prompt ids (hashed). Several episodes that started from the
  same prompt are a GRPO group: the same question answered several times;
- a trajectory column (`repo`, `task_type`, `session_id` ...): its first non-null value in the
  episode;
- `batch`: every sample of the batch.
The first key whose group has at least `min_group_size` episodes wins; a sample with no such
key is excluded (`no_group`) — put `batch` last to make sure every sample has a baseline.
The label written to `group_key` is `prompt:<hash>`, `<column>:<value>` or `batch`.

Advantages. Within a group g with n included samples, rewards r_1..r_n, mean m:

    loo       A_i = r_i - (sum_j r_j - r_i) / (n - 1)  =  n / (n - 1) * (r_i - m)
              (RLOO: the baseline is the mean of the *other* samples, so it does not depend on
              r_i and the estimate stays unbiased)
    mean_std  A_i = (r_i - m) / (s + std_eps), s the sample std (ddof = 1), as GRPO
    dr_grpo   A_i = r_i - m   (Dr. GRPO: no division by the std, which over-weights groups
              whose rewards barely differ)

A group of one sample has no baseline (A = 0). A *flat* group — all rewards equal within
`flat_tol`, which includes every group of one — teaches nothing: its advantages are 0, it is
counted, and with `exclude_flat_groups` its samples are excluded (`flat_group`, weight 0),
except samples that emitted an invalid tool call: those are never excluded.
Samples excluded before this step (`no_completion`) take no part in any baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

C = pl.col
NORMALIZATIONS = ("loo", "mean_std", "dr_grpo")


@dataclass
class Groups:
    code: np.ndarray  # per episode: group index, -1 = none
    labels: pl.Series  # per group: its group_key label
    by_source: dict[str, int] = field(default_factory=dict)  # groups per key source


def assign(episodes: pl.DataFrame, group_keys: list[str], min_size: int) -> Groups:
    """The group of every episode (module docstring), numbered in (source, key) order."""
    n = episodes.height
    src = np.full(n, -1, dtype=np.int64)  # which source gave the episode its group
    key = np.zeros(n, dtype=np.uint64)  # the group's key within that source
    # Walk the sources last to first, so that the first eligible source ends up on top.
    for i, source in reversed(list(enumerate(group_keys))):
        k, ok = _source_key(episodes, source, min_size)
        src[ok], key[ok] = i, k[ok]
    code = np.full(n, -1, dtype=np.int64)
    labels, by_source, offset = [], {}, 0
    for i, source in enumerate(group_keys):  # sorted keys: ids do not depend on row order
        members = np.flatnonzero(src == i)
        if not members.size:
            continue
        uniq, first, inverse = np.unique(key[members], return_index=True, return_inverse=True)
        code[members] = offset + inverse
        labels.append(_labels(episodes, source, uniq, members[first]))
        by_source[source], offset = int(uniq.size), offset + int(uniq.size)
    return Groups(code, pl.concat(labels) if labels else pl.Series("label", [], pl.String), by_source)


def _source_key(e: pl.DataFrame, source: str, min_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, eligible) per episode for one source: a u64 key and whether its group is big enough."""
    if source == "batch":
        return np.zeros(e.height, np.uint64), np.ones(e.height, bool)
    col = C(source)  # "prompt" is the episode frame's turn-0 prompt hash column
    k = col if source == "prompt" else col.rank("dense")
    ok = col.is_not_null() & (pl.len().over(source) >= min_size)
    f = e.select(k=k.cast(pl.UInt64).fill_null(0), ok=ok)
    return f.get_column("k").to_numpy(), f.get_column("ok").to_numpy()


def _labels(e: pl.DataFrame, source: str, keys: np.ndarray, first_ep: np.ndarray) -> pl.Series:
    """`batch`, `prompt:<hash>` or `<column>:<value>` for each group of one source."""
    if source == "batch":
        return pl.Series("label", ["batch"])
    if source == "prompt":
        return pl.select(pl.lit("prompt:") + pl.Series(keys).cast(pl.String)).to_series().alias("label")
    values = e.get_column(source).gather(first_ep).cast(pl.String)
    return pl.select(pl.lit(f"{source}:") + values).to_series().alias("label")


@dataclass
class Advantages:
    advantage: np.ndarray  # float64; NaN where the sample has none (excluded before)
    flat_rows: np.ndarray  # bool: the sample's group is flat
    n_groups: int  # groups with at least one included sample
    n_flat_groups: int
    n_singleton_groups: int
    group_sizes: dict[str, float]  # min / median / max samples per group


def compute(
    reward: np.ndarray, group: np.ndarray, included: np.ndarray, normalization: str, std_eps: float, flat_tol: float
) -> Advantages:
    """Advantages of the `included` samples of groups >= 0 (others NaN)."""
    if normalization not in NORMALIZATIONS:  # the config validates this; never a silent default
        raise ValueError(f"unknown normalization {normalization!r}")
    use = included & (group >= 0)
    every = bool(use.all())
    g, r = (group, reward) if every else (group[use], reward[use])
    k = int(group.max()) + 1 if group.size else 0
    n = np.bincount(g, minlength=k).astype(np.float64)
    mean = np.bincount(g, weights=r, minlength=k) / np.maximum(n, 1)
    dev = r - mean[g]  # r_i - m, per sample
    # Two-pass variance (sum of squared deviations): stable when rewards are large and close.
    ssd = np.bincount(g, weights=dev * dev, minlength=k)
    flat = (n > 0) & (ssd <= n * flat_tol * flat_tol)  # population std <= flat_tol (n = 1 too)
    # Every normalisation is dev * (a factor per group):
    #   loo       n / (n - 1)        (r - mean of the others = n / (n - 1) * (r - m))
    #   mean_std  1 / (s + std_eps)  (s = sqrt(ssd / (n - 1)), the sample std, ddof 1)
    #   dr_grpo   1
    # and 0 for a flat group (which includes every group of one: no baseline at all).
    if normalization == "loo":
        factor = n / np.maximum(n - 1, 1)
    elif normalization == "mean_std":
        factor = 1.0 / (np.sqrt(ssd / np.maximum(n - 1, 1)) + std_eps)
    else:
        factor = np.ones(k)
    factor[flat] = 0.0
    dev *= factor[g]
    dev += 0.0  # exactly 0, never -0.0, for a flat group
    flat_g = flat[g]
    if every:
        out, flat_rows = dev, flat_g
    else:
        out = np.full(reward.shape, np.nan)
        out[use] = dev
        flat_rows = np.zeros(reward.shape, dtype=bool)
        flat_rows[use] = flat_g
    present = n > 0
    sizes = n[present]
    return Advantages(
        out,
        flat_rows,
        int(present.sum()),
        int(flat.sum()),
        int((n == 1).sum()),
        {"min": float(sizes.min()), "median": float(np.median(sizes)), "max": float(sizes.max())} if sizes.size else {},
    )
