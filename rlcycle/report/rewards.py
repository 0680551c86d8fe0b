"""The reward section: what each reward part contributed, per policy version, and the monitors.

From `distill/reward_report.json` (signals, shares per version, monitor rates, warnings, named
hacks; layout in rlcycle/distill/monitors.py) and `distill/examples.arrow` (the `reward_parts`
struct, for each part's mean per version). Each part is drawn from whichever file is there.
"""

from __future__ import annotations

from typing import Any

from rlcycle.report import metrics, svg
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.page import Raw, Section, charts, dl, join, section, table, tag

MONITOR_ROWS = (  # (key in per_policy_version, label, format)
    ("episodes", "episodes", "int"),
    ("samples", "samples", "int"),
    ("mean_reward", "mean reward", "num"),
    ("invalid_tool_call_rate", "invalid tool call rate (samples)", "pct"),
    ("invalid_rate_failed", "  … on failed episodes", "pct"),
    ("invalid_rate_other", "  … on the others", "pct"),
    ("tool_error_rate", "tool error rate", "pct"),
    ("clarification_rate", "clarification rate", "pct"),
    ("edit_rate", "edit rate", "pct"),
    ("dissatisfied_rate", "dissatisfied rate", "pct"),
    ("success_rate", "success rate", "pct"),
    ("mean_latency_ms", "mean latency (ms)", "num"),
)


def build(run: RunDir) -> Section:
    return section(
        "reward", "Reward parts", (_overview, (run,)), (_alerts, (run,)), (_parts, (run,)), (_monitors, (run,))
    )


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    return {"int": lambda v: f"{int(v):,}", "pct": svg.pct, "num": svg.num}[kind](value)


def _overview(run: RunDir) -> Raw:
    r = run.json("reward_report")
    excluded = ", ".join(f"{k} {v:,}" for k, v in (r.get("excluded") or {}).items()) or "none"
    groups = r.get("groups") or {}
    return dl(
        [
            ("rows / episodes", f"{r.get('rows', 0):,} samples, {r.get('episodes', 0):,} episodes"),
            ("included", f"{r.get('included', 0):,} (excluded: {excluded})"),
            (
                "advantage",
                f"{r.get('normalization', '?')} within groups by {' then '.join(groups.get('keys', []))} "
                f"({groups.get('count', '?')} groups, {groups.get('flat', 0)} flat); credit={r.get('credit', '?')}",
            ),
            ("reward", _stats(r.get("reward"))),
            ("advantage stats", _stats(r.get("advantage"))),
            ("reward spec", (r.get("spec") or {}).get("source") or "built-in defaults"),
        ]
    )


def _stats(d: dict | None) -> str:
    return "  ".join(f"{k} {svg.num(v)}" for k, v in (d or {}).items())


def _alerts(run: RunDir) -> Raw:
    r = run.json("reward_report")
    out: list[Any] = [tag("h3", "Hack monitors")]
    hacks, warnings, notes = r.get("hacks") or [], r.get("warnings") or [], r.get("notes") or []
    for h in hacks:
        out.append(
            Raw(
                f'<div class="callout bad"><b>{tag("span", h.get("hack", "hack"))}</b>: '
                f"{tag('span', h.get('message', ''))}</div>"
            )
        )
    for w in warnings:
        out.append(Raw(f'<div class="callout warn">{tag("span", w.get("message", w))}</div>'))
    if not hacks and not warnings:
        out.append(tag("p", "No monitored rate moved between policy versions; no reward hack flagged.", "note"))
    cfg = r.get("config") or {}
    out.append(
        tag(
            "p",
            f"A rate moved when it changed by at least {cfg.get('monitor_abs', '?')} (absolute) and "
            f"{cfg.get('monitor_rel', '?')} of its old value; versions with fewer than "
            f"{cfg.get('monitor_min_episodes', '?')} episodes are not compared.",
            "note",
        )
    )
    out += [tag("p", f"note: {n}", "note") for n in notes]
    return join(out)


def _parts(run: RunDir) -> Raw:
    """Per part: a table (spec + overall numbers) and two charts (mean and share per version)."""
    out: list[Any] = [tag("h3", "Reward parts per policy version")]
    signals: dict[str, Any] = {}
    per_version: dict[str, Any] = {}
    try:
        report = run.json("reward_report")
        signals, per_version = report.get("signals") or {}, report.get("per_policy_version") or {}
    except Unavailable:
        pass  # the overview above says why
    try:
        frame = run.table("examples", ["policy_version", "ts", "reward_parts"])
        versions, parts, means = metrics.reward_parts_by_version(frame)
    except Unavailable as e:
        if not signals:
            raise
        out.append(tag("p", f"means per version not available: {e}", "na"))
        versions, parts, means = [v for v in per_version], list(signals), {}
    out.append(_parts_table(parts or list(signals), versions, signals, means, per_version))
    shares = {p: {v: (per_version.get(v, {}).get("shares") or {}).get(p) for v in versions} for p in parts or signals}
    out.append(
        charts(
            _part_chart("Mean of each reward part, per policy version", parts, versions, means, svg.num),
            _part_chart("Share of |reward| per part, per policy version", list(shares), versions, shares, svg.pct),
        )
    )
    return join(out)


def _part_chart(title: str, parts: list[str], versions: list[str], values: dict, fmt) -> str:
    if not values:
        return svg.no_data(title)
    series = [svg.Series(v, [values.get(p, {}).get(v) for p in parts]) for v in versions]
    return svg.bar_chart(title, parts, series, fmt)


def _parts_table(parts: list[str], versions: list[str], signals: dict, means: dict, per_version: dict) -> Raw:
    head = ["part", "scope", "weight", "cap", "mean (all)", "share", "share before cap", "coverage"]
    head += [f"{v}: mean / share" for v in versions]
    rows = []
    for p in parts:
        s = signals.get(p, {})
        row = [
            p,
            s.get("scope", ""),
            svg.num(s.get("weight")),
            _cap(s),
            svg.num(s.get("mean")),
            svg.pct(s.get("share")),
            svg.pct(s.get("share_before_cap")),
            f"{s['coverage']:,}" if "coverage" in s else "",
        ]
        for v in versions:
            share = (per_version.get(v, {}).get("shares") or {}).get(p)
            row.append(f"{svg.num(means.get(p, {}).get(v))} / {svg.pct(share)}")
        rows.append(row)
    return join([Raw('<div class="scroll">'), table(head, rows), Raw("</div>")])


def _cap(signal: dict) -> str:
    if signal.get("cap") is None:
        return ""
    scale = signal.get("cap_scale")
    return svg.pct(signal["cap"]) + (f" (scaled ×{scale:.2f})" if scale is not None and scale < 1 else "")


def _monitors(run: RunDir) -> Raw:
    r = run.json("reward_report")
    per_version = r.get("per_policy_version") or {}
    versions = [v for v in r.get("version_order") or [] if v in per_version] or list(per_version)
    if not versions:
        raise Unavailable("the reward report holds no policy versions")
    rows = [[label, *(_fmt(per_version[v].get(key), kind) for v in versions)] for key, label, kind in MONITOR_ROWS]
    return join(
        [
            tag("h3", "Monitored rates per policy version (distill)"),
            Raw('<div class="scroll">'),
            table(["rate", *versions], rows),
            Raw("</div>"),
        ]
    )
