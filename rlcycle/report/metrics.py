"""The numbers behind the report's charts: online metrics with CIs, reward parts per version.

Online metrics come from the trajectories (one row per model sample), per policy version:

    edit persistence         lines surviving / lines proposed (edit outcomes of the version)
    dissatisfied follow-ups  episodes whose follow-up the classifier scores < 0 / episodes with
                             a follow-up that was not the answer to a clarifying question
    invalid tool calls       invalid calls per sample
    latency                  mean latency per sample (ms)
    explicit feedback        mean feedback value over samples that carry one

Every one of them is a ratio of sums, R = Σy / Σx, and the samples of one episode are not
independent (one confused episode emits several broken calls), so the 95% interval is the
normal approximation of the ratio estimator with *episodes* as the units (the delta method,
cluster-robust):  se(R) = sqrt(Σ_e (y_e − R·x_e)² / (n(n−1))) / x̄,  R ± z·se. A rate with no
variation (0 of 300) gets a zero-width interval; the table shows the counts beside it.

Versions are ordered by their first sample, as in the distill monitors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import polars as pl

from rlcycle.distill import followup

C = pl.col
NO_VERSION = "(none)"
LEVEL = 0.95


@dataclass
class Estimate:
    value: float | None
    low: float | None
    high: float | None
    n: int  # units (episodes) that carried the denominator
    denominator: float = 0.0  # Σx: samples, lines proposed, episodes with a follow-up


@dataclass
class OnlineMetrics:
    """Per policy version (in `versions` order), each metric's estimate."""

    versions: list[str]
    samples: dict[str, int]
    episodes: dict[str, int]
    metrics: dict[str, dict[str, Estimate]] = field(default_factory=dict)  # metric -> version -> estimate
    complaints: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # version -> newest (episode, text)
    notes: list[str] = field(default_factory=list)


METRICS = {  # name: (title, how it is computed, unit, what the denominator counts)
    "edit_persistence": ("Edit persistence", "lines surviving / lines proposed", "rate", "lines proposed"),
    "dissatisfied_rate": ("Dissatisfied follow-ups", "dissatisfied / episodes with a follow-up", "rate", "follow-ups"),
    "invalid_per_sample": ("Invalid tool calls per sample", "invalid calls / samples", "count", "samples"),
    "latency_ms": ("Mean latency (ms)", "mean latency per sample", "ms", "samples timed"),
    "feedback": ("Explicit feedback", "mean feedback value where given", "value", "samples with feedback"),
}
BOUNDS = {"rate": (0.0, 1.0), "count": (0.0, math.inf), "ms": (0.0, math.inf), "value": (-math.inf, math.inf)}


def ratio_estimate(y: list[float], x: list[float], level: float = LEVEL) -> Estimate:
    """Σy/Σx with a cluster-robust normal-approximation CI (units = list entries)."""
    n = sum(1 for xi in x if xi > 0)
    sx = sum(x)
    if sx <= 0:
        return Estimate(None, None, None, 0, 0.0)
    r = sum(y) / sx
    units = len(x)
    if units < 2:
        return Estimate(r, r, r, n, sx)
    resid = sum((yi - r * xi) ** 2 for yi, xi in zip(y, x, strict=True))
    se = math.sqrt(resid / (units * (units - 1))) / (sx / units)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return Estimate(r, r - z * se, r + z * se, n, sx)


def version_order(frame: pl.DataFrame) -> list[str]:
    """Policy versions by first sample time, then name (nulls as NO_VERSION, last)."""
    v = frame.select(C("policy_version").fill_null(NO_VERSION).alias("v"), C("ts"))
    first = v.group_by("v").agg(C("ts").min()).sort("ts", "v", nulls_last=True)
    names = first.get_column("v").to_list()
    return [n for n in names if n != NO_VERSION] + ([NO_VERSION] if NO_VERSION in names else [])


def online_metrics(traj: pl.DataFrame, scoring: dict[str, Any], clarify_tools: list[str],
                   n_complaints: int = 5) -> OnlineMetrics:  # fmt: skip
    """The metrics of METRICS per version from a trajectories frame (see the docstring)."""
    episodes = _episodes(traj, clarify_tools)
    texts = episodes.get_column("followup")
    score = followup.score_texts(texts, scoring.get("hook"), scoring.get("phrases", followup.DISSATISFIED),
                                 scoring.get("satisfied", followup.SATISFIED), scoring.get("negations", followup.NEGATIONS))  # fmt: skip
    answered = texts.is_not_null() & ~episodes.get_column("asked")
    episodes = episodes.with_columns(
        answered=answered.cast(pl.Float64),
        dissatisfied=(answered & (score < 0).fill_null(False)).cast(pl.Float64),
    )
    versions = version_order(traj)
    out = OnlineMetrics(versions, {}, {})
    pairs = {"edit_persistence": ("surviving", "proposed"), "dissatisfied_rate": ("dissatisfied", "answered"),
             "invalid_per_sample": ("invalid", "n"), "latency_ms": ("latency_sum", "latency_n"),
             "feedback": ("feedback_sum", "feedback_n")}  # fmt: skip
    for v in versions:
        ep = episodes.filter(C("v") == v)
        out.samples[v] = int(ep.get_column("n").sum())
        out.episodes[v] = ep.height
        for name, (y, x) in pairs.items():
            est = ratio_estimate(ep.get_column(y).to_list(), ep.get_column(x).to_list())
            out.metrics.setdefault(name, {})[v] = _clamp(name, est)
        newest = ep.filter(C("dissatisfied") > 0).sort("start", descending=True, nulls_last=True).head(n_complaints)
        out.complaints[v] = list(newest.select("unit", "followup").iter_rows())
    return out


def _episodes(traj: pl.DataFrame, clarify_tools: list[str]) -> pl.DataFrame:
    """One row per (version, episode) with the sums the ratios need."""
    # A clarifying question counts when it went out (status ok, or its result never logged), as
    # in distill's features: the follow-up is then an answer, not a verdict.
    call = pl.element().struct
    asked = call.field("name").is_in(clarify_tools) & (call.field("status").eq("ok") | call.field("status").is_null())
    names = C("tool_calls").list.eval(asked).list.any()
    unit = pl.coalesce(C("episode_id"), C("sample_id"))  # a sample without episode is its own unit
    return traj.with_columns(v=C("policy_version").fill_null(NO_VERSION), unit=unit).group_by("v", "unit").agg(
        n=pl.len().cast(pl.Float64),
        start=C("ts").min(),
        proposed=C("edit_lines_proposed").fill_null(0).sum().cast(pl.Float64),
        surviving=C("edit_lines_surviving").fill_null(0).sum().cast(pl.Float64),
        invalid=C("n_invalid_tool_calls").fill_null(0).sum().cast(pl.Float64),
        latency_sum=C("latency_ms").fill_null(0).sum().cast(pl.Float64),
        latency_n=C("latency_ms").count().cast(pl.Float64),
        feedback_sum=C("feedback").fill_null(0).sum().cast(pl.Float64),
        feedback_n=C("feedback").count().cast(pl.Float64),
        followup=C("followup_text").drop_nulls().first(),
        asked=names.fill_null(False).any(),
    )  # fmt: skip


def _clamp(name: str, est: Estimate) -> Estimate:
    """Rates stay in [0, 1], counts and latencies >= 0 (the normal approximation can overshoot)."""
    if est.value is None:
        return est
    lo_bound, hi_bound = BOUNDS[METRICS[name][2]]
    return Estimate(est.value, max(lo_bound, est.low), min(hi_bound, est.high), est.n, est.denominator)


def reward_parts_by_version(examples: pl.DataFrame) -> tuple[list[str], list[str], dict[str, dict[str, float]]]:
    """(versions, part names, part -> version -> mean) from an examples frame.

    Means are over every row (excluded rows too: a reward part is what the signal said, and
    exclusion is about the baseline group, not about the reward).
    """
    parts_dtype = examples.schema["reward_parts"]
    parts = [f.name for f in parts_dtype.fields] if isinstance(parts_dtype, pl.Struct) else []
    versions = version_order(examples)
    if not parts:
        return versions, [], {}
    flat = examples.select(C("policy_version").fill_null(NO_VERSION).alias("v"), C("reward_parts").struct.unnest())
    means = flat.group_by("v").agg(*(C(p).cast(pl.Float64).mean() for p in parts))
    table: dict[str, dict[str, float]] = {p: {} for p in parts}
    for row in means.iter_rows(named=True):
        for p in parts:
            table[p][row["v"]] = row[p]
    return versions, parts, table
