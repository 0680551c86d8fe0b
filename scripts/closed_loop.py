"""Closed loop: `rlcycle cycle` N times in a row on simulated users, then the online A/B table.

What it does (issue #8, item 4):
  1. a fresh RLCYCLE_HOME (`OUT/home` unless `--home`): the first cycle finds no `production`
     model and bootstraps the tiny default model (random weights). `--warm-start` first makes a
     warm-started model (`rlcycle init-model --warm-start SUITE`, ~4 min on 2 cores) and
     registers it as `production` instead;
  2. cycle k runs in its own run directory `OUT/cycle-k` with `source = "simulate"`: simulate
     (the current `production` policy on the task suite, with the simulated user) -> collect ->
     distill -> train -> eval -> deploy. So cycle k's events are sampled from the checkpoint
     cycle k-1 deployed: on-policy data. The simulate seed is k, so every cycle sees fresh
     "traffic"; with `--episodes` a multiple of the suite size, every version sees the same
     task mix. A refused candidate (exit 3) leaves `production` as it was: the next cycle
     measures the same version again, on new traffic;
  3. `OUT/measure` (`rlcycle cycle --until collect`, seed N+1) measures the version the last
     cycle deployed, which no cycle has served yet (`--no-measure` skips it);
  4. the online metrics per policy version, read from every run's `trajectories.arrow`, each
     with a 95% confidence interval, the differences to the first version (the A/B table), each
     cycle's eval decision, and a plain statement whether the policy improved, and why not.

    .venv/bin/python scripts/closed_loop.py                          # 3 cycles, ~8 min, 2 cores
    .venv/bin/python scripts/closed_loop.py --cycles 5 --episodes 84 --out runs/closed_loop5
    .venv/bin/python scripts/closed_loop.py --warm-start --out runs/closed_loop_warm
    .venv/bin/python scripts/closed_loop.py --out runs/closed_loop --report-only --json
    .venv/bin/python scripts/closed_loop.py --set train.lr=1e-4 --set eval.max_tasks=20

The metrics, per policy version (what a production A/B test reads; docs/closed_loop.md):
  edit persistence        lines surviving / lines proposed, over the edits whose outcome arrived
  dissatisfied follow-ups episodes whose follow-up the distill classifier
                          (rlcycle.distill.followup, built-in rules) scores < 0 / episodes with
                          a follow-up, leaving out episodes that asked a clarifying question
                          (their follow-up is an answer, not a verdict; as distill does)
  latency                 mean `latency_ms` per model call (wall clock: load-sensitive)
  invalid tool calls      invalid calls / model calls (samples)
Intervals: the three ratios use the delta method with sessions as clusters (the samples of one
session are not independent); the follow-up rate is a Wilson interval over episodes. A
difference between two versions (independent traffic) is normal with the two standard errors
combined, or Newcombe's hybrid score interval for the follow-up rate. Only the simulator knows
whether a follow-up *is* a complaint: a second row counts the simulated user's own labels
(rlcycle.agent.user), to show what the classifier misses.

Output: the report on stdout (`--json`: one JSON object), progress on stderr; `OUT/report.json`
and `OUT/report.txt` are written too. Exit 0 when every cycle finished with a decision (accept
or refuse), 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import polars as pl
import tomllib

REPO = Path(__file__).resolve().parent.parent
Z95 = NormalDist().inv_cdf(0.975)
COLUMNS = ["session_id", "episode_id", "policy_version", "latency_ms", "n_invalid_tool_calls",
           "edit_lines_proposed", "edit_lines_surviving", "followup_text", "tool_calls", "completion_ids"]  # fmt: skip

# The cycle config the script writes (tables of CycleConfig); `--set table.key=value` edits it.
# Sized for ~8 minutes on 2 busy cores with the tiny model: one session per task, short
# completions, one pass of training over the collected samples, the cycle's quick eval.
DEFAULTS: dict[str, dict[str, Any]] = {
    "simulate": {"max_new_tokens": 48, "max_turns": 3, "sandboxes": 4},
    "train": {"batch_size": 16, "epochs": 1, "lr": 1e-5, "max_policy_lag": -1, "save_every": 1},
    "eval": {"attempts": 1, "max_tasks": 12, "max_new_tokens": 48, "max_turns": 3, "sandboxes": 2,
             "min_paired_tasks": 5},
}  # fmt: skip
WARM_DEFAULTS = {"simulate.max_new_tokens": 160, "eval.max_new_tokens": 160}  # a tool call is ~50-150 tokens


# --- statistics -------------------------------------------------------------------------------


@dataclass
class Estimate:
    """A metric of one version: value with a 95% CI, the totals behind it, and its kind."""

    value: float | None  # None: nothing to measure (e.g. no edit outcome arrived)
    lo: float | None  # None: no interval (fewer than two units)
    hi: float | None
    num: float  # numerator total (lines surviving, complaints, ms, invalid calls)
    den: float  # denominator total (lines proposed, follow-ups, model calls)
    units: int  # independent units behind the interval: sessions, or episodes (proportion)
    se: float | None = None  # standard error (ratio estimates)
    kind: str = "ratio"  # ratio (delta method, clustered) or proportion (Wilson)


def ratio_estimate(y: list[float], n: list[float], upper: float | None = None) -> Estimate:
    """sum(y) / sum(n) over clusters with n > 0, with a cluster-robust delta-method 95% CI.

    Var(R) = k/(k-1) * sum_i (y_i - R n_i)^2 / (sum n)^2 over the k clusters: the usual
    linearisation of a ratio of sums (e.g. Cochran, Sampling Techniques, 6.9), which counts a
    session's correlated samples once. The interval is clipped to [0, upper]."""
    pairs = [(a, b) for a, b in zip(y, n, strict=True) if b > 0]
    total_y, total_n, k = sum(a for a, _ in pairs), sum(b for _, b in pairs), len(pairs)
    if k == 0:
        return Estimate(None, None, None, total_y, total_n, 0)
    r = total_y / total_n
    if k == 1:
        return Estimate(r, None, None, total_y, total_n, 1)
    se = math.sqrt(k / (k - 1) * sum((a - r * b) ** 2 for a, b in pairs)) / total_n
    lo, hi = max(0.0, r - Z95 * se), r + Z95 * se
    return Estimate(r, lo, min(hi, upper) if upper is not None else hi, total_y, total_n, k, se)


def wilson(k: int, n: int) -> Estimate:
    """k of n with the Wilson score 95% interval (sane at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return Estimate(None, None, None, k, n, 0, kind="proportion")
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), k, n, n, kind="proportion")


def difference(a: Estimate, b: Estimate) -> Estimate:
    """b - a (b: the later version) with a 95% CI, the two versions' traffic independent."""
    if a.value is None or b.value is None:
        return Estimate(None, None, None, 0, 0, 0, kind=a.kind)
    d = b.value - a.value
    if a.kind == "proportion":  # Newcombe (1998), method 10: from the two Wilson intervals
        lo = d - math.sqrt((b.value - b.lo) ** 2 + (a.hi - a.value) ** 2)
        hi = d + math.sqrt((b.hi - b.value) ** 2 + (a.value - a.lo) ** 2)
        return Estimate(d, lo, hi, 0, 0, a.units + b.units, kind="proportion")
    if a.se is None or b.se is None:
        return Estimate(d, None, None, 0, 0, a.units + b.units)
    se = math.sqrt(a.se**2 + b.se**2)
    return Estimate(d, d - Z95 * se, d + Z95 * se, 0, 0, a.units + b.units, se)


# --- the metrics ------------------------------------------------------------------------------

# name -> (label, +1 when higher is better / -1 when lower is better / 0 neither, unit)
METRICS = {
    "edit_persistence": ("edit persistence (surviving/proposed lines)", +1, "%"),
    "dissatisfied_rate": ("dissatisfied follow-ups (classifier)", -1, "%"),
    "latency_ms": ("latency per model call (ms, wall clock)", -1, "ms"),
    "invalid_per_sample": ("invalid tool calls per model call", -1, ""),
}
# Shown beside them: what only a simulation knows, and what explains latency.
EXTRA = {
    "dissatisfied_truth": ("dissatisfied follow-ups (simulated user's label)", -1, "%"),
    "tokens_per_call": ("completion tokens per model call", 0, "1"),
}
ALL = {**METRICS, **EXTRA}
# Latency is wall clock per batched generate call: it moves with the batch size the lock-step
# scheduler happens to form and with the machine's load, and every version has the same
# architecture. It is shown, with tokens per call and the eval's ABBA-ordered latency ratio per
# cycle (the fair comparison), but not counted in the verdict (docs/closed_loop.md).
VERDICT_METRICS = ("edit_persistence", "dissatisfied_rate", "invalid_per_sample")


def online_metrics(traj: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """The online metrics of every policy version in `traj` (trajectories rows), in the order
    versions first appear: {version: {metric: Estimate, "counts": {...}}}."""
    from rlcycle.agent import user
    from rlcycle.distill.followup import score_texts

    complaints = set(user.DISSATISFIED_FAILED) | set(user.DISSATISFIED_NOTHING)
    out: dict[str, dict[str, Any]] = {}
    for version in traj.get_column("policy_version").unique(maintain_order=True).to_list():
        rows = traj.filter(pl.col("policy_version").eq_missing(version))
        sessions = rows.group_by("session_id", maintain_order=True).agg(
            samples=pl.len(),
            timed=pl.col("latency_ms").is_not_null().sum(),
            latency=pl.col("latency_ms").sum(),
            invalid=pl.col("n_invalid_tool_calls").fill_null(0).sum(),
            tokens=pl.col("completion_ids").list.len().sum(),
            # an edit counts once its outcome arrived (both numbers present)
            proposed=pl.col("edit_lines_proposed").filter(pl.col("edit_lines_surviving").is_not_null()).sum(),
            surviving=pl.col("edit_lines_surviving").filter(pl.col("edit_lines_proposed").is_not_null()).sum(),
        )  # fmt: skip
        episodes = _episodes(rows)
        eligible = episodes.filter(pl.col("followup").is_not_null() & ~pl.col("asked"))
        scores = score_texts(eligible.get_column("followup"), None)
        said = eligible.get_column("followup").is_in(sorted(complaints))
        col = sessions.get_column
        out[version] = {
            "edit_persistence": ratio_estimate(col("surviving").to_list(), col("proposed").to_list(), upper=1.0),
            "dissatisfied_rate": wilson(int((scores < 0).sum()), eligible.height),
            "latency_ms": ratio_estimate(col("latency").to_list(), col("timed").to_list()),
            "invalid_per_sample": ratio_estimate(col("invalid").to_list(), col("samples").to_list()),
            "dissatisfied_truth": wilson(int(said.sum()), eligible.height),
            "tokens_per_call": ratio_estimate(col("tokens").to_list(), col("samples").to_list()),
            "counts": {"sessions": sessions.height, "episodes": episodes.height, "samples": rows.height,
                       "followups": eligible.height, "asked": int(episodes.get_column("asked").sum()),
                       "edits_with_outcome": int((col("proposed") > 0).sum()),
                       "complaints_missed": int((said & (scores >= 0)).sum())},
        }  # fmt: skip
    return out


def _episodes(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per episode: its follow-up (the first non-null), and whether it asked a question
    (an `ask_user` call whose result was ok or never logged, as distill counts it)."""
    call = pl.element().struct
    asked = (call.field("name") == "ask_user") & (call.field("status").is_null() | (call.field("status") == "ok"))
    return rows.select(
        "episode_id", "followup_text",
        pl.col("tool_calls").list.eval(asked.fill_null(False)).list.any().fill_null(False).alias("asked"),
    ).group_by("episode_id", maintain_order=True).agg(
        followup=pl.col("followup_text").drop_nulls().first(),
        asked=pl.col("asked").any(),
    )  # fmt: skip


def ab_table(metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every later version vs the first: {version: {metric: {"diff": Estimate, "call": ...}}}.
    call: better / worse (the 95% CI excludes 0, signed by the metric's direction) / no change
    detected / n/a."""
    versions = list(metrics)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for v in versions[1:]:
        out[v] = {}
        for name, (_, sign, _) in ALL.items():
            d = difference(metrics[versions[0]][name], metrics[v][name])
            out[v][name] = {"diff": d, "call": _call(d, sign)}
    return out


def _call(d: Estimate, sign: int) -> str:
    if d.value is None or d.lo is None:
        return "n/a"
    if d.lo > 0 or d.hi < 0:
        return "changed" if sign == 0 else "better" if (d.value > 0) == (sign > 0) else "worse"
    return "no change detected"


# --- running the cycles -----------------------------------------------------------------------


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`table.key=value` -> {"table.key": value}; the value is read as TOML (1e-4, true, "x")."""
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--set {item!r}: expected table.key=value, e.g. train.lr=1e-4")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def cycle_toml(seed: int, episodes: int, tasks: str, overrides: dict[str, Any]) -> str:
    """The cycle config of one run: DEFAULTS, the seed and episode count, then the overrides."""
    tables = {name: dict(t) for name, t in DEFAULTS.items()}
    tables["simulate"].update(episodes=episodes, seed=seed)
    for key, value in overrides.items():
        table, _, name = key.partition(".")
        tables.setdefault(table, {})[name] = value
    lines = ["[cycle]", 'source = "simulate"', f"tasks = {_toml(tasks)}"]
    for table, values in tables.items():
        lines += ["", f"[cycle.{table}]", *(f"{k} = {_toml(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


def rlcycle(args: list[str], env: dict[str, str], quiet: bool) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (the venv's interpreter); its progress goes to our stderr."""
    return subprocess.run([sys.executable, "-m", "rlcycle", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL if quiet else None, text=True)  # fmt: skip


def warm_start(home: Path, tasks: str, env: dict[str, str], quiet: bool) -> dict[str, Any]:
    """A warm-started model registered as `production` (skipped when production exists)."""
    if (home / "registry" / "state.json").exists() and '"production"' in (home / "registry" / "state.json").read_text():
        return {"skipped": "production exists"}
    out = home / "models" / "warm-start"
    started = time.monotonic()
    r = rlcycle(["init-model", "-o", str(out), "--warm-start", tasks, "--force", "--json"], env, quiet)
    if r.returncode:
        raise SystemExit(f"init-model --warm-start failed (exit {r.returncode})")
    info = json.loads(r.stdout)
    if rlcycle(["registry", "add", str(out), "--alias", "production"], env, quiet).returncode:
        raise SystemExit("registry add failed")
    info["seconds_total"] = round(time.monotonic() - started, 1)
    return info


def run_loop(args: argparse.Namespace, out: Path, home: Path) -> dict[str, Any]:
    env = dict(os.environ, RLCYCLE_HOME=str(home))
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models on busy cores: many times faster (docs/simulate.md)
    overrides = {**(WARM_DEFAULTS if args.warm_start else {}), **parse_sets(args.set or [])}
    runs: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cycles": [], "home": str(home)}
    if args.warm_start:
        _log(args, "warm start: init-model --warm-start (minutes on CPU)")
        runs["warm_start"] = warm_start(home, args.tasks, env, args.quiet)
    plan = [(f"cycle-{k}", k, []) for k in range(1, args.cycles + 1)]
    if not args.no_measure:
        plan.append(("measure", args.cycles + 1, ["--until", "collect"]))
    for name, seed, extra in plan:
        toml = out / f"{name}.toml"
        toml.write_text(cycle_toml(seed, args.episodes, args.tasks, overrides))
        _log(args, f"{name}: rlcycle cycle --config {toml} --run-dir {out / name}")
        started = time.monotonic()
        r = rlcycle(["cycle", "--config", str(toml), "--run-dir", str(out / name), "--json", *extra,
                     *(["-q"] if args.quiet else [])], env, args.quiet)  # fmt: skip
        try:
            result = json.loads(r.stdout)
        except json.JSONDecodeError:
            result = {"decision": None, "stages": []}
        result.update(name=name, seed=seed, exit_code=r.returncode, wall_s=round(time.monotonic() - started, 1))
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        runs["cycles"].append(result)
        if r.returncode not in (0, 3):  # 3: the gate refused; production stays, the loop goes on
            _log(args, f"{name}: failed (exit {r.returncode}); stopping")
            break
    (out / "runs.json").write_text(json.dumps(runs, indent=2) + "\n")
    return runs


# --- the report -------------------------------------------------------------------------------


def build_report(out: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """Everything the table shows, from the run directories (works on a finished OUT too)."""
    home = Path(runs["home"])
    frames, cycles, labels = [], [], {}

    def label(cid: str | None, origin: str) -> str | None:
        if cid and cid not in labels:
            labels[cid] = {"label": f"v{len(labels)}", "origin": origin}
        return labels[cid]["label"] if cid else None

    for c in runs["cycles"]:
        run = out / c["name"]
        base = json.loads((run / "run.json").read_text())["base_id"] if (run / "run.json").exists() else None
        label(base, "warm start" if runs.get("warm_start") else "tiny default model (random weights)")
        traj = run / "collect" / "trajectories.arrow"
        if traj.exists():
            frames.append(pl.read_ipc(traj, columns=COLUMNS).with_columns(run=pl.lit(c["name"])))
        stages = {s["name"]: s for s in c.get("stages", [])}
        cycles.append({
            "run": c["name"], "exit_code": c["exit_code"], "wall_s": c["wall_s"],
            "base": base, "base_label": labels.get(base, {}).get("label"),
            "samples": stages.get("collect", {}).get("result", {}).get("samples_out"),
            "train_steps": stages.get("train", {}).get("result", {}).get("steps"),
            "decision": c.get("decision"), "failed_gates": stages.get("eval", {}).get("result", {}).get("failed_gates", []),
            **_eval_summary(run), "deployed": c.get("deployed"),
            "deployed_label": label(c.get("deployed"), f"deployed by {c['name']}"),
            "stage_seconds": {s["name"]: round(s["seconds"], 1) for s in c.get("stages", [])},
        })  # fmt: skip
    empty = pl.DataFrame(schema={"policy_version": pl.String})
    traj = pl.concat(frames, how="vertical_relaxed") if frames else empty
    metrics = online_metrics(traj) if frames else {}
    first = next(iter(metrics), None)
    versions = [{"id": v, "label": labels.get(v, {}).get("label", "?"), "origin": labels.get(v, {}).get("origin", "?"),
                 "served_in": traj.filter(pl.col("policy_version") == v).get_column("run").unique(maintain_order=True).to_list(),
                 "weight_change": _weight_change(home, first, v)}
                for v in metrics]  # fmt: skip
    ab = ab_table(metrics)
    return {"cycles": cycles, "versions": versions, "metrics": metrics, "ab": ab,
            "verdict": _overall(cycles, versions, metrics, ab), "runs": runs}  # fmt: skip


def _eval_summary(run: Path) -> dict[str, Any]:
    """The eval's pass@1 of candidate and baseline, and its ABBA-ordered latency ratio."""
    path = run / "eval" / "verdict.json"
    if not path.exists():
        return {"eval_pass": None, "eval_latency_ratio": None}
    v = json.loads(path.read_text())
    m = v.get("metrics", {})
    ratio = next((g["value"] for g in v.get("gates", []) if g["name"] == "latency"), None)
    return {"eval_pass": {side: m.get(side, {}).get("pass@1") for side in ("candidate", "baseline")},
            "eval_latency_ratio": ratio}  # fmt: skip


def _weight_change(home: Path, first: str | None, version: str) -> float | None:
    """||w - w_first|| / ||w_first|| over all parameters (None when a checkpoint is missing)."""
    ckpts = home / "registry" / "checkpoints"
    a, b = ckpts / str(first) / "model.safetensors", ckpts / str(version) / "model.safetensors"
    if not (a.exists() and b.exists()):
        return None
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    diff = sum(float((wb[k].double() - wa[k].double()).pow(2).sum()) for k in wa)
    norm = sum(float(wa[k].double().pow(2).sum()) for k in wa)
    return math.sqrt(diff / norm) if norm else None


def _overall(cycles, versions, metrics, ab) -> dict[str, Any]:
    """Did the policy improve (last measured version vs the first), and the evidence why not."""
    if len(versions) < 2:
        return {"improved": False, "summary": "only one policy version was measured: nothing to compare", "reasons": []}
    first, last = versions[0], versions[-1]
    calls = {m: ab[last["id"]][m]["call"] for m in ALL}
    better = [METRICS[m][0] for m in VERDICT_METRICS if calls[m] == "better"]
    worse = [METRICS[m][0] for m in VERDICT_METRICS if calls[m] == "worse"]
    improved = bool(better) and not worse
    if improved:
        summary = f"{last['label']} improved on {first['label']}: {', '.join(better)} (95% CI excludes 0)"
    elif worse:
        summary = f"{last['label']} is worse than {first['label']} on {', '.join(worse)}" + (
            f" and better on {', '.join(better)}" if better else "")
    else:
        summary = (f"no improvement detected: neither edit persistence, nor dissatisfied follow-ups, nor "
                   f"invalid tool calls of {last['label']} differ from {first['label']} with 95% confidence")  # fmt: skip
    reasons = []
    counts = [metrics[v["id"]]["counts"] for v in versions]
    if not any(c["edits_with_outcome"] for c in counts):
        reasons.append("no version made an edit that applied, so edit persistence is undefined and "
                       "every follow-up complains that nothing changed")  # fmt: skip
    passes = [x for c in cycles for x in (c.get("eval_pass") or {}).values() if x is not None]
    if passes and not any(passes):
        reasons.append("every eval scored pass@1 = 0 for candidate and baseline alike: nothing "
                       "succeeded, so the rewards carry no signal about solving tasks, and the gate "
                       "can only check that nothing regressed")  # fmt: skip
    changes = [v["weight_change"] for v in versions[1:] if v["weight_change"] is not None]
    if changes:
        reasons.append(f"training moved the weights by at most {max(changes):.1e} (relative L2 distance "
                       f"to {first['label']}): a few small steps per cycle")  # fmt: skip
    missed = sum(c["complaints_missed"] for c in counts)
    complained = sum(int(metrics[v["id"]]["dissatisfied_truth"].num) for v in versions)
    if missed:
        reasons.append(f"the follow-up classifier scored {missed} of {complained} complaints of the "
                       "simulated user as neutral (e.g. \"you didn't change anything?\"): its "
                       "dissatisfied rate is far below the users' own, and the reward is noisier")  # fmt: skip
    if calls["latency_ms"] in ("better", "worse"):
        lat = ab[last["id"]]["latency_ms"]["diff"].value
        tok = [metrics[v["id"]]["tokens_per_call"].value for v in (first, last)]
        ratios = [f"{c['eval_latency_ratio']:.2f}" for c in cycles if c.get("eval_latency_ratio") is not None]
        reasons.append(
            f"wall-clock latency per call moved by {lat:+.0f} ms while tokens per call went {tok[0]:.1f} -> "
            f"{tok[1]:.1f} on the same architecture: in simulate a call's latency is the wall time of the "
            "batched generate it ran in, so it follows the batch size (set by how sessions line up in the "
            "lock-step scheduler: one session taking an extra turn reshuffles every later batch) and the "
            "machine's load, not the model's speed; it is left out of the verdict"
            + (f" (the eval's ABBA-ordered candidate/baseline latency ratios: {', '.join(ratios)})" if ratios else ""))  # fmt: skip
    refused = [c["run"] for c in cycles if c["decision"] == "refuse"]
    if refused:
        reasons.append(f"the eval gate refused the candidate of {', '.join(refused)}: production stayed")
    return {"improved": improved, "summary": summary, "reasons": reasons, "calls": calls}


# --- rendering ----------------------------------------------------------------------------------


def _fmt(e: Estimate, unit: str, signed: bool = False) -> str:
    if e.value is None:
        return "n/a"
    scale, digits, suffix = {"%": (100.0, 1, "%"), "ms": (1.0, 0, ""), "1": (1.0, 1, "")}.get(unit, (1.0, 3, ""))
    s = "+" if signed else ""
    text = f"{e.value * scale:{s}.{digits}f}{suffix}"
    if e.lo is None:
        return text + " [no CI]"
    return text + f" [{e.lo * scale:{s}.{digits}f}, {e.hi * scale:{s}.{digits}f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Plain-text columns: the first left-aligned, the rest right-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in [header, *rows]]  # fmt: skip


def render(report: dict[str, Any]) -> str:
    lines: list[str] = []
    w = lines.append
    w("Cycles (simulate -> collect -> distill -> train -> eval -> deploy, one run dir each)")
    rows = []
    for c in report["cycles"]:
        p = c.get("eval_pass") or {}
        ratio = c.get("eval_latency_ratio")
        rows.append([c["run"], c["base_label"] or "?", str(c["samples"] or "-"), str(c["train_steps"] or "-"),
                     f"{_pct(p.get('candidate'))} / {_pct(p.get('baseline'))}" if p else "-",
                     f"{ratio:.2f}" if ratio is not None else "-", c["decision"] or "-",
                     ", ".join(c["failed_gates"]) or "-", c["deployed_label"] or "-", f"{c['wall_s']:.0f}s"])  # fmt: skip
    lines += _table(["run", "served", "samples", "train steps", "eval pass@1 cand/base", "eval latency ratio",
                     "decision", "failed gates", "deployed", "wall"], rows)  # fmt: skip
    w("")
    w("Policy versions")
    for v in report["versions"]:
        change = "" if v["weight_change"] is None else f"; weights vs v0: {v['weight_change']:.1e} relative L2"
        w(f"  {v['label']:<4} {str(v['id'])[:23]}…  {v['origin']}; served in {', '.join(v['served_in'])}{change}")
    vs, metrics = report["versions"], report["metrics"]
    if not vs:
        return "\n".join(lines)
    w("")
    w("Online metrics per policy version (95% CI; simulated users; sessions are the unit, episodes for follow-ups)")
    rows = [[label, *(_fmt(metrics[v["id"]][m], unit) for v in vs)] for m, (label, _, unit) in ALL.items()]
    for key in ("sessions", "samples", "followups", "edits_with_outcome"):
        rows.append([f"  n {key.replace('_', ' ')}", *(str(metrics[v["id"]]["counts"][key]) for v in vs)])
    lines += _table(["metric", *(v["label"] for v in vs)], rows)
    if report["ab"]:
        w("")
        w(f"A/B: each version minus {vs[0]['label']} (95% CI; better/worse only where the CI excludes 0)")
        rows = [[label, *(_ab_cell(report["ab"][v["id"]][m], unit) for v in vs[1:])]
                for m, (label, _, unit) in ALL.items()]  # fmt: skip
        lines += _table(["metric", *(f"{v['label']} - {vs[0]['label']}" for v in vs[1:])], rows)
    w("")
    v = report["verdict"]
    w(f"Improved? {'YES' if v['improved'] else 'NO'}: {v['summary']}.")
    for r in v["reasons"]:
        w(f"  - {r}")
    return "\n".join(lines)


def _ab_cell(cell: dict[str, Any], unit: str) -> str:
    text = _fmt(cell["diff"], unit, signed=True)
    return text if cell["call"] == "n/a" else f"{text} {cell['call']}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    def conv(x: Any) -> Any:
        if isinstance(x, Estimate):
            return asdict(x)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return conv(report)


# --- main -------------------------------------------------------------------------------------


def _log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(f"[closed_loop] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See docs/closed_loop.md.")  # fmt: skip
    p.add_argument("--cycles", type=int, default=3, help="Cycles in a row (default 3).")
    p.add_argument("--episodes", type=int, default=42, help="Simulated sessions per cycle (default 42: each sample task once).")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "closed_loop", help="Output directory (must not hold runs yet).")
    p.add_argument("--home", type=Path, default=None, help="RLCYCLE_HOME (default OUT/home: fresh, so it starts from the tiny default model).")
    p.add_argument("--tasks", default=str(REPO / "sample_data" / "tasks"), help="Task suite for simulate and eval.")
    p.add_argument("--warm-start", action="store_true", help="Start from a warm-started model (init-model --warm-start; ~4 min on 2 cores).")
    p.add_argument("--no-measure", action="store_true", help="Skip measuring the last deployed version online.")
    p.add_argument("--set", action="append", metavar="TABLE.KEY=VALUE", help="Edit the cycle config: --set train.lr=1e-4 (repeatable).")
    p.add_argument("--report-only", action="store_true", help="Only print the report of a finished OUT.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")
    p.add_argument("-q", "--quiet", action="store_true", help="No progress on stderr.")
    args = p.parse_args(argv)
    out = args.out.resolve()
    if args.report_only:
        if not (out / "runs.json").exists():
            raise SystemExit(f"{out}/runs.json not found: run the loop first")
        runs = json.loads((out / "runs.json").read_text())
    else:
        if args.cycles < 1 or args.episodes < 1:
            raise SystemExit("--cycles and --episodes must be >= 1")
        if (out / "runs.json").exists() or any(out.glob("cycle-*")):
            raise SystemExit(f"{out} holds runs already: pick another --out, remove it, or use --report-only")
        out.mkdir(parents=True, exist_ok=True)
        runs = run_loop(args, out, (args.home or out / "home").resolve())
    report = build_report(out, runs)
    text = render(report)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(as_json(report), indent=2) + "\n")
    print(json.dumps(as_json(report)) if args.json else text)
    return 0 if all(c["exit_code"] in (0, 3) for c in runs["cycles"]) else 1


if __name__ == "__main__":
    sys.exit(main())
