"""The local executor (today's behaviour) and what every executor shares.

`LocalExecutor` holds one `SandboxPool` on this machine's Docker engine and runs each batch of
episodes with `run_episodes`, policy and renderer as the caller made them. `pin_policy`
names a policy reference the way `resolve_policy` would, without loading it, for the Ray driver.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def pin_policy(ref: str, registry: str | Path | None = None) -> tuple[str, str, str | None]:
    """(reference, name, checkpoint id) of a policy, as `resolve_policy` names it, unloaded.

    The Ray driver needs the name (it is in every event id) while the model lives in the
    workers. A registry alias is pinned to the checkpoint directory it points to now, so every
    worker loads the same checkpoint even if a deploy moves the alias mid-run, and workers
    need no registry of their own (only the directory, on shared storage). `registry`: the
    registry directory aliases resolve in, as for `resolve_policy`."""
    from rlcycle.policy.registry import checkpoint_dir, checkpoint_id

    if ref.startswith("scripted:"):
        return ref, ref, None
    if ref.startswith(("http://", "https://")):  # what the server serves names it, not the URL
        from rlcycle.policy.resolve import resolve_policy

        resolved = resolve_policy(ref, registry=registry)
        resolved.policy.close()
        return ref, resolved.name, resolved.checkpoint_id
    path = checkpoint_dir(ref, registry)
    cid = checkpoint_id(path)
    return str(path.resolve()), cid, cid


def load_policy_spec(spec: PolicySpec) -> tuple[Any, Any]:
    """(policy, renderer) for `spec` in this process: what a worker runs (renderer None: the
    runner renders with the policy's own tokenizer)."""
    from rlcycle.harness import ChatRenderer
    from rlcycle.policy.resolve import resolve_policy

    assert spec.ref is not None
    policy = resolve_policy(
        spec.ref, tokenizer=spec.tokenizer, prefix_cache_tokens=spec.prefix_cache_tokens, dtype=spec.dtype
    ).policy
    renderer = ChatRenderer.from_pretrained(spec.tokenizer) if spec.tokenizer is not None else None
    return policy, renderer


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
