"""The Accelerate training loop: one optimizer step per global batch, resumable, with metrics.

Multi-process: the same code runs under `torchrun` or `accelerate launch` (DDP; FSDP through
an Accelerate config). Every process reads the whole examples file and computes the same
schedule; each takes its token-balanced share of a step's global batch. Gradient accumulation
is manual: all but the last micro-batch of a process run under `no_sync`, and each micro-batch
loss is multiplied by the world size because DDP/FSDP *average* gradients, so the reduced
gradient is exactly Σ c_t·∇L_t over the global batch (loss.py). DeepSpeed is refused: its
engine steps inside `backward` and would need a fixed accumulation count per step.

Steps with a non-finite loss or gradient norm are skipped (no optimizer step, gradients
dropped, the LR schedule still advances) and counted; more than `max_skipped_steps` aborts.

Resume: every `save_every` steps all processes write `accelerator.save_state` (model,
optimizer, scheduler, RNG per process) into STATE/step-N.tmp, then the main process adds
trainer_state.json (step, skip count, metrics rows, fingerprint) and renames it to step-N.
A rerun with the same config, data, base and process count continues from the newest step-N
and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from rlcycle import io as rio
from rlcycle.errors import RlcycleError
from rlcycle.train import data as D
from rlcycle.train import hints as H
from rlcycle.train import longseq as LS
from rlcycle.train import loss as L
from rlcycle.train import memory as M
from rlcycle.train import prefix as PX
from rlcycle.train.config import TrainConfig

STATE_FILE = "trainer_state.json"


# --- setup ----------------------------------------------------------------------------------


def make_accelerator(config: TrainConfig):
    """An Accelerator whose process count is the one the launcher started (checked)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    cpu = config.cpu or not torch.cuda.is_available()
    # Without cpu=True, Accelerate on a CPU-only host ignores torchrun's WORLD_SIZE and every
    # process would train alone on its share: the silent failure this check exists for.
    precision = resolve_precision(config, cpu)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    _forget_other_precision(precision, cpu, launched)
    LS.check_context_parallel(config)  # refused up front, naming all it lacks (docs/train.md)
    acc = Accelerator(
        cpu=cpu,
        mixed_precision=precision,
        step_scheduler_with_optimizer=False,
        **({"parallelism_config": LS.parallelism_config(config, launched)} if config.context_parallel != "off" else {}),
    )
    if acc.num_processes != launched:
        raise RlcycleError(
            f"the launcher started {launched} processes but Accelerate sees {acc.num_processes}",
            hint="launch with `torchrun --nproc_per_node N -m rlcycle train ...` or `rlcycle train ... --processes N`",
        )
    if acc.distributed_type == DistributedType.DEEPSPEED:
        raise RlcycleError(
            "DeepSpeed is not supported by rlcycle train (its engine steps inside backward, which "
            "breaks the exact global-batch accumulation)",
            hint="use FSDP (`accelerate config` -> FSDP, FULL_SHARD is ZeRO-3's equivalent)",
        )
    return acc


def _forget_other_precision(precision: str, cpu: bool, launched: int) -> None:
    """Accelerate keeps one process-wide state and refuses a second Accelerator with another
    mixed precision; a single process that trains again (a cycle, a bench, a notebook) with
    another `precision`, or on the CPU after a GPU run, starts it afresh (device included).
    Launched processes keep theirs (one run each)."""
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if launched != 1 or not state:
        return
    device = state.get("device")
    other_device = cpu and device is not None and getattr(device, "type", "cpu") != "cpu"
    if state.get("_mixed_precision", precision) != precision or other_device:
        AcceleratorState._reset_state(reset_partial_state=True)


def resolve_precision(config: TrainConfig, cpu: bool) -> str:
    """Accelerate's mixed_precision: bf16 autocast (fp32 master weights) where supported."""
    if config.precision == "fp32":
        return "no"
    if config.precision == "bf16":
        return "bf16"
    return "bf16" if not cpu and torch.cuda.is_bf16_supported() else "no"


def load_model(path: Path, config: TrainConfig, trainable: bool = True):
    from transformers import AutoModelForCausalLM

    # fp32 master weights: bf16 weights would round away updates of lr ~1e-6.
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=config.attn_implementation
    )
    if not trainable:
        model.requires_grad_(False)
        return model.eval()
    if config.gradient_checkpointing:  # true, or auto: prepared here, switched per pass (longseq.py)
        # transformers 5 renamed it; 4.x only has the old name. Non-reentrant: works with DDP.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        LS.set_checkpointing(model, config.gradient_checkpointing is True)
    return model.train()


def build_optimizer(model, config: TrainConfig, n_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.AdamW(
            params,
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(config, n_steps))


def lr_lambda(config: TrainConfig, n_steps: int):
    """LR multiplier of step k: linear warmup, then constant / linear / cosine decay to 0."""
    warm, kind = config.warmup_steps, config.lr_schedule

    def f(k: int) -> float:
        if k < warm:
            return (k + 1) / warm
        if kind == "constant":
            return 1.0
        frac = (k - warm) / max(1, n_steps - warm)
        return max(0.0, 1.0 - frac) if kind == "linear" else 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    return f


# --- log-probabilities ---------------------------------------------------------------------------


def _forward(model, batch, device, **kw):
    """One ordinary (unshared) forward pass of a micro-batch, without a KV cache."""
    return model(
        input_ids=batch.input_ids.to(device),
        attention_mask=None if batch.attention_mask is None else batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
        **kw,
    )


def completion_logprobs(model, batch: D.Batch, device, chunk_tokens: int = 0) -> torch.Tensor:
    """ℓ_t for every completion token of the batch, float32, flat in `keep` order.

    Only completion positions are scored: prompt positions never reach the vocabulary-sized
    head. `chunk_tokens` > 0 (TrainConfig.logprob_chunk_tokens): the model returns its final
    hidden states and no logits, and longseq.chunked_logprobs applies the head that many
    positions at a time, recomputing each chunk's logits in backward. 0: the completion
    positions' logits at once (`logits_to_keep` as a boolean mask). log-softmax in float32. A
    shared-prefix pass runs its prefix once (prefix.py); the scoring is the same.
    """
    keep = batch.keep.to(device)
    if chunk_tokens > 0:
        none = torch.zeros_like(keep)  # no logits from the forward: the head runs in chunks below
        kw = {"logits_to_keep": none, "output_hidden_states": True}
        if batch.prefix_ids is not None:
            out = PX.suffix_forward(model, batch, device, **kw)
        else:
            out = _forward(model, batch, device, **kw)
        hidden = out.hidden_states[-1][keep]  # the final (normed) hidden states, completion positions
        del out
        temp = None if batch.temperature is None else batch.temperature.to(device)
        return LS.chunked_logprobs(LS.output_head(model), hidden, batch.labels.to(device), temp, chunk_tokens)
    if batch.prefix_ids is not None:  # a shared-prefix pass (prefix.py)
        logits = PX.suffix_logits(model, batch, device, keep)
    else:
        logits = _forward(model, batch, device, logits_to_keep=keep).logits
    if logits.dim() == 3:  # a model that ignores a boolean logits_to_keep returns all positions
        logits = logits[keep]
    logits = logits.float()
    if batch.temperature is not None:
        logits = logits / batch.temperature.to(device)[:, None]
    # log π(y_t) = -cross_entropy(logits_t, y_t): log-softmax and gather in one fused op.
    return -F.cross_entropy(logits, batch.labels.to(device), reduction="none")


# The packing check's limit on KL(alone || packed) per position, in nats. Measured on
# SmolLM2-135M (12 random tokens, sdpa, CPU): honest packing 7e-8 in fp32 and 2.0e-3 under bf16
# autocast (its max |Δ log p| over the vocabulary 0.28: bf16 rounding of the tail, which is why
# the check does not use that), a packed batch whose attention crosses sequences 4.7-4.9. So
# under bf16 a leak is caught when it moves predictions more than bf16 rounding can: a
# random-weight model, whose predictions barely depend on context, leaks only 3.7e-3.
PACKING_KL = {"fp32": 1e-4, "bf16": 2e-2}


def check_packing(model, device, vocab_size: int, tolerance: float) -> float:
    """Packed sequences must score as they do alone; returns the largest KL(alone || packed)
    over their positions (nats).

    A model whose attention ignores the position-id restarts would let packed sequences
    attend to each other: a silent train/inference mismatch. Raises with a hint if so.
    """
    g = torch.Generator().manual_seed(1234)
    a, b = torch.randint(0, vocab_size, (7,), generator=g), torch.randint(0, vocab_size, (5,), generator=g)
    pos = torch.cat([torch.arange(7), torch.arange(5)])[None].to(device)
    with torch.no_grad():
        alone = torch.cat(
            [F.log_softmax(model(input_ids=x[None].to(device), use_cache=False).logits[0].float(), -1) for x in (a, b)]
        )
        packed = model(input_ids=torch.cat([a, b])[None].to(device), position_ids=pos, use_cache=False).logits
        packed = F.log_softmax(packed[0].float(), -1)
    kl = float((alone.exp() * (alone - packed)).sum(-1).max())
    if not kl <= tolerance:
        diff = float((packed - alone).abs().max())
        raise RlcycleError(
            f"this model scores packed sequences differently from single ones (KL up to {kl:.3g} nats per "
            f"position, limit {tolerance:g}; max |Δ log p| = {diff:.3g}): its attention does not honour "
            "position-id restarts",
            hint="--set batching=bucketed (padding instead of packing), or attn_implementation=flash_attention_2",
        )
    return kl


# --- resumable state --------------------------------------------------------------------------------


def latest_state(state_dir: Path) -> Path | None:
    done = sorted(p for p in state_dir.glob("step-*") if (p / STATE_FILE).is_file() and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def save_state(acc, state_dir: Path, step: int, payload: dict) -> None:
    """All processes: write step-N atomically (temp dir, trainer_state.json last, rename)."""
    final = state_dir / f"step-{step:06d}"
    tmp = state_dir / f"step-{step:06d}.tmp"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    acc.save_state(str(tmp))
    acc.wait_for_everyone()
    if acc.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(payload, default=str))
        rio.replace_dir(tmp, final)
        for old in state_dir.glob("step-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


# --- the step ---------------------------------------------------------------------------------------


class Trainer:
    """Holds what a step needs; `step(k)` runs optimizer step k and returns its metrics row."""

    def __init__(
        self,
        acc,
        model,
        ref_model,
        optimizer,
        scheduler,
        ex: D.Examples,
        schedule: D.Schedule,
        config: TrainConfig,
        hint_rows: H.HintRows | None = None,
    ):
        self.acc, self.model, self.ref = acc, model, ref_model
        self.opt, self.sched = optimizer, scheduler
        self.ex, self.schedule, self.c = ex, schedule, config
        self.settings = L.LossSettings.from_config(config)
        self.m_tokens = D.max_completion_tokens(ex, config)
        self.skipped: list[int] = []
        # Under FSDP lm_head is sharded outside the forward: the logits come from the forward.
        self.chunk = 0 if LS.fsdp_wrapped(model) else config.logprob_chunk_tokens
        # Hinted self-distillation (hints.py): the teacher prompts, and the step's metrics.
        self.hint_rows = hint_rows if config.hints.on else None
        self.hint_stats = H.HintStats(acc.device, config.hints.gap_clip) if self.hint_rows is not None else None

    def _teacher(self, lines) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The hinted teacher's logprobs of this pass's completion tokens (hints.py), no gradient."""
        teacher = self.c.hints.teacher
        model = self.ref if teacher == "behavior" else self.acc.unwrap_model(self.model)
        adapter_off = model.disable_adapter() if teacher == "base" else contextlib.nullcontext()
        with adapter_off, self.acc.autocast():
            return H.teacher_logprobs(model, self.ex, self.hint_rows, H.batch_rows(lines, self.ex), self.acc.device)

    def _token_batch(self, batch: D.Batch, lines=None) -> L.TokenBatch:
        dev = self.acc.device
        ref = None
        if self.ref is not None and self.c.kl_coef > 0:  # the ref may be loaded for the hint teacher only
            with torch.no_grad():
                ref = completion_logprobs(self.ref, batch, dev, self.chunk)
        return L.TokenBatch(
            logp=completion_logprobs(self.model, batch, dev, self.chunk),
            behavior_logp=batch.behavior.to(dev),
            advantage=batch.advantage.to(dev),
            coef=batch.coef.to(dev),
            mask=batch.mask.to(dev),
            ref_logp=ref,
            row=batch.row.to(dev) if batch.row is not None else None,
            **self._hint_fields(lines),
        )

    def _hint_fields(self, lines) -> dict:
        got = self._teacher(lines) if self.hint_rows is not None and lines is not None else None
        return {} if got is None else {"teacher_logp": got[0], "hinted": got[1]}

    def _accumulate(self, plan: D.StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward/backward every micro-batch of this process; local (sums, maxes, counts)."""
        dev, world = self.acc.device, self.acc.num_processes
        sums = torch.zeros(len(L.SUM_STATS), device=dev)
        maxes = torch.full((len(L.MAX_STATS),), float("-inf"), device=dev)
        counts = torch.zeros(4, device=dev, dtype=torch.float64)  # tokens, slots, micro-batches, forward
        for k, lines in enumerate(plan.micro):
            batch = D.collate(self.ex, lines, plan.coef_of, self.c.batching == "packed", plan.dummy)
            if self.c.gradient_checkpointing == "auto":  # by this pass's length (longseq.py)
                LS.set_checkpointing(self.model, LS.wants_checkpointing(self.c, batch))
            last = k == len(plan.micro) - 1
            # Only the last backward of a process all-reduces; the others accumulate locally.
            # context_parallel_pass: this rank's part of the sequence (off: the batch as it is).
            with (
                contextlib.nullcontext() if last else self.acc.no_sync(self.model),
                LS.context_parallel_pass(self.acc, batch, self.c) as batch,
            ):
                tb = self._token_batch(batch, lines)
                loss, s, m = L.micro_loss(tb, self.settings)
                if self.hint_stats is not None:
                    self.hint_stats.observe(tb)
                # x world: DDP/FSDP average the all-reduced gradient over processes.
                self.acc.backward(loss * world)
            sums += s
            maxes = torch.maximum(maxes, m)
            counts += torch.tensor(
                [batch.tokens, batch.slots, 0 if plan.dummy else 1, batch.forward], device=dev, dtype=torch.float64
            )
        return sums, maxes, counts

    def step(self, k: int) -> dict:
        t0 = time.perf_counter()
        plan = D.plan_step(self.ex, self.schedule, k, self.c, *LS.data_parallel_rank(self.acc, self.c), self.m_tokens)
        lr = self.sched.get_last_lr()[0]
        sums, maxes, counts = self._accumulate(plan)
        sums = self.acc.reduce(sums, "sum")
        maxes = self.acc.reduce(maxes, "max")
        counts = self.acc.reduce(counts, "sum")
        max_norm = self.c.max_grad_norm if self.c.max_grad_norm > 0 else float("inf")
        grad_norm = float(self.acc.clip_grad_norm_(self.model.parameters(), max_norm))
        stats = L.summarize(sums.cpu(), maxes.cpu())
        finite = math.isfinite(stats["loss"]) and math.isfinite(grad_norm)
        if finite:
            self.opt.step()
        else:
            self.skipped.append(k + 1)
        with warnings.catch_warnings():  # a skipped first step makes torch warn about the order
            warnings.simplefilter("ignore", UserWarning)
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        tokens, slots, micro, forward = counts.tolist()
        return {
            "step": k + 1,
            "epoch": plan.epoch,
            "lr": lr,
            **stats,
            "kl_loss": stats["kl_loss"] if self.c.kl_coef > 0 else None,
            "kl_ref": stats.get("kl_ref") if self.c.kl_coef > 0 else None,
            "rows": len(plan.rows),
            "loss_tokens": plan.loss_tokens,
            "tokens": int(tokens),
            "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
            "micro_batches": int(micro),
            "sequences": plan.sequences,  # segments.py: a segment is one sequence
            "forward_tokens": int(forward),
            "unique_tokens": plan.unique_tokens,
            "world_size": self.acc.num_processes,
            "grad_norm": grad_norm,
            "skipped": not finite,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "step_seconds": seconds,
            "peak_memory_gb": M.peak_gb(self.acc.device),
            **(self.hint_stats.metrics(self.acc, self.hint_rows, plan.rows) if self.hint_stats is not None else {}),
        }
