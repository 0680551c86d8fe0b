"""What serves the gateway's requests: loaded checkpoints, the alias router, reloads and canary.

In: a `GatewayConfig` (alias, registry, upstream or in-process options). Out: `Models`, whose
`acquire(session_id)` hands a request the `Engine` that serves it (production, or `candidate`
for a sticky canary share of sessions) and `release` gives it back.

An `Engine` is one checkpoint: its id (logged as `policy_version` and sent as the
`X-Checkpoint-Id` header), its tokenizer's `ChatRenderer`s (one per tool set), and a backend:
- in-process: an `HFPolicy` behind the shared `policy.batching.Batcher` (take what is queued,
  up to `max_batch_size`, waiting at most `batch_wait_ms`, one `generate` for all);
- upstream: `HTTPPolicy` against an OpenAI-compatible completions server (token ids in, token
  ids and logprobs out), which batches on its side. It requests the model that serves this
  checkpoint: its adapter `rlcycle-<12 hex>` as the deploy hook loads it into vLLM, or a listed
  model whose root is the checkpoint (rlcycle/policy/served.py); a checkpoint the upstream does
  not serve is an error (at start) or a failed reload, retried at every watch tick (a deploy
  moves the alias before its hook loads the adapter). So the logged `policy_version` is the
  checkpoint that answered, and a canary works upstream too: the candidate's sessions go to
  the candidate's adapter. Whether the upstream is up, and serves each engine's checkpoint
  after it comes back, is `upstream.UpstreamWatch`'s: a request is checked before it is sent,
  and a failure becomes a 502/503 for the client (never a logged event).

Reloads (`Models.reload`, called by POST /v1/rlcycle/reload and by the registry watcher): the
aliases are resolved again; a checkpoint that changed is loaded *before* anything is swapped,
then the router switches in one assignment. A request holds its engine from `acquire` to
`release`, so in-flight requests finish on the old checkpoint; an engine that has been
replaced is closed when its last request releases it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlcycle.errors import InputError, RlcycleError
from rlcycle.gateway.config import GatewayConfig
from rlcycle.gateway.upstream import UpstreamWatch
from rlcycle.harness.render import ChatRenderer
from rlcycle.harness.tools import ToolSpec
from rlcycle.policy.base import Generation, SamplingParams
from rlcycle.policy.batching import Batcher, generate_batch
from rlcycle.policy.open import Located, PolicyConfig, open_checkpoint, open_policy, server_policy
from rlcycle.policy.registry import Registry, checkpoint_id


class Engine:
    """One checkpoint that serves requests (see the module docstring)."""

    def __init__(
        self,
        cid: str,
        path: Path | None,
        policy: Any,
        tokenizer: Any,
        config: GatewayConfig,
        role: str = "production",
        in_process: bool = True,
        watch: UpstreamWatch | None = None,
    ):
        self.checkpoint_id = cid
        self.path = path
        self.policy = policy
        self.tokenizer = tokenizer
        self.role = role
        self.in_process = in_process
        self.config = config
        self.inflight = 0
        self.retired = False
        self.watch = watch  # upstream engines: the upstream's health (upstream.py)
        self.unserved: str | None = None  # why the upstream does not serve this checkpoint now
        self.unserved_since: float | None = None
        self._renderers: OrderedDict[str, ChatRenderer] = OrderedDict()
        self._lock = threading.Lock()
        if in_process:
            self._batcher = Batcher(
                generate_batch(policy), config.max_batch_size, config.batch_wait_ms, name=f"gw-batch-{cid[:15]}"
            )
        else:
            self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="gw-upstream")

    def renderer(self, tools: tuple[ToolSpec, ...]) -> ChatRenderer:
        """The renderer for one tool set (cached: a request's tools are usually the last one's)."""
        key = json.dumps([t.openai() for t in tools], sort_keys=True)
        with self._lock:
            r = self._renderers.get(key)
            if r is not None:
                self._renderers.move_to_end(key)
                return r
        r = ChatRenderer(self.tokenizer, tools=tools)
        with self._lock:
            self._renderers[key] = r
            while len(self._renderers) > 64:
                self._renderers.popitem(last=False)
        return r

    def check(self) -> None:
        """Raise `upstream.Unavailable` when this engine cannot serve now (upstream engines only)."""
        if self.watch is not None:
            self.watch.check(self)

    def submit(self, prompt: list[int], params: SamplingParams) -> Future:
        """Queue one prompt; the Future resolves to its Generation."""
        if self.in_process:
            return self._batcher.submit((prompt, params))
        return self._pool.submit(self._upstream_one, prompt, params)

    def _upstream_one(self, prompt: list[int], params: SamplingParams) -> Generation:
        start = time.perf_counter()
        try:
            [gen] = self.policy.generate([prompt], params)
        except RlcycleError as e:  # what the client gets instead, and the upstream's state
            assert self.watch is not None
            raise self.watch.failed(self, e) from None
        gen.latency_ms = (time.perf_counter() - start) * 1000.0
        return gen

    def close(self, release_policy: bool = True) -> None:
        """Stop the worker and release the model (called once nothing is in flight); a policy
        the caller owns (`Fixed`) is left open."""
        if self.in_process:
            self._batcher.close()  # runs anything still queued before the model goes
        else:
            self._pool.shutdown(wait=False)
        if release_policy:
            self.policy.close()


def session_bucket(session_id: str) -> float:
    """A session's fixed point in [0, 1): the canary takes sessions below its fraction."""
    return int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") / 2**64


class Models:
    """The router: alias → engine, canary share, reloads and the registry watcher."""

    def __init__(self, config: GatewayConfig, registry: Registry | None = None):
        self.config = config
        if registry is None and config.registry is None:
            raise InputError(
                "gateway config: `registry` is not set (the registry directory to serve from)",
                hint="set registry = DIR; `rlcycle gateway` defaults it to $RLCYCLE_HOME/registry",
            )
        self.registry = registry or Registry(config.registry)
        self.primary: Engine | None = None
        self.candidate: Engine | None = None
        self.canary_fraction = 0.0
        self.reloads = 0
        self._lock = threading.Lock()  # acquire/release/swap
        self._reload_lock = threading.Lock()  # one reload at a time
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._state_sig: tuple[int, int] | None = None
        self.upstream = (
            UpstreamWatch(self, config.upstream, config.upstream_probe_s, config.upstream_probe_timeout_s)
            if config.upstream
            else None
        )
        self.reload()

    # --- requests -------------------------------------------------------------------------
    def acquire(self, session_id: str | None) -> Engine:
        """The engine for a session (the canary's share goes to `candidate`); None: the alias's own
        (/v1/completions: what /v1/models names must be what answers)."""
        with self._lock:
            engine = self.primary
            if (
                self.candidate is not None
                and session_id is not None
                and session_bucket(session_id) < self.canary_fraction
            ):
                engine = self.candidate
            assert engine is not None
            engine.inflight += 1
            return engine

    def engines(self) -> list[Engine]:
        """The engines serving now (production, and the candidate during a canary)."""
        with self._lock:
            return [e for e in (self.primary, self.candidate) if e is not None]

    def release(self, engine: Engine) -> None:
        with self._lock:
            engine.inflight -= 1
            done = engine.retired and engine.inflight == 0
        if done:
            engine.close()

    # --- loading --------------------------------------------------------------------------
    def _resolve(self, ref: str) -> tuple[str, Path]:
        located = open_checkpoint(ref, self.registry, what="the gateway's alias")
        assert located.path is not None and located.checkpoint_id is not None
        return located.checkpoint_id, located.path

    def _load(self, cid: str, path: Path, role: str) -> Engine:
        from transformers import AutoTokenizer

        c = self.config
        if c.upstream:
            # The adapter that serves this checkpoint (rlcycle-<12 hex>, loaded by the deploy hook),
            # or the base when it is this checkpoint; an error naming the fix when neither is listed.
            # No retries here: a failed request is the client's to retry (the OpenAI SDK does), and
            # nothing is resent before the watch has re-checked a restarted upstream's identity.
            # Not identified yet: at start-up the upstream may still be loading (503 until found).
            options = {"api_key": c.upstream_api_key, "max_concurrency": 64, "retries": 0}
            policy = server_policy(Located("checkpoint", str(path), path, cid), c.upstream, options)
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(path))
                engine = Engine(cid, path, policy, tokenizer, c, role, in_process=False, watch=self.upstream)
                assert self.upstream is not None
                if self.primary is None:  # starting: down or unserved, 503 until the probe finds it
                    self.upstream.identify_at_start(engine)
                else:  # a reload: a failure keeps the old checkpoint serving (`_watch` retries)
                    policy.identify()
            except BaseException:
                policy.close()
                raise
            return engine
        options = {"device": c.device, "max_batch_size": c.max_batch_size, "num_threads": c.num_threads}
        policy = open_policy(path, PolicyConfig(dtype=c.dtype), options=options).policy
        return Engine(cid, path, policy, policy.tokenizer, c, role)

    def _canary(self, aliases: dict[str, str], state: dict[str, Any]) -> float:
        if self.config.canary_fraction is not None:
            return self.config.canary_fraction
        canary = state.get("canary") or {}
        if canary.get("alias", "production") == self.config.alias and "candidate" in aliases:
            return float(canary.get("fraction") or 0.0)
        return 0.0

    def reload(self) -> dict[str, Any]:
        """Resolve the aliases again; load what changed, then swap (in-flight requests finish)."""
        with self._reload_lock:
            self._state_sig = self._signature()
            state = self.registry.state()
            aliases = dict(state.get("aliases") or {})
            cid, path = self._resolve(self.config.alias)
            fraction = self._canary(aliases, state)
            cand = self._resolve("candidate") if fraction > 0 and "candidate" in aliases else None
            primary = self._reuse_or_load(cid, path, "production")
            candidate = self._reuse_or_load(*cand, "candidate") if cand else None
            old = [e for e in (self.primary, self.candidate) if e is not None and e not in (primary, candidate)]
            first = self.primary is None
            with self._lock:
                changed = (self.primary is not primary) or (self.candidate is not candidate)
                self.primary, self.candidate = primary, candidate
                self.canary_fraction = fraction if candidate is not None else 0.0
                idle = []
                for e in old:
                    e.retired = True
                    if e.inflight == 0:
                        idle.append(e)
            for e in idle:
                e.close()
            self.reloads += changed and not first
            return self.describe() | {"changed": changed}

    def _reuse_or_load(self, cid: str, path: Path, role: str) -> Engine:
        for e in (self.primary, self.candidate):
            if e is not None and e.checkpoint_id == cid:
                e.role = role
                return e
        return self._load(cid, path, role)

    def describe(self) -> dict[str, Any]:
        p, c = self.primary, self.candidate
        return {
            "alias": self.config.alias,
            "checkpoint_id": p.checkpoint_id if p else None,
            "candidate_id": c.checkpoint_id if c else None,
            "canary_fraction": self.canary_fraction,
            "upstream": self.config.upstream,
            "reloads": self.reloads,
        }

    # --- watching the registry ----------------------------------------------------------------
    def _signature(self) -> tuple[int, int] | None:
        try:
            st = (self.registry.root / "state.json").stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def start_watch(self) -> None:
        """Start the registry watcher and, with an upstream, its prober."""
        if self.upstream is not None:
            self.upstream.start()
        if self.config.watch_interval_s <= 0 or self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="gw-registry-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        from rlcycle import console

        failed: str | None = None
        while not self._stop.wait(self.config.watch_interval_s):
            if self._signature() == self._state_sig:
                continue
            try:
                info = self.reload()
                failed = None
                if info["changed"]:
                    console.info(
                        f"gateway: now serving {info['checkpoint_id']}"
                        + (
                            f" (canary {info['candidate_id']} at {info['canary_fraction']:g})"
                            if info["candidate_id"]
                            else ""
                        )
                    )
            except (RlcycleError, OSError, ValueError) as e:  # keep serving the old checkpoint
                # ... and retry at the next tick: a deploy moves the alias before its hook loads
                # the adapter into the upstream, so the first reload can come too early.
                self._state_sig = None
                if str(e) != failed:
                    console.warn(f"gateway: reload failed, still serving the old checkpoint (retrying): {e}")
                failed = str(e)

    def close(self) -> None:
        self._stop.set()
        if self.upstream is not None:
            self.upstream.close()
        with self._lock:
            engines = [e for e in (self.primary, self.candidate) if e is not None]
            self.primary = self.candidate = None
        for e in engines:
            e.close()


class Fixed:
    """One policy object served as it is: no registry, no reloads, no canary.

    What `gateway.start(config, policy=...)` serves: a library caller's own `Policy` (anything
    with `generate` and a `tokenizer`), e.g. the scripted stand-ins of tests and demos. It has
    `Models`' interface (acquire, release, engines, describe, reload, start_watch, close).
    `checkpoint`, the directory the policy was loaded from, when there is one, is listed as the
    model's `root` in /v1/models (as vLLM lists its --model) and its id is the `X-Checkpoint-Id`
    and logged `policy_version`; without one, the policy's `name` stands in for both.
    """

    upstream = None  # in-process only

    def __init__(self, config: GatewayConfig, policy: Any, checkpoint: Path | None = None):
        cid = checkpoint_id(checkpoint) if checkpoint is not None else str(getattr(policy, "name", config.alias))
        self.config = config
        self.primary = Engine(cid, checkpoint, policy, policy.tokenizer, config)
        self.reloads = 0

    def acquire(self, session_id: str | None) -> Engine:
        self.primary.inflight += 1  # only counted: the engine is never replaced
        return self.primary

    def release(self, engine: Engine) -> None:
        engine.inflight -= 1

    def engines(self) -> list[Engine]:
        return [self.primary]

    def describe(self) -> dict[str, Any]:
        return {
            "alias": self.config.alias,
            "checkpoint_id": self.primary.checkpoint_id,
            "candidate_id": None,
            "canary_fraction": 0.0,
            "upstream": None,
            "reloads": 0,
        }

    def reload(self) -> dict[str, Any]:
        return self.describe() | {"changed": False}

    def start_watch(self) -> None:
        pass

    def close(self) -> None:
        self.primary.close(release_policy=False)  # the caller's object: theirs to close
