"""The online section: how each policy version did with real users, with 95% intervals.

From `collect/trajectories.arrow`; the numbers and the interval method are in metrics.py.
The follow-up classifier is the one distill used: the phrase lists (and the `classifier` hook)
of the `dissatisfied_followup` signal in reward_report.json's spec, and its `clarify_tools`;
the built-in rules of rlcycle/distill/followup.py when distill did not run.
"""

from __future__ import annotations

from typing import Any

from rlcycle.distill.spec import resolve_callable
from rlcycle.errors import RlcycleError
from rlcycle.report import metrics, svg
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.metrics import METRICS, Estimate, OnlineMetrics
from rlcycle.report.page import Raw, Section, charts, esc, join, section, table, tag

COLUMNS = ["sample_id", "episode_id", "policy_version", "ts", "tool_calls", "n_invalid_tool_calls",
           "edit_lines_proposed", "edit_lines_surviving", "followup_text", "feedback", "latency_ms"]  # fmt: skip
FORMAT = {"rate": svg.pct, "count": lambda v: f"{v:.3f}", "ms": lambda v: f"{v:,.0f}", "value": lambda v: f"{v:+.3f}"}


def build(run: RunDir) -> Section:
    return section("online", "Online metrics by policy version", (_body, (run,)))


def _body(run: RunDir) -> Raw:
    traj = run.table("trajectories", COLUMNS)
    if traj.height == 0:
        raise Unavailable("collect/trajectories.arrow has no rows")
    scoring, clarify, source = _classifier(run)
    m = metrics.online_metrics(traj, scoring, clarify)
    figures = [_chart(name, m) for name in METRICS]
    notes = [
        "Bars: the estimate; whiskers: 95% confidence interval (normal approximation of the ratio "
        "estimator, episodes as the units, so that the samples of one episode are not taken as "
        "independent). Hover a bar for its numbers.",
        f"Dissatisfied follow-ups: {source}; follow-ups that answer a clarifying question "
        f"({', '.join(clarify) or 'no clarify tools'}) are not counted.",
    ]
    return join([charts(*figures), _table(m), *(tag("p", n, "note") for n in notes), _complaints(m)])


def _classifier(run: RunDir) -> tuple[dict[str, Any], list[str], str]:
    """(scoring params, clarify tools, a sentence saying which classifier) as distill used them."""
    try:
        report = run.json("reward_report")
    except Unavailable:
        return {}, ["ask_user"], "the built-in phrase rules of rlcycle/distill/followup.py (distill did not run)"
    clarify = list((report.get("config") or {}).get("clarify_tools") or ["ask_user"])
    signals = (report.get("spec") or {}).get("signals") or []
    params = next((s.get("params") or {} for s in signals if s.get("name") == "dissatisfied_followup"), {})
    scoring = {"phrases": params.get("phrases"), "satisfied": params.get("satisfied_phrases"), "negations": params.get("negations")}
    scoring = {k: v for k, v in scoring.items() if v is not None}
    source = "the phrase rules of the run's reward spec (rlcycle/distill/followup.py)"
    if params.get("classifier"):
        try:
            scoring["hook"] = resolve_callable(params["classifier"])
            source = f"the reward spec's classifier {params['classifier']}"
        except RlcycleError as e:
            source = f"the built-in phrase rules: the spec's classifier could not be loaded ({e})"
    return scoring, clarify, source


def _chart(name: str, m: OnlineMetrics) -> str:
    title, how, unit, _ = METRICS[name]
    ests = [m.metrics[name][v] for v in m.versions]
    series = svg.Series(how, [e.value for e in ests], [e.low for e in ests], [e.high for e in ests])
    fmt = svg.pct if unit == "rate" else svg.num
    return svg.bar_chart(f"{title}: {how}", m.versions, [series], fmt, height=220)


def _cell(e: Estimate, unit: str, noun: str) -> Raw:
    if e.value is None:
        return Raw(f'n/a <span class="muted">(no {esc(noun)})</span>')
    f = FORMAT[unit]
    return Raw(f'{esc(f(e.value))} [{esc(f(e.low))}, {esc(f(e.high))}] '
               f'<span class="muted">{int(e.denominator):,} {esc(noun)}</span>')  # fmt: skip


def _table(m: OnlineMetrics) -> Raw:
    """Metrics as rows, policy versions as columns (versions are few, metrics have long names)."""
    rows: list[list[Any]] = [["samples", "", *(f"{m.samples[v]:,}" for v in m.versions)],
                             ["episodes", "", *(f"{m.episodes[v]:,}" for v in m.versions)]]  # fmt: skip
    for name, (title, how, unit, noun) in METRICS.items():
        rows.append([title, how, *(_cell(m.metrics[name][v], unit, noun) for v in m.versions)])
    head = ["metric", "computed as", *(f"{v}: estimate [95% CI]" for v in m.versions)]
    return join([Raw('<div class="scroll">'), table(head, rows, "data nowrap"), Raw("</div>")])


def _complaints(m: OnlineMetrics, limit: int = 300) -> Raw:
    """The newest dissatisfied follow-ups per version: what users complained about, verbatim."""
    rows = [[v, episode, text if len(text) <= limit else text[: limit - 1] + "…"]
            for v in m.versions for episode, text in m.complaints.get(v, [])]  # fmt: skip
    if not rows:
        return tag("p", "No follow-up was classified dissatisfied.", "note")
    return join([tag("h3", "Newest dissatisfied follow-ups per policy version"),
                 table(["policy version", "episode", "follow-up (as the user wrote it)"], rows)])  # fmt: skip
