"""The online section: how each policy version did with real users, with 95% intervals.

From `collect/trajectories.arrow`; the numbers are rlcycle/online.py's `online_metrics` (the
intervals are in rlcycle/stats.py), with the follow-up classifier distill used (metrics.py).
Metrics the input cannot measure (no `tests_passed` column, say) are left out, with a note.

With two versions or more, an A/B table: each version minus the first (report/ab.py, the same
differences and calls as the closed-loop script), or the pairs of `RUN_DIR/comparisons.json`
(`{"pairs": [[baseline, version], ...]}`; rlcycle/report/experiment.py writes one with each arm's
last version vs v0 and vs control's).
"""

from __future__ import annotations

import json
from typing import Any

from rlcycle.online import METRICS, OPTIONAL, REQUIRED, OnlineMetrics
from rlcycle.report import ab, metrics, paired, svg
from rlcycle.report.load import RunDir
from rlcycle.report.page import Raw, Section, charts, esc, join, section, table, tag
from rlcycle.stats import Estimate


def build(run: RunDir) -> Section:
    return section("online", "Online metrics by policy version", (_body, (run,)))


def _body(run: RunDir) -> Raw:
    m, scoring = metrics.run_online_metrics(run)
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
            _ab(run, m, shown, scoring),
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


def is_paired(run: RunDir) -> bool:
    """comparisons.json says the versions served the same sessions (the closed-loop experiment's
    measure runs): session ids without their run prefix name the same session in each."""
    path = run.path / "comparisons.json"
    return path.exists() and bool(json.loads(path.read_text()).get("paired"))


def _ab(run: RunDir, m: OnlineMetrics, shown: list[str], scoring: metrics.Scoring) -> Raw:
    """Differences with 95% CIs and their calls, one column per compared pair: independent
    traffic (sessions as clusters), or paired by session when comparisons.json says so."""
    pairs = comparisons(run, m.versions)
    if not pairs:
        return Raw("")
    note = Raw("")
    if is_paired(run):
        traj = run.table("trajectories", REQUIRED, OPTIONAL)
        done = {(a, b): paired.version_cells(traj, scoring, a, b, shown) for a, b in pairs}
        cells = {pair: c for pair, (c, _) in done.items()}
        matched = ", ".join(f"{b} − {a}: {n}" for (a, b), (_, n) in done.items())
        note = tag(
            "p",
            "Paired by session: every version served the same sessions (the same tasks, simulated "
            f"users and sampling seeds), so each difference is over matched sessions ({matched}); "
            "rlcycle.stats.paired_difference, as the experiment's text report.",
            "note",
        )
    else:
        cells = {(a, b): ab.ab_table({a: m.metrics[a], b: m.metrics[b]}, a, shown)[b] for a, b in pairs}
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
