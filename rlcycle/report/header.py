"""The report's first section: which run, which checkpoints, what was decided, stage timings."""

from __future__ import annotations

from typing import Any

from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.page import Raw, Section, badge, compact, dl, join, section, table, tag
from rlcycle.stage import RunLayout

DECISION_KIND = {"accept": "ok", "refuse": "bad", "no_verdict": "warn"}
STATE_KIND = {"finished": "ok", "unfinished": "warn", "not run": "neutral"}


def build(run: RunDir) -> Section:
    return section("run", "Run", (_facts, (run,)), (_stages, (run,)))


def _facts(run: RunDir) -> Raw:
    info = run.run_info()
    base = info.get("base_id") or "unknown (no run.json)"
    if info.get("base"):
        base = f"{base} ({info['base']})"
    return dl(
        [
            ("run directory", str(run.path.resolve())),
            ("base checkpoint", base),
            ("candidate", _candidate(run)),
            ("decision", _decision(run)),
            ("deployed", _deployed(run)),
        ]
    )


def _candidate(run: RunDir) -> str:
    result = (run.manifest("train") or {}).get("result", {})
    if result.get("checkpoint_id"):
        return result["checkpoint_id"]
    for name, key in (("checkpoint_meta", "id"), ("verdict", "candidate_id")):
        try:
            if run.json(name).get(key):
                return run.json(name)[key]
        except Unavailable:
            pass
    return f"none (train: {run.stage_state('train')})"


def _decision(run: RunDir) -> Raw:
    result = (run.manifest("eval") or {}).get("result", {})
    decision, failed = result.get("decision"), result.get("failed_gates") or []
    if decision is None:
        try:
            verdict = run.json("verdict")
            decision = verdict.get("decision")
            failed = [g.get("name") for g in verdict.get("gates", []) if not g.get("passed")]
        except Unavailable:
            return tag("span", f"none (eval: {run.stage_state('eval')})", "muted")
    parts: list[Any] = [badge(str(decision), DECISION_KIND.get(str(decision), "neutral"))]
    if failed:
        parts.append(f"  failed gates: {', '.join(map(str, failed))}")
    return join(parts)


def _deployed(run: RunDir) -> str:
    manifest = run.manifest("deploy")
    if manifest is None:
        return f"nothing (deploy: {run.stage_state('deploy')})"
    result = manifest.get("result", {})
    what = result.get("action") or result.get("status") or "ran"
    return f"{result.get('checkpoint_id', '?')} ({what})"


def _stages(run: RunDir) -> Raw:
    rows, total = [], 0.0
    for stage in RunLayout.STAGES:
        state = run.stage_state(stage)
        if stage == "simulate" and state == "not run":
            continue  # only cycles with source=simulate have it
        m = run.manifest(stage) or {}
        seconds = m.get("seconds")
        total += seconds or 0.0
        result = m.get("result", {})
        summary = "  ".join(f"{k}={compact(v, 60)}" for k, v in result.items() if k not in ("status", "verdict"))
        rows.append(
            [
                stage,
                badge(state, STATE_KIND[state]),
                result.get("status", "ran" if m else ""),
                "" if seconds is None else f"{seconds:,.1f} s",
                m.get("finished", ""),
                summary,
            ]
        )
    rows.append([tag("b", "total"), "", "", f"{total:,.1f} s", "", ""])
    note = tag("p", "Times are those of the run that wrote each manifest (a cached rerun keeps them).", "note")
    return join(
        [
            tag("h3", "Stages"),
            Raw('<div class="scroll">'),
            table(["stage", "state", "status", "time", "finished", "result"], rows),
            Raw("</div>"),
            note,
        ]
    )
