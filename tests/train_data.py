"""Tiny real inputs for the train tests: a Qwen2 checkpoint built from a config, and examples.

The model is a real `transformers` Qwen2 (hidden 32, 2 layers, the sample tokenizer's 4096
vocab) with random weights; behaviour logprobs are computed *by that model* on the logged ids,
so the data starts exactly on-policy (ratio 1) unless a test perturbs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "sample_data" / "tokenizer"
VOCAB = 4096


def make_base(path: Path, seed: int = 0, tie: bool = True) -> Path:
    """A tiny Qwen2 checkpoint with the sample tokenizer at `path`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    for f in TOKENIZER.iterdir():
        shutil.copy2(f, path / f.name)
    return path


def behavior_logprobs(
    base: Path, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
) -> list[list[float]]:
    """log π_base(completion tokens | prefix), one sequence at a time (the sampler's view)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            ids = torch.tensor([p + c])
            logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
            pos = torch.arange(len(p) - 1, len(p) + len(c) - 1)
            out.append(logp[pos, torch.tensor(c)].tolist())
    return out


def make_rows(n: int, seed: int = 0, prompt_len=(3, 12), completion_len=(2, 10)) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(5, VOCAB, rng.integers(*prompt_len)).tolist() for _ in range(n)]
    comps = [rng.integers(5, VOCAB, rng.integers(*completion_len)).tolist() for _ in range(n)]
    adv = [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
    return {"prompt_ids": prompts, "completion_ids": comps, "advantage": adv}


def write_examples(
    path: Path,
    base: Path,
    rows: dict[str, list],
    versions: list[str] | None = None,
    sample_temperature: float = 1.0,
    **extra: list,
) -> Path:
    """examples.arrow with on-policy behaviour logprobs (of logits / sample_temperature, which
    also fills a `temperature` column); `extra` adds or overrides columns."""
    from rlcycle.schema import EXAMPLES, conform

    n = len(rows["prompt_ids"])
    cols = {
        "sample_id": [f"s{i}" for i in range(n)],
        "policy_version": versions or [None] * n,
        "prompt_ids": rows["prompt_ids"],
        "completion_ids": rows["completion_ids"],
        "behavior_logprobs": behavior_logprobs(base, rows["prompt_ids"], rows["completion_ids"], sample_temperature),
        "advantage": rows["advantage"],
        "weight": [1.0] * n,
        "excluded": [None] * n,
        "reward": rows["advantage"],
    }
    if sample_temperature != 1.0:
        cols["temperature"] = [sample_temperature] * n
    cols.update(extra)
    types = {
        "prompt_ids": pa.list_(pa.int32()),
        "completion_ids": pa.list_(pa.int32()),
        "behavior_logprobs": pa.list_(pa.float32()),
        "loss_mask": pa.list_(pa.int8()),
        "temperature": pa.float32(),
    }
    table = pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()})
    table = conform(table, EXAMPLES)
    from rlcycle import io as rio

    rio.write_table(table, path)
    return path


# /proc/meminfo's text with MemAvailable to fill in (kB): rlcycle/train/memory.py reads it.
MEMINFO = """MemTotal:       24576000 kB
MemFree:          512000 kB
MemAvailable:    {avail} kB
Buffers:            1024 kB
"""
