"""The eval section: candidate vs baseline, the paired pass-rate difference, every gate.

From `eval/verdict.json` (rlcycle/evaluation/verdict.py) and, for pass rates per task cluster,
`eval/eval_results.arrow` (one row per task × policy × attempt; `error` rows left out, as the
verdict does).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from rlcycle.report import svg
from rlcycle.report.header import DECISION_KIND
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.page import Raw, Section, badge, charts, dl, join, section, table, tag

RATE_METRICS = ("pass@", "pass^", "_rate")


def build(run: RunDir) -> Section:
    return section("eval", "Eval: candidate vs baseline", (_verdict, (run,)), (_clusters, (run,)))


def _is_rate(name: str) -> bool:
    return any(k in name for k in RATE_METRICS)


def _fmt(name: str, v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "n/a" if v is None else str(v)
    return svg.pct(v) if _is_rate(name) else f"{v:,}" if isinstance(v, int) else svg.num(v)


def _verdict(run: RunDir) -> Raw:
    v = run.json("verdict")
    decision = str(v.get("decision"))
    facts = [
        ("decision", badge(decision, DECISION_KIND.get(decision, "neutral"))),
        ("candidate", v.get("candidate_id") or v.get("candidate", "?")),
        ("baseline", v.get("baseline_id") or v.get("baseline", "?")),
        ("paired tasks", f"{v.get('paired_tasks', '?')} (infrastructure errors left out: {v.get('errors', 0)})"),
    ]
    if v.get("reason"):
        facts.append(("no verdict because", v["reason"]))
    return join([dl(facts), _metrics_table(v), _paired(v), _gates(v)])


def _metrics_table(v: dict) -> Raw:
    m = v.get("metrics") or {}
    cand, base = m.get("candidate") or {}, m.get("baseline") or {}
    rows = []
    for name in dict.fromkeys([*cand, *base]):
        a, b = cand.get(name), base.get(name)
        diff = ""
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            d = a - b
            diff = f"{d * 100:+.1f} points" if _is_rate(name) else f"{d:+,.4g}"
        rows.append([name, _fmt(name, a), _fmt(name, b), diff])
    return join([tag("h3", "Metrics"), table(["metric", "candidate", "baseline", "candidate − baseline"], rows)])


def _paired(v: dict) -> Raw:
    paired = v.get("paired")
    if not paired:
        return join(
            [
                tag("h3", "Paired pass-rate difference"),
                tag("p", "not available: no paired comparison (too few tasks ran cleanly under both policies)", "na"),
            ]
        )
    ci, mc = paired.get("pass_rate_diff") or {}, paired.get("mcnemar") or {}
    level = ci.get("level", 0.95)
    drop = (v.get("config") or {}).get("max_pass_rate_drop")
    text = (
        f"candidate − baseline pass rate, per task: {ci.get('estimate', 0):+.3f} "
        f"[{ci.get('low', 0):+.3f}, {ci.get('high', 0):+.3f}] ({level:.0%} cluster-bootstrap CI over "
        f"{paired.get('clusters', '?')} clusters). McNemar on discordant attempts: candidate only "
        f"{mc.get('candidate_only', '?')}, baseline only {mc.get('baseline_only', '?')}, p = {svg.num(mc.get('p_value'))}."
    )
    chart = svg.interval_chart(
        f"Paired pass-rate difference ({level:.0%} CI)",
        ci.get("estimate", 0.0),
        ci.get("low", 0.0),
        ci.get("high", 0.0),
        -drop if drop is not None else None,
        lambda x: f"{x:+.2f}",
        "candidate − baseline",
    )
    return join([tag("h3", "Paired pass-rate difference"), tag("p", text), charts(chart)])


def _gates(v: dict) -> Raw:
    gates = v.get("gates") or []
    if not gates:
        return join([tag("h3", "Gates"), tag("p", "no gate was evaluated (no verdict)", "na")])
    rows = [
        [
            g.get("name", ""),
            g.get("metric", ""),
            svg.num(g.get("value")),
            svg.num(g.get("threshold")),
            badge("pass", "ok") if g.get("passed") else badge("FAIL", "bad"),
            g.get("detail", ""),
        ]
        for g in gates
    ]
    return join([tag("h3", "Gates"), table(["gate", "metric", "value", "threshold", "result", "detail"], rows)])


def _clusters(run: RunDir) -> Raw:
    """Pass rate per task cluster and policy: where the candidate gained or lost."""
    results = run.table("eval_results", ["task_id", "cluster", "policy", "status"])
    try:
        verdict = run.json("verdict")
        policies = [verdict.get("candidate"), verdict.get("baseline")]
    except Unavailable:
        policies = sorted(results.get_column("policy").drop_nulls().unique().to_list())
    ok = results.filter(pl.col("status") != "error").with_columns(pl.col("cluster").fill_null("(none)"))
    if ok.height == 0:
        raise Unavailable("every eval episode ended in an infrastructure error")
    rates = ok.group_by("cluster", "policy").agg((pl.col("status") == "pass").mean().alias("rate"), pl.len().alias("n"))
    clusters = sorted(rates.get_column("cluster").unique().to_list())
    lookup = {(c, p): (r, n) for c, p, r, n in rates.iter_rows()}
    names = [_short(p) for p in policies]
    series = [
        svg.Series(name, [lookup.get((c, p), (None, 0))[0] for c in clusters])
        for name, p in zip(names, policies, strict=True)
    ]
    rows = [[c, *(_rate_cell(lookup.get((c, p))) for p in policies)] for c in clusters]
    chart = svg.bar_chart("Pass rate per task cluster", clusters, series, svg.pct)
    return join([tag("h3", "Pass rate per task cluster"), charts(chart), table(["cluster", *names], rows)])


def _short(policy: str | None) -> str:
    """'candidate:sha256:abc…' -> 'candidate (sha256:abc123456789)'."""
    if not policy:
        return "?"
    role, _, ident = policy.partition(":")
    return f"{role} ({ident[:19]})" if ident else role


def _rate_cell(v: tuple[float, int] | None) -> str:
    return "n/a" if v is None else f"{svg.pct(v[0])} of {v[1]}"
