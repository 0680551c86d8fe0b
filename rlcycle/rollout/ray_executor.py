"""The Ray executor: episodes on Ray actors, each with a warm sandbox pool on its own node.

    with RayExecutor(RolloutConfig(executor="ray", workers_per_node=2), sandboxes=4) as ex:
        results = ex.run(PolicySpec("scripted:reference"), "scripted:reference", tasks, runner)

Layout. On start the driver joins the cluster (`ray_address`, else RAY_ADDRESS, else a local
Ray), builds the sandbox image once per alive node (one `ensure_image` task pinned to the node:
the same code `rlcycle sandbox build` runs), then starts `workers_per_node` actors on every
node, pinned by hard node affinity, so a worker's sandboxes run on the Docker engine of the
node it lives on. Each actor loads its own copy of the policy from the reference (scripted,
checkpoint directory on shared storage, registry alias) or talks to a policy server (http
URL: vLLM, SGLang, `rlcycle gateway`) — the model is never shipped through Ray's object store.

Scheduling. The run's job list is cut into shards of `sandboxes` positions; each idle actor
gets the next shard and runs `run_episodes(only=shard)` (lock-step, batched generation over
its pool), so every id, seed and simulated time is the full run's and the rows equal a local
run's. A shard's results are taken only when the whole shard came back: a worker that dies
mid-episode loses nothing half-written. Its shard goes back to the queue and is rerun by
another worker, up to `worker_retries` times; after that its episodes are `error` rows with
an `infrastructure:` reason (never `fail`, never training data). A dead worker is replaced
on its node when the node is still alive.

Cleanup. Every worker labels its containers `rlcycle.run=<run>-w<k>`. A worker that exits
closes its pool; one that was killed leaves its workspace volumes (its containers remove
themselves when their attach socket closes, docs/sandbox.md), so the driver runs a cleanup
task on that node removing everything labelled with the worker's run, and again on every
node at `close()`.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlcycle.agent.runner import EpisodeResult, RunnerConfig
from rlcycle.agent.user import UserConfig
from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.open import open_spec
from rlcycle.rollout import PolicySpec, RolloutConfig, import_ray
from rlcycle.rollout.executor import infra_error
from rlcycle.tasks.suite import Task

# --- what runs on the nodes -----------------------------------------------------------------


class _Worker:
    """A Ray actor: one sandbox pool on its node's engine and the policies it was asked for."""

    def __init__(self, sandboxes: int, run: str):
        from rlcycle.sandbox import SandboxPool

        self.pool = SandboxPool(size=sandboxes, run=run)
        self.policies: dict[tuple[str | None, str | None, int], tuple[Any, Any]] = {}

    def pid(self) -> int:
        return os.getpid()

    def run(
        self,
        spec: PolicySpec,
        name: str,
        tasks: list[Task],
        runner: RunnerConfig,
        kwargs: dict[str, Any],
        only: list[int],
    ) -> list[EpisodeResult]:
        from rlcycle.agent.runner import run_episodes

        key = (spec.ref, spec.tokenizer, spec.prefix_cache_tokens, spec.dtype)
        if key not in self.policies:  # loaded once per worker, reused by every shard
            self.policies[key] = open_spec(spec)
        policy, renderer = self.policies[key]
        return run_episodes(policy, name, tasks, self.pool, runner, renderer=renderer, only=only, **kwargs)

    def close(self) -> None:
        self.pool.close()
        for policy, _ in self.policies.values():
            policy.close()
        self.policies.clear()


def _build_image() -> str:
    from rlcycle.sandbox import ensure_image

    return ensure_image()


def _remove_runs(prefix: str) -> int:
    """Remove every container and volume on this node's engine whose run label starts with
    `prefix` (containers first: a mounted volume cannot go)."""
    from rlcycle.sandbox.cleanup import list_leftovers, remove
    from rlcycle.sandbox.engine import docker_client

    client = docker_client()
    mine = [x for x in list_leftovers(client) if x.run.startswith(prefix)]
    for x in sorted(mine, key=lambda x: x.kind != "container"):
        remove(client, x.kind, x.name)
    client.close()
    return len(mine)


def _own_error(e: Any) -> Exception:
    """The error a worker's episode code raised, as a local run would raise it."""
    if isinstance(e.cause, RlcycleError):
        return e.cause
    return RlcycleError(
        f"a Ray worker failed: {type(e.cause).__name__}: {str(e.cause)[:300]}",
        hint="RLCYCLE_DEBUG=1 and the Ray logs (/tmp/ray/session_latest/logs) show more",
    )


# --- the driver ------------------------------------------------------------------------------

# Seconds to wait for a worker to start (its pool's containers), a node's cleanup, or the
# workers to close: past that the node is taken for gone (the run goes on without it).
_WAIT_S = 120


@dataclass
class _Handle:
    actor: Any
    node: str
    run: str
    pid: int


@dataclass
class _Shard:
    positions: list[int]
    deaths: int = 0
    reasons: list[str] = field(default_factory=list)


class RayExecutor:
    """Episodes on Ray actors across the cluster (see the module docstring)."""

    kind = "ray"

    def __init__(self, config: RolloutConfig, sandboxes: int):
        ray = import_ray()
        self.ray = ray
        self.config, self.sandboxes = config, sandboxes
        # What makes a shard's result unreachable without the episode code being at fault: the
        # actor died (killed, crashed, its node went), or its node went after it returned
        # (results over ~100 KB live in that node's object store) or killed it for memory.
        x = ray.exceptions
        self._worker_lost = (
            x.RayActorError,
            x.WorkerCrashedError,
            x.NodeDiedError,
            x.ObjectLostError,
            x.OutOfMemoryError,
        )
        self.started_ray = False
        if not ray.is_initialized():
            ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=False)
            self.started_ray = True
        self.run_label = f"ray-{uuid.uuid4().hex[:10]}"
        self.stats = {"workers": 0, "worker_deaths": 0, "retried_episodes": 0}
        self.workers: list[_Handle] = []
        self._next = 0
        self._closed = False
        self._busy: dict[Any, tuple[_Handle, _Shard]] = {}
        try:
            nodes = self._alive_nodes()
            ray.get([self._on(node, _build_image).remote() for node in nodes])  # once per node
            handles = [self._spawn(node) for node in nodes for _ in range(config.workers_per_node)]
            self.workers = [self._ready(h) for h in handles]
        except Exception:
            self.close()
            raise
        self.stats["workers"] = len(self.workers)

    # --- the run loop --------------------------------------------------------------------

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
        """Every job of the run, in job order, as `run_episodes` would return them locally."""
        if policy.ref is None:
            raise InputError(
                "the ray executor needs a policy reference, not a loaded Policy object",
                hint="pass a checkpoint dir, registry alias, http URL or scripted:* name",
            )
        ray = self.ray
        total = n_episodes if n_episodes is not None else attempts * len(tasks)
        kwargs = {
            "attempts": attempts,
            "seed": seed,
            "simulate_user": simulate_user,
            "n_episodes": n_episodes,
            "user_config": user_config,
        }
        tasks_ref = ray.put(list(tasks))
        step = max(1, self.sandboxes)
        queue = deque(_Shard(list(range(i, min(i + step, total)))) for i in range(0, total, step))
        results: list[EpisodeResult | None] = [None] * total
        idle = list(self.workers)
        busy: dict[Any, tuple[_Handle, _Shard]] = {}
        self._busy = busy

        def deliver(got: list[EpisodeResult]) -> None:
            for r in got:
                results[r.index] = r
                if on_result is not None:
                    on_result(r)

        while queue or busy:
            while queue and idle:
                h, shard = idle.pop(0), queue.popleft()
                ref = h.actor.run.remote(policy, name, tasks_ref, runner, kwargs, shard.positions)
                busy[ref] = (h, shard)
            if not busy:  # work left, nobody to do it
                for shard in queue:
                    deliver(self._lost(shard, tasks, name, "no live Ray worker left"))
                queue.clear()
                break
            (ref,), _ = ray.wait(list(busy), num_returns=1)
            h, shard = busy.pop(ref)
            try:
                got = ray.get(ref)
            except self._worker_lost as e:  # the worker, its node or its result is gone
                replacement = self._worker_died(h)
                if replacement is not None:
                    idle.append(replacement)
                shard.deaths += 1
                shard.reasons.append(f"Ray worker pid {h.pid} on node {h.node[:8]} died ({type(e).__name__})")
                if shard.deaths > self.config.worker_retries:
                    deliver(self._lost(shard, tasks, name, "; ".join(shard.reasons)))
                else:
                    self.stats["retried_episodes"] += len(shard.positions)
                    queue.appendleft(shard)  # first in line: another worker takes it next
                continue
            except ray.exceptions.RayTaskError as e:  # the episode code raised: not the worker
                self._abandon(busy)
                raise _own_error(e) from None
            idle.append(h)
            deliver(got)
        return results  # type: ignore[return-value]

    def warm_up(self, policy: PolicySpec, tasks: list[Task], runner: RunnerConfig, seed: int = 0) -> None:
        """One discarded round per worker, so every worker's first-call costs stay out."""
        ray = self.ray
        part = list(range(min(self.sandboxes, len(tasks))))
        refs = [
            h.actor.run.remote(policy, "warm-up", tasks[: len(part)], runner, {"seed": seed}, part)
            for h in self.workers
        ]
        ray.wait(refs, num_returns=len(refs))  # a worker that died here is found by the run

    def worker_pids(self, busy_only: bool = False) -> list[int]:
        """Process ids of the live workers (of those running a shard now, with `busy_only`)."""
        if busy_only:
            return [h.pid for h, _ in self._busy.values()]
        return [h.pid for h in self.workers]

    # --- workers -------------------------------------------------------------------------

    def _alive_nodes(self) -> list[str]:
        nodes = sorted(n["NodeID"] for n in self.ray.nodes() if n.get("Alive"))
        if not nodes:
            raise RlcycleError("the Ray cluster has no alive node", hint="`ray status` on the head node")
        return nodes

    def _on(self, node: str, fn: Callable, **options: Any) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.ray.remote(fn).options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            **options,
        )

    def _spawn(self, node: str) -> _Handle:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        run = f"{self.run_label}-w{self._next}"
        self._next += 1
        # num_cpus=0: the work happens in the node's containers, whose limits Docker enforces;
        # the actor itself mostly waits on them (or on a policy server).
        actor = (
            self.ray.remote(_Worker)
            .options(
                num_cpus=0,
                max_restarts=0,
                max_concurrency=2,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            .remote(self.sandboxes, run)
        )
        return _Handle(actor, node, run, -1)

    def _ready(self, h: _Handle) -> _Handle:
        h.pid = self.ray.get(h.actor.pid.remote(), timeout=_WAIT_S)  # waits for the pool to start
        return h

    def _worker_died(self, h: _Handle) -> _Handle | None:
        """Count the death, clean its node, and start a successor there if the node lives."""
        self.stats["worker_deaths"] += 1
        self.workers = [w for w in self.workers if w is not h]
        alive = set()
        try:
            alive = set(self._alive_nodes())
        except RlcycleError:
            pass
        if h.node not in alive:
            return None
        try:
            self.ray.get(self._on(h.node, _remove_runs).remote(h.run), timeout=_WAIT_S)
            new = self._ready(self._spawn(h.node))
        except Exception:  # the node went away meanwhile: the others carry on
            return None
        self.workers.append(new)
        return new

    def _lost(self, shard: _Shard, tasks: list[Task], name: str, why: str) -> list[EpisodeResult]:
        n = len(tasks)
        return [infra_error(tasks[i % n], name, i // n, i, why, shard.deaths) for i in shard.positions]

    def _abandon(self, busy: dict[Any, tuple[_Handle, _Shard]]) -> None:
        """Stop the shards still running (the run failed): their workers are killed, since a
        running actor task cannot be cancelled; `close()` sweeps their containers."""
        for h, _ in busy.values():
            self.ray.kill(h.actor)
            self.workers = [w for w in self.workers if w is not h]
        busy.clear()

    # --- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Close every worker's pool, then sweep each node for anything of this executor."""
        if self._closed:
            return
        self._closed = True
        ray = self.ray
        if ray.is_initialized():
            done = [h.actor.close.remote() for h in self.workers]
            ray.wait(done, num_returns=len(done), timeout=_WAIT_S)
            for h in self.workers:
                ray.kill(h.actor)
            self.workers = []
            try:
                nodes = self._alive_nodes()
                ray.get(
                    [self._on(n, _remove_runs).remote(self.run_label) for n in nodes],
                    timeout=_WAIT_S,
                )
            except Exception:  # best effort: `rlcycle sandbox gc` finds what is left by its labels
                pass
            if self.started_ray:
                ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
