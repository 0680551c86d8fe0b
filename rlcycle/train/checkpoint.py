"""Checkpoints in and out: the base's identity and lineage, and the atomic HF + rlcycle.json save.

A checkpoint directory is what `transformers.AutoModelForCausalLM.from_pretrained` loads as it
is (config.json, model*.safetensors, generation_config.json) plus its tokenizer files, copied
byte for byte from the base, and `rlcycle.json`:

    id        the content id: "sha256:" over the hashes of every file of the checkpoint but
              rlcycle's metadata (weights, adapter, configs, tokenizer; rlcycle/policy/manifest.py),
              the same function init-model and the registry use
    parent    the base's id: its rlcycle.json id, else the registry's hash of its files
    lineage   the ids from the first ancestor to this one (the policy-version order staleness uses)
    data      [{path, sha256}] of the examples files
    config    the resolved TrainConfig
    metrics   the run's summary
    adapter   with LoRA (lora.r > 0) only: {dir, r, alpha, target_modules, base: {id, path}} (base:
              the adapter's own base, the first of a chain of LoRA runs); OUT/adapter/ holds
              adapter_model.safetensors + adapter_config.json (peft's format; docs/lora.md)
    created   RFC 3339 UTC

`rlcycle.manifest.json` lists each of those files' size, mtime and sha256 (what opening and
deploying the checkpoint verify it against). The directory appears whole or not at all: it is
written under a temp name beside OUT and renamed (`rlcycle.io.atomic_dir`); the manifest comes
after the model files, and rlcycle.json is its last file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle.errors import InputError
from rlcycle.policy import manifest

RLCYCLE_JSON = "rlcycle.json"
FORMAT = "rlcycle.checkpoint/1"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class BaseInfo:
    """What train needs to know about the base checkpoint."""

    path: Path
    id: str
    lineage: list[str]
    dtype: str | None  # the config's dtype, e.g. "bfloat16"
    tokenizer_files: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # its rlcycle.json, if any


def weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    return files or sorted(path.glob("pytorch_model*.bin"))


def content_id(path: str | Path) -> str:
    """The content id of a checkpoint directory's files, hashed now (rlcycle/policy/manifest.py)."""
    return manifest.content_id(path)


def checkpoint_id(path: str | Path) -> str:
    """The id a checkpoint is known by (and served and logged as `policy_version` under):
    its rlcycle.json `id`, else the registry's hash of its files (rlcycle.policy.registry)."""
    from rlcycle.policy.registry import checkpoint_id as registry_id

    return registry_id(path)


def read_base(base: str | Path) -> BaseInfo:
    p = Path(base)
    if not p.is_dir():
        raise InputError(
            f"--base {base}: not a checkpoint directory",
            hint="pass a directory holding config.json and *.safetensors (e.g. the output of a previous train)",
        )
    problems = []
    if not (p / "config.json").is_file():
        problems.append(f"{p}: no config.json")
    if not weight_files(p):
        problems.append(f"{p}: no *.safetensors (or pytorch_model*.bin) weights")
    tok = [name for name in TOKENIZER_FILES if (p / name).is_file()]
    if not tok:
        problems.append(f"{p}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])})")
    if problems:
        raise InputError(
            f"--base {base} is not a usable checkpoint:\n  " + "\n  ".join(problems),
            hint="a base needs config.json, weights and its tokenizer (save_pretrained both)",
        )
    meta: dict[str, Any] = {}
    if (p / RLCYCLE_JSON).is_file():
        try:
            meta = json.loads((p / RLCYCLE_JSON).read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{p / RLCYCLE_JSON}: not JSON ({e})") from None
    base_id = checkpoint_id(p)
    lineage = [str(v) for v in meta.get("lineage") or []] or [base_id]
    if lineage[-1] != base_id:
        lineage.append(base_id)
    config = json.loads((p / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype")
    return BaseInfo(p, base_id, lineage, dtype if isinstance(dtype, str) else None, tok, meta)


def check_output(out: str | Path, overwrite: bool) -> Path:
    """Refuse an existing, non-empty OUT before any training happens (unless overwrite)."""
    p = Path(out)
    if p.exists() and (not p.is_dir() or any(p.iterdir())) and not overwrite:
        raise InputError(
            f"-o {out}: already exists",
            hint="choose a new directory, or pass --overwrite to replace it",
        )
    return p


def save_dtype(config_value: str, base: BaseInfo):
    import torch

    name = {"fp32": "float32", "bf16": "bfloat16"}.get(config_value, base.dtype or "float32")
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def write_checkpoint(
    model,
    state_dict: dict,
    base: BaseInfo,
    out: Path,
    meta: dict[str, Any],
    dtype,
    extra_files: dict[str, Path] | None = None,
) -> str:
    """Save `state_dict` with `model`'s config into `out` atomically; return the content id.

    Main process only. `extra_files` (name -> path, a file or a directory) are moved into the
    directory first (e.g. train_metrics.arrow, the LoRA `adapter/`); rlcycle.json is written last.
    """
    with rio.atomic_dir(out) as tmp:
        sd = {
            k: v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu() for k, v in state_dict.items()
        }
        model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
        _set_config_dtype(tmp / "config.json", dtype)  # save_pretrained writes the live model's
        for name in base.tokenizer_files:
            shutil.copy2(base.path / name, tmp / name)
        for name, src in (extra_files or {}).items():
            shutil.move(str(src), tmp / name)
        for f in tmp.rglob("*"):  # temp-file helpers create 0600 files; a checkpoint is shared
            f.chmod(0o755 if f.is_dir() else 0o644)
        ckpt_id = manifest.write_manifest(tmp).id  # after every model file, before rlcycle.json
        lineage = list(base.lineage) + ([] if ckpt_id == base.lineage[-1] else [ckpt_id])
        doc = {
            "format": FORMAT,
            "id": ckpt_id,
            "parent": base.id,
            "lineage": lineage,
            **meta,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        (tmp / RLCYCLE_JSON).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return ckpt_id


def _set_config_dtype(path: Path, dtype) -> None:
    """Record the saved weights' dtype in config.json (what from_pretrained loads by default)."""
    config = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
