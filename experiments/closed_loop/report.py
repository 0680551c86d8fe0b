"""One arm's report: from its run directories (experiments/closed_loop/run.py) to its tables.

In:  `OUT/<arm>/` (one run directory per cycle, `runs.json`: the arm's record) and the record.
Out: `build_report` -> the arm's report dict (cycles, policy versions, online metrics per
     version, the A/B table against v0, the verdict "did the policy improve, and why not");
     `render` -> its plain text; `as_json` -> a JSON-ready copy of any report dict. The
     experiment across arms is compare.py.

Run directories are read through rlcycle.report.load.RunDir (the reader `rlcycle report` uses),
checkpoints through the arm's registry (rlcycle.policy.registry.Registry).

The online metrics are rlcycle/online.py's, with the follow-up classifier of the first run whose
distill ran (rlcycle/report/metrics.py `run_scoring`, as `rlcycle report` does), so the numbers
of this table and of `rlcycle report` on the same run agree. Rows that only a simulation knows:
  hidden tests passed  the runner grades every session with the task's hidden tests, and the
                       simulated user (rlcycle.agent.user) writes a satisfied follow-up exactly
                       when they passed, a complaint when they failed (followup_rate 1, the
                       default: one verdict per session). The events carry no test column, so
                       the user's verdict is read back from the follow-up text as the optional
                       `tests_passed` column of rlcycle.online (tests/test_closed_loop.py checks
                       it against simulate's own pass count);
  dissatisfied (user's label)  the user's own complaint labels, scored by the same estimator,
                       to show what the classifier misses.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl

from experiments.closed_loop import text
from rlcycle import online, stats
from rlcycle.agent import user
from rlcycle.errors import RlcycleError
from rlcycle.report import ab
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.metrics import Scoring, run_scoring
from rlcycle.stats import Estimate

C = pl.col
ARM = "loop"  # the closed loop has one arm; rows are keyed (arm, version)
# name -> (label, unit); the first four are the online A/B metrics, then what explains them.
SHOWN = {
    "tests_pass_rate": ("hidden tests passed (sessions; the user's verdict)", "rate"),
    "edit_persistence": ("edit persistence (surviving/proposed lines)", "rate"),
    "dissatisfied_rate": ("dissatisfied follow-ups (classifier)", "rate"),
    "latency_ms": ("latency per model call (ms, wall clock)", "ms"),
    "invalid_per_sample": ("invalid tool calls per model call", "count"),
    "dissatisfied_truth": ("dissatisfied follow-ups (simulated user's label)", "rate"),
    "clarification_rate": ("clarifying questions (episodes that asked)", "rate"),
    "tokens_per_call": ("completion tokens per model call", "tokens"),
    "reward": ("mean reward per model call (the reward spec, as distill scored it)", "value"),
}
DIRECTIONS = {"dissatisfied_truth": -1, "reward": +1}
# Latency is wall clock per batched generate call: it moves with the batch size the lock-step
# scheduler happens to form and with the machine's load, and every version has the same
# architecture. It is shown, with tokens per call and the eval's ABBA-ordered latency ratio per
# cycle (the fair comparison), but not counted in the verdict (docs/closed_loop.md).
VERDICT_METRICS = ("tests_pass_rate", "edit_persistence", "dissatisfied_rate", "invalid_per_sample")
# What "the loop learned" is decided on: the hidden tests or edit persistence (issue #11); the
# reward itself for a run whose reward spec is not about them (tests/test_learning.py's).
LEARN_METRICS = ("tests_pass_rate", "edit_persistence", "reward")
COUNTS = ("sessions", "samples", "followups", "edits_with_outcome")


# --- the metrics ------------------------------------------------------------------------------


def loop_metrics(traj: pl.DataFrame, scoring: Scoring | None = None) -> dict[str, dict[str, Any]]:
    """{version: {metric: Estimate, "counts": {...}}} in version order, the simulated user's
    labels as `dissatisfied_truth`, and `counts["complaints_missed"]` (labelled complaints the
    classifier did not score < 0)."""
    scoring = scoring or Scoring()
    facts = online.episode_facts(traj, scoring.classifier(), scoring.clarify_tools, scoring.edit_tools)
    m = online.summarize(facts)
    truth = _user_labels(facts)
    t = online.summarize(truth)
    scored_neutral = pl.lit((facts.get_column("score") >= 0).fill_null(False))
    missed = truth.with_columns(missed=(C("score") < 0) & scored_neutral & ~C("asked"))
    out: dict[str, dict[str, Any]] = {}
    # Versions in the order they served (row order: the runs are concatenated in cycle order).
    # Not by first `ts`: every simulate run starts its simulated clock at the same time.
    served = [
        v for v in facts.sort("order").get_column("version").unique(maintain_order=True).to_list() if v in m.metrics
    ]
    for v in served:
        counts = m.counts[v] | {"complaints_missed": int(missed.filter(C("version") == v).get_column("missed").sum())}
        out[v] = {**m.metrics[v], "dissatisfied_truth": t.metrics[v]["dissatisfied_rate"], "counts": counts}
    return out


def with_user_verdict(traj: pl.DataFrame) -> pl.DataFrame:
    """`tests_passed` from the simulated user's follow-up: true for a satisfied text, false for
    a complaint, null otherwise (a clarification answer, no follow-up): the hidden tests'
    verdict, which the user's reaction follows exactly (module docstring). A table that has
    a non-null `tests_passed` column already keeps it."""
    if online.TESTS_COLUMN in traj.columns and traj.get_column(online.TESTS_COLUMN).null_count() < traj.height:
        return traj
    if "followup_text" not in traj.columns:
        return traj
    failed = sorted({*user.DISSATISFIED_FAILED, *user.DISSATISFIED_NOTHING})
    text = C("followup_text")
    verdict = pl.when(text.is_in(list(user.SATISFIED))).then(True).when(text.is_in(failed)).then(False).otherwise(None)
    return traj.with_columns(verdict.cast(pl.Boolean).alias(online.TESTS_COLUMN))


def _user_labels(facts: pl.DataFrame) -> pl.DataFrame:
    """The episode facts with each follow-up scored -1 when it is one of the simulated user's
    complaints (rlcycle.agent.user), else 0: what the classifier should have said."""
    complaints = sorted({*user.DISSATISFIED_FAILED, *user.DISSATISFIED_NOTHING})
    label = pl.when(C("followup").is_null()).then(None).when(C("followup").is_in(complaints)).then(-1.0).otherwise(0.0)
    return facts.with_columns(score=label)


def shown(metrics: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The SHOWN metrics that some version measured."""
    return {n: s for n, s in SHOWN.items() if any(n in m for m in metrics.values())}


def ab_cells(metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, ab.Cell]]:
    """Every later version minus the first, per shown metric: {version: {metric: Cell}}."""
    if not metrics:
        return {}
    rows = {(ARM, v): {k: e for k, e in m.items() if isinstance(e, Estimate)} for v, m in metrics.items()}
    first = next(iter(rows))
    cells = ab.ab_table(rows, first, list(shown(metrics)), DIRECTIONS)
    return {key[1]: row for key, row in cells.items()}


# --- from the run directories -----------------------------------------------------------------


def build_report(out: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """Everything the table shows, from the run directories (works on a finished OUT too)."""
    home = Path(runs["home"])
    frames, cycles, labels = [], [], {}

    def label(cid: str | None, origin: str) -> str | None:
        if cid and cid not in labels:
            labels[cid] = {"label": f"v{len(labels)}", "origin": origin}
        return labels[cid]["label"] if cid else None

    for c in runs["cycles"]:
        run = rundir(out / c["name"])
        base = run.run_info().get("base_id") if run is not None else None
        label(
            base,
            (runs.get("start") or {}).get("origin")
            or ("warm start" if runs.get("warm_start") else "tiny default model (random weights)"),
        )
        frame = table(run, "trajectories", online.REQUIRED, online.OPTIONAL)
        if frame is not None:
            frames.append(with_user_verdict(frame).with_columns(run=pl.lit(c["name"])))
        stages = {s["name"]: s for s in c.get("stages", [])}
        cycles.append(
            {
                "run": c["name"],
                "exit_code": c["exit_code"],
                "wall_s": c["wall_s"],
                "base": base,
                "base_label": labels.get(base, {}).get("label"),
                "samples": stages.get("collect", {}).get("result", {}).get("samples_out"),
                "train_steps": stages.get("train", {}).get("result", {}).get("steps"),
                "decision": c.get("decision"),
                "failed_gates": stages.get("eval", {}).get("result", {}).get("failed_gates", []),
                **_eval_summary(run),
                "mismatch": _step1_mismatch(run),
                "deployed": c.get("deployed"),
                "deployed_label": label(c.get("deployed"), f"deployed by {c['name']}"),
                "stage_seconds": {
                    s["name"]: round(s["seconds"], 1) for s in c.get("stages", []) if s.get("status") != "skipped"
                },
                "shared_traffic": c.get("shared_traffic", False),
            }
        )
    traj = (
        pl.concat(frames, how="diagonal_relaxed")
        if frames
        else pl.DataFrame(schema={"policy_version": pl.String, "run": pl.String})
    )
    metrics = loop_metrics(traj, _scoring(out, runs)) if frames else {}
    first = next(iter(metrics), None)
    versions = [
        {
            "id": v,
            "label": labels.get(v, {}).get("label", "?"),
            "origin": labels.get(v, {}).get("origin", "?"),
            "served_in": traj.filter(C("policy_version") == v).get_column("run").unique(maintain_order=True).to_list(),
            "weight_change": _weight_change(home, first, v),
        }
        for v in metrics
    ]
    for v, est in _rewards(out, runs).items():
        if v in metrics:
            metrics[v]["reward"] = est
    cells = ab_cells(metrics)
    return {
        "cycles": cycles,
        "versions": versions,
        "metrics": metrics,
        "ab": cells,
        "verdict": _overall(cycles, versions, metrics, cells),
        "runs": runs,
        "_traj": traj,
    }


def rundir(path: Path) -> RunDir | None:
    """The run directory at `path`, None when the cycle made none (it failed before)."""
    try:
        return RunDir(path)
    except RlcycleError:
        return None


def table(run: RunDir | None, name: str, columns: list[str], optional: tuple[str, ...] = ()) -> pl.DataFrame | None:
    """A run's named table (rlcycle.report.load.RUN_FILES), None when it is not there."""
    try:
        return run.table(name, columns, optional) if run is not None else None
    except Unavailable:
        return None


def _json(run: RunDir | None, name: str) -> dict[str, Any] | None:
    try:
        return run.json(name) if run is not None else None
    except Unavailable:
        return None


def _rewards(out: Path, runs: dict[str, Any]) -> dict[str, Estimate]:
    """Per policy version, the mean reward per sample of the runs' distill outputs (the measure
    run distills too, without the arm's switch), sessions as the clusters (rlcycle.stats)."""
    found = (
        table(rundir(out / c["name"]), "examples", ["session_id", "policy_version", "reward"]) for c in runs["cycles"]
    )
    frames = [f for f in found if f is not None]
    if not frames:
        return {}
    per = (
        pl.concat(frames)
        .group_by("policy_version", "session_id", maintain_order=True)
        .agg(y=C("reward").cast(pl.Float64).sum(), x=pl.len().cast(pl.Float64))
    )
    return {
        v: stats.ratio_estimate(g.get_column("y").to_numpy(), g.get_column("x").to_numpy())
        for (v,), g in per.partition_by("policy_version", as_dict=True, maintain_order=True).items()
    }


def _scoring(out: Path, runs: dict[str, Any]) -> Scoring:
    """The classifier of the first run whose distill ran (the built-in rules otherwise)."""
    for c in runs["cycles"]:
        run = rundir(out / c["name"])
        if _json(run, "reward_report") is not None:
            return run_scoring(run)
    return Scoring()


def _eval_summary(run: RunDir | None) -> dict[str, Any]:
    """The eval's pass@1 of candidate and baseline, and its ABBA-ordered latency ratio."""
    v = _json(run, "verdict")
    if v is None:
        return {"eval_pass": None, "eval_latency_ratio": None}
    m = v.get("metrics", {})
    ratio = next((g["value"] for g in v.get("gates", []) if g["name"] == "latency"), None)
    return {
        "eval_pass": {side: m.get(side, {}).get("pass@1") for side in ("candidate", "baseline")},
        "eval_latency_ratio": ratio,
    }


STEP1 = ("mismatch_kl", "ratio_min", "ratio_max", "seq_ratio_min", "seq_ratio_max", "is_frac", "clip_frac")


def _step1_mismatch(run: RunDir | None) -> dict[str, float] | None:
    """Step 1 of the cycle's train (weights still = the sampler's): how far the behaviour
    logprobs the server logged are from the trainer's own. `is_frac` is the share of tokens whose
    importance weight was truncated; `seq_ratio_*` the spread of e^Σlog r per sequence."""
    frame = table(run, "train_metrics", ["step"], STEP1)
    if frame is None or frame.is_empty():
        return None
    row = frame.sort("step").row(0, named=True)
    return {k: row[k] for k in STEP1 if row.get(k) is not None}


def _weight_change(home: Path, first: str | None, version: str) -> float | None:
    """||w - w_first|| / ||w_first|| over all parameters (None when a checkpoint is missing)."""
    from rlcycle.policy.registry import Registry

    if first is None or not (home / "registry").is_dir():
        return None
    reg = Registry(home / "registry")
    try:
        a, b = (reg.resolve(cid) / "model.safetensors" for cid in (first, version))
    except RlcycleError:
        return None
    if not (a.exists() and b.exists()):
        return None
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    diff = sum(float((wb[k].double() - wa[k].double()).pow(2).sum()) for k in wa)
    norm = sum(float(wa[k].double().pow(2).sum()) for k in wa)
    return math.sqrt(diff / norm) if norm else None


def _overall(cycles, versions, metrics, cells) -> dict[str, Any]:
    """Did the policy improve (last measured version vs the first), and the evidence why not."""
    if len(versions) < 2:
        return {"improved": False, "summary": "only one policy version was measured: nothing to compare", "reasons": []}
    first, last = versions[0], versions[-1]
    calls = {m: c.call for m, c in cells[last["id"]].items()}
    better = [SHOWN[m][0] for m in VERDICT_METRICS if calls.get(m) == "better"]
    worse = [SHOWN[m][0] for m in VERDICT_METRICS if calls.get(m) == "worse"]
    improved = bool(better) and not worse
    if improved:
        summary = f"{last['label']} improved on {first['label']}: {', '.join(better)} (95% CI excludes 0)"
    elif worse:
        summary = f"{last['label']} is worse than {first['label']} on {', '.join(worse)}" + (
            f" and better on {', '.join(better)}" if better else ""
        )
    else:
        summary = (
            f"no improvement detected: neither edit persistence, nor dissatisfied follow-ups, nor "
            f"invalid tool calls of {last['label']} differ from {first['label']} with 95% confidence"
        )
    reasons = _reasons(cycles, versions, metrics)
    if calls.get("latency_ms") in ("better", "worse"):
        lat = cells[last["id"]]["latency_ms"].diff.value
        tok = [metrics[v["id"]]["tokens_per_call"].value or 0.0 for v in (first, last)]
        ratios = [f"{c['eval_latency_ratio']:.2f}" for c in cycles if c.get("eval_latency_ratio") is not None]
        reasons.append(
            f"wall-clock latency per call moved by {lat:+.0f} ms while tokens per call went {tok[0]:.1f} -> "
            f"{tok[1]:.1f} on the same architecture: in simulate a call's latency is the wall time of the "
            "batched generate it ran in, so it follows the batch size (set by how sessions line up in the "
            "lock-step scheduler: one session taking an extra turn reshuffles every later batch) and the "
            "machine's load, not the model's speed; it is left out of the verdict"
            + (f" (the eval's ABBA-ordered candidate/baseline latency ratios: {', '.join(ratios)})" if ratios else "")
        )
    refused = [c["run"] for c in cycles if c["decision"] == "refuse"]
    if refused:
        reasons.append(f"the eval gate refused the candidate of {', '.join(refused)}: production stayed")
    return {"improved": improved, "summary": summary, "reasons": reasons, "calls": calls}


def _reasons(cycles, versions, metrics) -> list[str]:
    """Why the loop could not improve: no edits, no passing eval, tiny steps, a weak classifier."""
    reasons = []
    counts = [metrics[v["id"]]["counts"] for v in versions]
    if not any(c["edits_with_outcome"] for c in counts):
        reasons.append(
            "no version made an edit that applied, so edit persistence is undefined and "
            "every follow-up complains that nothing changed"
        )
    passes = [x for c in cycles for x in (c.get("eval_pass") or {}).values() if x is not None]
    if passes and not any(passes):
        reasons.append(
            "every eval scored pass@1 = 0 for candidate and baseline alike: nothing "
            "succeeded, so the rewards carry no signal about solving tasks, and the gate "
            "can only check that nothing regressed"
        )
    changes = [v["weight_change"] for v in versions[1:] if v["weight_change"] is not None]
    if changes:
        reasons.append(
            f"training moved the weights by at most {max(changes):.1e} (relative L2 distance "
            f"to {versions[0]['label']}): a few small steps per cycle"
        )
    missed = sum(c["complaints_missed"] for c in counts)
    complained = sum(int(metrics[v["id"]]["dissatisfied_truth"].num) for v in versions)
    if missed:
        reasons.append(
            f"the follow-up classifier scored {missed} of {complained} complaints of the "
            'simulated user as neutral (e.g. "you didn\'t change anything?"): its '
            "dissatisfied rate is far below the users' own, and the reward is noisier"
        )
    return reasons


# --- rendering ----------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    """The plain-text report: cycles, versions, online metrics, the A/B table, the verdict."""
    lines: list[str] = []
    w = lines.append
    w("Cycles (simulate -> collect -> distill -> train -> eval -> deploy, one run dir each)")
    rows = []
    for c in report["cycles"]:
        p = c.get("eval_pass") or {}
        ratio = c.get("eval_latency_ratio")
        rows.append(
            [
                c["run"],
                c["base_label"] or "?",
                str(c["samples"] or "-"),
                str(c["train_steps"] or "-"),
                f"{_pct(p.get('candidate'))} / {_pct(p.get('baseline'))}" if p else "-",
                f"{ratio:.2f}" if ratio is not None else "-",
                c["decision"] or "-",
                ", ".join(c["failed_gates"]) or "-",
                c["deployed_label"] or "-",
                f"{c['wall_s']:.0f}s",
            ]
        )
    lines += text.text_table(
        [
            "run",
            "served",
            "samples",
            "train steps",
            "eval pass@1 cand/base",
            "eval latency ratio",
            "decision",
            "failed gates",
            "deployed",
            "wall",
        ],
        rows,
    )
    steps = [(c["run"], c["mismatch"]) for c in report["cycles"] if c.get("mismatch")]
    if steps:
        w("")
        w("Serving vs trainer at step 1 of each cycle's train (the weights the samples came from)")
        lines += text.text_table(
            [
                "run",
                "mismatch KL",
                "token ratio min-max",
                "sequence ratio min-max",
                "IS-truncated share",
                "clipped share",
            ],
            [
                [
                    run,
                    _num(m.get("mismatch_kl")),
                    f"{_num(m.get('ratio_min'))}-{_num(m.get('ratio_max'))}",
                    f"{_num(m.get('seq_ratio_min'))}-{_num(m.get('seq_ratio_max'))}",
                    _num(m.get("is_frac")),
                    _num(m.get("clip_frac")),
                ]
                for run, m in steps
            ],
        )
    w("")
    w("Policy versions")
    for v in report["versions"]:
        change = "" if v["weight_change"] is None else f"; weights vs v0: {v['weight_change']:.1e} relative L2"
        w(f"  {v['label']:<4} {str(v['id'])[:23]}…  {v['origin']}; served in {', '.join(v['served_in'])}{change}")
    vs, metrics = report["versions"], report["metrics"]
    if not vs:
        return "\n".join(lines)
    names, labels = shown(metrics), {v["id"]: v["label"] for v in vs}
    w("")
    w("Online metrics per policy version (95% CI; simulated users; sessions are the clusters)")
    counts = [[f"  n {key.replace('_', ' ')}", *(str(metrics[v["id"]]["counts"][key]) for v in vs)] for key in COUNTS]
    lines += text.metrics_lines(metrics, labels, names, extra=counts)
    if report["ab"]:
        w("")
        w(f"A/B: each version minus {vs[0]['label']} (95% CI; better/worse only where the CI excludes 0)")
        lines += text.ab_lines(report["ab"], labels, vs[0]["label"], names)
    w("")
    v = report["verdict"]
    w(f"Improved? {'YES' if v['improved'] else 'NO'}: {v['summary']}.")
    for r in v["reasons"]:
        w(f"  - {r}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    """The report with every Estimate and Cell as a plain dict."""

    def conv(x: Any) -> Any:
        if isinstance(x, (Estimate, ab.Cell)):
            return conv(asdict(x))
        if isinstance(x, dict):
            return {
                ("/".join(k) if isinstance(k, tuple) else k): conv(v)
                for k, v in x.items()
                if not str(k).startswith("_")
            }
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return conv(report)
