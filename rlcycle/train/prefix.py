"""Shared-prefix forward passes: the tokens every row of a pass shares are run once, with gradient.

Agent rows repeat themselves: every call of a session starts with the same system prompt and
tool list (~900 tokens), and turn k+1's prompt extends turn k's. Run as separate sequences, a
micro-batch of B such rows computes that prefix B times. Here a pass whose rows share their first
P tokens (`common_prefix`: before any completion token, and leaving every row at least its last
prompt token, whose logit scores its first completion token) runs in two forwards:

    1. the prefix, batch 1, WITH gradient and use_cache: its keys/values per layer, [1, h, P, d];
    2. the rows' suffixes (right-padded, position ids P, P+1, ..., an attention mask over
       prefix + suffix) on that KV cache repeated to B rows.

Why it is exact: a suffix token at position P + j attends to the prefix keys/values exactly as
it would in the full sequence (causal attention never lets a prefix token see the suffix, so
the prefix's states do not depend on which row follows), at the same rotary positions. So
every logprob equals the unshared one up to float summation order (tests/test_train_prefix.py:
1e-5 in fp32). The gradient is the gradient of the *same* loss: the repeat is an autograd op
whose backward sums the B rows' gradients into the one prefix forward, which is what the B
separate prefix copies would have received. Nothing is detached (model_init's warm start runs
its prefix under no_grad, which drops the prefix's share of the gradient; a trainer cannot).

Grouping (`shared_passes`, packed/bucketed batching): a process's rows are sorted by their
prompt ids, so rows sharing a prefix are adjacent and the prefix shared by a contiguous run is
the minimum of the adjacent common prefixes (a trie walked in order). A run is either one group
(cut, longest suffix first, into passes under the token budget counting the prefix once:
P + B x longest suffix <= micro_batch_tokens) or split where its adjacent common prefix is
shortest into sub-runs with longer prefixes, whichever costs fewer forward tokens. A pass of one
row, or one where sharing would not save tokens, goes back to ordinary packing. `padded`
batching keeps its schedule-order micro-batches and shares each one's common prefix.

Processes: under DDP only the suffix forward goes through the wrapper (see `suffix_logits`);
tested with 2 CPU processes. Under FSDP sharing is off (train's stage says so): the prefix
forward would be an extra FSDP forward, an all-gather the other processes may not join.

Limits: gradient checkpointing drops a layer's KV cache inside the checkpoint, so it turns
sharing off (TrainConfig.shares_prefix); attention implementations must take a KV cache and a
2-D padding mask (sdpa, eager, flash_attention_2 all do). Dropout (0 in the models rlcycle
trains) would draw one mask for the prefix instead of B.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

# Beyond this depth a run is not split further (one group): bounds recursion on long chains
# of nested prompts (the turns of one long session), at no cost in correctness.
MAX_SPLIT_DEPTH = 48


@dataclass
class SharedPass:
    """One forward pass whose rows share their first `prefix` prompt tokens (run once)."""

    rows: list[int]
    prefix: int


# --- grouping --------------------------------------------------------------------------------


def common_prefix(ex, rows: list[int]) -> int:
    """Tokens all `rows` share at the start of their prompts, leaving each >= 1 prompt token.

    Capped at (shortest prompt - 1): the logit that scores a row's first completion token sits
    at its last prompt token, which must be in the suffix forward. So the prefix never reaches
    a completion token either. A segment (segments.py) counts its first member's prompt.
    """
    first = ex.prompt.row(rows[0])
    n = min(ex.first_prompt_len(r) for r in rows) - 1
    for r in rows[1:]:
        if n <= 0:
            break
        diff = np.flatnonzero(ex.prompt.row(r)[:n] != first[:n])
        if len(diff):
            n = int(diff[0])
    return max(n, 0)


def shared_passes(
    ex, rows: list[int], seq_len: np.ndarray, budget: int, min_prefix: int
) -> tuple[list[SharedPass], list[int]]:
    """(passes that share a prefix, the rows left for ordinary packing); see the docstring."""
    order = sorted(rows, key=lambda r: (ex.prompt.row(r).tolist(), r))
    adj = [common_prefix(ex, [a, b]) for a, b in zip(order, order[1:], strict=False)]
    passes: list[SharedPass] = []
    rest: list[int] = []
    start = 0
    for k in range(len(order)):  # maximal runs whose adjacent common prefixes are all long enough
        if k == len(order) - 1 or adj[k] < min_prefix:
            if k > start:
                _, p, s = _plan_run(order[start : k + 1], adj[start:k], seq_len, budget, 0)
                passes += p
                rest += s
            else:
                rest.append(order[k])
            start = k + 1
    # Each pass's own common prefix can be longer than its run's (its rows may be closer kin).
    return [SharedPass(p.rows, common_prefix(ex, p.rows)) for p in passes], rest


def _plan_run(
    run: list[int], adj: list[int], seq_len: np.ndarray, budget: int, depth: int
) -> tuple[int, list[SharedPass], list[int]]:
    """(forward tokens, passes, unshared rows) of the cheaper of: the run as one group, or the
    run split at its shortest adjacent common prefix into sub-runs planned the same way."""
    p = min(adj)
    cost, passes, single = _one_group(run, p, seq_len, budget)
    if depth >= MAX_SPLIT_DEPTH:
        return cost, passes, single
    # Split where the common prefix is shortest: each side shares more with itself.
    split_cost, split_passes, split_single = 0, [], []
    lo = 0
    for k in range(len(run)):
        if k == len(run) - 1 or adj[k] == p:
            part = run[lo : k + 1]
            if len(part) > 1:
                c, ps, ss = _plan_run(part, adj[lo:k], seq_len, budget, depth + 1)
            else:
                c, ps, ss = _alone(part, seq_len), [], part
            split_cost, split_passes, split_single = split_cost + c, split_passes + ps, split_single + ss
            lo = k + 1
    if split_cost < cost:
        return split_cost, split_passes, split_single
    return cost, passes, single


def _one_group(run: list[int], p: int, seq_len: np.ndarray, budget: int) -> tuple[int, list[SharedPass], list[int]]:
    """The run's rows, longest first, cut into passes with P + B x longest suffix <= budget."""
    by_len = sorted(run, key=lambda r: (-int(seq_len[r]), r))
    groups: list[list[int]] = []
    for r in by_len:
        g = groups[-1] if groups else None
        if g is not None and p + (len(g) + 1) * (int(seq_len[g[0]]) - p) <= budget:
            g.append(r)
        else:
            groups.append([r])
    cost, passes, single = 0, [], []
    for g in groups:
        shared = p + len(g) * (int(seq_len[g[0]]) - p)
        if len(g) > 1 and shared < _alone(g, seq_len):
            cost += shared
            passes.append(SharedPass(g, p))
        else:  # one row, or padding would eat the saving: ordinary packing (no padding)
            cost += _alone(g, seq_len)
            single += g
    return cost, passes, single


def _alone(rows: list[int], seq_len: np.ndarray) -> int:
    return int(sum(int(seq_len[r]) for r in rows))


def padded_pass(ex, rows: list[int], min_prefix: int) -> SharedPass | list[list[int]]:
    """`padded` batching: the micro-batch as it is, sharing its common prefix when long enough."""
    p = common_prefix(ex, rows) if len(rows) > 1 else 0
    return SharedPass(list(rows), p) if p >= min_prefix else [[r] for r in rows]


# --- the forward -------------------------------------------------------------------------------


def suffix_logits(model, batch, device, keep):
    """The logits that score the completion tokens of a shared-prefix batch (`batch.prefix_ids`
    set): the prefix once with gradient, then the suffixes on its KV cache. loop.py's
    `completion_logprobs` turns them into log-probabilities, as for an ordinary batch."""
    return suffix_forward(model, batch, device, logits_to_keep=keep).logits


def suffix_forward(model, batch, device, **kw):
    """The suffix forward's model output (`kw`: logits_to_keep, output_hidden_states...)."""
    import torch

    prefix = batch.prefix_ids.to(device)[None]
    n_rows = batch.input_ids.shape[0]
    cache_kw = cache_kwarg(model)
    # No logit of the prefix scores a completion token: keep none (no vocab-sized output).
    none = torch.zeros(prefix.shape[1], dtype=torch.bool, device=device)
    # Under DDP the prefix runs on the wrapped module: a DDP forward may broadcast buffers (a
    # collective), and the other processes, which may run an ordinary pass, would not join it.
    # Its gradient still reaches DDP's reducer: the hooks are on the parameters, and the
    # suffix forward below, through the wrapper, prepares the reduction for the backward.
    # (FSDP would need its wrapper for both forwards, a collective the others may not join:
    # train's stage turns sharing off under FSDP.)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    out = inner(input_ids=prefix, use_cache=True, logits_to_keep=none)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        raise RuntimeError("the model returned no KV cache for the shared prefix (use_cache=True)")
    # An autograd op: backward sums the rows' gradients into the one prefix forward.
    cache.batch_repeat_interleave(n_rows)
    return model(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),  # [B, P + L]: the prefix, then the row
        position_ids=batch.position_ids.to(device),  # P, P+1, ...: the positions in the full row
        use_cache=True,
        **kw,
        **{cache_kw: cache},
    )


def cache_kwarg(model) -> str:
    """`cache` in newer transformers, `past_key_values` before: read off the wrapped HF model
    (under DDP, FSDP or peft the outer forward takes **kwargs)."""
    from transformers import PreTrainedModel

    hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
