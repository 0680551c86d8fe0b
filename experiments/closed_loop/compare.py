"""The experiment across arms: v0 and every arm's last version side by side, and "did it learn".

In:  `OUT` and its `runs.json` record (per arm the runs of run.py's `run_arm`).
Out: `build_experiment` -> a dict: each arm's own report (report.py `build_report`), the online
     metrics of v0 (the shared start) and of every arm's last version, each last version minus
     v0, every arm's last version minus control's, the verdict, and seconds per stage;
     `render_experiment` -> its plain text; `write_html` -> OUT/report.html, `rlcycle report`
     of the real run directories (the v0 run first, then each arm's measure run).

The verdict "did the loop learn" (issue #11): YES when treatment's last version beats v0 *and*
control's last version on the hidden-test pass rate or on edit persistence (LEARN_METRICS),
each with a 95% CI that excludes 0, and control's last version beats v0 on neither. Every
difference is rlcycle.stats.difference via rlcycle/report/ab.py (independent traffic: the
versions were measured on different sessions; sessions are the clusters), except with a v0
measure run (`OUT/v0/measure`, the start served on the measure traffic): then every row is its
version on the measure traffic alone, and each difference is paired by session. With held-out
runs (`OUT/<arm>/measure-heldout`, run.py --heldout) the same paired tables and verdict are made
a second time on the held-out tasks (`heldout` in the dict): a result that holds there is a skill,
not the training tasks learnt by heart.

Why paired: the measure runs of v0 and of every arm's last version use one traffic seed, so
their sessions carry the same `pair_key`s (rlcycle/agent/events.py: seed, task, attempt): the
same task, simulated user and sampling seeds; only the policy differs. A comparison on the same
sessions removes the task-to-task variance from the difference (a hard task is hard for both),
which is most of the variance of a pass rate over a mixed suite. The mean reward stays an
independent comparison (distill's samples are not re-keyed here).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import polars as pl

from experiments.closed_loop import text
from experiments.closed_loop.report import (
    DIRECTIONS,
    LEARN_METRICS,
    SHOWN,
    _rewards,
    _scoring,
    _user_labels,
    build_report,
    loop_metrics,
    render,
    rundir,
    shown,
    table,
    with_user_verdict,
)
from rlcycle import online
from rlcycle.report import ab
from rlcycle.report.metrics import Scoring
from rlcycle.stats import Estimate

C = pl.col
STAGES = ("simulate", "collect", "distill", "train", "eval", "deploy")
V0 = "v0"
MEASURE = "measure"
HELDOUT = "measure-heldout"  # run.py --heldout: the measure run on tasks no arm trained on
Measured = tuple[dict[str, Any], pl.DataFrame, pl.DataFrame]


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
        vs_v0 = {k: paired_cells(m[v0], m[k], metric_names, c) for k, c in vs_v0.items()}
        vs_control = {k: paired_cells(m[last["control"]], m[k], metric_names, c) for k, c in vs_control.items()}
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
        "heldout": heldout_block(out, record, last, metric_names, names) if pairing is not None else None,
        "seconds": stage_seconds(arms),
    }


def heldout_block(
    out: Path, record: dict[str, Any], last: dict[str, tuple[str, str]], metric_names: list[str], names: dict
) -> dict[str, Any] | None:
    """v0 and every arm's last version on the held-out tasks: rows, paired differences against
    v0 and control, the verdict; None when the experiment ran no held-out measure runs."""
    if not (record.get("v0") or {}).get("heldout") or any("heldout" not in record["arms"].get(arm, {}) for arm in last):
        return None
    view = {
        **record,
        "v0": _heldout_view(record["v0"]),
        "arms": {arm: _heldout_view(runs) for arm, runs in record["arms"].items()},
    }
    pairing = _paired_rows(out, view, {}, last, HELDOUT)
    if pairing is None:
        return None
    rows, m, v0 = pairing["rows"], pairing["measured"], (V0, V0)
    vs_v0 = ab.ab_table(rows, v0, metric_names, DIRECTIONS)
    vs_v0 = {k: paired_cells(m[v0], m[k], metric_names, c) for k, c in vs_v0.items() if k in last.values()}
    vs_control: dict[Any, dict[str, ab.Cell]] = {}
    if "control" in last and len(last) > 1:
        base = last["control"]
        pair = {base: rows[base], **{k: rows[k] for a, k in last.items() if a != "control"}}
        cells = ab.ab_table(pair, base, metric_names, DIRECTIONS)
        vs_control = {k: paired_cells(m[base], m[k], metric_names, c) for k, c in cells.items()}
    return {
        "tasks": record.get("heldout"),
        "rows": rows,
        "names": {v0: V0, **{k: names[k] for k in last.values()}},
        "vs_v0": vs_v0,
        "vs_control": vs_control,
        "paired": pairing["matched"],
        "verdict": verdict(last, vs_v0, vs_control),
    }


def _heldout_view(runs: dict[str, Any]) -> dict[str, Any]:
    """An arm's runs as `_paired_rows` reads them, with the held-out run as its only run."""
    return {**runs, "cycles": [runs["heldout"]] if "heldout" in runs else []}


def _paired_rows(
    out: Path, record: dict[str, Any], arms: dict[str, Any], last: dict[str, tuple[str, str]], name: str = MEASURE
) -> dict[str, Any] | None:
    """With a v0 measure run (OUT/v0/measure), every row from the measure traffic alone and the
    facts to pair them by session (`measured_run`); None without one, or when an
    arm's last version has no measure run."""
    if not record.get("v0") or not last:
        return None
    first_arm = next(iter(record["arms"]))
    scoring = _scoring(out / first_arm, record["arms"][first_arm])
    m0 = measured_run(out / V0, record["v0"], scoring, name)
    measured = {
        (V0, V0): m0,
        **{key: measured_run(out / arm, record["arms"][arm], scoring, name) for arm, key in last.items()},
    }
    if any(m is None for m in measured.values()):
        return None
    rows: dict[tuple[str, str], dict[str, Estimate]] = {}
    for (arm, label), m in measured.items():
        runs = record["v0"] if arm == V0 else record["arms"][arm]
        row = _estimates(m[0])
        reward = _rewards(out / arm, {"cycles": [c for c in runs["cycles"] if c["name"] == name]})
        if reward:  # the measure run's distill: one version
            row["reward"] = next(iter(reward.values()))
        rows[(arm, label)] = row
    matched = {f"{k[0]} {k[1]}": matched_sessions(m0, m) for k, m in measured.items() if k != (V0, V0)}
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
        lines += text.metrics_lines(report["rows"], report["names"], names)
    if report["vs_v0"]:
        w("")
        w("Each arm's last version minus v0 (better/worse only where the CI excludes 0)")
        lines += text.ab_lines(report["vs_v0"], report["names"], V0, names)
    if report["vs_control"]:
        w("")
        base = report["last"]["control"]
        w(f"Each arm's last version minus control's ({report['names'][base]})")
        lines += text.ab_lines(report["vs_control"], report["names"], report["names"][base], names)
    w("")
    v = report["verdict"]
    w(f"Learned? {'YES' if v['learned'] else 'NO' if v['learned'] is False else 'n/a'}: {v['summary']}.")
    if report.get("heldout"):
        lines += _heldout_lines(report["heldout"], names)
    w("")
    w("Seconds per stage (median over the cycles that ran it; cached stages left out)")
    header = ["arm", *STAGES, "per cycle", "measure", "arm total"]
    rows = [
        [arm, *("-" if s.get(k) is None else f"{s[k]:.1f}" for k in (*STAGES, "cycle", "measure", "total"))]
        for arm, s in report["seconds"].items()
    ]
    lines += text.text_table(header, rows)
    if report.get("wall_s") is not None:
        w(f"  wall time, all arms: {report['wall_s']:.0f} s")
    if report.get("html"):
        w("")
        w(f"HTML: {report['html']['report']} ({report['html']['command']})")
    return "\n".join(lines)


def _heldout_lines(h: dict[str, Any], names: dict[str, Any]) -> list[str]:
    """The held-out block as text: the same tables and verdict on tasks no arm trained on."""
    lines = ["", f"=== held-out tasks ({h['tasks']}): v0 and each arm's last version, no arm trained on them ==="]
    pairs = ", ".join(f"{k} {n}" for k, n in h["paired"].items())
    lines.append(
        f"  every version on the same held-out sessions; differences paired by session (matched with v0: {pairs})"
    )
    lines += text.metrics_lines(h["rows"], h["names"], names)
    if h["vs_v0"]:
        lines += ["", "Held-out: each arm's last version minus v0"]
        lines += text.ab_lines(h["vs_v0"], h["names"], V0, names)
    if h["vs_control"]:
        base = next(k for k in h["names"] if k[0] == "control")
        lines += ["", f"Held-out: each arm's last version minus control's ({h['names'][base]})"]
        lines += text.ab_lines(h["vs_control"], h["names"], h["names"][base], names)
    v = h["verdict"]
    lines += [
        "",
        f"Learned on held-out tasks? {'YES' if v['learned'] else 'NO' if v['learned'] is False else 'n/a'}: {v['summary']}.",
    ]
    return lines


# --- paired by session ---------------------------------------------------------------------------


def measured_run(out: Path, runs: dict[str, Any], scoring: Scoring, name: str = MEASURE) -> Measured | None:
    """(metrics of the one version its measure run `name` served, its episode facts and its
    user-label facts, both keyed by pair key), None when the run has no trajectories."""
    if not any(c["name"] == name for c in runs["cycles"]):
        return None
    traj = table(rundir(out / name), "trajectories", online.REQUIRED, online.OPTIONAL)
    if traj is None:
        return None
    traj = with_user_verdict(traj)
    metrics = loop_metrics(traj, scoring)
    if len(metrics) != 1:
        return None  # a measure run serves one version; anything else is not a measure run
    facts = online.episode_facts(
        traj, scoring.classifier(), scoring.clarify_tools, scoring.edit_tools, session_column=online.PAIR_COLUMN
    )
    return next(iter(metrics.values())), facts, _user_labels(facts)


def paired_cells(a: Measured, b: Measured, names: list[str], independent: dict[str, ab.Cell]) -> dict[str, ab.Cell]:
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


def matched_sessions(a: Measured, b: Measured) -> int:
    """How many sessions both versions served (the pairs behind every paired cell)."""
    return online.paired_differences(a[1], b[1])[1]


# --- OUT/report.html: `rlcycle report` of the real run directories --------------------------------


def html_runs(out: Path, record: dict[str, Any], report: dict[str, Any]) -> list[Path]:
    """The run directories OUT/report.html draws: the run that served v0 first (OUT/v0/measure,
    else the first arm's cycle-1), then each arm's measure run (else its last cycle) whose
    version is not v0's."""
    arms = report["arms"]
    if not arms or not any(rep["versions"] for rep in arms.values()):
        return []
    first_arm = next(iter(arms))
    runs = [out / V0 / MEASURE] if report.get("paired") else [out / first_arm / "cycle-1"]
    for arm, rep in arms.items():
        if len(rep["versions"]) < 2 or arm not in report["last"]:
            continue  # never deployed: its measure run served v0, which the first run shows
        names = [c["name"] for c in record["arms"][arm]["cycles"]]
        runs.append(out / arm / (MEASURE if MEASURE in names else names[-1]))
    return [r for r in runs if rundir(r) is not None]


def write_html(out: Path, record: dict[str, Any], report: dict[str, Any]) -> dict[str, Any] | None:
    """OUT/report.html: `rlcycle report FIRST MORE... -o OUT/report.html` of `html_runs` (the
    online section compares each arm's last version with v0, paired by session where they
    served the same sessions); the command and its result, None without trajectories."""
    from rlcycle import report as rlcycle_report

    runs = html_runs(out, record, report)
    if not runs:
        return None
    result = rlcycle_report.run(runs[0], out / "report.html", runs[1:])
    return {"command": "rlcycle report " + " ".join(map(str, runs)) + f" -o {out / 'report.html'}", **result.as_dict()}
