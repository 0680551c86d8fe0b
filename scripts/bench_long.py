"""Benchmark one long sequence through `rlcycle train`: peak memory and seconds per step by length.

Issue 36 item 3. One row of L tokens (the last `--completion-fraction` of them a completion, as
in an agent segment whose turns are ~20 % generated) trains for one optimizer step, through the
real CLI in its own subprocess (benchkit.run_process: peak RSS from wait4; seconds per step from
train's own `step_seconds` metric, so model loading and saving are not counted):

    rlcycle train one_row.arrow --base TINY -o OUT --set batch_size=1 --set max_steps=1 ...

Sides, in the same run on the same rows:
- `today`: what train did before: logits for every completion position at once
  (`logprob_chunk_tokens=0`) and no checkpointing (`gradient_checkpointing=false`), with
  `max_seq_len` raised so the row is not dropped (today's default, 8,192, drops every row above
  it: `too_long`), and `micro_batch_tokens` = L so the row fits one pass as it had to;
- `chunked`: the new logprobs alone (`logprob_chunk_tokens=4096`), checkpointing off;
- `defaults`: today's defaults (chunked logprobs, `gradient_checkpointing=auto`, which turns on
  for this pass because it is longer than `micro_batch_tokens` = 8,192 — for L <= 8,192 it
  stays off).

A side that fails (killed for memory, an error) is reported as such, with its exit code: where
`today` stops is part of the result. The base is `rlcycle init-model` (tiny: hidden 256, 4 layers,
vocab 4,096) with `max_position_embeddings` = 65,536; `--smollm2` adds SmolLM2-135M's shape
(Llama, hidden 576, 30 layers, vocab 49,152) at its longest context, 8,192, with random weights
when its GGUF is not on disk (the cost of a step does not depend on the weights' values).

    .venv/bin/python scripts/bench_long.py                                  # 2k, 4k, 8k (~2 min)
    .venv/bin/python scripts/bench_long.py --lengths 8192,16384,32768,65536 --runs 1
    .venv/bin/python scripts/bench_long.py --lengths 8192 --smollm2 --runs 1 --json

`--head-sweep`: instead, the logprob head alone (lm_head + log-softmax + gather, forward and
backward, `rlcycle.train.longseq.chunked_logprobs`) over `--positions` completion positions
with a `--vocab`-sized head of SmolLM2's width (576), one subprocess per `--chunks` size (0 =
all at once, the baseline): seconds and peak RSS, to choose `logprob_chunk_tokens`.

    .venv/bin/python scripts/bench_long.py --head-sweep --positions 13107 --vocab 49152 --chunks 0,512,1024,2048,4096
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import benchkit
import pyarrow as pa
import pyarrow.ipc as ipc

REPO = Path(__file__).resolve().parent.parent
SIDES = {
    "today": {"logprob_chunk_tokens": 0, "gradient_checkpointing": "false"},
    "chunked": {"logprob_chunk_tokens": 4096, "gradient_checkpointing": "false"},
    "defaults": {},
}
SMOLLM2 = dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)


def parse_args():
    ap = benchkit.parser(__doc__, runs=1)
    ap.add_argument("--lengths", default="2048,4096,8192", help="sequence lengths in tokens, comma list")
    ap.add_argument("--completion-fraction", type=float, default=0.2, help="share of the row that is completion")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma list of {', '.join(SIDES)}")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M's shape at 8,192 tokens")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds one side may run")
    ap.add_argument("--head-sweep", action="store_true", help="measure the logprob head alone per chunk size")
    ap.add_argument("--positions", type=int, default=13107, help="--head-sweep: completion positions")
    ap.add_argument("--vocab", type=int, default=49152, help="--head-sweep: vocabulary size")
    ap.add_argument("--chunks", default="0,1024,4096", help="--head-sweep: chunk sizes (0 = unchunked)")
    args = ap.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    args.sides = [s for s in args.sides.split(",") if s.strip()]
    if not args.sides or "today" not in args.sides or any(s not in SIDES for s in args.sides):
        ap.error(f"--sides: a comma list of {', '.join(SIDES)} that includes today (the baseline)")
    return args


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlcycle", *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def tiny_base(root: Path) -> Path:
    base = root / "tiny64k"
    p = benchkit.run_process(
        cli("init-model", "-o", str(base), "--set", "max_position_embeddings=65536", "--force", "--json"), env=env()
    )
    if p.returncode:
        raise SystemExit(f"init-model failed:\n{p.stderr}")
    return base


def smollm2_base(root: Path) -> tuple[Path, str]:
    """SmolLM2-135M's checkpoint: the real one when its GGUF is on disk, else its shape."""
    from transformers import AutoConfig, AutoModelForCausalLM

    base = root / "smollm2"
    try:
        from rlcycle.policy.gguf import preset_gguf

        gguf = preset_gguf("smollm2-135m", None, download=False)
        p = benchkit.run_process(cli("init-model", "-o", str(base), "--from-gguf", str(gguf), "--force"), env=env())
        if p.returncode == 0:
            return base, "SmolLM2-135M (real weights)"
    except Exception as e:  # not installed: the shape is what the cost depends on
        benchkit.progress(f"bench_long: SmolLM2-135M's weights are not on disk ({e}); using its shape")
    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**SMOLLM2))
    model.save_pretrained(base)
    # train needs a tokenizer beside the weights; it never tokenizes (the row is token ids).
    for f in (REPO / "sample_data" / "tokenizer").iterdir():
        shutil.copy2(f, base / f.name)
    return base, "SmolLM2-135M shape (random weights)"


def write_row(path: Path, length: int, fraction: float, vocab: int, seed: int) -> None:
    """One row of `length` tokens, the last `fraction` a completion, with flat behaviour logprobs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_comp = max(1, int(length * fraction))
    ids = rng.integers(5, vocab, length).astype(np.int32)
    table = pa.table(
        {
            "prompt_ids": pa.array([ids[: length - n_comp]], type=pa.list_(pa.int32())),
            "completion_ids": pa.array([ids[length - n_comp :]], type=pa.list_(pa.int32())),
            "behavior_logprobs": pa.array([[-8.0] * n_comp], type=pa.list_(pa.float32())),
            "policy_version": pa.array([None], type=pa.string()),
            "advantage": pa.array([1.0], type=pa.float32()),
        }
    )
    with ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)


def train_once(base: Path, row: Path, out: Path, length: int, side: str, timeout: int) -> dict:
    sets = {
        "batch_size": 1,
        "max_steps": 1,
        "save_every": 0,
        "max_policy_lag": "none",
        "optimizer": "sgd",
        "precision": "fp32",
        **({"max_seq_len": length, "micro_batch_tokens": max(length, 8192)} if side == "today" else {}),
        **SIDES[side],
    }
    args = ["train", str(row), "--base", str(base), "-o", str(out), "--overwrite", "--json"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    p = benchkit.run_process(["timeout", "-k", "10", str(timeout), *cli(*args)], env=env())
    if p.returncode:
        last = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
        why = "killed (out of memory?)" if p.returncode in (-9, 137) else "timed out" if p.returncode == 124 else last
        return {"ok": False, "why": f"exit {p.returncode}: {why}", "rss_mb": p.rss_mb}
    metrics = ipc.open_file(str(out / "train_metrics.arrow")).read_all().to_pylist()[0]
    return {"ok": True, "step_s": metrics["step_seconds"], "rss_mb": p.rss_mb, "tokens": metrics["tokens"]}


def measure(label: str, base: Path, vocab: int, lengths: list[int], args, root: Path):
    """(tables, rows of the printed grid) for one model."""
    secs: dict[str, list[float]] = {}
    rss: dict[str, list[float]] = {}
    grid = []
    for length in lengths:
        row = root / f"row{length}.arrow"
        write_row(row, length, args.completion_fraction, vocab, seed=length)
        for side in args.sides:
            for run in range(args.runs):
                benchkit.progress(f"bench_long: {label} L={length} {side} run {run + 1}/{args.runs}")
                r = train_once(base, row, root / "out", length, side, args.timeout)
                grid.append({"model": label, "length": length, "side": side, **r})
                if r["ok"]:
                    secs.setdefault(f"{length} {side}", []).append(r["step_s"])
                    rss.setdefault(f"{length} {side}", []).append(r["rss_mb"])
    tables = []
    for length in lengths:
        base_key = f"{length} today"
        if base_key not in secs:
            continue  # today's path failed at this length: the grid says how
        for title, unit, d in (("s/step", "seconds", secs), ("peak RSS", "MB", rss)):
            sides = {k: v for k, v in d.items() if k.startswith(f"{length} ")}
            tables.append(benchkit.Table(f"{label}, L={length}: {title}", unit, base_key, sides, False))
    return tables, grid


def grid_lines(grid: list[dict]) -> list[str]:
    lines = ["", "model | tokens | side | s/step | peak RSS MB | note", "---|---:|---|---:|---:|---"]
    for g in grid:
        s = f"{g['step_s']:.2f}" if g["ok"] else "-"
        lines.append(f"{g['model']} | {g['length']:,} | {g['side']} | {s} | {g['rss_mb']:,.0f} | {g.get('why', '')}")
    return lines


def growth_lines(grid: list[dict], lengths: list[int]) -> list[str]:
    """How each side's seconds and memory grow per doubling of the length."""
    out = []
    ok = [g for g in grid if g["ok"]]
    for model in dict.fromkeys(g["model"] for g in ok):
        for side in dict.fromkeys(g["side"] for g in ok):
            pts = sorted(
                (g["length"], g["step_s"], g["rss_mb"]) for g in ok if g["model"] == model and g["side"] == side
            )
            steps = [
                f"{a[0] // 1024}k->{b[0] // 1024}k: time x{b[1] / a[1]:.2f}, RSS x{b[2] / a[2]:.2f}"
                for a, b in zip(pts, pts[1:], strict=False)
            ]
            if steps:
                out.append(f"growth {model} {side}: " + "; ".join(steps))
    return out


HEAD = """
import sys, time, torch
from rlcycle.train.longseq import chunked_logprobs
positions, vocab, chunk = map(int, sys.argv[1:4])
torch.manual_seed(0)
head = torch.nn.Linear(576, vocab, bias=False)
hidden = torch.randn(positions, 576, requires_grad=True)
labels = torch.randint(0, vocab, (positions,))
t = time.perf_counter()
chunked_logprobs(head, hidden, labels, None, chunk or positions).sum().backward()
print(time.perf_counter() - t)
"""


def head_sweep(args) -> int:
    chunks = [int(c) for c in args.chunks.split(",")]
    secs: dict[str, list[float]] = {}
    rss: dict[str, list[float]] = {}
    for chunk in chunks:
        name = f"chunk {chunk}" if chunk else "unchunked"
        for run in range(args.runs):
            benchkit.progress(f"bench_long: head {name} run {run + 1}/{args.runs}")
            p = benchkit.run_process(
                [sys.executable, "-c", HEAD, str(args.positions), str(args.vocab), str(chunk)], env=env()
            )
            if p.returncode:
                raise SystemExit(f"head sweep {name} failed: {p.stderr[-400:]}")
            secs.setdefault(name, []).append(float(p.stdout.strip()))
            rss.setdefault(name, []).append(p.rss_mb)
    what = f"head {args.positions:,} positions x vocab {args.vocab:,}"
    baseline = "unchunked" if 0 in chunks else next(iter(secs))
    tables = [
        benchkit.Table(f"{what}: forward + backward", "seconds", baseline, secs, False),
        benchkit.Table(f"{what}: peak RSS", "MB", baseline, rss, False),
    ]
    benchkit.emit(args, "bench_long", tables)
    return 0


def main() -> int:
    args = parse_args()
    if args.head_sweep:
        return head_sweep(args)
    with tempfile.TemporaryDirectory(prefix="rlcycle-bench-long-") as tmp:
        root = Path(tmp)
        base = tiny_base(root)
        vocab = json.loads((base / "config.json").read_text())["vocab_size"]
        tables, grid = measure("tiny", base, vocab, args.lengths, args, root)
        if args.smollm2:
            smol, label = smollm2_base(root)
            t2, g2 = measure(label, smol, SMOLLM2["vocab_size"], [8192], args, root)
            tables, grid = tables + t2, grid + g2
    notes = grid_lines(grid) + growth_lines(grid, args.lengths)
    benchkit.emit(args, "bench_long", tables, notes=notes, extra={"grid": grid})
    return 0


if __name__ == "__main__":
    sys.exit(main())
