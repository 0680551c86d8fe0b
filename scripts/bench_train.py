"""Benchmark `rlcycle train` batching: sequence packing vs naive padding, in the same run.

The model is the default tiny Qwen2 shape (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab
4096, random weights); the examples have long-tailed lengths like agent turns (prompt 32-1024
tokens, completion 8-256). Each batching mode trains the same steps on the same rows:

- padded   (baseline): rows in schedule order, `micro_batch_size` per forward, padded to the
           longest: what a plain DataLoader + collator does;
- bucketed: rows sorted by length, padded, under a token budget;
- packed:  whole sequences concatenated under the token budget, no padding at all.

Printed: real tokens/s (padding excluded; the median step, best of interleaved rounds), the
padding fraction, forward passes per step, and each mode's speed as a ratio to the baseline.
Speed is measured, never asserted (CONVENTIONS.md §17).

    .venv/bin/python scripts/bench_train.py                        # 12 steps of 16 rows, 2 rounds
    .venv/bin/python scripts/bench_train.py --steps 4 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def make_base(path: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    for f in (REPO / "sample_data" / "tokenizer").iterdir():
        shutil.copy2(f, path / f.name)
    return path


def make_examples(path: Path, n: int, seed: int = 0) -> Path:
    """Long-tailed lengths (log-uniform); behaviour logprobs are placeholders (speed only)."""
    from rlcycle import io as rio
    from rlcycle.schema import EXAMPLES, conform

    rng = np.random.default_rng(seed)
    plen = np.exp(rng.uniform(np.log(32), np.log(1024), n)).astype(int)
    clen = np.exp(rng.uniform(np.log(8), np.log(256), n)).astype(int)
    cols = {
        "prompt_ids": [rng.integers(5, 4096, k).tolist() for k in plen],
        "completion_ids": [rng.integers(5, 4096, k).tolist() for k in clen],
        "behavior_logprobs": [[-8.3] * k for k in clen],
        "advantage": rng.choice([-1.0, 1.0], n).tolist(),
        "policy_version": ["bench"] * n,
    }
    types = {"prompt_ids": pa.list_(pa.int32()), "completion_ids": pa.list_(pa.int32()),
             "behavior_logprobs": pa.list_(pa.float32())}  # fmt: skip
    rio.write_table(conform(pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()}), EXAMPLES), path)
    return path


def run_mode(mode: str, out: Path, base: Path, examples: Path, steps: int, batch: int) -> dict:
    """One training run; tokens/s is the median over its steps after the first (warm-up)."""
    from rlcycle import io as rio
    from rlcycle.train import stage
    from rlcycle.train.config import TrainConfig

    cfg = TrainConfig(batching=mode, batch_size=batch, max_steps=steps, micro_batch_tokens=4096,
                      micro_batch_size=4, max_seq_len=2048, max_policy_lag=None, save_every=0,
                      lr=1e-5, shuffle=True, seed=0)  # fmt: skip
    stage.run(cfg, examples, base, out, overwrite=True, quiet=True)
    rows = rio.read_table(out / stage.METRICS_FILE).to_pylist()[1:]
    return {
        "mode": mode,
        "tokens_per_s": statistics.median(r["tokens"] / r["step_seconds"] for r in rows),
        "padding": statistics.mean(r["padding_fraction"] for r in rows),
        "micro": statistics.mean(r["micro_batches"] for r in rows),
    }


MODES = ("padded", "bucketed", "packed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per mode (the first is not timed)")
    ap.add_argument("--batch", type=int, default=16, help="rows per step")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each mode keeps its best")
    args, _ = ap.parse_known_args()  # `scripts/dev.sh bench` passes every bench the same args
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="rlcycle-bench-train-") as tmp:
        root = Path(tmp)
        base = make_base(root / "base")
        examples = make_examples(root / "examples.arrow", args.steps * args.batch)
        # Rounds interleave the modes and each keeps its best round, so a burst of load from
        # other processes on a shared machine does not decide the comparison.
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for m in MODES:
                r = run_mode(m, root / f"out-{m}", base, examples, args.steps, args.batch)
                if m not in best or r["tokens_per_s"] > best[m]["tokens_per_s"]:
                    best[m] = r
        results = [best[m] for m in MODES]
    baseline = results[0]["tokens_per_s"]
    print(f"rlcycle train batching: median of {args.steps - 1} timed steps of {args.batch} rows, "
          f"best of {args.rounds} rounds (default tiny Qwen2 shape, fp32)")  # fmt: skip
    print(f"{'mode':<10} {'tokens/s':>10} {'padding':>9} {'passes/step':>12} {'vs padded':>10}")
    for r in results:
        print(f"{r['mode']:<10} {r['tokens_per_s']:>10.0f} {r['padding']:>9.1%} {r['micro']:>12.1f} "
              f"{r['tokens_per_s'] / baseline:>9.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
