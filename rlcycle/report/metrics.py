"""The numbers behind the report's charts: online metrics of a run, reward parts per version.

Online metrics are rlcycle/online.py's `online_metrics` (the one function the closed-loop script
and the distill monitors use too), on `collect/trajectories.arrow`, with the follow-up
classifier distill used: the phrase lists (and the `classifier` hook) of the
`dissatisfied_followup` signal in reward_report.json's spec, and its `clarify_tools` and
`edit_tools`; the built-in rules of rlcycle/distill/followup.py when distill did not run.

    run_online_metrics(RunDir("runs/r1")) -> (OnlineMetrics, classifier settings)

Versions are ordered by their first sample, as in the distill monitors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from rlcycle import online
from rlcycle.distill import followup
from rlcycle.distill.spec import resolve_callable
from rlcycle.errors import RlcycleError
from rlcycle.online import OnlineMetrics
from rlcycle.report.load import RunDir, Unavailable

C = pl.col
NO_VERSION = online.NO_VERSION


@dataclass
class Scoring:
    """How a run's follow-ups are classified and which calls ask or edit (as distill did)."""

    params: dict[str, Any] = field(default_factory=dict)  # score_texts keywords: hook, phrases, ...
    clarify_tools: list[str] = field(default_factory=lambda: list(online.CLARIFY_TOOLS))
    edit_tools: list[str] = field(default_factory=lambda: list(online.EDIT_TOOLS))
    source: str = "the built-in phrase rules of rlcycle/distill/followup.py (distill did not run)"

    def classifier(self) -> online.Classifier:
        p = self.params
        return functools.partial(
            followup.score_texts,
            hook=p.get("hook"),
            phrases=p.get("phrases", followup.DISSATISFIED),
            satisfied=p.get("satisfied", followup.SATISFIED),
            negations=p.get("negations", followup.NEGATIONS),
        )


def run_scoring(run: RunDir) -> Scoring:
    """The classifier settings of `run`'s distill (reward_report.json), or the built-in ones."""
    try:
        report = run.json("reward_report")
    except Unavailable:
        return Scoring()
    config = report.get("config") or {}
    signals = (report.get("spec") or {}).get("signals") or []
    params = next((s.get("params") or {} for s in signals if s.get("name") == "dissatisfied_followup"), {})
    scoring = {
        "phrases": params.get("phrases"),
        "satisfied": params.get("satisfied_phrases"),
        "negations": params.get("negations"),
    }
    out = Scoring(
        {k: v for k, v in scoring.items() if v is not None},
        list(config.get("clarify_tools") or online.CLARIFY_TOOLS),
        list(config.get("edit_tools") or online.EDIT_TOOLS),
        "the phrase rules of the run's reward spec (rlcycle/distill/followup.py)",
    )
    if params.get("classifier"):
        try:
            out.params["hook"] = resolve_callable(params["classifier"])
            out.source = f"the reward spec's classifier {params['classifier']}"
        except RlcycleError as e:
            out.source = f"the built-in phrase rules: the spec's classifier could not be loaded ({e})"
    return out


def online_of(traj: Any, scoring: Scoring) -> OnlineMetrics:
    """`online.online_metrics` of a trajectories table with `scoring`'s classifier and tools."""
    return online.online_metrics(traj, scoring.classifier(), scoring.clarify_tools, scoring.edit_tools)


def run_online_metrics(run: RunDir) -> tuple[OnlineMetrics, Scoring]:
    """The online metrics of `run`'s trajectories, classified as its distill did."""
    traj = run.table("trajectories", online.REQUIRED, online.OPTIONAL)
    if traj.height == 0:
        raise Unavailable("collect/trajectories.arrow has no rows")
    scoring = run_scoring(run)
    return online_of(traj, scoring), scoring


def version_order(frame: pl.DataFrame) -> list[str]:
    """Policy versions by first sample time, then name (nulls as NO_VERSION, last)."""
    v = frame.select(C("policy_version").fill_null(NO_VERSION).alias("v"), C("ts"))
    first = v.group_by("v").agg(C("ts").min()).sort("ts", "v", nulls_last=True)
    names = first.get_column("v").to_list()
    return [n for n in names if n != NO_VERSION] + ([NO_VERSION] if NO_VERSION in names else [])


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
