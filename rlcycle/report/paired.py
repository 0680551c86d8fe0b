"""Paired comparisons of the closed-loop experiment: every version measured on the same sessions.

In:  `OUT` of rlcycle/closed_loop.py with a `v0` measure run (the start served on the measure
     traffic) beside each arm's measure run; the record of runs.json; the follow-up scoring.
Out: `measured(...)` -> per row key (`("v0", "v0")`, `(arm, label)`) the online metrics of that
     version on the measure traffic only, and its episode facts keyed by the session's *pair
     key*; `paired_cells(...)` -> the A/B cells (rlcycle/report/ab.py `Cell`) of b − a per
     metric with rlcycle.stats.paired_difference.

Why paired: the measure runs of v0 and of every arm's last version use one traffic seed, so
session `sim-<run>-<task>-a<k>` of one run and of another are the same task, the same
simulated user and the same sampling seeds; only the policy differs. The run prefix differs (it
hashes the policy), so the pair key is the session id without it. A comparison on the same
sessions removes the task-to-task variance from the difference (a hard task is hard for both),
which is most of the variance of a pass rate over a mixed suite. The mean reward stays an
independent comparison (distill's samples are not re-keyed here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from rlcycle import online
from rlcycle.report import ab
from rlcycle.report.closed_loop import DIRECTIONS, _user_labels, loop_metrics, with_user_verdict
from rlcycle.report.load import RunDir
from rlcycle.report.metrics import Scoring
from rlcycle.stats import Estimate

C = pl.col
MEASURE = "measure"
RUN_PREFIX = re.compile(r"^sim-[0-9a-f]{8}-")  # rlcycle.agent.runner.default_run_id + "-"


def pair_key(traj: pl.DataFrame) -> pl.DataFrame:
    """`session_id` without its run prefix: the same (task, attempt) in every measure run."""
    return traj.with_columns(C("session_id").str.replace(RUN_PREFIX.pattern, ""))


def measured(
    out: Path, runs: dict[str, Any], scoring: Scoring
) -> tuple[dict[str, Any], pl.DataFrame, pl.DataFrame] | None:
    """(metrics of the one version its measure run served, its facts, its user-label facts),
    the sessions keyed by pair key; None when the run has no trajectories."""
    path = out / MEASURE / "collect" / "trajectories.arrow"
    if not any(c["name"] == MEASURE for c in runs["cycles"]) or not path.exists():
        return None
    traj = pair_key(with_user_verdict(RunDir(out / MEASURE).table("trajectories", online.REQUIRED, online.OPTIONAL)))
    metrics = loop_metrics(traj, scoring)
    if len(metrics) != 1:
        return None  # a measure run serves one version; anything else is not a measure run
    facts = online.episode_facts(traj, scoring.classifier(), scoring.clarify_tools, scoring.edit_tools)
    return next(iter(metrics.values())), facts, _user_labels(facts)


def paired_cells(
    a: tuple[Any, pl.DataFrame, pl.DataFrame],
    b: tuple[Any, pl.DataFrame, pl.DataFrame],
    names: list[str],
    independent: dict[str, ab.Cell],
) -> dict[str, ab.Cell]:
    """b − a per metric of `names` on the matched sessions; a metric the pairing cannot give
    (the mean reward) keeps its independent cell from `independent`."""
    diffs, _ = online.paired_differences(a[1], b[1])
    truth, _ = online.paired_differences(a[2], b[2])
    diffs["dissatisfied_truth"] = truth["dissatisfied_rate"]
    sign = {n: online.METRICS[n].direction if n in online.METRICS else 0 for n in names} | DIRECTIONS
    cells: dict[str, ab.Cell] = {}
    for n in names:
        d: Estimate | None = diffs.get(n)
        if d is None:
            if n in independent:
                cells[n] = independent[n]
            continue
        cells[n] = ab.Cell(d, ab.call(d, sign[n]))
    return cells


def matched_sessions(a: tuple[Any, pl.DataFrame, pl.DataFrame], b: tuple[Any, pl.DataFrame, pl.DataFrame]) -> int:
    """How many sessions both versions served (the pairs behind every paired cell)."""
    return online.paired_differences(a[1], b[1])[1]


def version_cells(
    traj: pl.DataFrame, scoring: Scoring, a: str, b: str, names: list[str]
) -> tuple[dict[str, ab.Cell], int]:
    """b − a per metric of `names`, paired by session, for two policy versions of one
    trajectories table whose sessions carry the pair key (`rlcycle report` of OUT/report with
    comparisons.json `"paired": true`); and how many sessions were matched."""
    facts = online.episode_facts(pair_key(traj), scoring.classifier(), scoring.clarify_tools, scoring.edit_tools)
    diffs, n = online.paired_differences(facts.filter(C("version") == a), facts.filter(C("version") == b))
    sign = {k: m.direction for k, m in online.METRICS.items()}
    return {k: ab.Cell(d, ab.call(d, sign[k])) for k, d in diffs.items() if k in names}, n
