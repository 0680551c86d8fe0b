"""Benchmark `rlcycle cycle`: wall time per stage of a fresh cycle, then the cached re-run.

What it measures (issue #8, item 8), each through the real CLI in a subprocess
(`python -m rlcycle cycle --config demo --run-dir RUN --json`), in a fresh RLCYCLE_HOME and run directory
under a temp dir, with the packaged demo config (rlcycle/configs/demo.toml, source=simulate: the
tiny default model on the bundled task suite, 16 sessions; the demo's quick train and eval; the experiment script,
rlcycle/closed_loop.py, prints the same per-stage seconds for the stand-in loop):
- the first cycle: each stage's seconds (from the cycle's own JSON), plus what happens before
  the first stage (interpreter start, imports, lock, bootstrapping the tiny model into the
  empty registry) as "startup + bootstrap", and the process's wall time;
- the re-run of the finished run directory, `--runs` times (default 3), median: every stage
  is cached except deploy, which finds `production` already pointing at the checkpoint
  (`up_to_date`). Target (issue #8): < 3 s; the table prints the ratio to it. When the eval
  gate refused the candidate (exit 3: e.g. its latency gate on a busy machine), the cycle still
  finished: the table says so, and the re-run stops after the cached eval as the first did;
- the named baseline of the same run: `python -m rlcycle --help` (interpreter + CLI start,
  nothing else), so the re-run's own cost is visible apart from Python's start-up.

    .venv/bin/python scripts/bench_cycle.py             # ~2-3 min on 2 cores (Docker needed: eval)
    .venv/bin/python scripts/bench_cycle.py --runs 5 --json
    .venv/bin/python scripts/bench_cycle.py --keep runs/bench_cycle   # keep the run dir and home
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 3.0


def timed(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, the finished process) of `python -m rlcycle ARGS`."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlcycle", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc


def cycle(run_dir: Path, env: dict[str, str]) -> tuple[float, dict]:
    wall, proc = timed(["cycle", "--config", "demo", "--run-dir", str(run_dir), "--json", "-q"], env)
    if proc.returncode not in (0, 3):  # 3: the gate refused; the cycle still finished
        sys.exit(f"rlcycle cycle failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout)


def bench(root: Path, runs: int) -> dict:
    env = dict(os.environ, RLCYCLE_HOME=str(root / "home"), NO_COLOR="1")
    run_dir = root / "run"
    first_wall, first = cycle(run_dir, env)
    stages = {s["name"]: {"status": s["status"], "seconds": s["seconds"]} for s in first["stages"]}
    startup = first_wall - sum(s["seconds"] for s in first["stages"])
    reruns = []
    for _ in range(runs):
        wall, again = cycle(run_dir, env)
        statuses = [s["status"] for s in again["stages"]]
        if any(s not in ("cached", "up_to_date", "skipped") for s in statuses):
            sys.exit(f"the re-run was not cached: {statuses}")
        reruns.append(wall)
    helps = [timed(["--help"], env)[0] for _ in range(runs)]
    rerun = statistics.median(reruns)
    return {
        "first": {
            "wall_s": first_wall,
            "startup_bootstrap_s": startup,
            "stages": stages,
            "decision": first["decision"],
            "deployed": first["deployed"],
        },
        "rerun": {
            "median_s": rerun,
            "runs_s": reruns,
            "statuses": statuses,
            "target_s": TARGET_S,
            "ratio_to_target": rerun / TARGET_S,
        },
        "baseline_cli_help": {"median_s": statistics.median(helps), "runs_s": helps},
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def render(r: dict) -> str:
    f, rr, base = r["first"], r["rerun"], r["baseline_cli_help"]
    lines = [
        "rlcycle cycle --config demo (the sample data), fresh RLCYCLE_HOME and run dir",
        f"  {'stage':<20} {'status':<10} {'seconds':>8}",
        f"  {'startup + bootstrap':<20} {'':<10} {f['startup_bootstrap_s']:>8.1f}",
    ]
    for name, s in f["stages"].items():
        lines.append(f"  {name:<20} {s['status']:<10} {s['seconds']:>8.1f}")
    lines += [
        f"  {'total (wall)':<20} {'':<10} {f['wall_s']:>8.1f}   decision={f['decision']}",
        "",
        f"cached re-run of the finished run dir, median of {len(rr['runs_s'])}: {rr['median_s']:.2f} s "
        f"(runs {', '.join(f'{x:.2f}' for x in rr['runs_s'])}; stages {'/'.join(rr['statuses'])})",
        f"  target < {rr['target_s']:.0f} s: ratio {rr['ratio_to_target']:.2f}x of the target "
        f"({'met' if rr['median_s'] < rr['target_s'] else 'NOT met'})",
        f"  baseline `python -m rlcycle --help`, median: {base['median_s']:.2f} s "
        f"(re-run = {rr['median_s'] / base['median_s']:.2f}x the bare CLI start)",
        f"  machine: {r['cpus']} CPUs, load average {r['load_avg'][0]:.1f} at the end, "
        f"OMP_NUM_THREADS={r['omp_num_threads'] or 'unset'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="Cached re-runs (median), default 3.")
    p.add_argument(
        "--keep", type=Path, default=None, help="Use (and keep) this directory instead of a temp one; must not exist."
    )
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = p.parse_args(argv)
    if args.keep is not None:
        if args.keep.exists():
            sys.exit(f"{args.keep} exists: the benchmark needs a fresh directory")
        args.keep.mkdir(parents=True)
        root = args.keep.resolve()
    else:
        root = Path(tempfile.mkdtemp(prefix="bench_cycle-"))
    try:
        print("running a fresh cycle on the sample data (a few minutes on 2 cores) ...", file=sys.stderr)
        result = bench(root, max(1, args.runs))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
