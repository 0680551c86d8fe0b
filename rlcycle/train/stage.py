"""train: examples + a base checkpoint in, an updated HF checkpoint out.

In:  `examples.arrow` (distill's output; one or more Arrow/Parquet files) and a base checkpoint
     directory (HF format, with its tokenizer; `rlcycle.json` if rlcycle wrote it).
Out: OUT/ — loadable by `AutoModelForCausalLM.from_pretrained(OUT)` as it is, with the base's
     tokenizer, `rlcycle.json` (id, parent, lineage, data hashes, config, metrics) and
     `train_metrics.arrow` (one row per optimizer step); and a `TrainResult`. With LoRA
     (lora.r > 0) only the adapters train; OUT/ holds the *merged* model as above plus
     OUT/adapter/ (adapter_model.safetensors + adapter_config.json, peft's format; docs/lora.md);
     a base trained with LoRA continues its adapter (lora.continue_adapter), so a chain's adapters
     are all deltas from its first base.

    rlcycle train runs/demo/examples.arrow --base checkpoints/base -o runs/demo/checkpoint

Flow, top to bottom: set up Accelerate and check the process count -> read the base -> read
and filter the examples (data.py: every dropped row counted by reason) -> the step schedule ->
model, optimizer, LR schedule through `accelerator.prepare` -> resume from OUT.state if it
holds this run -> one optimizer step per global batch (loop.py; the loss is loss.py) ->
save the checkpoint atomically (checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlcycle import console
from rlcycle import io as rio
from rlcycle.digest import file_sha256
from rlcycle.errors import InputError, RlcycleError
from rlcycle.train import checkpoint as C
from rlcycle.train import data as D
from rlcycle.train import hints as H
from rlcycle.train import longseq, loop, memory
from rlcycle.train import segments as SG
from rlcycle.train.config import TrainConfig

METRICS_FILE = "train_metrics.arrow"
ADAPTER_DIR = "adapter"  # OUT/adapter/: the LoRA adapter in peft's format (lora.r > 0)
# KL(μ‖π) per token at step 1 above which the sampler and this base evidently differ.
MISMATCH_WARN = 0.5
# Config fields that do not change the result: a run may resume with them changed.
_NOT_FINGERPRINTED = {"stop_after", "save_every", "keep_state", "resume", "state_dir", "max_skipped_steps"}

_F = pa.float64()
TRAIN_METRICS_SCHEMA = pa.schema(
    [
        ("step", pa.int32()),
        ("epoch", pa.int32()),
        ("lr", _F),
        ("loss", _F),
        ("pg_loss", _F),
        ("kl_loss", _F),
        ("rows", pa.int32()),
        ("loss_tokens", pa.int64()),
        ("tokens", pa.int64()),
        ("padding_fraction", _F),
        ("micro_batches", pa.int32()),
        ("sequences", pa.int32()),
        ("forward_tokens", pa.int64()),
        ("unique_tokens", pa.int64()),
        ("world_size", pa.int32()),
        ("ratio_mean", _F),
        ("ratio_min", _F),
        ("ratio_max", _F),
        ("log_ratio_mean", _F),
        ("mismatch_kl", _F),
        ("seq_ratio_min", _F),
        ("seq_ratio_max", _F),
        ("seq_log_ratio_std", _F),
        ("ess", _F),
        ("clip_frac", _F),
        ("clip_frac_low", _F),
        ("clip_frac_high", _F),
        ("is_frac", _F),
        ("kl_ref", _F),
        ("grad_norm", _F),
        ("skipped", pa.bool_()),
        ("tokens_per_s", _F),
        ("step_seconds", _F),
        ("peak_memory_gb", _F),
        # Hinted self-distillation (train/hints.py; null when hints.coef = 0).
        ("hint_rows_frac", _F),
        ("hint_tokens", pa.int64()),
        ("hint_gap_mean", _F),
        ("hint_gap_p99", _F),
        ("hint_clip_frac", _F),
        ("hint_loss", _F),
        ("hint_ngram_overlap", _F),
    ],
    metadata={b"rlcycle.schema": b"train_metrics", b"rlcycle.schema_version": b"1"},
)


@dataclass
class TrainResult:
    output: str | None  # None when the run stopped early (stop_after)
    metrics_path: str | None
    checkpoint_id: str | None
    parent_id: str
    steps: int = 0
    steps_total: int = 0
    skipped_steps: list[int] = field(default_factory=list)
    rows_in: int = 0
    rows_used: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    excluded_reasons: dict[str, int] = field(default_factory=dict)
    version_counts: dict[str, int] = field(default_factory=dict)
    world_size: int = 1
    resumed_from: int | None = None
    stopped: bool = False
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run(
    config: TrainConfig,
    examples: list[str] | str,
    base: str | Path,
    out: str | Path,
    *,
    metrics_path: str | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    registry: str | Path | None = None,
) -> TrainResult:
    """Train `base` (a checkpoint directory, or an alias or id of `registry`, opened like every
    policy reference: rlcycle/policy/open.py) on `examples` into `out`; see the module docstring."""
    from accelerate.utils import set_seed

    from rlcycle.policy.open import open_checkpoint

    started = time.monotonic()
    paths = [examples] if isinstance(examples, (str, Path)) else list(examples)
    paths, out = [str(p) for p in paths], Path(out)
    acc = loop.make_accelerator(config)
    say = console.info if acc.is_main_process and not quiet else (lambda _m: None)
    config = _fsdp_without_sharing(acc, config, say)
    H.check(config, config.lora_r)  # before any model is loaded
    set_seed(config.seed)
    C.check_output(out, overwrite)
    base_info = C.read_base(open_checkpoint(base, registry, what="--base").path or base)
    model = loop.load_model(base_info.path, config)
    adapter_base = None
    if config.lora_r > 0:
        model, adapter_base = apply_lora(model, config, base_info)
        if adapter_base["id"] != base_info.id:
            say(f"train: continuing the adapter of {base_info.path} (delta from {adapter_base['id']})")
    vocab = model.get_input_embeddings().num_embeddings
    config = longseq.resolve_max_seq_len(config, model, say)  # none: the model's context length
    versions = list(config.policy_versions) or base_info.lineage
    ex = D.load_examples(paths, config, versions, vocab)
    _check_rows(ex, config, versions, paths)
    schedule = D.Schedule(len(ex), config, ex.segments)
    say(_start_line(ex, schedule, config, acc))
    optimizer, scheduler = loop.build_optimizer(model, config, schedule.n_steps)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    ref = None
    if config.kl_coef > 0 or (config.hints.on and config.hints.teacher == "behavior"):
        ref = acc.prepare_model(loop.load_model(base_info.path, config, trainable=False), evaluation_mode=True)
    if config.batching == "packed":
        loop.check_packing(
            model, acc.device, vocab, loop.PACKING_KL["bf16" if acc.mixed_precision == "bf16" else "fp32"]
        )
    data_hashes = [{"path": p, "sha256": file_sha256(p)} for p in paths]
    state_dir = Path(config.state_dir) if config.state_dir else out.parent / f"{out.name}.state"
    fp = _fingerprint(config, data_hashes, base_info.id, acc.num_processes)
    start, rows, skipped = _resume(acc, config, state_dir, fp)
    trainer = loop.Trainer(
        acc, model, ref, optimizer, scheduler, ex, schedule, config, _hint_rows(ex, base_info, config, say)
    )
    trainer.skipped = skipped
    result = TrainResult(
        None,
        None,
        None,
        base_info.id,
        steps_total=schedule.n_steps,
        rows_in=ex.rows_in,
        rows_used=len(ex),
        dropped=dict(ex.dropped),
        excluded_reasons=dict(ex.excluded_reasons),
        version_counts=dict(ex.version_counts),
        world_size=acc.num_processes,
        resumed_from=start or None,
    )
    if start:
        say(f"train: resuming from step {start} ({state_dir})")
    result.stopped = _train(trainer, acc, config, schedule, start, rows, state_dir, fp, quiet)
    result.steps, result.skipped_steps = len(rows), list(trainer.skipped)
    result.summary = summarize_run(rows, ex)
    if not result.stopped:
        meta = {
            "stage": "train",
            "base": str(base_info.path),
            "data": data_hashes,
            "config": dataclasses.asdict(config),
            "metrics": result.summary,
        }
        if config.lora_r > 0:
            meta["adapter"] = {
                "dir": ADAPTER_DIR,
                "r": config.lora_r,
                "alpha": config.lora_alpha,
                "target_modules": list(config.lora.target_modules),
                "base": adapter_base,
            }
        _save(acc, model, base_info, out, meta, rows, config, result, metrics_path)
        if acc.is_main_process and not config.keep_state:
            shutil.rmtree(state_dir, ignore_errors=True)
    acc.wait_for_everyone()
    result.seconds = time.monotonic() - started
    return result


def _hint_rows(ex: D.Examples, base_info: C.BaseInfo, config: TrainConfig, say) -> H.HintRows | None:
    """The hinted teacher's prompts (train/hints.py), when the hint term is on."""
    if not config.hints.on:
        return None
    splicer = H.Splicer.from_pretrained(base_info.path, config.hints.role)
    rows = H.prepare(ex, ex.hint, splicer, config.hints.ngram)
    say(
        f"train: hints on {rows.with_hint - rows.no_header:,} of {len(ex):,} rows "
        f"(teacher {config.hints.teacher}, {config.hints.mode}, λ={config.hints.coef:g}"
        + (f"; {rows.no_header:,} prompts without the assistant header left out" if rows.no_header else "")
        + ")"
    )
    return rows


def _fsdp_without_sharing(acc, config: TrainConfig, say) -> TrainConfig:
    """share_prefix off under FSDP: its prefix forward would be one more FSDP forward (an
    all-gather) that processes running an ordinary pass would not join."""
    from accelerate.utils import DistributedType

    if not (config.shares_prefix and acc.distributed_type == DistributedType.FSDP):
        return config
    say("share_prefix: off under FSDP (each forward is a collective; docs/train.md)")
    return dataclasses.replace(config, share_prefix=False)


def _train(
    trainer: loop.Trainer,
    acc,
    config: TrainConfig,
    schedule: D.Schedule,
    start: int,
    rows: list[dict],
    state_dir: Path,
    fp: str,
    quiet: bool,
) -> bool:
    """Steps start..n; appends metrics rows; True when stopped early by stop_after."""
    progress = console.Progress("train", quiet=quiet or not acc.is_main_process)
    memory_warned = False
    for k in range(start, schedule.n_steps):
        row = trainer.step(k)
        rows.append(row)
        if not memory_warned and acc.is_main_process and not quiet:
            low = memory.pressure(acc.device)
            if low:
                console.warn(f"step {k + 1}: {low}")
                memory_warned = True
        if k == 0 and acc.is_main_process and not quiet and (row.get("mismatch_kl") or 0) > MISMATCH_WARN:
            console.warn(
                f"step 1: the behaviour logprobs are far from this base (mismatch KL "
                f"{row['mismatch_kl']:.3g}, ESS {_g(row.get('ess'))}): were the examples sampled "
                "from another checkpoint, with tempered logprobs (use_sample_temperature), or "
                "another tokenizer/template?"
            )
        if k == 0 and acc.is_main_process and not quiet:
            _warn_sequence_spread(row)
        progress.update(
            step=f"{k + 1}/{schedule.n_steps}",
            loss=_g(row["loss"]),
            ratio=_g(row.get("ratio_mean")),
            clip=_g(row.get("clip_frac")),
            tok_s=_g(row["tokens_per_s"]),
        )
        if len(trainer.skipped) > config.max_skipped_steps:
            raise RlcycleError(
                f"training aborted: {len(trainer.skipped)} steps had a non-finite loss or gradient "
                f"(steps {', '.join(map(str, trainer.skipped[:10]))}; max_skipped_steps={config.max_skipped_steps})",
                hint="lower lr, look for extreme advantages or weights in the examples, or raise "
                f"--set max_skipped_steps; the last saved state is in {state_dir}",
            )
        done = k + 1
        if config.save_every and done % config.save_every == 0 and done < schedule.n_steps:
            payload = {"step": done, "fingerprint": fp, "skipped": trainer.skipped, "metrics": rows}
            loop.save_state(acc, state_dir, done, payload)
        if config.stop_after is not None and done >= config.stop_after and done < schedule.n_steps:
            return True
    return False


def _resume(acc, config: TrainConfig, state_dir: Path, fp: str) -> tuple[int, list[dict], list[int]]:
    """(first step, metrics rows so far, skipped steps) from the newest saved state, if any."""
    if not config.resume:
        if acc.is_main_process:
            shutil.rmtree(state_dir, ignore_errors=True)
        acc.wait_for_everyone()
        return 0, [], []
    latest = loop.latest_state(state_dir) if state_dir.is_dir() else None
    if latest is None:
        return 0, [], []
    payload = json.loads((latest / loop.STATE_FILE).read_text())
    if payload.get("fingerprint") != fp:
        raise InputError(
            f"{state_dir} holds the state of another run (its config, data, base or process count differ)",
            hint=f"remove {state_dir}, or pass --no-resume to start over",
        )
    acc.load_state(str(latest))
    return int(payload["step"]), list(payload["metrics"]), list(payload["skipped"])


def _save(
    acc,
    model,
    base_info: C.BaseInfo,
    out: Path,
    meta: dict,
    rows: list[dict],
    config: TrainConfig,
    result: TrainResult,
    metrics_path: str | None,
) -> None:
    """All processes gather the weights (FSDP); the main process writes the checkpoint."""
    acc.wait_for_everyone()
    state_dict = acc.get_state_dict(model)
    if not acc.is_main_process:
        return
    unwrapped = acc.unwrap_model(model)
    if config.gradient_checkpointing:
        disable = (
            getattr(unwrapped, "activation_checkpointing_disable", None) or unwrapped.gradient_checkpointing_disable
        )
        disable()
    extra: dict[str, Path] = {}
    if config.lora_r > 0:
        # The adapter first (peft's files, loadable by PeftModel and vLLM), then the merged model.
        extra[ADAPTER_DIR] = save_adapter(unwrapped, Path(meta["adapter"]["base"]["path"]), out)
        unwrapped = unwrapped.merge_and_unload()
        state_dict = unwrapped.state_dict()
    table = metrics_table(rows)
    if metrics_path:
        rio.write_table(table, metrics_path)
        result.metrics_path = metrics_path
    else:
        tmp = out.parent / f".{out.name}.{METRICS_FILE}"
        out.parent.mkdir(parents=True, exist_ok=True)
        rio.write_table(table, tmp)
        extra[METRICS_FILE] = tmp
        result.metrics_path = str(out / METRICS_FILE)
    dtype = C.save_dtype(config.save_dtype, base_info)
    try:
        result.checkpoint_id = C.write_checkpoint(unwrapped, state_dict, base_info, out, meta, dtype, extra)
    finally:
        for tmp in extra.values():  # moved into OUT on success; left behind only on failure
            if Path(tmp).is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                Path(tmp).unlink(missing_ok=True)
    result.output = str(out)


def apply_lora(model, config: TrainConfig, base_info: C.BaseInfo):
    """Wrap `model` in peft LoRA adapters (only they train): (model, the adapter's base {id, path}).

    A base that carries an adapter (a previous LoRA run, rlcycle.json `adapter`) continues it when
    `lora.continue_adapter` (default): its adapter is loaded and its delta subtracted from the
    merged weights, so the model is unchanged (to float rounding) and the adapter this run saves
    is still the delta from the chain's first base, the one a LoRA server keeps loaded.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise RlcycleError(
            f"lora.r={config.lora_r} needs peft, which is not installed",
            hint="pip install 'rlcycle[lora]'  (or --set lora.r=0 for a full fine-tune)",
        ) from None
    mods = list(config.lora.target_modules)
    spec = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora.dropout,
        target_modules="all-linear" if mods == ["all-linear"] else mods,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        model = get_peft_model(model, spec)
    except ValueError as e:
        import torch

        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise InputError(
            f"lora.target_modules={','.join(mods)}: {e}",
            hint=f"this model's linear layers are named {', '.join(linear)} (or use all-linear)",
        ) from None
    prev = base_info.meta.get("adapter")
    if not (prev and config.lora.continue_adapter):
        return model, {"id": base_info.id, "path": str(base_info.path.resolve())}
    return model, _continue_adapter(model, config, base_info, prev)


def _continue_adapter(model, config: TrainConfig, base_info: C.BaseInfo, prev: dict) -> dict:
    """Load the base's adapter into `model` and unmerge it; the adapter's base {id, path}."""
    import torch
    from peft import set_peft_model_state_dict
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import load_file

    here = base_info.path / prev.get("dir", ADAPTER_DIR)
    wanted = {"r": config.lora_r, "alpha": config.lora_alpha, "target_modules": list(config.lora.target_modules)}
    differs = [f"{k}={prev.get(k)!r} (now {v!r})" for k, v in wanted.items() if prev.get(k) != v]
    if differs or not (here / "adapter_model.safetensors").is_file():
        raise InputError(
            f"--base {base_info.path} carries a LoRA adapter that this run cannot continue: "
            + ("; ".join(differs) if differs else f"{here}/adapter_model.safetensors is missing"),
            hint="train with the same lora.r, lora.alpha and lora.target_modules, or --set "
            "lora.continue_adapter=false (a new adapter, the delta from this base's merged weights)",
        )
    result = set_peft_model_state_dict(model, load_file(str(here / "adapter_model.safetensors")))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [k for k in (getattr(result, "missing_keys", []) or []) if "lora_" in k]
    if unexpected or missing:
        raise InputError(
            f"{here}: the adapter does not fit this model (unexpected {unexpected[:3]}, missing {missing[:3]})",
            hint="--set lora.continue_adapter=false",
        )
    with torch.no_grad():  # base = merged - delta: the model computes what the merged base did
        for layer in model.modules():
            if isinstance(layer, LoraLayer):
                for name in layer.active_adapters:
                    layer.get_base_layer().weight -= layer.get_delta_weight(name)
    root = prev.get("base") or {}
    if not root.get("path"):  # an adapter saved before `base` was recorded: peft's own field
        doc = json.loads((here / "adapter_config.json").read_text())
        root = {"id": root.get("id"), "path": doc.get("base_model_name_or_path")}
    return root


def save_adapter(peft_model, adapter_base: Path, out: Path) -> Path:
    """peft's adapter files (adapter_model.safetensors, adapter_config.json) in a temp dir beside OUT."""
    tmp = out.parent / f".{out.name}.{ADAPTER_DIR}"
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(tmp), safe_serialization=True)
    # peft records the path it loaded; record the adapter's own base (the chain's first), absolute.
    cfg_path = tmp / "adapter_config.json"
    doc = json.loads(cfg_path.read_text())
    doc["base_model_name_or_path"] = str(adapter_base)
    cfg_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (tmp / "README.md").unlink(missing_ok=True)  # peft's model-card template: not the adapter
    return tmp


def metrics_table(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in TRAIN_METRICS_SCHEMA}
    return pa.Table.from_pydict(cols, schema=TRAIN_METRICS_SCHEMA)


def summarize_run(rows: list[dict], ex: D.Examples) -> dict[str, Any]:
    """Means over the steps that were not skipped, plus totals (rlcycle.json `metrics`)."""
    ok = [r for r in rows if not r["skipped"]]
    out: dict[str, Any] = {
        "steps": len(rows),
        "skipped_steps": len(rows) - len(ok),
        "rows_used": len(ex),
        "rows_dropped": dict(ex.dropped),
        "tokens": sum(r["tokens"] for r in rows),
        "loss_tokens": sum(r["loss_tokens"] for r in rows),
        **SG.segment_stats(ex),
        # Tokens the forwards ran, and the unique tokens of the rows trained (segments.py).
        "forward_tokens": sum(r.get("forward_tokens") or 0 for r in rows),
        "unique_tokens": sum(r.get("unique_tokens") or 0 for r in rows),
    }
    out["forward_per_unique"] = out["forward_tokens"] / out["unique_tokens"] if out["unique_tokens"] else None
    for key in (
        "loss",
        "ratio_mean",
        "mismatch_kl",
        "seq_log_ratio_std",
        "ess",
        "clip_frac",
        "is_frac",
        "kl_ref",
        "grad_norm",
        "padding_fraction",
        "tokens_per_s",
    ):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out[f"{key}_mean"] = sum(vals) / len(vals) if vals else None
    for key in ("seq_ratio_min", "seq_ratio_max", "seq_log_ratio_std"):  # step 1: the serving mismatch itself
        out[f"{key}_first"] = ok[0].get(key) if ok else None
    peaks = [r["peak_memory_gb"] for r in rows if r.get("peak_memory_gb") is not None]
    out["peak_memory_gb_max"] = max(peaks) if peaks else None
    out["loss_first"] = ok[0]["loss"] if ok else None
    out["loss_last"] = ok[-1]["loss"] if ok else None
    return out


SEQ_RATIO_WARN = 2.0  # step 1: warn when some sequence's e^Σlog r is beyond [1/2, 2]


def _warn_sequence_spread(row: dict) -> None:
    """At step 1 the policy has not moved, so the sequence-level ratios are the sampler's
    mismatch alone; a bf16 server spreads them to ~0.3-2 over 64 tokens (docs/vllm.md)."""
    lo, hi = row.get("seq_ratio_min"), row.get("seq_ratio_max")
    if lo is None or hi is None or (hi <= SEQ_RATIO_WARN and lo >= 1 / SEQ_RATIO_WARN):
        return
    console.warn(
        f"step 1: the sequence-level ratios e^Σlog r span {lo:.3g}-{hi:.3g} before any update "
        f"(token mismatch KL {_g(row.get('mismatch_kl'))}): the sampler's logprobs drift from this "
        "trainer's along sequences (e.g. a bfloat16 server). The per-token IS correction "
        "(is_mode=truncate) bounds it; serve in float32 to remove it (docs/vllm.md)"
    )


def _fingerprint(config: TrainConfig, data_hashes: list[dict], base_id: str, world: int) -> str:
    cfg = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_FINGERPRINTED}
    doc = {"config": cfg, "data": [d["sha256"] for d in data_hashes], "base": base_id, "world": world}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _check_rows(ex: D.Examples, config: TrainConfig, versions: list[str], paths: list[str]) -> None:
    if len(ex) and D.Schedule(len(ex), config, ex.segments).n_steps:
        return
    why = ", ".join(f"{k}={v}" for k, v in Counter(ex.dropped).most_common()) or "the file is empty"
    hint = "check the examples with `rlcycle inspect`"
    if ex.dropped.get("unknown_policy_version") or ex.dropped.get("stale"):
        hint = (
            f"the known policy versions (oldest first) are {versions[-5:]}; pass --set "
            "policy_versions=v1,v2 or --set max_policy_lag=none to skip the staleness check"
        )
    elif len(ex) and config.drop_last:
        hint = f"{len(ex)} rows is less than batch_size={config.batch_size}; lower it or drop drop_last"
    raise InputError(f"no trainable rows in {', '.join(paths)} ({ex.rows_in} rows read; dropped: {why})", hint=hint)


def _start_line(ex: D.Examples, schedule: D.Schedule, config: TrainConfig, acc) -> str:
    dropped = ", ".join(f"{k}={v}" for k, v in ex.dropped.most_common()) or "none"
    return (
        f"train: {len(ex):,} of {ex.rows_in:,} rows usable (dropped: {dropped}); "
        f"{schedule.n_steps} steps of {config.batch_size} rows, objective={config.objective} "
        f"({config.norm} normalisation), {acc.num_processes} process(es) on {acc.device}, "
        f"precision={acc.mixed_precision}"
    )


def _g(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def format_summary(r: TrainResult) -> str:
    """The human-readable lines `rlcycle train` prints on stderr after a run."""
    s = r.summary
    lines = [
        f"train: {r.steps} steps ({len(r.skipped_steps)} skipped) on {r.world_size} process(es) in {r.seconds:.1f}s"
        + (f", resumed from step {r.resumed_from}" if r.resumed_from else ""),
        f"  rows           {r.rows_used:,} used of {r.rows_in:,}",
    ]
    for reason, n in sorted(r.dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {n:>8,}  dropped: {reason}")
    lines += [
        f"  tokens         {s.get('tokens', 0):,} ({s.get('loss_tokens', 0):,} trained on), "
        f"{_g(s.get('tokens_per_s_mean'))} tokens/s, padding {_g(s.get('padding_fraction_mean'))}",
        f"  segments       {s.get('segments', 0):,} sequences for the rows ({s.get('rows_in_segments', 0):,} rows in "
        f"multi-turn segments, up to {s.get('segment_rows_max', 0):,} rows), {s.get('sessions', 0):,} sessions: "
        f"{_g(s.get('segments_per_session_mean'))} segments per session (max {s.get('segments_per_session_max') or 0})",
        f"  forward        {s.get('forward_tokens', 0):,} tokens run for {s.get('unique_tokens', 0):,} unique "
        f"({_g(s.get('forward_per_unique'))}x)",
        f"  loss           first {_g(s.get('loss_first'))}, last {_g(s.get('loss_last'))}",
        f"  off-policy     ratio {_g(s.get('ratio_mean_mean'))}, mismatch KL {_g(s.get('mismatch_kl_mean'))}, "
        f"ESS {_g(s.get('ess_mean'))}, clip {_g(s.get('clip_frac_mean'))}, IS-capped {_g(s.get('is_frac_mean'))}",
        f"  sequence ratio e^Σlog r at step 1: {_g(s.get('seq_ratio_min_first'))}-{_g(s.get('seq_ratio_max_first'))} "
        f"(std of Σlog r {_g(s.get('seq_log_ratio_std_first'))}; docs/vllm.md: bf16 serving)",
        f"  memory         peak {_g(s.get('peak_memory_gb_max'))} GB (CPU: process RSS; CUDA: allocated)",
        f"  checkpoint     {r.output} (id {_short(r.checkpoint_id)}, parent {_short(r.parent_id)})",
        f"  metrics        {r.metrics_path}",
    ]
    return "\n".join(lines)


def _short(cid: str | None) -> str:
    """sha256:0123456789ab... -> sha256:0123456789ab (12 hex digits)."""
    if not cid:
        return "-"
    head, sep, tail = cid.rpartition(":") if ":" in cid else ("", "", cid)
    return f"{head}{sep}{tail[:12]}"
