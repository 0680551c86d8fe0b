"""Turn a policy reference from the command line into a policy to run.

A reference is one of:
- `scripted:reference` / `scripted:nothing` / `scripted:clarify` — scripted policies for tests, benches, demos
  (`rlcycle.agent.scripted`): the tasks' reference solutions, or an agent that does nothing;
- an http(s) URL — an OpenAI-compatible server (vLLM, SGLang, `rlcycle serve`);
- a registry alias (`production`, `previous`, `candidate`, or `registry:<alias>`) or a
  checkpoint id — resolved through the model registry the caller names (`registry`, a
  registry directory; nothing here reads $RLCYCLE_HOME);
- a checkpoint directory.
The `name` recorded in events and eval results is the checkpoint id when there is one (so
collect's `policy_version` is the content hash of what served), else the reference itself.
A server's is what it serves (`HTTPPolicy.identify`: the served checkpoint's id, else the
served model's name; never the URL), and `run_key` adds the server's identity hash, so run
and event ids differ when something else answers behind the same URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ResolvedPolicy:
    policy: Any  # rlcycle.policy.base.Policy
    name: str
    checkpoint_id: str | None
    path: Path | None
    run_key: str | None = None  # what run ids derive from, when not `name` (a server's identity)


def resolve_policy(
    ref: str,
    tokenizer: str | Path | None = None,
    prefix_cache_tokens: int = 0,
    registry: str | Path | None = None,
    dtype: str = "auto",
    **options: Any,
) -> ResolvedPolicy:
    """Load the policy `ref` names (see the module docstring).

    `prefix_cache_tokens` is the prefix KV cache budget of the in-process backend
    (HFPolicyConfig, rlcycle/policy/prefix.py), so it applies to checkpoints only: a scripted
    policy has no model, and a server keeps its own cache (vLLM, SGLang, `rlcycle serve
    --prefix-cache-tokens`). `registry` is the registry directory an alias resolves in (None: a
    reference that is not a directory is an error). `dtype` is the in-process backend's too; a
    checkpoint run in another dtype than float32 gets a `run_key` naming it (its samples differ).
    `options` go to the backend's config as given."""
    from rlcycle.policy.load import load_policy
    from rlcycle.policy.registry import checkpoint_dir, checkpoint_id

    if ref.startswith("scripted:"):
        from rlcycle.agent import scripted

        return ResolvedPolicy(scripted.make(ref, tokenizer), ref, None, None)
    if ref.startswith(("http://", "https://")):
        registry_dir = str(registry) if registry is not None else None
        policy = load_policy(ref, **{"registry": registry_dir, **options}).identify()
        return ResolvedPolicy(policy, policy.name, policy.checkpoint_id, None, run_key(policy))
    path = checkpoint_dir(ref, registry)
    cid = checkpoint_id(path)
    options = {"prefix_cache_tokens": prefix_cache_tokens, "dtype": dtype, **options}
    policy = load_policy(path, **options)
    dtype_used = str(getattr(getattr(policy, "model", None), "dtype", "float32")).removeprefix("torch.")
    return ResolvedPolicy(policy, cid, cid, path, dtype_run_key(cid, dtype_used))


def dtype_run_key(name: str, dtype: str) -> str | None:
    """`<name>@<dtype>` for a checkpoint sampled in-process in another dtype than float32 (None for
    float32, the trainer's numerics, and for `auto`, named by what it resolves to where it runs).
    Run and event ids derive from it, so a bf16 rerun is never taken for a float32 run's duplicate."""
    return None if dtype in ("float32", "auto") else f"{name}@{dtype}"


def run_key(policy: Any) -> str | None:
    """`<policy_version>@<served identity>` for a server (None for anything else): what run
    ids of episodes sampled from it derive from (rlcycle/policy/served.py)."""
    identity = getattr(policy, "served_identity", None)
    return f"{policy.name}@{identity}" if identity else None
