"""Benchmark eval's throughput: tasks per minute at concurrency 1, 2, 4 and 8.

The scripted reference policy (no model time, so this measures the harness, the sandboxes and
grading) runs the shipped task suite through the same runner `rlcycle eval` uses, over a pool
of N sandboxes with N sessions live at once. The baseline is concurrency 1 in the same run;
the ratio column is the speed-up over it. Pool start-up is timed separately (it is paid once
per eval). Medians of `--runs`.

    .venv/bin/python scripts/bench_eval.py                       # 1,2,4,8 on sample_data/tasks
    .venv/bin/python scripts/bench_eval.py --levels 1,4 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one(level: int, tasks, runs: int) -> dict:
    from rlcycle.agent.runner import RunnerConfig, run_episodes
    from rlcycle.policy.scripted import ReferencePolicy, load_tokenizer
    from rlcycle.sandbox import SandboxPool

    policy = ReferencePolicy(load_tokenizer(None), tasks)
    walls, starts, passed = [], [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        with SandboxPool(size=level) as pool:
            starts.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            results = run_episodes(policy, "bench", tasks, pool, RunnerConfig(concurrency=level))
            walls.append(time.perf_counter() - t1)
        passed = sum(r.status == "pass" for r in results)
    wall = statistics.median(walls)
    return {
        "concurrency": level,
        "tasks": len(tasks),
        "passed": passed,
        "seconds": wall,
        "tasks_per_min": 60 * len(tasks) / wall,
        "pool_start_s": statistics.median(starts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8", help="comma-separated concurrency levels")
    ap.add_argument("--runs", type=int, default=1, help="runs per level; medians are reported")
    ap.add_argument("--tasks", type=Path, default=REPO / "sample_data" / "tasks")
    args = ap.parse_args()
    from rlcycle.tasks.suite import load_suite

    tasks = load_suite(args.tasks)
    rows = [one(int(n), tasks, args.runs) for n in args.levels.split(",")]
    base = rows[0]["tasks_per_min"]
    print(
        f"{'concurrency':>11} {'tasks':>5} {'passed':>6} {'wall s':>7} {'tasks/min':>9} {'vs c=' + str(rows[0]['concurrency']):>7} {'pool start s':>12}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>11} {r['tasks']:>5} {r['passed']:>6} {r['seconds']:>7.1f} {r['tasks_per_min']:>9.1f} "
            f"{r['tasks_per_min'] / base:>6.2f}x {r['pool_start_s']:>12.2f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
