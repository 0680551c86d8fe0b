"""Where episodes run: on this machine's sandbox pool (local) or on Ray actors across a cluster.

    from rlcycle.rollout import PolicySpec, RolloutConfig, open_executor
    with open_executor(RolloutConfig(executor="ray"), sandboxes=4) as ex:
        results = ex.run(PolicySpec("scripted:reference"), "scripted:reference", tasks,
                         RunnerConfig(), attempts=2)

What goes in: a `RolloutConfig` (which executor, the Ray address, workers per node, how often an
episode whose worker died is rerun), the sandboxes each pool holds, then per `run` a policy, the
tasks and the runner's config. What comes out: `EpisodeResult`s in job order, the very rows
`rlcycle.agent.runner.run_episodes` gives locally: the Ray executor runs shards of the same job
list (`run_episodes(only=...)`), so ids, seeds and the simulated clock do not depend on which
worker ran what (docs/scale.md).

`simulate` and `eval` hold a `RolloutConfig` as their `rollout` table, so `rollout.executor`,
`rollout.ray_address`, `rollout.workers_per_node` and `rollout.worker_retries` are keys of
`[simulate]`, `[eval]` and the cycle's `simulate`/`eval` tables (`[simulate.rollout]`), and
`--executor`/`--ray-address` flags of both commands.

The Ray executor is imported only when asked for: `import rlcycle` never needs ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError
from rlcycle.policy.open import PolicySpec  # what `run` takes (made by rlcycle.policy.open.open_policy)

EXECUTORS = ("local", "ray")


@dataclass
class RolloutConfig:
    """Where episodes run (the `rollout` table of SimulateConfig and EvalConfig)."""

    executor: str = cfg(
        "local",
        help="local: this machine's Docker engine; ray: Ray actors on "
        "every node of a cluster, each with its own sandbox pool.",
    )
    ray_address: str | None = cfg(
        None,
        help="Ray cluster to join (e.g. ray://head:10001 or auto); default: RAY_ADDRESS, else a local Ray.",
    )
    workers_per_node: int = cfg(1, help="Ray actors per node; each holds `sandboxes` sandboxes.")
    worker_retries: int = cfg(
        2,
        help="Reruns, on another worker, of an episode whose Ray worker died; then it is an infrastructure error.",
    )

    def validate(self) -> list[str]:
        problems: list[str] = []
        if self.executor not in EXECUTORS:
            problems.append(f"executor={self.executor!r}: one of {', '.join(EXECUTORS)}")
        check_range(problems, self, "workers_per_node", ge=1)
        check_range(problems, self, "worker_retries", ge=0)
        return problems


def import_ray() -> Any:
    """`import ray`, or the error every `--executor ray` gives when it is not installed."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "--executor ray needs Ray, which is not installed",
            hint="pip install 'rlcycle[ray]'",
        ) from None
    return ray


def open_executor(config: RolloutConfig, sandboxes: int) -> Any:
    """The executor `config.executor` names, started (a context manager: close it)."""
    problems = config.validate()
    if problems:
        raise InputError("; ".join(problems), hint="--executor local|ray (defaults < config < --set < flags)")
    if config.executor == "ray":
        from rlcycle.rollout.ray_executor import RayExecutor

        return RayExecutor(config, sandboxes)
    from rlcycle.rollout.executor import LocalExecutor

    return LocalExecutor(sandboxes)


__all__ = ["EXECUTORS", "PolicySpec", "RolloutConfig", "import_ray", "open_executor"]
