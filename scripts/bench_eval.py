"""Benchmark eval's throughput: tasks per minute at concurrency 1, 2, 4 and 8.

The scripted reference policy (no model time, so this measures the harness, the sandboxes and
grading) runs the shipped task suite through the same runner `rlcycle eval` uses, over a pool
of N sandboxes with N sessions live at once. The baseline is concurrency 1 (the first of
`--levels`) in the same run; the ratio is the speed-up over it. Pool start-up is timed
separately (it is paid once per eval). Medians of `--runs`; needs a Docker engine.

    .venv/bin/python scripts/bench_eval.py                       # 1,2,4,8 on sample_data/tasks
    .venv/bin/python scripts/bench_eval.py --levels 1,4 --runs 3
    .venv/bin/python scripts/bench_eval.py --levels 1,2 --json   # one JSON object
"""

from __future__ import annotations

import time
from pathlib import Path

import benchkit

REPO = Path(__file__).resolve().parent.parent


def one(level: int, tasks, runs: int) -> dict:
    """`runs` passes over the suite at concurrency `level`: tasks/min and pool start-up per run."""
    from rlcycle.agent.runner import RunnerConfig, run_episodes
    from rlcycle.policy.scripted import ReferencePolicy, load_tokenizer
    from rlcycle.sandbox import SandboxPool

    policy = ReferencePolicy(load_tokenizer(None), tasks)
    rates, starts, passed = [], [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        with SandboxPool(size=level) as pool:
            starts.append(time.perf_counter() - t0)
            wall, results = benchkit.timed(run_episodes, policy, "bench", tasks, pool, RunnerConfig(concurrency=level))
        rates.append(60 * len(tasks) / wall)
        passed = sum(r.status == "pass" for r in results)
        benchkit.progress(f"bench_eval: concurrency {level}: {wall:.1f} s, {passed}/{len(tasks)} passed")
    return {"tasks_per_min": rates, "pool_start_s": starts, "passed": passed}


def main() -> None:
    ap = benchkit.parser(__doc__, runs=1, runs_help="runs per level")
    ap.add_argument("--levels", default="1,2,4,8", help="comma-separated concurrency levels (the first: the baseline)")
    ap.add_argument("--tasks", type=Path, default=REPO / "sample_data" / "tasks")
    args = ap.parse_args()
    from rlcycle.tasks.suite import load_suite

    tasks = load_suite(args.tasks)
    levels = [int(n) for n in args.levels.split(",")]
    rows = {n: one(n, tasks, args.runs) for n in levels}
    side = {n: f"concurrency {n}" for n in levels}
    speed = benchkit.Table(
        f"eval on {len(tasks)} tasks (scripted reference policy)",
        "tasks/min",
        baseline=side[levels[0]],
        samples={side[n]: r["tasks_per_min"] for n, r in rows.items()},
    )
    start = benchkit.Table(
        "sandbox pool start-up (paid once per eval)",
        "seconds",
        baseline=side[levels[0]],
        samples={side[n]: r["pool_start_s"] for n, r in rows.items()},
        higher_is_better=False,
    )
    notes = ["passed: " + ", ".join(f"c={n} {r['passed']}/{len(tasks)}" for n, r in rows.items())]
    benchkit.emit(args, "bench_eval", [speed, start], notes, {"tasks": len(tasks)})


if __name__ == "__main__":
    main()
