"""A prefix KV cache for the in-process backend: agent turns extend the previous prompt.

Turn k+1 of an episode is prompt_k + completion_k + tool results (harness.render), and every
episode starts with the same system prompt and tool list, so most of a prompt was already run
through the model. `PrefixCache` keeps the keys/values of past prompts and completions (up to a
token budget, least recently used first out) and hands back the longest common prefix of a new
prompt, so only the rest is prefilled.

What it changes: the reused keys/values were computed by another forward pass (a decode step,
or a prefill of a different length), equal to a fresh prefill only up to float rounding. With
the cache on, a prompt's logprobs can differ from a cold run at the 1e-6 level, and a sampled
id can flip only when its uniform lands that close to a CDF boundary. Results then depend on
what was cached before, so it is off by default (HFPolicyConfig.prefix_cache_tokens = 0).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (1, kv_heads, seq, head_dim) each


class PrefixCache:
    """Token sequences → their per-layer keys/values, bounded by `budget_tokens`."""

    def __init__(self, budget_tokens: int):
        self.budget = budget_tokens
        self._entries: OrderedDict[int, tuple[torch.Tensor, KV]] = OrderedDict()
        self._next_key = 0
        self.tokens = 0
        self.hits = 0  # prompt tokens served from the cache (for benchmarks and logs)

    def lookup(self, prompt: list[int]) -> tuple[int, KV | None]:
        """(m, kv of the first m positions) for the longest cached common prefix, m < len(prompt).

        At least one prompt token is always left to prefill: its logits start the sampling.
        """
        if not self._entries or len(prompt) < 2:
            return 0, None
        p = torch.tensor(prompt)
        best, best_key = 0, None
        for key, (ids, _) in self._entries.items():
            n = min(len(ids), len(p) - 1)
            if n <= best:
                continue
            diff = (ids[:n] != p[:n]).nonzero()
            m = int(diff[0]) if len(diff) else n
            if m > best:
                best, best_key = m, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += best
        kv = self._entries[best_key][1]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def put(self, ids: list[int], kv: KV) -> None:
        """Remember `kv` (positions 0..len(ids)-1) of `ids`; drops entries it makes redundant."""
        if self.budget <= 0 or len(ids) > self.budget:
            return
        t = torch.tensor(ids)
        for key in [k for k, (e, _) in self._entries.items() if len(e) <= len(t) and torch.equal(e, t[: len(e)])]:
            self._drop(key)  # a prefix of the new entry: the new one serves it too
        self._entries[self._next_key] = (t, [(k.detach(), v.detach()) for k, v in kv])
        self._next_key += 1
        self.tokens += len(t)
        while self.tokens > self.budget:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def _drop(self, key: int) -> None:
        ids, _ = self._entries.pop(key)
        self.tokens -= len(ids)
