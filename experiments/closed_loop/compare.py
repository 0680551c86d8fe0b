"""The experiment report: the arms of rlcycle/closed_loop.py side by side, and "did it learn".

In:  `OUT` and its `runs.json` record (per arm the runs of rlcycle/closed_loop.py's `run_arm`).
Out: `build_experiment` -> a dict: each arm's own report (rlcycle/report/closed_loop.py
     `build_report`), the online metrics of v0 (the shared start) and of every arm's last
     version, each last version minus v0, every arm's last version minus control's, the verdict,
     and seconds per stage; `render_experiment` -> its plain text; `write_report_dir` ->
     `OUT/report/`, a run directory (collect/trajectories.arrow with `policy_version` =
     `v0` or `<arm>/<label>`, comparisons.json) whose online section `rlcycle report` draws,
     and its `report.html`.

The verdict "did the loop learn" (issue #11): YES when treatment's last version beats v0 *and*
control's last version on the hidden-test pass rate or on edit persistence (LEARN_METRICS),
each with a 95% CI that excludes 0, and control's last version beats v0 on neither. Every
difference is rlcycle.stats.difference via report/ab.py (independent traffic: the versions were
measured on different sessions; sessions are the clusters), except with a v0 measure run
(`OUT/v0/measure`, the start served on the measure traffic): then every row is its version on
the measure traffic alone, and each difference is paired by session (rlcycle/report/paired.py),
since all of them served the same sessions.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import polars as pl

from rlcycle import io as rio
from rlcycle import online
from rlcycle.report import ab, paired
from rlcycle.report.closed_loop import (
    DIRECTIONS,
    LEARN_METRICS,
    SHOWN,
    _rewards,
    _scoring,
    build_report,
    render,
    shown,
    with_user_verdict,
)
from rlcycle.report.load import RunDir
from rlcycle.stats import Estimate

STAGES = ("simulate", "collect", "distill", "train", "eval", "deploy")
V0 = "v0"


# --- building -----------------------------------------------------------------------------------


def _estimates(metrics: dict[str, Any]) -> dict[str, Estimate]:
    return {k: e for k, e in metrics.items() if isinstance(e, Estimate)}


def build_experiment(out: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The experiment dict (module docstring) from a finished (or partly finished) OUT."""
    arms = {arm: build_report(out / arm, runs) for arm, runs in record["arms"].items()}
    rows: dict[tuple[str, str], dict[str, Estimate]] = {}
    names: dict[tuple[str, str], str] = {}
    last: dict[str, tuple[str, str]] = {}
    for arm, rep in arms.items():
        if not rep["versions"]:
            continue
        first, final = rep["versions"][0], rep["versions"][-1]
        if not rows:  # v0: the same start (and, on cycle-1's shared traffic, the same sessions) in every arm
            rows[(arm, V0)] = _estimates(rep["metrics"][first["id"]])
            names[(arm, V0)] = V0
        key = (arm, final["label"])
        rows.setdefault(key, _estimates(rep["metrics"][final["id"]]))
        names.setdefault(key, f"{arm} {final['label']}")
        last[arm] = key
    metric_names = list(shown({k: dict(v) for k, v in rows.items()}))
    v0 = next(iter(rows), None)
    pairing = _paired_rows(out, record, arms, last) if v0 else None
    if pairing is not None:  # every row measured on the measure traffic; v0 too
        rows, v0 = pairing["rows"], (V0, V0)
        names = {v0: V0, **{k: names[k] for k in last.values()}}
    vs_v0 = ab.ab_table(rows, v0, metric_names, DIRECTIONS) if v0 else {}
    vs_v0 = {k: c for k, c in vs_v0.items() if k in last.values()}
    vs_control: dict[Any, dict[str, ab.Cell]] = {}
    if "control" in last and len(last) > 1:
        base = last["control"]
        pair = {base: rows[base], **{k: rows[k] for a, k in last.items() if a != "control"}}
        vs_control = ab.ab_table(pair, base, metric_names, DIRECTIONS)
    if pairing is not None:
        m = pairing["measured"]
        vs_v0 = {k: paired.paired_cells(m[v0], m[k], metric_names, c) for k, c in vs_v0.items()}
        vs_control = {k: paired.paired_cells(m[last["control"]], m[k], metric_names, c) for k, c in vs_control.items()}
    return {
        "seed": record.get("seed"),
        "cycles": record.get("cycles"),
        "episodes": record.get("episodes"),
        "tasks": record.get("tasks"),
        "sets": record.get("sets", []),
        "start": record.get("start", {}),
        "wall_s": record.get("wall_s"),
        "arms": arms,
        "rows": rows,
        "names": names,
        "last": last,
        "metric_names": metric_names,
        "vs_v0": vs_v0,
        "vs_control": vs_control,
        "paired": None if pairing is None else pairing["matched"],
        "verdict": verdict(last, vs_v0, vs_control),
        "seconds": stage_seconds(arms),
    }


def _paired_rows(
    out: Path, record: dict[str, Any], arms: dict[str, Any], last: dict[str, tuple[str, str]]
) -> dict[str, Any] | None:
    """With a v0 measure run (OUT/v0/measure), every row from the measure traffic alone and the
    facts to pair them by session (rlcycle/report/paired.py); None without one, or when an
    arm's last version has no measure run."""
    if not record.get("v0") or not last:
        return None
    first_arm = next(iter(record["arms"]))
    scoring = _scoring(out / first_arm, record["arms"][first_arm])
    m0 = paired.measured(out / V0, record["v0"], scoring)
    measured = {
        (V0, V0): m0,
        **{key: paired.measured(out / arm, record["arms"][arm], scoring) for arm, key in last.items()},
    }
    if any(m is None for m in measured.values()):
        return None
    rows: dict[tuple[str, str], dict[str, Estimate]] = {}
    for (arm, label), m in measured.items():
        runs = record["v0"] if arm == V0 else record["arms"][arm]
        row = _estimates(m[0])
        reward = _rewards(out / arm, {"cycles": [c for c in runs["cycles"] if c["name"] == paired.MEASURE]})
        if reward:  # the measure run's distill: one version
            row["reward"] = next(iter(reward.values()))
        rows[(arm, label)] = row
    matched = {f"{k[0]} {k[1]}": paired.matched_sessions(m0, m) for k, m in measured.items() if k != (V0, V0)}
    return {"rows": rows, "measured": measured, "matched": matched}


def verdict(last: dict[str, tuple[str, str]], vs_v0: dict, vs_control: dict) -> dict[str, Any]:
    """Did the loop learn (module docstring), and on which metric; the evidence per metric."""
    if "treatment" not in last or "control" not in last:
        return {"learned": None, "summary": "needs a treatment and a control arm", "on": []}
    t, c = last["treatment"], last["control"]
    calls = {
        m: {
            "treatment_vs_v0": _call(vs_v0, t, m),
            "control_vs_v0": _call(vs_v0, c, m),
            "treatment_vs_control": _call(vs_control, t, m),
        }
        for m in LEARN_METRICS
    }
    on = [m for m, x in calls.items() if x["treatment_vs_v0"] == "better" and x["treatment_vs_control"] == "better"]
    control_up = [m for m, x in calls.items() if x["control_vs_v0"] == "better"]
    learned = bool(on) and not control_up
    label = {m: SHOWN[m][0].split(" (")[0] for m in LEARN_METRICS}
    if learned:
        summary = (
            f"treatment {t[1]} beats v0 and control {c[1]} on {', '.join(label[m] for m in on)} "
            "(95% CIs exclude 0); control does not beat v0"
        )
    elif control_up:
        summary = f"control {c[1]} also beats v0 on {', '.join(label[m] for m in control_up)}: not attributable to the rewards"
    else:
        summary = "no metric shows treatment beating both v0 and control with 95% confidence: " + "; ".join(
            f"{label[m]}: vs v0 {x['treatment_vs_v0']}, vs control {x['treatment_vs_control']}"
            for m, x in calls.items()
        )
    return {"learned": learned, "summary": summary, "on": on, "control_improved_on": control_up, "calls": calls}


def _call(cells: dict, key: Any, metric: str) -> str:
    cell = cells.get(key, {}).get(metric)
    return cell.call if cell is not None else "n/a"


def stage_seconds(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per arm, the median seconds of each stage over the cycles that ran it (cached: left
    out), the median wall time per cycle and the measure run's."""
    out = {}
    for arm, rep in arms.items():
        cycles = [c for c in rep["cycles"] if c["run"].startswith("cycle-")]
        row: dict[str, float | None] = {}
        for stage in STAGES:
            xs = [c["stage_seconds"][stage] for c in cycles if c["stage_seconds"].get(stage)]
            row[stage] = round(statistics.median(xs), 1) if xs else None
        row["cycle"] = round(statistics.median([c["wall_s"] for c in cycles]), 1) if cycles else None
        measure = [c["wall_s"] for c in rep["cycles"] if c["run"] == "measure"]
        row["measure"] = measure[0] if measure else None
        row["total"] = round(sum(c["wall_s"] for c in rep["cycles"]), 1)
        out[arm] = row
    return out


# --- rendering ----------------------------------------------------------------------------------


def render_experiment(report: dict[str, Any]) -> str:
    """Each arm's report, then the experiment's tables and verdict, as plain text."""
    lines: list[str] = []
    w = lines.append
    start = report["start"] or {}
    w(
        f"Experiment: arms {', '.join(report['arms'])}; {report['cycles']} cycles x {report['episodes']} sessions; "
        f"seed {report['seed']}; start: {start.get('origin', '?')}; tasks {report['tasks']}"
    )
    if report["sets"]:
        w(f"  --set {' --set '.join(report['sets'])}")
    for arm, rep in report["arms"].items():
        w("")
        w(f"=== arm: {arm} ===")
        lines.append(render(rep))
    w("")
    w("=== the experiment: v0 and each arm's last version (95% CI; sessions are the clusters) ===")
    if report.get("paired"):
        pairs = ", ".join(f"{k} {n}" for k, n in report["paired"].items())
        w(f"  every version on the same measure sessions; differences paired by session (matched with v0: {pairs})")
    names = {m: SHOWN[m] for m in report["metric_names"]}
    if report["rows"]:
        lines += ab.metrics_lines(report["rows"], report["names"], names)
    if report["vs_v0"]:
        w("")
        w("Each arm's last version minus v0 (better/worse only where the CI excludes 0)")
        lines += ab.ab_lines(report["vs_v0"], report["names"], V0, names)
    if report["vs_control"]:
        w("")
        base = report["last"]["control"]
        w(f"Each arm's last version minus control's ({report['names'][base]})")
        lines += ab.ab_lines(report["vs_control"], report["names"], report["names"][base], names)
    w("")
    v = report["verdict"]
    w(f"Learned? {'YES' if v['learned'] else 'NO' if v['learned'] is False else 'n/a'}: {v['summary']}.")
    w("")
    w("Seconds per stage (median over the cycles that ran it; cached stages left out)")
    header = ["arm", *STAGES, "per cycle", "measure", "arm total"]
    rows = [
        [arm, *("-" if s.get(k) is None else f"{s[k]:.1f}" for k in (*STAGES, "cycle", "measure", "total"))]
        for arm, s in report["seconds"].items()
    ]
    lines += ab.text_table(header, rows)
    if report.get("wall_s") is not None:
        w(f"  wall time, all arms: {report['wall_s']:.0f} s")
    return "\n".join(lines)


# --- OUT/report: a run directory for `rlcycle report` -------------------------------------------


def write_report_dir(out: Path, record: dict[str, Any], report: dict[str, Any]) -> Path | None:
    """OUT/report/: every arm's trajectories (v0 once) under `v0` / `<arm>/<label>`, the pairs
    to compare (comparisons.json: each last version vs v0, each vs control's), the first
    distill's reward report (so the follow-ups are classified as in the text report), then
    `rlcycle report`'s HTML. With a paired report (a v0 measure run), only the measure runs'
    trajectories, and comparisons.json says `"paired": true`: the HTML's A/B table then pairs
    by session as the text report does. None when no arm has trajectories."""
    is_paired = bool(report.get("paired"))
    frames = _measure_frames(out, report["last"]) if is_paired else []
    for arm, rep in [] if is_paired else report["arms"].items():
        traj: pl.DataFrame = rep.get("_traj")
        if traj is None or traj.height == 0 or not rep["versions"]:
            continue
        names = {v["id"]: (V0 if v["label"] == V0 else f"{arm}/{v['label']}") for v in rep["versions"]}
        if frames:  # v0 once: its traffic is the same start on the same seeds in every arm
            traj = traj.filter(pl.col("policy_version") != rep["versions"][0]["id"])
        # ts null: each simulate run starts its simulated clock at the same instant, so the
        # online section orders the versions by first appearance (this concatenation's order).
        frames.append(
            traj.with_columns(
                pl.col("policy_version").replace_strict(names, default=None),
                pl.lit(None, pl.Datetime("ms", "UTC")).alias("ts"),
            ).drop("run")
        )
    if not frames:
        return None
    root = out / "report"
    (root / "collect").mkdir(parents=True, exist_ok=True)
    rio.write_table(pl.concat(frames, how="diagonal_relaxed").to_arrow(), root / "collect" / "trajectories.arrow")
    lasts = {arm: f"{arm}/{key[1]}" if key[1] != V0 else V0 for arm, key in report["last"].items()}
    pairs = [[V0, v] for v in lasts.values() if v != V0]
    if "control" in lasts:
        pairs += [[lasts["control"], v] for a, v in lasts.items() if a != "control"]
    doc: dict[str, Any] = {"pairs": pairs, **({"paired": True} if is_paired else {})}
    rio.atomic_write_text(root / "comparisons.json", json.dumps(doc, indent=2) + "\n")
    first_distill = next(
        (
            out / arm / c["name"] / "distill" / "reward_report.json"
            for arm, runs in record["arms"].items()
            for c in runs["cycles"]
            if (out / arm / c["name"] / "distill" / "reward_report.json").exists()
        ),
        None,
    )
    if first_distill is not None:
        (root / "distill").mkdir(exist_ok=True)
        shutil.copy2(first_distill, root / "distill" / "reward_report.json")
    from rlcycle.report import run as render_html

    render_html(root, root / "report.html")
    return root


def _measure_frames(out: Path, last: dict[str, tuple[str, str]]) -> list[pl.DataFrame]:
    """v0's measure trajectories, then each arm's last version's, labelled as in the text
    report (`v0`, `<arm>/<label>`), the hidden-test verdict the simulated user's."""
    # an arm that never deployed served v0 in its measure run: v0's own rows say that already
    runs = [(out / V0, V0)] + [(out / arm, f"{arm}/{key[1]}") for arm, key in last.items() if key[1] != V0]
    frames = []
    for root, name in runs:
        run = RunDir(root / paired.MEASURE)
        traj = with_user_verdict(run.table("trajectories", online.REQUIRED, online.OPTIONAL))
        frames.append(
            traj.with_columns(pl.lit(name).alias("policy_version"), pl.lit(None, pl.Datetime("ms", "UTC")).alias("ts"))
        )
    return frames
