"""In-process transformers backend: batched sampling with exact per-token logprobs.

What goes in: prompts as token ids and `SamplingParams` (one, or one per prompt).
What comes out: one `Generation` per prompt: sampled ids (stop token included), the logprob of
each under the distribution it was actually drawn from, the finish reason and latency.

Why a hand-written loop instead of `model.generate`: the logprob must be that of the exact
sampling distribution, every prompt needs its own seed, temperature and top-p, and finished rows
should leave the batch. The loop: prefill each prompt alone (or only what the optional prefix
cache does not hold), stack the KV caches with left padding, then one batched decode step per
token; finished rows leave the batch and the cache.

Sampling distribution, per row and step (logits in float32 whatever the model dtype):
  * temperature T > 0:  logp = log_softmax(logits / T)
  * top_p < 1:          keep the smallest set of most likely tokens whose mass under logp
                        reaches top_p (the most likely token is always kept; ties broken by a
                        stable sort, i.e. by token id), set the rest to -inf and renormalise:
                        logp = logp - logsumexp(logp over the kept set)
  * the token is drawn by inverse CDF from exp(logp) with one uniform number u in [0, 1) from
    the row's own CPU generator seeded with the request's seed;
  * the reported logprob is logp[token] of that (temperature-scaled, truncated, renormalised)
    distribution. With top_p = 1 it equals log_softmax(logits / T)[token], which is what a
    trainer recomputes with one forward pass (tests check they agree).
  * temperature 0 is greedy: token = argmax(logits), logprob = log_softmax(logits)[token]
    (the model's T = 1 distribution; top_p is ignored).

What is guaranteed:
  * same prompt, params (seed included), model, device, dtype and batch → identical ids and
    logprobs, run after run (uniforms come from CPU generators, so the random stream is the
    same on CPU and CUDA; the logits themselves are only as deterministic as the device's
    kernels, which on CUDA may need `torch.use_deterministic_algorithms`).
  * a prompt's sample does not depend on the *other* prompts of a call by construction (own
    generator, own stop rule, rows leave the batch when done). The logits do depend on the
    batch shape at the level of float rounding (padding changes reduction sizes), so ids match
    an unbatched run unless u lands within ~1e-6 of a CDF boundary (float32; wider in bf16)
    and logprobs match to ~1e-5. Tests check batched == unbatched ids on the tiny model.
"""

from __future__ import annotations

import inspect
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError
from rlcycle.policy.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    Generation,
    SamplingParams,
    check_prompts,
    per_prompt,
)
from rlcycle.policy.prefix import PrefixCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class HFPolicyConfig:
    """Options of the in-process backend."""

    device: str = cfg("auto", help="cpu, cuda, cuda:N, or auto (cuda when available).")
    dtype: str = cfg(
        "auto", help="float32, bfloat16, float16, or auto (bfloat16 on a CUDA device that supports it, else float32)."
    )
    max_batch_size: int = cfg(16, help="Prompts decoded together; more are run in chunks.")
    attn_implementation: str = cfg("sdpa", help="sdpa or eager (passed to from_pretrained).")
    batched_prefill: bool = cfg(
        False,
        help="Prefill all prompts in one padded forward instead "
        "of one by one (can be faster on a GPU for many "
        "short prompts).",
    )
    prefix_cache_tokens: int = cfg(
        0,
        help="Reuse the KV cache of past prompts/completions up to "
        "this many tokens (agent turns extend the previous "
        "prompt); 0 = off. See rlcycle/policy/prefix.py for "
        "what it does to reproducibility.",
    )
    num_threads: int | None = cfg(
        None,
        help="CPU threads torch uses while generating (restored "
        "afterwards); None leaves torch's setting. 1 is "
        "fastest for tiny models on a busy machine.",
    )

    def validate(self) -> list[str]:
        problems = []
        if self.dtype != "auto" and self.dtype not in DTYPES:
            problems.append(f"dtype={self.dtype!r}: use auto, {', '.join(DTYPES)}")
        check_range(problems, self, "max_batch_size", ge=1)
        check_range(problems, self, "num_threads", ge=1, optional=True)
        return problems


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name!r} requested but CUDA is not available", hint="use --device cpu (or auto)")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    return DTYPES[name]


# --- sampling: one step for a batch of rows ----------------------------------------------


def top_p_filter(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Truncate each row of log-probs to its top-p nucleus and renormalise.

    logp: (B, V) log-probabilities; top_p: (B,) in (0, 1]. Rows with top_p >= 1 come back
    unchanged. Kept: tokens whose preceding mass (in descending-probability order) is below
    top_p, so the first token is always kept and the kept mass is >= top_p.
    """
    if bool((top_p >= 1).all()):
        return logp
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
    sorted_p = sorted_logp.exp()
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    keep_sorted = mass_before < top_p.unsqueeze(-1)
    keep_sorted |= (top_p >= 1).unsqueeze(-1)  # untouched rows keep everything
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    masked = logp.masked_fill(~keep, float("-inf"))
    # Renormalise over the kept set: the result is the log of the truncated distribution.
    return masked - torch.logsumexp(masked, dim=-1, keepdim=True)


def sample_step(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (token ids (B,), their logprobs (B,)).

    logits: (B, V) float32; temperature, top_p: (B,) float32; u: (B,) float64 uniforms in
    [0, 1), one per row from the row's own generator (so a row's draw never depends on others).
    """
    greedy = temperature <= 0
    # Greedy rows are scored at T = 1 with no truncation (see the module docstring).
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    p = torch.where(greedy, torch.ones_like(top_p), top_p)
    logp = torch.log_softmax(logits / t.unsqueeze(-1), dim=-1)
    logp = top_p_filter(logp, p)
    # Inverse CDF in float64: the first token whose cumulative mass exceeds u * total.
    # Zero-probability (filtered) tokens add nothing to the CDF, so they can never be chosen.
    cdf = torch.cumsum(logp.double().exp(), dim=-1)
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    drawn = drawn.clamp(max=logits.shape[-1] - 1)  # u * total rounding up to the total
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, chosen


# --- the backend ----------------------------------------------------------------------


@dataclass
class _Row:
    """Book-keeping of one prompt while it decodes."""

    index: int  # position in the caller's list
    prompt: list[int]
    params: SamplingParams
    stops: frozenset[int]
    budget: int  # tokens it may still sample (max_new_tokens capped by the context)
    gen: torch.Generator
    ids: list[int]
    lps: list[float]
    done: Generation | None = None


class HFPolicy:
    """A causal LM held in this process; implements `rlcycle.policy.base.Policy`."""

    def __init__(
        self, model: Any, tokenizer: Any = None, config: HFPolicyConfig | None = None, name: str | None = None
    ):
        self.config = config or HFPolicyConfig()
        self.device = pick_device(self.config.device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or "hf-policy"
        self.vocab_size = int(model.config.vocab_size)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.default_stops = frozenset(_stop_ids(model, tokenizer))
        self.pad_id = _pad_id(model, tokenizer)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        self._lock = threading.Lock()  # one generate at a time (the server calls from threads)
        n_prefix = self.config.prefix_cache_tokens
        self.prefix = PrefixCache(n_prefix) if n_prefix > 0 else None

    @classmethod
    def from_pretrained(cls, path: str | Path, config: HFPolicyConfig | None = None) -> HFPolicy:
        """Load a model directory (HF format) and its tokenizer."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = config or HFPolicyConfig()
        problems = config.validate()
        if problems:
            raise InputError("; ".join(problems), hint="see HFPolicyConfig")
        device = pick_device(config.device)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(path), attn_implementation=config.attn_implementation, **_dtype_kw(pick_dtype(config.dtype, device))
            )
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise InputError(
                f"cannot load a policy from {path}: {e}", hint="create one with `rlcycle init-model -o DIR`"
            ) from None
        return cls(model, tokenizer, config, name=Path(path).name)

    def close(self) -> None:
        """Drop the model (frees device memory once nothing else references it)."""
        self.model = None

    # --- generation -------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        """Sample one completion per prompt (see the module docstring for the guarantees)."""
        check_prompts(prompts, self.vocab_size)
        plist = per_prompt(params, len(prompts))
        start = time.perf_counter()
        rows = [self._row(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))]
        for r in rows:
            if r.budget <= 0:  # prompt already fills the context: nothing can be sampled
                r.done = Generation([], [], FINISH_LENGTH, 0.0)
        todo = sorted((r for r in rows if r.done is None), key=lambda r: -len(r.prompt))
        size = self.config.max_batch_size
        with self._lock, torch.inference_mode(), _threads(self.config.num_threads):
            for k in range(0, len(todo), size):
                self._decode(todo[k : k + size], start)
        return [r.done for r in rows]  # type: ignore[misc]

    def _row(self, index: int, prompt: list[int], sp: SamplingParams) -> _Row:
        seed = sp.seed if sp.seed is not None else secrets.randbits(63)
        gen = torch.Generator(device="cpu").manual_seed(seed % (1 << 63))
        stops = frozenset(sp.stop_token_ids) or self.default_stops
        budget = min(sp.max_new_tokens, self.max_length - len(prompt))
        return _Row(index, list(prompt), sp, stops, budget, gen, [], [])

    def _decode(self, rows: list[_Row], start: float) -> None:
        """Prefill `rows`, then decode them together until every row stopped."""
        dev = self.device
        cache, mask, last_pos, logits = self._prefill(rows)
        temp = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=dev)
        top_p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=dev)
        live = list(rows)
        while True:
            # One uniform per live row from its own generator: batch composition never
            # changes which random number a row gets at its n-th token.
            u = torch.stack([torch.rand((), generator=r.gen, dtype=torch.float64) for r in live])
            tokens, lps = sample_step(logits, temp, top_p, u)
            keep = self._record(live, tokens.tolist(), lps.tolist(), start)
            if self.prefix and len(keep) < len(live):
                self._remember([b for b in range(len(live)) if b not in set(keep)], live, cache)
            if not keep:
                return
            if len(keep) < len(live):  # finished rows leave the batch and the cache
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                tokens, mask, last_pos = tokens[sel], mask[sel], last_pos[sel]
                temp, top_p = temp[sel], top_p[sel]
                live = [live[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            last_pos = last_pos + 1
            logits = self._forward(tokens.unsqueeze(-1), mask, last_pos.unsqueeze(-1), cache)

    def _prefill(self, rows: list[_Row]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """KV cache, attention mask, last positions and next-token logits of `rows`.

        Default: each prompt is prefilled alone (no padding, the causal fast path, and a cache
        that is bitwise what a lone run computes), then the caches are left-padded with zeros
        and stacked; the mask hides the padding. `batched_prefill` runs one padded forward.
        """
        dev = self.device
        width = max(len(r.prompt) for r in rows)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):  # left padding: every prompt ends at the last column
            mask[b, width - len(r.prompt) :] = 1
        mask = mask.to(dev)
        last_pos = torch.tensor([len(r.prompt) - 1 for r in rows], device=dev)
        if not self.config.batched_prefill and _stitchable(self.model.config):
            caches, logits = [], []
            for r in rows:
                done, kv = self.prefix.lookup(r.prompt) if self.prefix else (0, None)
                cache = _new_cache(self.model.config, kv)
                ids = torch.tensor([r.prompt[done:]], device=dev)
                pos = torch.arange(done, len(r.prompt), device=dev).unsqueeze(0)
                logits.append(self._forward(ids, None, pos, cache))
                caches.append(cache)
                if self.prefix:
                    self.prefix.put(r.prompt, _kv(cache))
            lengths = [len(r.prompt) for r in rows]
            return _stitch(caches, lengths, width, self.model.config), mask, last_pos, torch.cat(logits)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, width - len(r.prompt) :] = torch.tensor(r.prompt)
        # Positions count real tokens only, so a padded row sees the same positions as alone.
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(self.model.config)
        return cache, mask, last_pos, self._forward(ids.to(dev), mask, pos, cache)

    def _remember(self, finished: list[int], live: list[_Row], cache: Any) -> None:
        """Put finished rows' prompt + completion keys/values in the prefix cache.

        The batch cache is left-padded, so a row's n real positions are the last n; the last
        sampled token was never fed back, so n = len(prompt) + len(completion) - 1.
        """
        layers = _kv(cache)
        for b in finished:
            r = live[b]
            n = len(r.prompt) + len(r.ids) - 1
            kv = [(k[b : b + 1, :, -n:].clone(), v[b : b + 1, :, -n:].clone()) for k, v in layers]
            self.prefix.put(r.prompt + r.ids[:-1], kv)

    def _record(self, live: list[_Row], tokens: list[int], lps: list[float], start: float) -> list[int]:
        """Append each row's new token; finish rows that stopped; return the live indices."""
        keep = []
        for b, (r, t, lp) in enumerate(zip(live, tokens, lps, strict=True)):
            r.ids.append(t)
            r.lps.append(lp)
            reason = FINISH_STOP if t in r.stops else (FINISH_LENGTH if len(r.ids) >= r.budget else None)
            if reason is None:
                keep.append(b)
            else:
                ms = (time.perf_counter() - start) * 1000.0
                r.done = Generation(r.ids, r.lps, reason, ms)
        return keep

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """Logits (float32) of the last position of every row, updating `cache` in place."""
        kw: dict[str, Any] = {self._cache_kw: cache}
        if self._keep_kw:
            kw[self._keep_kw] = 1  # only the last position's logits are needed
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kw)
        return out.logits[:, -1, :].float()

    # --- scoring (the trainer's view) -------------------------------------------------
    def logprobs_at(self, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
        """log_softmax(logits / T) over the vocabulary at each completion position (row i: the
        distribution of completion[i] given prompt + completion[:i]; T = 1 when `temperature` is
        0), float32, from one forward pass, no cache."""
        ids = torch.tensor([prompt + completion], device=self.device)
        with self._lock, torch.inference_mode(), _threads(self.config.num_threads):
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        t = temperature if temperature > 0 else 1.0
        return torch.log_softmax(logits[len(prompt) - 1 : -1] / t, dim=-1)

    def score(self, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
        """log_softmax(logits / T) of each completion token, from one forward pass, no cache.

        This is what a trainer computes; comparing it with Generation.logprobs measures the
        train/inference mismatch (top_p = 1 sampling).
        """
        logp = self.logprobs_at(prompt, completion, temperature)
        return logp.gather(-1, torch.tensor(completion, device=self.device).unsqueeze(-1)).squeeze(-1).tolist()

    def top_logprobs(
        self, prompt: list[int], completion: list[int], temperature: float, k: int
    ) -> list[list[tuple[int, float]]]:
        """The k most likely tokens at each completion position and their log_softmax(logits / T)
        (T = 1 when `temperature` is 0, as `score`), most likely first; one forward pass, no
        cache. What the gateway's /v1/completions returns for `logprobs: k` (vLLM's top logprobs)."""
        if not completion or k <= 0:
            return [[] for _ in completion]
        logp = self.logprobs_at(prompt, completion, temperature)
        vals, idx = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return [list(zip(i, v, strict=True)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Run with `n` intra-op CPU threads, then restore (a no-op when n is None)."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _dtype_kw(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """`dtype=` (transformers >= 4.56) or `torch_dtype=` (older) for from_pretrained."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _stitchable(config: Any) -> bool:
    """Per-prompt prefill needs plain full-attention caches (no sliding window layers)."""
    return not (getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None))


def _kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, shaped (batch, kv_heads, seq, head_dim), across versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def _stitch(caches: list[Any], lengths: list[int], width: int, config: Any) -> Any:
    """One batch cache from single-prompt caches, each left-padded with zeros to `width`.

    Zero keys/values at masked positions get exactly zero attention weight, so a row decodes
    as if it were alone (up to the rounding of the longer reduction).
    """
    out = _new_cache(config)
    per_row = [_kv(c) for c in caches]
    for layer in range(len(per_row[0])):
        keys, values = [], []
        for kv, n in zip(per_row, lengths, strict=True):
            k, v = kv[layer]
            pad = (0, 0, width - n, 0)  # left-pad the sequence dimension (-2)
            keys.append(torch.nn.functional.pad(k, pad))
            values.append(torch.nn.functional.pad(v, pad))
        out.update(torch.cat(keys), torch.cat(values), layer)
    return out


def _new_cache(config: Any, kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """An empty DynamicCache, or one holding `kv` (copied: the source is never mutated)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:  # older transformers: no config argument
        cache = DynamicCache()
    for layer, (k, v) in enumerate(kv or []):
        cache.update(k, v, layer)
    return cache


def _stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS of the generation config and tokenizer, plus `<|im_end|>` / `<|endoftext|>`."""
    out: set[int] = set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    out.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None:
        if tokenizer.eos_token_id is not None:
            out.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_added_vocab()
        out.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)
    return out


def _pad_id(model: Any, tokenizer: Any) -> int:
    """Any valid id works for padding (masked out); prefer the declared pad token."""
    for src in (tokenizer, model.config):
        pad = getattr(src, "pad_token_id", None) if src is not None else None
        if pad is not None:
            return int(pad)
    return 0
