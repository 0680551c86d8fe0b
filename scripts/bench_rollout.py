"""Episodes/s of the local executor (baseline) vs the Ray executor with 1 and 2 workers.

    nice -n 10 .venv/bin/python scripts/bench_rollout.py --episodes 16 --runs 5
    .venv/bin/python scripts/bench_rollout.py --episodes 4 --runs 1 --json   # a quick look, one JSON object

The scripted reference policy on the shipped task suite, in real sandboxes, with the same total
number of sandboxes in every layout (local: one pool of S; ray1: one worker with S; ray2: two
workers with S/2 each), so the ratio is what Ray's scheduling costs, not more containers. All
three executors are started (pools warm, policy loaded) before the clock starts; their start-up
is printed apart. Each run runs every layout once, in a rotating order, so a machine that
gets busier or quieter during the bench biases none of them; the table (scripts/benchkit.py)
shows episodes/s, medians over `--runs`, and each layout's ratio to local (the baseline).
Needs a Docker engine and Ray.

Then a projection: how many sandboxes at once, and nodes, a 10,000-episode eval needs to finish
in a target time, at the measured episode time and at each `--episode-s` given.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import ExitStack

import benchkit

from rlcycle import resources
from rlcycle.agent.runner import RunnerConfig
from rlcycle.rollout import PolicySpec, RolloutConfig, open_executor
from rlcycle.tasks.suite import load_suite

POLICY = "scripted:reference"


def start(stack: ExitStack, config: RolloutConfig, sandboxes: int, tasks: list) -> tuple:
    """(executor, policy spec, start-up seconds): started, warmed by one discarded round."""
    t0 = time.perf_counter()
    ex = stack.enter_context(open_executor(config, sandboxes))
    spec = PolicySpec(POLICY)
    if ex.kind == "local":  # the local executor runs a policy object, as simulate makes it
        from rlcycle.policy.open import open_policy

        spec = open_policy(POLICY).spec
    ex.run(spec, "warm-up", tasks, RunnerConfig(concurrency=sandboxes), n_episodes=2 * sandboxes)
    return ex, spec, time.perf_counter() - t0


def run_round(ex, spec: PolicySpec, sandboxes: int, tasks: list, n: int) -> float:
    """Seconds for `n` episodes; every one must come back graded (none lost, none an error)."""
    seconds, results = benchkit.timed(ex.run, spec, POLICY, tasks, RunnerConfig(concurrency=sandboxes), n_episodes=n)
    assert [r.index for r in results] == list(range(n))
    assert all(r.status == "pass" for r in results), [r.error for r in results if r.error]
    return seconds


def project(total: int, t_ep: float, target_min: float, per_node: int, label: str) -> str:
    # One sandbox runs one episode at a time, so an episode of T seconds occupies T
    # sandbox-seconds: N episodes in W seconds need N*T/W sandboxes at once.
    needed = math.ceil(total * t_ep / (60 * target_min))
    nodes = math.ceil(needed / per_node)
    return (
        f"projection ({label}): {total:,} episodes of {t_ep:.1f}s in {target_min:.0f} min need "
        f"{needed:,} sandboxes at once = {nodes} node(s) of {per_node} sandboxes"
    )


def parse_args():
    ap = benchkit.parser(__doc__, runs=5, runs_help="runs of every layout")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per timed run")
    ap.add_argument("--sandboxes", type=int, default=2, help="total sandboxes in every layout")
    ap.add_argument(
        "--episode-s",
        type=float,
        nargs="*",
        default=[60.0, 300.0],
        help="more episode times for the projection (a model-driven episode)",
    )
    ap.add_argument("--cores-per-node", type=int, default=64)
    ap.add_argument("--cpus-per-sandbox", type=float, default=1.0)
    ap.add_argument("--target-min", type=float, default=30.0, help="wall time the eval may take")
    ap.add_argument("--total-episodes", type=int, default=10_000)
    return ap.parse_args()


def measure(args, tasks: list) -> dict[str, list[float]]:
    """Seconds of each run of each layout (local, ray1, ray2), started and warmed first."""
    import ray

    ray.init(num_cpus=2, object_store_memory=80 * 1024**2, include_dashboard=False, log_to_driver=False)
    s = args.sandboxes
    layouts = {
        "local": (RolloutConfig("local"), s),
        "ray1": (RolloutConfig("ray", workers_per_node=1), s),
        "ray2": (RolloutConfig("ray", workers_per_node=2), max(1, s // 2)),
    }
    times: dict[str, list[float]] = {name: [] for name in layouts}
    try:
        with ExitStack() as stack:
            started = {}
            for name, (config, sandboxes) in layouts.items():
                started[name] = start(stack, config, sandboxes, tasks)
                benchkit.progress(f"{name:6s} start-up {started[name][2]:6.2f}s")
            names = list(layouts)
            for k in range(args.runs):
                for name in names[k % 3 :] + names[: k % 3]:  # rotating order
                    ex, spec, _ = started[name]
                    times[name].append(run_round(ex, spec, layouts[name][1], tasks, args.episodes))
    finally:
        ray.shutdown()
    return times


def main() -> None:
    args = parse_args()
    tasks = [t for t in load_suite(resources.tasks()) if not t.ambiguous][:8]
    times = measure(args, tasks)
    s = args.sandboxes
    per_ep = {name: statistics.median(ts) / args.episodes for name, ts in times.items()}
    table = benchkit.Table(
        f"{args.episodes} episodes a run, {s} sandboxes in every layout (scripted reference policy)",
        "episodes/s",
        baseline="local",
        samples={name: [args.episodes / t for t in ts] for name, ts in times.items()},
    )
    notes = []
    for name in ("ray1", "ray2"):
        extra_ms = 1000 * (per_ep[name] - per_ep["local"])
        notes.append(
            f"{name}: Ray cost per episode {extra_ms:+.0f} ms wall ({s} sandboxes in all, {s * extra_ms:+.0f} sandbox-ms)"
        )
    per_node = max(1, int(args.cores_per_node / args.cpus_per_sandbox))
    notes.append(
        f"({per_node} sandboxes per node = {args.cores_per_node} cores / {args.cpus_per_sandbox} CPU per sandbox)"
    )
    t_local = per_ep["local"] * s  # one sandbox's episode time, measured
    notes.append(project(args.total_episodes, t_local, args.target_min, per_node, "measured, scripted"))
    notes += [project(args.total_episodes, t_ep, args.target_min, per_node, "given") for t_ep in args.episode_s]
    benchkit.emit(args, "bench_rollout", [table], notes, {"seconds_per_episode": per_ep})


if __name__ == "__main__":
    main()
