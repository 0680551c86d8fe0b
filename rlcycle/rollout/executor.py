"""The local executor (today's behaviour) and what every executor shares.

`LocalExecutor` holds one `SandboxPool` on this machine's Docker engine and runs each batch of
episodes with `run_episodes`, policy and renderer as the caller opened them
(`rlcycle.policy.open.open_policy`).
"""

from __future__ import annotations

from collections.abc import Callable

from rlcycle.agent.runner import EpisodeResult, RunnerConfig, run_episodes
from rlcycle.agent.user import UserConfig
from rlcycle.rollout import PolicySpec
from rlcycle.tasks.suite import Task


class LocalExecutor:
    """Episodes on this machine: one warm pool of `sandboxes` containers, shared by every run."""

    kind = "local"

    def __init__(self, sandboxes: int):
        from rlcycle.sandbox import SandboxPool

        self.sandboxes = sandboxes
        self.pool = SandboxPool(size=sandboxes)
        self.stats = {"workers": 1, "worker_deaths": 0, "retried_episodes": 0}

    def run(
        self,
        policy: PolicySpec,
        name: str,
        tasks: list[Task],
        runner: RunnerConfig,
        *,
        attempts: int = 1,
        seed: int = 0,
        simulate_user: bool = False,
        n_episodes: int | None = None,
        user_config: UserConfig | None = None,
        on_result: Callable[[EpisodeResult], None] | None = None,
    ) -> list[EpisodeResult]:
        """`run_episodes` over the pool (see its docstring for the arguments)."""
        return run_episodes(
            policy.policy,
            name,
            tasks,
            self.pool,
            runner,
            attempts=attempts,
            seed=seed,
            simulate_user=simulate_user,
            n_episodes=n_episodes,
            renderer=policy.renderer,
            user_config=user_config,
            on_result=on_result,
        )

    def warm_up(self, policy: PolicySpec, tasks: list[Task], runner: RunnerConfig, seed: int = 0) -> None:
        """One discarded round on the real path (first-call costs stay out of the latencies)."""
        self.run(policy, "warm-up", tasks[: self.sandboxes], runner, seed=seed)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def infra_error(task: Task, policy: str, attempt: int, index: int, reason: str, tries: int) -> EpisodeResult:
    """An episode that infrastructure lost: status error, no events, never a task failure."""
    return EpisodeResult(
        task_id=task.id,
        cluster=task.cluster,
        policy=policy,
        attempt=attempt,
        status="error",
        reward=0.0,
        turns=0,
        n_tool_calls=0,
        n_invalid_tool_calls=0,
        edited=False,
        asked_clarification=False,
        tokens=0,
        latency_ms=0.0,
        end_reason="error",
        events=[],
        error=f"infrastructure: {reason}",
        tries=tries,
        index=index,
    )
