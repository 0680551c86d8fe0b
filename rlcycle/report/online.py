"""The online section: how each policy version did with real users, with 95% intervals.

From `collect/trajectories.arrow`; the numbers are rlcycle/online.py's `online_metrics` (the
intervals are in rlcycle/stats.py), with the follow-up classifier distill used (metrics.py).
Metrics the input cannot measure (no `tests_passed` column, say) are left out, with a note.

With two versions or more, an A/B table: each version minus the first (report/ab.py, the same
differences and calls as the closed-loop experiment's text report), or the pairs of
`RUN_DIR/comparisons.json` (`{"pairs": [[baseline, version], ...]}`). A difference is paired by
session (rlcycle.online.paired_differences) when every sample of both versions carries a
`pair_key` and they share some: the same sessions served to both (rlcycle/agent/events.py);
otherwise the traffic is independent (rlcycle.stats.difference).

More run directories (`rlcycle report RUN_DIR MORE...`, e.g. the closed-loop experiment's
measure runs) add their trajectories: versions are ordered by run, and each version is compared
with the first run's first version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import polars as pl

from rlcycle import online
from rlcycle.online import METRICS, OPTIONAL, PAIR_COLUMN, REQUIRED, OnlineMetrics
from rlcycle.report import ab, metrics, svg
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.page import Raw, Section, charts, esc, join, section, table, tag
from rlcycle.stats import Estimate


def build(run: RunDir, more: Sequence[RunDir] = ()) -> Section:
    return section("online", "Online metrics by policy version", (_body, (run, tuple(more))))


def _body(run: RunDir, more: tuple[RunDir, ...] = ()) -> Raw:
    if more:
        m, scoring, traj, pairs = _runs_online_metrics(run, more)
    else:
        m, scoring = metrics.run_online_metrics(run)
        traj = run.table("trajectories", REQUIRED, OPTIONAL)
        pairs = comparisons(run, m.versions)
    shown = [name for name in METRICS if name not in m.absent]
    figures = [_chart(name, m) for name in shown]
    notes = [
        "Bars: the estimate; whiskers: 95% confidence interval, sessions as the clusters (so that "
        "the samples and episodes of one session are not taken as independent): the delta method "
        "for ratios, Wilson's score interval on the effective sample size for shares of episodes. "
        "Hover a bar for its numbers.",
        f"Dissatisfied follow-ups: {scoring.source}; follow-ups that answer a clarifying question "
        f"({', '.join(scoring.clarify_tools) or 'no clarify tools'}) are not counted.",
        *m.notes,
    ]
    return join(
        [
            charts(*figures),
            _table(m, shown),
            _ab(traj, m, pairs, shown, scoring),
            *(tag("p", n, "note") for n in notes),
            _complaints(m),
        ]
    )


def _chart(name: str, m: OnlineMetrics) -> str:
    spec = METRICS[name]
    ests = [m.metrics[v][name] for v in m.versions]
    series = svg.Series(spec.how, [e.value for e in ests], [e.low for e in ests], [e.high for e in ests])
    fmt = svg.pct if spec.unit == "rate" else svg.num
    return svg.bar_chart(f"{spec.title}: {spec.how}", m.versions, [series], fmt, height=220)


def _cell(e: Estimate, unit: str, noun: str) -> Raw:
    if e.value is None:
        return Raw(f'n/a <span class="muted">(no {esc(noun)})</span>')
    # the closed-loop table prints the same text (rlcycle/report/ab.py)
    return Raw(f'{esc(ab.fmt(e, unit))} <span class="muted">{int(e.den):,} {esc(noun)}</span>')


def _table(m: OnlineMetrics, shown: list[str]) -> Raw:
    """Metrics as rows, policy versions as columns (versions are few, metrics have long names)."""
    rows: list[list[Any]] = [
        [key, "", *(f"{m.counts[v][key]:,}" for v in m.versions)] for key in ("samples", "episodes", "sessions")
    ]
    for name in shown:
        spec = METRICS[name]
        rows.append([spec.title, spec.how, *(_cell(m.metrics[v][name], spec.unit, spec.noun) for v in m.versions)])
    head = ["metric", "computed as", *(f"{v}: estimate [95% CI]" for v in m.versions)]
    return join([Raw('<div class="scroll">'), table(head, rows, "data nowrap"), Raw("</div>")])


def comparisons(run: RunDir, versions: list[str]) -> list[tuple[str, str]]:
    """(baseline, version) pairs: comparisons.json's that name known versions, else each
    version against the first."""
    path = run.path / "comparisons.json"
    if path.exists():
        pairs = json.loads(path.read_text()).get("pairs", [])
        return [(a, b) for a, b in pairs if a in versions and b in versions and a != b]
    return [(versions[0], v) for v in versions[1:]]


def _runs_online_metrics(
    run: RunDir, more: tuple[RunDir, ...]
) -> tuple[OnlineMetrics, metrics.Scoring, pl.DataFrame, list[tuple[str, str]]]:
    """The online metrics over several runs' trajectories (classified as the first run's distill
    did, else the first later run's that distilled), versions in run order, and the pairs: each
    version against the first run's first version."""
    frames: list[pl.DataFrame] = []
    first_run: dict[str, int] = {}
    for i, r in enumerate((run, *more)):
        frame = r.table("trajectories", REQUIRED, OPTIONAL)
        frames.append(frame)
        for v in frame.get_column("policy_version").fill_null(online.NO_VERSION).unique(maintain_order=True):
            first_run.setdefault(v, i)
    traj = pl.concat(frames, how="diagonal_relaxed")
    if traj.height == 0:
        raise Unavailable("collect/trajectories.arrow has no rows in any of the runs")
    distilled = next((r for r in (run, *more) if _has(r, "reward_report")), run)
    scoring = metrics.run_scoring(distilled)
    m = metrics.online_of(traj, scoring)
    m.versions = sorted(m.versions, key=lambda v: first_run.get(v, len(more) + 1))  # stable: time order within a run
    base = next((v for v in m.versions if first_run.get(v) == 0), None)
    return m, scoring, traj, [(base, v) for v in m.versions if base is not None and v != base]


def _has(run: RunDir, name: str) -> bool:
    try:
        run.file(name)
    except Unavailable:
        return False
    return True


def paired_cells(
    traj: pl.DataFrame, scoring: metrics.Scoring, a: str, b: str, names: Sequence[str]
) -> tuple[dict[str, ab.Cell], int] | None:
    """b − a per metric of `names`, paired by session, when every sample of both versions
    carries a pair key and they share some (the same sessions served to both); and how many
    sessions were matched. None when they cannot be paired."""
    sides = traj.filter(pl.col("policy_version").is_in([a, b]))
    if PAIR_COLUMN not in sides.columns or sides.height == 0 or sides.get_column(PAIR_COLUMN).null_count():
        return None
    facts = online.episode_facts(
        sides, scoring.classifier(), scoring.clarify_tools, scoring.edit_tools, session_column=PAIR_COLUMN
    )
    diffs, n = online.paired_differences(facts.filter(pl.col("version") == a), facts.filter(pl.col("version") == b))
    if n == 0:
        return None
    return {k: ab.Cell(d, ab.call(d, METRICS[k].direction)) for k, d in diffs.items() if k in names}, n


def _ab(
    traj: pl.DataFrame, m: OnlineMetrics, pairs: list[tuple[str, str]], shown: list[str], scoring: metrics.Scoring
) -> Raw:
    """Differences with 95% CIs and their calls, one column per compared pair: paired by
    session where both versions served the same sessions (pair keys), else independent
    traffic (sessions as clusters)."""
    if not pairs:
        return Raw("")
    note = Raw("")
    cells: dict[tuple[str, str], dict[str, ab.Cell]] = {}
    matched = []
    for a, b in pairs:
        found = paired_cells(traj, scoring, a, b, shown)
        if found is None:
            cells[(a, b)] = ab.ab_table({a: m.metrics[a], b: m.metrics[b]}, a, shown)[b]
        else:
            cells[(a, b)], n = found
            matched.append(f"{b} − {a}: {n}")
    if matched:
        note = tag(
            "p",
            "Paired by session: these versions served the same sessions (the same pair keys: tasks, "
            f"simulated users and sampling seeds), so each difference is over matched sessions "
            f"({', '.join(matched)}); rlcycle.stats.paired_difference, as the experiment's text report.",
            "note",
        )
    rows = []
    for name in shown:
        spec = METRICS[name]
        row: list[Any] = [spec.title]
        for pair in pairs:
            c = cells[pair].get(name)
            row.append(
                "n/a"
                if c is None or c.call == "n/a" and c.diff.value is None
                else f"{ab.fmt(c.diff, spec.unit, signed=True)} {c.call}"
            )
        rows.append(row)
    head = ["metric", *(f"{b} − {a}" for a, b in pairs)]
    return join(
        [
            tag("h3", "A/B: differences with 95% CI (better/worse only where the CI excludes 0)"),
            Raw('<div class="scroll">'),
            table(head, rows, "data nowrap"),
            Raw("</div>"),
            note,
        ]
    )


def _complaints(m: OnlineMetrics, limit: int = 300) -> Raw:
    """The newest dissatisfied follow-ups per version: what users complained about, verbatim."""
    rows = [
        [v, episode, text if len(text) <= limit else text[: limit - 1] + "…"]
        for v in m.versions
        for episode, text in m.complaints.get(v, [])
    ]
    if not rows:
        return tag("p", "No follow-up was classified dissatisfied.", "note")
    return join(
        [
            tag("h3", "Newest dissatisfied follow-ups per policy version"),
            table(["policy version", "episode", "follow-up (as the user wrote it)"], rows),
        ]
    )
