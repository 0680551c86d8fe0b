"""Closed loop: `rlcycle cycle` N times in a row on simulated users, per experiment arm, then
the online A/B tables. The library behind scripts/closed_loop.py (a thin caller); the report is
rlcycle/report/closed_loop.py, the metrics rlcycle/online.py, the intervals rlcycle/stats.py.

What it does (issue #8 item 4, issue #11 items 2-3), docs/closed_loop.md:
  1. the start: one checkpoint every arm starts from: `--start DIR`, or `--warm-start`
     (`rlcycle init-model --warm-start TASKS` into OUT/start, once), or none (each arm's first
     cycle bootstraps the tiny default model, the same bytes in every arm);
  2. per arm (`--arms treatment,control[,naive]`) its own RLCYCLE_HOME `OUT/<arm>/home`, where
     a copy of the start is registered as `production`; then cycle k runs in `OUT/<arm>/cycle-k`
     with `source = "simulate"`: simulate (the arm's current `production` on the suite, the
     simulated user) -> collect -> distill -> train -> eval -> deploy. Cycle k's simulate seed
     is 1000*seed + k in every arm (the same traffic), so its events come from the checkpoint
     the arm's cycle k-1 deployed: on-policy. The arms differ only in distill:
       treatment  the reward spec as it is
       control    `permute_rewards`: rewards shuffled across the samples of each distill batch
                  before advantages (same reward distribution, no link to behaviour)
       naive      `discard_invalid`: samples with an invalid tool call are dropped instead of
                  penalised (the seed's first reward hack)
     The first cycle of every arm serves the start on the same seed: byte-identical sessions,
     so arms after the first reuse the first arm's cycle-1 simulate and collect outputs (the
     cycle's own cache finds them: same policy id, tasks and config) instead of recomputing;
  3. `OUT/<arm>/measure` (`rlcycle cycle --until distill`, seed 1000*seed + 900, the same
     config in every arm, without the arm's switch) measures the version the arm's last cycle
     deployed on fresh traffic (distill scores its mean reward under the plain spec); with a
     start checkpoint, `OUT/v0/measure` measures the start on the same traffic, so v0 and every
     last version served the same sessions and the report pairs its differences by session;
  4. the report: the online metrics per (arm, policy version) with 95% CIs, sessions as the
     clusters; each version minus v0, and the last versions of the arms against each other
     (treatment - control); each cycle's eval decision; seconds per stage; and the verdicts
     "did the policy improve" (per arm) and "did the loop learn" (treatment beats v0 and
     control on hidden-test pass rate or edit persistence, control does not beat v0).

    .venv/bin/python scripts/closed_loop.py                       # treatment + control, 3 cycles
    .venv/bin/python scripts/closed_loop.py --arms treatment --out runs/closed_loop1
    .venv/bin/python scripts/closed_loop.py --start runs/warm --tasks sample_data/edit_tasks/train \
        --cycles 3 --episodes 96 --seed 1 --out runs/exp_s1
    .venv/bin/python scripts/closed_loop.py --out runs/exp_s1 --report-only --json
    .venv/bin/python scripts/closed_loop.py --set train.lr=1e-4 --set eval.max_tasks=20

The metrics (rlcycle.online's `online_metrics`, the numbers `rlcycle report` shows): hidden
tests passed (from the simulated user's verdict: rlcycle/report/closed_loop.py says why), edit
persistence, dissatisfied follow-ups, invalid tool calls per call, clarification rate, tokens
and latency per call. `OUT/report/` is a run directory holding every arm's trajectories with
`policy_version` = `<arm>/<label>`: `rlcycle report OUT/report` draws its online section
(OUT/report/report.html is written too).

Output: the report on stdout (`--json`: one JSON object), progress on stderr; `OUT/report.json`
and `OUT/report.txt` are written too. Exit 0 when every cycle finished with a decision (accept
or refuse), 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomllib

from rlcycle.report.closed_loop import as_json
from rlcycle.report.experiment import build_experiment, render_experiment, write_report_dir

REPO = Path(__file__).resolve().parent.parent  # the defaults of --out and --tasks: a source checkout

# The cycle config the script writes (tables of CycleConfig); `--set table.key=value` edits it.
# Sized for minutes on 2 busy cores with the tiny model: short completions, one pass of
# training over the collected samples, the cycle's quick eval.
DEFAULTS: dict[str, dict[str, Any]] = {
    "simulate": {"runner.max_new_tokens": 48, "runner.max_turns": 3, "sandboxes": 4},
    # max_steps: the cycle's own default caps train at 2 steps (a quick demo); here `epochs` decide.
    "train": {"batch_size": 16, "epochs": 1, "max_steps": 100000, "lr": 1e-5, "max_policy_lag": -1, "save_every": 1},
    "eval": {
        "attempts": 1,
        "max_tasks": 12,
        "runner.max_new_tokens": 48,
        "runner.max_turns": 3,
        "sandboxes": 2,
        "min_paired_tasks": 5,
    },
}
WARM_DEFAULTS = {
    "simulate.runner.max_new_tokens": 160,
    "eval.runner.max_new_tokens": 160,
}  # a tool call is ~50-150 tokens
# What each arm changes in the cycle config (the rest is identical). `permute_seed` is set per
# cycle (the cycle's traffic seed), so each batch gets its own shuffle.
ARMS: dict[str, dict[str, Any]] = {
    "treatment": {},
    "control": {"distill.permute_rewards": True},
    "naive": {"distill.discard_invalid": True},
}
V0 = "v0"  # OUT/v0/measure: the start on the measure traffic
MEASURE_SEED = 900  # + 1000 * seed: the fresh traffic every arm's last version is measured on


def seeds(seed: int, cycles: int) -> list[tuple[str, int]]:
    """(run name, simulate seed) of the cycles and the measure run: the same in every arm."""
    return [(f"cycle-{k}", 1000 * seed + k) for k in range(1, cycles + 1)] + [("measure", 1000 * seed + MEASURE_SEED)]


# --- the cycle config -------------------------------------------------------------------------


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
    """The cycle config of one run: DEFAULTS, the seed and episode count, then the overrides
    (`cycle.key` sets a top-level key of [cycle], e.g. cycle.reward_spec)."""
    tables = {name: dict(t) for name, t in DEFAULTS.items()}
    tables["simulate"].update(episodes=episodes, seed=seed)
    top: dict[str, Any] = {"source": "simulate", "tasks": tasks}
    for key, value in overrides.items():
        table, _, name = key.partition(".")
        (top if table == "cycle" else tables.setdefault(table, {}))[name] = value
    lines = ["[cycle]", *(f"{k} = {_toml(v)}" for k, v in top.items())]
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


def arm_overrides(arm: str, seed: int, base: dict[str, Any]) -> dict[str, Any]:
    """The overrides of one arm's cycle: the shared ones, then the arm's distill switch."""
    out = {**base, **ARMS[arm]}
    if out.get("distill.permute_rewards"):
        out["distill.permute_seed"] = seed
    return out


# --- running ------------------------------------------------------------------------------------


def rlcycle(args: list[str], env: dict[str, str], quiet: bool) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (the venv's interpreter); its progress goes to our stderr."""
    return subprocess.run(
        [sys.executable, "-m", "rlcycle", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
    )


def make_start(out: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The checkpoint every arm starts from: --start, a warm start made once, or none."""
    if args.start:
        return {"path": str(Path(args.start).resolve()), "origin": f"--start {args.start}"}
    if not args.warm_start:
        return {"path": None, "origin": "tiny default model (random weights)"}
    path = out / "start"
    started = time.monotonic()
    if not (path / "config.json").exists():
        _log(args, f"warm start: init-model --warm-start {args.tasks} (minutes on CPU)")
        r = rlcycle(["init-model", "-o", str(path), "--warm-start", args.tasks, "--force", "--json"], env, args.quiet)
        if r.returncode:
            raise SystemExit(f"init-model --warm-start failed (exit {r.returncode})")
    return {"path": str(path), "origin": "warm start", "seconds": round(time.monotonic() - started, 1)}


def register_start(home: Path, start: dict[str, Any], env: dict[str, str], quiet: bool) -> None:
    """A copy of the start registered as `production` in the arm's home (once)."""
    state = home / "registry" / "state.json"
    if start["path"] is None or (state.exists() and '"production"' in state.read_text()):
        return
    if rlcycle(["registry", "add", start["path"], "--alias", "production"], env, quiet).returncode:
        raise SystemExit(f"registry add {start['path']} failed (RLCYCLE_HOME={home})")


def share_first_cycle(src: Path, dst: Path) -> bool:
    """Copy the first arm's cycle-1 simulate and collect outputs into another arm's cycle-1:
    the same start on the same seed gives the same sessions, and the cycle's cache (keyed by
    the policy id, the tasks and the config) then skips recomputing them."""
    if not (src / "collect" / "manifest.json").exists() or dst.exists():
        return False
    for stage in ("simulate", "collect"):
        shutil.copytree(src / stage, dst / stage)
    return True


def run_arm(
    arm: str, args: argparse.Namespace, out: Path, start: dict[str, Any], first: Path | None, measure_only: bool = False
) -> dict[str, Any]:
    """One arm: its home, the start as production, N cycles and the measure run (`measure_only`:
    just the measure run, of the start: the `v0` row every arm's last version is paired with)."""
    home = out / arm / "home"
    env = dict(os.environ, RLCYCLE_HOME=str(home))
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models on busy cores: many times faster (docs/simulate.md)
    base = {**(WARM_DEFAULTS if args.warm_start or args.start else {}), **parse_sets(args.set or [])}
    runs: dict[str, Any] = {
        "arm": arm,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cycles": [],
        "home": str(home),
        "start": start,
    }
    (out / arm).mkdir(parents=True, exist_ok=True)
    register_start(home, start, env, args.quiet)
    plan = (
        seeds(args.seed, args.cycles)[-1:]
        if measure_only
        else seeds(args.seed, args.cycles)[: None if not args.no_measure else -1]
    )
    for name, seed in plan:
        run_dir, toml = out / arm / name, out / arm / f"{name}.toml"
        episodes = args.measure_episodes or args.episodes if name == "measure" else args.episodes
        # The measure run only measures: every arm's is the same config (no arm switch), and it
        # runs distill too, so the version's mean reward under the plain spec is known.
        overrides = base if name == "measure" else arm_overrides(arm, seed, base)
        toml.write_text(cycle_toml(seed, episodes, args.tasks, overrides))
        shared = name == "cycle-1" and first is not None and share_first_cycle(first, run_dir)
        _log(
            args,
            f"{arm}/{name}: rlcycle cycle --config {toml} --run-dir {run_dir}"
            + (" (cycle-1 traffic shared)" if shared else ""),
        )
        started = time.monotonic()
        extra = ["--until", "distill"] if name == "measure" else []
        r = rlcycle(
            [
                "cycle",
                "--config",
                str(toml),
                "--run-dir",
                str(run_dir),
                "--json",
                *extra,
                *(["-q"] if args.quiet else []),
            ],
            env,
            args.quiet,
        )
        try:
            result = json.loads(r.stdout)
        except json.JSONDecodeError:
            result = {"decision": None, "stages": []}
        result.update(
            name=name,
            seed=seed,
            exit_code=r.returncode,
            wall_s=round(time.monotonic() - started, 1),
            shared_traffic=shared,
        )
        (out / arm / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        runs["cycles"].append(result)
        if r.returncode not in (0, 3):  # 3: the gate refused; production stays, the loop goes on
            _log(args, f"{arm}/{name}: failed (exit {r.returncode}); stopping this arm")
            break
    runs["wall_s"] = round(sum(c["wall_s"] for c in runs["cycles"]), 1)
    (out / arm / "runs.json").write_text(json.dumps(runs, indent=2) + "\n")
    return runs


def run_experiment(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Every arm in turn (one at a time: they share the machine), from the same start."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    started = time.monotonic()
    record: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seed": args.seed,
        "cycles": args.cycles,
        "episodes": args.episodes,
        "tasks": args.tasks,
        "sets": args.set or [],
        "arms": {},
    }
    record["start"] = make_start(out, args, env)
    if record["start"]["path"] is not None and not args.no_measure:
        # v0 on the measure traffic: the same sessions every arm's last version serves, so the
        # report pairs the comparisons by session (rlcycle/report/paired.py).
        record["v0"] = run_arm(V0, args, out, record["start"], None, measure_only=True)
    first: Path | None = None
    for arm in args.arms:
        record["arms"][arm] = run_arm(arm, args, out, record["start"], first)
        first = first or out / arm / "cycle-1"
    record["wall_s"] = round(time.monotonic() - started, 1)
    (out / "runs.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


# --- main -------------------------------------------------------------------------------------


def _log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(f"[closed_loop] {msg}", file=sys.stderr, flush=True)


def _arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms or len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of distinct arms from {', '.join(ARMS)}")
    return arms


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See docs/closed_loop.md.",
    )
    p.add_argument(
        "--arms",
        type=_arms,
        default=["treatment", "control"],
        help="Arms, comma-separated: treatment, control, naive (default treatment,control).",
    )
    p.add_argument("--cycles", type=int, default=3, help="Cycles in a row per arm (default 3).")
    p.add_argument(
        "--episodes", type=int, default=42, help="Simulated sessions per cycle (default 42: each sample task once)."
    )
    p.add_argument(
        "--measure-episodes", type=int, default=None, help="Sessions of the measure run (default: --episodes)."
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Experiment seed: cycle k's traffic seed is 1000*seed+k, the measure run's 1000*seed+900.",
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "runs" / "closed_loop", help="Output directory (must not hold runs yet)."
    )
    p.add_argument("--tasks", default=str(REPO / "sample_data" / "tasks"), help="Task suite for simulate and eval.")
    p.add_argument(
        "--start",
        default=None,
        help="Checkpoint directory every arm starts from (registered as production in each arm's home).",
    )
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="Start from a warm-started model made once into OUT/start (init-model --warm-start TASKS).",
    )
    p.add_argument("--no-measure", action="store_true", help="Skip measuring the last deployed version online.")
    p.add_argument(
        "--set",
        action="append",
        metavar="TABLE.KEY=VALUE",
        help="Edit the cycle config of every arm: --set train.lr=1e-4 (repeatable).",
    )
    p.add_argument("--report-only", action="store_true", help="Only print the report of a finished OUT.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the tables.")
    p.add_argument("-q", "--quiet", action="store_true", help="No progress on stderr.")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = args.out.resolve()
    if args.report_only:
        if not (out / "runs.json").exists():
            raise SystemExit(f"{out}/runs.json not found: run the loop first")
        record = json.loads((out / "runs.json").read_text())
    else:
        if args.cycles < 1 or args.episodes < 1:
            raise SystemExit("--cycles and --episodes must be >= 1")
        if args.start and args.warm_start:
            raise SystemExit("--start and --warm-start: pick one")
        if (out / "runs.json").exists() or any(out.glob("*/cycle-*")):
            raise SystemExit(f"{out} holds runs already: pick another --out, remove it, or use --report-only")
        out.mkdir(parents=True, exist_ok=True)
        record = run_experiment(args, out)
    report = build_experiment(out, record)
    write_report_dir(out, record, report)
    text = render_experiment(report)
    (out / "report.txt").write_text(text + "\n")
    (out / "report.json").write_text(json.dumps(as_json(report), indent=2) + "\n")
    print(json.dumps(as_json(report)) if args.json else text)
    cycles = [c for runs in record["arms"].values() for c in runs["cycles"]]
    return 0 if all(c["exit_code"] in (0, 3) for c in cycles) else 1
