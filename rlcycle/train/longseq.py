"""Long sequences in train: the length limit from the model, chunked logprobs, checkpointing by
length, and the up-front check of context parallelism (docs/train.md, "Long sequences").

A 64k-token agent segment is one row. Three things make it trainable on one device:

1. **max_seq_len from the model.** `max_seq_len = none` (the default) is the model's
   `max_position_embeddings` (else `n_positions`, `max_sequence_length`, `seq_length`); a model
   config naming none of them sets no limit, and train says so. Only rows past the limit are
   dropped (`too_long`); a row longer than `micro_batch_tokens` runs alone in its own pass
   (data.py's `group_lines`).
2. **Chunked logprobs.** The vocabulary-sized logits are the largest tensor of a long pass:
   64k positions x 49,152 (SmolLM2's vocabulary) x 4 bytes = 12.9 GB, plus as much again for
   the log-softmax autograd keeps. `chunked_logprobs` takes the final hidden states of the
   completion positions only (prompt positions never reach the head), and runs head +
   log-softmax + gather `logprob_chunk_tokens` positions at a time, each chunk under
   `torch.utils.checkpoint`: backward recomputes the chunk's logits instead of storing them,
   so at most one chunk of logits lives at a time. The logprobs and the gradient are the
   unchunked ones up to float summation order (tests/test_train_long.py).
3. **Gradient checkpointing by length.** `gradient_checkpointing = "auto"` (the default)
   checkpoints a forward pass whose token slots (rows x longest row) exceed
   `checkpoint_above_tokens` (none = `micro_batch_tokens`): passes within the budget you set
   run as fast as before, and only a row longer than one pass pays the ~30 % recompute for
   activations that grow with its length. A shared-prefix pass (prefix.py) is never
   checkpointed (it fits the budget, and checkpointing would drop its KV cache).

Past one device, `context_parallel` names an existing engine (Accelerate's torch context
parallel with FSDP2, or DeepSpeed Ulysses through Accelerate). `check_context_parallel` refuses
it up front, listing every requirement this machine lacks; `parallelism_config` is what the
Accelerator gets when they hold. Neither engine was run on this project's CPU machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rlcycle.errors import InputError
from rlcycle.train.config import TrainConfig

# Where a model config keeps its context length, in the order they are tried.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


# --- max_seq_len ------------------------------------------------------------------------------------


def model_max_len(model_config) -> int | None:
    """The context length a model config declares (POSITION_KEYS), None when it names none."""
    for key in POSITION_KEYS:
        value = getattr(model_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_max_seq_len(config: TrainConfig, model, say: Callable[[str], None]) -> TrainConfig:
    """The config with `max_seq_len` set from the model when it is none (explicit values stay)."""
    if config.max_seq_len is not None:
        return config
    limit = model_max_len(getattr(model, "config", None))
    if limit is None:
        say("train: the model config names no context length: no row is dropped for length")
        return config
    return dataclasses.replace(config, max_seq_len=limit)


# --- chunked logprobs -----------------------------------------------------------------------------


def output_head(model) -> torch.nn.Module:
    """The lm_head of an HF causal LM, through DDP and peft wrappers."""
    from transformers import PreTrainedModel

    hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)
    return hf.get_output_embeddings()


def _chunk_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, temperature: torch.Tensor | None
) -> torch.Tensor:
    logits = head(hidden).float()
    if temperature is not None:
        logits = logits / temperature[:, None]
    # log π(y_t) = -cross_entropy(logits_t, y_t): log-softmax and gather in one fused op.
    return -F.cross_entropy(logits, labels, reduction="none")


def chunked_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: torch.Tensor | None,
    chunk: int,
) -> torch.Tensor:
    """log π(labels) from final hidden states [T, H], `chunk` positions at a time.

    With gradient, each chunk runs under a non-reentrant checkpoint: the forward keeps only
    the chunk's hidden states (the head's input, already alive) and its [chunk] logprobs;
    backward recomputes the chunk's [chunk, V] logits, takes their gradient and frees them
    before the next chunk. Autocast state is restored in the recompute, so bf16 matches.
    """
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    out = []
    for s in range(0, hidden.shape[0], chunk):
        args = (
            head,
            hidden[s : s + chunk],
            labels[s : s + chunk],
            None if temperature is None else temperature[s : s + chunk],
        )
        out.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if grad else _chunk_logprobs(*args))
    return torch.cat(out)


def fsdp_wrapped(model) -> bool:
    """True under FSDP (1 or 2): lm_head's weights are sharded outside the model's own forward,
    so the chunked head, which calls lm_head after the forward, is not used there."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules())


# --- gradient checkpointing by length ----------------------------------------------------------------


def wants_checkpointing(config: TrainConfig, batch) -> bool:
    """Whether this forward pass is checkpointed (see the module docstring for the rule)."""
    if config.gradient_checkpointing != "auto":
        return bool(config.gradient_checkpointing)
    return batch.prefix_ids is None and batch.input_ids.numel() > config.checkpoint_threshold


def set_checkpointing(model, on: bool) -> None:
    """Turn the per-layer checkpoint flags of a model (prepared once with
    `activation_checkpointing_enable`) on or off without re-registering anything."""
    for m in model.modules():
        if hasattr(m, "_gradient_checkpointing_func") and hasattr(m, "gradient_checkpointing"):
            m.gradient_checkpointing = on


# --- context parallelism ---------------------------------------------------------------------------


def context_parallel_missing(config: TrainConfig, env: dict[str, str] | None = None) -> list[str]:
    """What this machine and run lack for `config.context_parallel` (empty: it can be built)."""
    env = dict(os.environ) if env is None else env
    mode, size = config.context_parallel, config.context_parallel_size
    if mode == "off":
        return []
    missing = []
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2 or config.cpu:
        missing.append(f">= 2 CUDA GPUs on the node (found {gpus}{', and cpu = true' if config.cpu else ''})")
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        missing.append("NCCL (a CUDA build of torch; gloo on CPU cannot run it)")
    world = int(env.get("WORLD_SIZE", "1"))
    if world < size or world % size:
        missing.append(f"a launch of a multiple of context_parallel_size={size} processes (WORLD_SIZE={world})")
    if mode == "accelerate":
        if env.get("ACCELERATE_USE_FSDP", "").lower() != "true" or env.get("FSDP_VERSION", "1") != "2":
            missing.append("FSDP2 (`accelerate launch --config_file fsdp2.yaml`, fsdp_version: 2)")
        if config.attn_implementation != "sdpa":
            missing.append(f"attn_implementation = sdpa (torch's context parallel; got {config.attn_implementation})")
    else:
        if importlib.util.find_spec("deepspeed") is None:
            missing.append("DeepSpeed installed (pip install deepspeed)")
        if importlib.util.find_spec("flash_attn") is None:
            missing.append("FlashAttention installed (pip install flash-attn)")
        if config.attn_implementation != "flash_attention_2":
            missing.append(f"attn_implementation = flash_attention_2 (got {config.attn_implementation})")
        # Accelerate runs Ulysses only on its DeepSpeed engine, which steps inside backward:
        # loop.make_accelerator refuses it, because that breaks the exact global-batch accumulation.
        missing.append("rlcycle train support for the DeepSpeed engine (refused today: it steps inside backward)")
    return missing


def check_context_parallel(config: TrainConfig, env: dict[str, str] | None = None) -> None:
    """Raise InputError (exit 2) listing every missing requirement of `context_parallel`."""
    missing = context_parallel_missing(config, env)
    if missing:
        engine = {"accelerate": "Accelerate's context parallel (FSDP2)", "ulysses": "DeepSpeed Ulysses"}
        raise InputError(
            f"context_parallel={config.context_parallel!r} ({engine[config.context_parallel]}) cannot run here; "
            "it needs:\n  " + "\n  ".join(missing),
            hint="--set context_parallel=off: one device trains a long row alone, with chunked logprobs and "
            "gradient checkpointing (docs/train.md, Long sequences)",
        )


def parallelism_config(config: TrainConfig, world: int):
    """The Accelerate ParallelismConfig of `context_parallel` (None when off).

    accelerate: FSDP2 shards over dp_shard x cp; each forward runs inside
    `accelerator.maybe_context_parallel` (loop.py) so the sequence dimension is split cp ways.
    ulysses: sp_size over DeepSpeed with flash-attention as the core attention.
    """
    if config.context_parallel == "off":
        return None
    from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig

    size = config.context_parallel_size
    if config.context_parallel == "accelerate":
        return ParallelismConfig(dp_shard_size=world // size, cp_size=size, cp_backend="torch")
    return ParallelismConfig(
        sp_size=size,
        sp_backend="deepspeed",
        sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation=config.attn_implementation),
    )


# The per-position tensors of a pass that context parallel shards beside input_ids.
_FLAT = ("labels", "behavior", "advantage", "coef", "mask", "row", "temperature")


def data_parallel_rank(acc, config: TrainConfig) -> tuple[int, int]:
    """(data-parallel world, this process's rank in it) for the step plan: the ranks of one
    context-parallel group (consecutive ranks: cp is the innermost mesh dimension) take the
    same share of the batch, each computing its part of every sequence."""
    cp = config.context_parallel_size if config.context_parallel == "accelerate" else 1
    return acc.num_processes // cp, acc.process_index // cp


@contextlib.contextmanager
def context_parallel_pass(acc, batch, config: TrainConfig) -> Iterator:
    """One forward pass under `context_parallel = "accelerate"` (else the batch as it is).

    NOT RUN on this project's machines (no GPUs): the code path Accelerate documents
    (`accelerator.maybe_context_parallel(buffers, buffer_seq_dims)`), written to the tests'
    bookkeeping check (tests/test_train_long.py shards with a stand-in). A pass of one
    sequence without padding is split along the sequence over the cp ranks: input ids,
    positions, the keep mask and every per-token tensor (scattered to [1, L] first) are
    sharded alike, so each rank scores its own completion positions and the ranks' losses add
    up to the pass's. Any other pass (several packed sequences: torch's context parallel takes
    no block-diagonal mask) runs whole on every cp rank with its coefficients and mask / cp, so
    the cp copies add up to it once. Backward must run inside the context (loop.py does).
    """
    if config.context_parallel != "accelerate":
        yield batch
        return
    cp = config.context_parallel_size
    pos = batch.position_ids
    one_sequence = pos.shape[0] == 1 and bool((pos[0, 1:] > pos[0, :-1]).all())  # no packed restart
    if not one_sequence or batch.attention_mask is not None or batch.prefix_ids is not None:
        yield dataclasses.replace(
            batch, coef=batch.coef / cp, mask=batch.mask / cp, tokens=batch.tokens / cp, slots=batch.slots / cp
        )
        return
    keep = batch.keep
    pad = -keep.shape[1] % (2 * cp)  # torch's load balancing cuts the sequence into 2 x cp chunks
    n = keep.shape[1]
    tail = torch.arange(n, n + pad)[None]  # padding after every real token, positions running on
    ids = torch.cat([batch.input_ids, torch.zeros_like(tail)], 1)
    pos = torch.cat([batch.position_ids, tail], 1)
    keep = torch.cat([keep, torch.zeros_like(tail, dtype=torch.bool)], 1)
    dense = {}
    for name in _FLAT:
        flat = getattr(batch, name)
        if flat is not None:
            dense[name] = flat.new_zeros(keep.shape)
            dense[name][keep] = flat
    buffers = [ids, pos, keep, *dense.values()]
    with acc.maybe_context_parallel(
        buffers=buffers, buffer_seq_dims=[1] * len(buffers), no_restore_buffers=set(buffers)
    ):
        ids, pos, keep, *local = buffers  # sharded in place: this rank's part of the sequence
        flat = {name: t[keep] for name, t in zip(dense, local, strict=True)}
        share = {"tokens": batch.tokens / cp, "slots": batch.slots / cp}  # the cp ranks' counts add up once
        yield dataclasses.replace(batch, input_ids=ids, position_ids=pos, keep=keep, **flat, **share)
