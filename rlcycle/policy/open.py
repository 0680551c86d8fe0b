"""The one way from a policy reference to an opened policy: simulate, eval, train's `--base`,
the gateway, the deploy hook and Ray workers all come through here.

    from rlcycle.policy.open import PolicyConfig, open_policy
    opened = open_policy("production", PolicyConfig(), registry="~/.rlcycle/registry")
    opened.spec            # what an executor runs (rlcycle.rollout.PolicySpec)
    opened.name            # what events log as `policy_version`
    opened.checkpoint_id   # the checkpoint's content id (None: scripted, or a server serving no checkpoint)
    opened.run_key         # what run and event ids derive from, when it is not `name`
    opened.tokenizer       # the tokenizer directory prompts are rendered with (None: the policy's own)
    opened.close()

A reference is one of four kinds, and each opens in one of two places:

| reference                                  | where="local" (this process)              | where="ray" (named here, loaded by each worker)          |
|--------------------------------------------|-------------------------------------------|----------------------------------------------------------|
| `scripted:reference`, `scripted:nothing`,  | the scripted policy (rlcycle.policy.      | the reference as is                                      |
| `scripted:clarify`                         | scripted), sample_data's tokenizer        |                                                          |
| `http(s)://host:port[#MODEL]`              | an `HTTPPolicy`, identified once: named   | identified once here (its name and run key), the URL     |
|                                            | by what it serves, never by its URL       | for the workers                                          |
| a registry alias (`production`,            | the checkpoint it points to now, verified | pinned to that checkpoint's directory, so a deploy that  |
| `registry:candidate`) or checkpoint id     | cheaply, in-process (`HFPolicy`)          | moves the alias mid-run changes nothing                  |
| a checkpoint directory                     | verified cheaply, in-process (`HFPolicy`) | its absolute directory                                   |

`PolicyConfig.server` set: a checkpoint reference (the last two rows) is asked for on that
OpenAI-compatible server by its served identity (its adapter `rlcycle-<12 hex>`, or full weights
rooted at its directory; rlcycle/policy/served.py) instead of being loaded in-process, and its
prompts are rendered with its own tokenizer.

Names: a checkpoint is named by its content id; run in another dtype than float32 (the
trainer's), its run key is `<id>@<dtype>` — `auto` is resolved here, once, to what this machine
picks (bfloat16 on a CUDA GPU that supports it, else float32), and Ray workers get the resolved
dtype, so a local and a Ray run of one policy have one name. A server is named by what it serves
(`HTTPPolicy.identify`) and its run key adds the server's identity hash, so run and event ids
differ when something else answers behind the same URL. A scripted policy is named by its
reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle.config import cfg, check_dtype, check_range
from rlcycle.errors import InputError

SCRIPTED, HTTP, CHECKPOINT = "scripted", "http", "checkpoint"
WHERE = ("local", "ray")


@dataclass
class PolicyConfig:
    """How a policy reference is opened: the `policy` table of simulate and eval."""

    tokenizer: str | None = cfg(
        None,
        help="Tokenizer directory prompts are rendered with: needed for an http policy; scripted policies "
        "default to sample_data/tokenizer; a checkpoint uses its own.",
    )
    server: str | None = cfg(
        None,
        help="Sample checkpoint policies (directory, alias or id) on this OpenAI-compatible server (vLLM) instead "
        "of in-process: each is asked for by its served identity (its adapter rlcycle-<12 hex>, or full weights "
        "rooted at its directory; an error when neither is served) and rendered with its own tokenizer unless "
        "`tokenizer` is set. None: in-process.",
    )
    prefix_cache_tokens: int = cfg(
        0,
        help="Prefix KV cache budget (tokens) of a checkpoint run in-process: a turn reuses the keys/values of "
        "earlier prompts (rlcycle/policy/prefix.py); 0 = off. Reused keys/values change logprobs at the 1e-6 "
        "level. Servers keep their own cache.",
    )
    dtype: str = cfg(
        "auto",
        help="Dtype of a checkpoint run in-process: auto (float32 on a CPU, bfloat16 on a CUDA GPU that "
        "supports it), float32, bfloat16 or float16. bfloat16 samples ~2x faster than float32 on a CPU "
        "(SmolLM2) but its logprobs disagree with the trainer's (docs/performance.md); a run in another "
        "dtype than float32 is named by it (run and event ids differ). Servers keep their own.",
    )

    def validate(self) -> list[str]:
        problems: list[str] = []
        check_range(problems, self, "prefix_cache_tokens", ge=0)
        check_dtype(problems, self.dtype)
        return problems


@dataclass
class PolicySpec:
    """A policy as an executor needs it: `ref` (what `open_policy` takes; a worker opens it with
    `open_spec`) with its tokenizer, prefix cache budget and resolved dtype; `policy` and
    `renderer`, already made, where it runs in this process."""

    ref: str | None
    tokenizer: str | None = None
    policy: Any = None
    renderer: Any = None
    prefix_cache_tokens: int = 0
    dtype: str = "float32"  # of a checkpoint run in-process, resolved (never `auto`: open_policy resolves it)


@dataclass(frozen=True)
class Located:
    """A reference named without loading anything: its kind, what a worker opens (`ref`: the
    scripted name, the URL, or the checkpoint's absolute directory), and for a checkpoint its
    directory and content id."""

    kind: str
    ref: str
    path: Path | None = None
    checkpoint_id: str | None = None


@dataclass
class OpenedPolicy:
    """A policy opened for `where`: the executor's spec and every name the run records."""

    spec: PolicySpec
    name: str
    checkpoint_id: str | None
    path: Path | None
    run_key: str | None
    tokenizer: str | None

    @property
    def policy(self) -> Any:
        """The loaded backend (None where it runs on Ray workers)."""
        return self.spec.policy

    def close(self) -> None:
        if self.spec.policy is not None:
            self.spec.policy.close()


# --- naming a reference ---------------------------------------------------------------------


def kind_of(ref: str) -> str:
    """scripted, http or checkpoint (a directory, registry alias or checkpoint id)."""
    if ref.startswith("scripted:"):
        return SCRIPTED
    if ref.startswith(("http://", "https://")):
        return HTTP
    return CHECKPOINT


def locate(ref: str | Path, registry: Any = None) -> Located:
    """Name `ref` without loading it. A checkpoint reference is resolved to its directory (an
    alias through `registry`, a directory or `rlcycle.policy.registry.Registry`) and verified
    cheaply against its manifest, so a checkpoint whose files changed since it was made is
    refused here, naming the file."""
    text = str(ref)
    kind = kind_of(text)
    if kind != CHECKPOINT:
        return Located(kind, text)
    from rlcycle.policy.registry import checkpoint_dir, verify_checkpoint

    path = checkpoint_dir(text, registry).resolve()
    verified = verify_checkpoint(path, full=False)  # sizes and mtimes; a moved file is re-hashed
    return Located(CHECKPOINT, str(path), path, verified.id)


def open_checkpoint(ref: str | Path, registry: Any = None, what: str = "policy") -> Located:
    """A checkpoint reference located (train's `--base`, the gateway's aliases, the deploy hook);
    a scripted or http reference is an error naming `what` needed a checkpoint."""
    located = locate(ref, registry)
    if located.kind != CHECKPOINT:
        raise InputError(
            f"{what} {str(ref)!r} is a {located.kind} policy; a checkpoint is needed here",
            hint="pass a checkpoint directory, a registry alias (production, previous, candidate) or a checkpoint id",
        )
    return located


# --- opening it -----------------------------------------------------------------------------


def open_policy(
    ref: Any,
    config: PolicyConfig | None = None,
    registry: Any = None,
    where: str = "local",
    options: Mapping[str, Any] | None = None,
) -> OpenedPolicy:
    """Open `ref` (a reference string or path, or an already made Policy object, local only) for
    `where` ("local": loaded here; "ray": named here, each worker loads it with `open_spec`).
    `registry`: what aliases resolve in. `options`: extra fields of the backend's config
    (`HFPolicyConfig` for a checkpoint, `HTTPPolicyConfig` for a server), e.g. the gateway's
    batch size; unknown ones are an error."""
    config = config or PolicyConfig()
    if where not in WHERE:
        raise InputError(f"where={where!r}: one of {', '.join(WHERE)}")
    problems = config.validate()
    if problems:
        raise InputError("policy: " + "; ".join(problems), hint="see `rlcycle config help` (the policy table)")
    if not isinstance(ref, (str, Path)):
        return _opened_object(ref, config, where)
    located = locate(ref, registry)
    if located.kind == CHECKPOINT and config.server is not None:
        return _open_on_server(located, config, registry, where, options or {})
    if located.kind == SCRIPTED:
        return _open_scripted(located, config, where)
    if located.kind == HTTP:
        return _open_http(located, config, registry, where, options or {})
    return _open_checkpoint(located, config, where, options or {})


def open_spec(spec: PolicySpec) -> tuple[Any, Any]:
    """(policy, renderer) for a spec a Ray driver made with `open_policy(..., where="ray")`: what
    a worker runs. Its reference is already pinned (a checkpoint's absolute directory, a URL), so
    no registry is needed; dtype is already resolved."""
    assert spec.ref is not None
    config = PolicyConfig(tokenizer=spec.tokenizer, prefix_cache_tokens=spec.prefix_cache_tokens, dtype=spec.dtype)
    opened = open_policy(spec.ref, config)
    return opened.spec.policy, opened.spec.renderer


def _open_scripted(located: Located, config: PolicyConfig, where: str) -> OpenedPolicy:
    spec = PolicySpec(located.ref, config.tokenizer)
    if where == "local":
        from rlcycle.policy import scripted

        policy = scripted.make(located.ref, config.tokenizer)
        spec = dataclasses.replace(spec, policy=policy, renderer=_renderer(policy, config.tokenizer, located.ref))
    return OpenedPolicy(spec, located.ref, None, None, None, config.tokenizer)


def _open_http(
    located: Located, config: PolicyConfig, registry: Any, where: str, options: Mapping[str, Any]
) -> OpenedPolicy:
    """A server, identified once here (its name is what it serves). Local: that policy is the one
    sampled; Ray: the probe is closed and each worker identifies its own."""
    if config.tokenizer is None:
        raise InputError(
            f"policy {located.ref!r} is a server and comes without a tokenizer",
            hint="pass --tokenizer DIR (or set policy.tokenizer): the tokenizer of the served model",
        )
    from rlcycle.policy.http import HTTPPolicy, HTTPPolicyConfig

    url, _, model = located.ref.partition("#")  # `URL#MODEL`: the model (or checkpoint) to ask for
    fields = {"registry": _registry_path(registry)}
    fields.update(options)
    if model:
        fields["model"] = model
    policy = HTTPPolicy(url, _backend_config(HTTPPolicyConfig, fields, located.ref))
    return _identified(policy, located.ref, config, where)


def _open_on_server(
    located: Located, config: PolicyConfig, registry: Any, where: str, options: Mapping[str, Any]
) -> OpenedPolicy:
    """A checkpoint asked for on `config.server` by its served identity, rendered with its own
    tokenizer unless one is given."""
    assert config.server is not None and located.path is not None
    config = dataclasses.replace(config, tokenizer=config.tokenizer or str(located.path))
    policy = server_policy(located, config.server, options)
    opened = _identified(policy, f"{config.server.rstrip('/')}#{located.path}", config, where)
    opened.path = located.path
    return opened


def server_policy(located: Located, server: str, options: Mapping[str, Any] | None = None) -> Any:
    """An `HTTPPolicy` asking `server` for the checkpoint `located` names by its served identity,
    not identified yet (the gateway identifies an upstream once it answers)."""
    from rlcycle.policy.http import HTTPPolicy, HTTPPolicyConfig

    assert located.path is not None and located.checkpoint_id is not None
    ref = f"{server.rstrip('/')}#{located.path}"
    config = _backend_config(HTTPPolicyConfig, dict(options or {}), ref)
    return HTTPPolicy(server, config, checkpoint=(located.checkpoint_id, located.path))


def _identified(policy: Any, ref: str, config: PolicyConfig, where: str) -> OpenedPolicy:
    try:
        policy.identify()
    except BaseException:
        policy.close()
        raise
    key = server_run_key(policy)
    spec = PolicySpec(ref, config.tokenizer)
    if where == "ray":
        policy.close()
    else:
        spec = dataclasses.replace(spec, policy=policy, renderer=_renderer(policy, config.tokenizer, ref))
    return OpenedPolicy(spec, policy.name, policy.checkpoint_id, None, key, config.tokenizer)


def _open_checkpoint(located: Located, config: PolicyConfig, where: str, options: Mapping[str, Any]) -> OpenedPolicy:
    """A checkpoint in-process, in the dtype `auto` resolves to here (named by it)."""
    assert located.path is not None and located.checkpoint_id is not None
    dtype = resolve_dtype(options.get("dtype", config.dtype), options.get("device", "auto"))
    cid = located.checkpoint_id
    key = dtype_run_key(cid, dtype)
    spec = PolicySpec(located.ref, config.tokenizer, prefix_cache_tokens=config.prefix_cache_tokens, dtype=dtype)
    if where == "local":
        from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

        fields = {"prefix_cache_tokens": config.prefix_cache_tokens, **options, "dtype": dtype}
        policy = HFPolicy.from_pretrained(located.path, _backend_config(HFPolicyConfig, fields, located.ref))
        spec = dataclasses.replace(spec, policy=policy, renderer=_renderer(policy, config.tokenizer, located.ref))
    return OpenedPolicy(spec, cid, cid, located.path, key, config.tokenizer)


def _opened_object(policy: Any, config: PolicyConfig, where: str) -> OpenedPolicy:
    """A Policy object a library caller made (tests, experiments): named by what it says it is."""
    if where == "ray":
        raise InputError(
            "executor=ray takes a policy reference, not a loaded Policy object",
            hint="pass a checkpoint dir, registry alias, http URL or scripted:* name",
        )
    if hasattr(policy, "identify"):  # an HTTPPolicy: named by what it serves
        policy.identify()
    name = str(getattr(policy, "name", type(policy).__name__))
    spec = PolicySpec(None, config.tokenizer, policy, _renderer(policy, config.tokenizer, name))
    key = server_run_key(policy)
    return OpenedPolicy(spec, name, getattr(policy, "checkpoint_id", None), None, key, config.tokenizer)


# --- the shared rules ---------------------------------------------------------------------


def resolve_dtype(dtype: str, device: str = "auto") -> str:
    """The dtype a checkpoint runs in on this machine: `auto` is bfloat16 on a CUDA device that
    supports it, else float32 (rlcycle.policy.hf.pick_dtype); any other name as it is."""
    if dtype != "auto":
        return dtype
    from rlcycle.policy.hf import pick_device, pick_dtype

    return str(pick_dtype(dtype, pick_device(device))).removeprefix("torch.")


def server_run_key(policy: Any) -> str | None:
    """`<policy_version>@<served identity>` for an identified server (None for anything else):
    run and event ids differ when something else answers behind the same URL."""
    identity = getattr(policy, "served_identity", None)
    return f"{policy.name}@{identity}" if identity else None


def dtype_run_key(name: str, dtype: str) -> str | None:
    """`<name>@<dtype>` for a checkpoint sampled in another dtype than float32 (the trainer's
    numerics), else None. Run and event ids derive from it, so a bf16 rerun is never taken for a
    float32 run's duplicate."""
    return None if dtype == "float32" else f"{name}@{dtype}"


def _renderer(policy: Any, tokenizer: str | None, ref: str) -> Any:
    """The chat renderer prompts are made with: the tokenizer given, else the policy's own."""
    from rlcycle.harness import ChatRenderer

    if tokenizer is not None:
        return ChatRenderer.from_pretrained(tokenizer)
    if getattr(policy, "tokenizer", None) is None:
        raise InputError(
            f"policy {ref!r} comes without a tokenizer", hint="pass --tokenizer DIR: the tokenizer of the served model"
        )
    return ChatRenderer(policy.tokenizer)


def _registry_path(registry: Any) -> str | None:
    """The registry directory an http backend resolves `URL#ALIAS` in."""
    if registry is None:
        return None
    return str(getattr(registry, "root", registry))


def _backend_config(cls: type, fields: Mapping[str, Any], ref: str) -> Any:
    """`cls(**fields)`, validated; unknown fields and invalid values are one error naming them."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise InputError(
            f"policy {ref}: unknown option(s) {', '.join(unknown)}", hint=f"valid options: {', '.join(sorted(names))}"
        )
    obj = cls(**fields)
    problems = obj.validate() if hasattr(obj, "validate") else []
    if problems:
        raise InputError(f"policy {ref}: " + "; ".join(problems), hint=f"see {cls.__name__}")
    return obj


__all__ = [
    "CHECKPOINT",
    "HTTP",
    "SCRIPTED",
    "Located",
    "OpenedPolicy",
    "PolicyConfig",
    "PolicySpec",
    "dtype_run_key",
    "kind_of",
    "locate",
    "open_checkpoint",
    "open_policy",
    "open_spec",
    "resolve_dtype",
    "server_policy",
]
