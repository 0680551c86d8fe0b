"""Benchmark `rlcycle train` on agent rows: shared prefixes on vs off vs a plain padded HF loop.

The rows are what the edit-suite experiment trains on, rendered by the real harness with the
model's own tokenizer: every row's prompt is the system prompt + tool specs (identical in every
row) + the row's task text; the completion is a ~30-token tool call. With `--turns 2` each
session adds a second call whose prompt is the first call's prompt + its tool call + a tool
result. All sides train the same steps on the same rows (schedule order, no shuffle), in the
same process, fp32 on CPU (but the `--bf16` side):

- baseline:   a plain Hugging Face training loop: `micro_batch_size` rows per forward,
              right-padded with an attention mask, logits of every position, completion
              logprobs gathered, -mean(A * logprob) backward, AdamW step;
- share off:  `rlcycle train` with `share_prefix = false` (packed batching, as before);
- share on:   `rlcycle train` with `share_prefix = true` (the default): the common prefix of a
              pass runs once, with gradient, and the rows' suffixes on its KV cache;
- grad ckpt:  (`--grad-ckpt`) `rlcycle train` with gradient_checkpointing (sharing is off
              under it), to price checkpointing against `share off`;
- bf16:       (`--bf16`) `share on` under bf16 autocast (`precision = "bf16"`; fp32 master
              weights), to price it against `share on` in fp32 on a CPU with native bf16.

Printed per side: tokens/s (every row's prompt + completion tokens, whatever ran once, per
second of optimizer step: the same token count on every side) and seconds per step, the median
(min, max) over `--runs` interleaved runs (each run's own value is the median of its timed
steps), and the ratio to the baseline (scripts/benchkit.py's table; `--json`: one object).
Speed is measured, never asserted (README.md, "Development").

    .venv/bin/python scripts/bench_train.py                              # tiny default model
    .venv/bin/python scripts/bench_train.py --model runs/smol/warm --batch 8 --steps 2 \\
        --warmup 0 --runs 2 --grad-ckpt                                  # SmolLM2-135M
    .venv/bin/python scripts/bench_train.py --model SMOL --batch 16 --steps 3 --runs 1 --bf16
    .venv/bin/python scripts/bench_train.py --steps 2 --batch 4 --runs 1 --json   # a quick look
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchkit
import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TASKS = [
    "Fix the off-by-one error in utils/pagination.py: the last page is never returned",
    "Add a --verbose flag to the CLI in cli.py that prints every file it touches",
    "The test test_parse_dates fails on leap years; make it pass without changing the test",
    "Rename the function getUser to get_user everywhere, including the docs",
    "Add type hints to models/order.py and make mypy pass on it",
    "Cache the results of fetch_prices for 60 seconds; the cache must be thread-safe",
    "Make the retry loop in client.py use exponential backoff with jitter, at most 5 tries",
    "Write a unit test for merge_configs that covers nested tables and list values",
]
TOOL_RESULT = "def paginate(items, size):\n    return [items[i:i + size] for i in range(0, len(items) - size, size)]\n"


# --- rows ------------------------------------------------------------------------------------------


def agent_rows(model_dir: Path, n: int, turns: int) -> dict[str, list]:
    """n rows (sessions of `turns` calls), rendered by the harness with the model's tokenizer."""
    from rlcycle.harness import ChatRenderer, initial_messages

    renderer = ChatRenderer.from_pretrained(model_dir)
    prompts, comps = [], []
    for s in range(-(-n // turns)):
        messages = initial_messages(f"{TASKS[s % len(TASKS)]} (session {s}, repository r{s * 7919 % 1000})")
        for t in range(turns):
            call = (
                f'<tool_call>\n{{"name": "read_file", "arguments": {{"path": "src/module_{s}_{t}.py"}}}}\n</tool_call>'
            )
            prompts.append(renderer.render(messages, add_generation_prompt=True))
            comps.append(renderer.encode(call))
            messages = [*messages, {"role": "assistant", "content": call}, {"role": "tool", "content": TOOL_RESULT}]
    return {"prompt_ids": prompts[:n], "completion_ids": comps[:n]}


def write_examples(path: Path, rows: dict[str, list]) -> Path:
    """Examples with placeholder behaviour logprobs (speed only) and +-1 advantages."""
    from rlcycle import io as rio
    from rlcycle.schema import EXAMPLES, conform

    n = len(rows["prompt_ids"])
    cols = {
        **rows,
        "behavior_logprobs": [[-2.0] * len(c) for c in rows["completion_ids"]],
        "advantage": [1.0 if i % 2 == 0 else -1.0 for i in range(n)],
        "policy_version": ["bench"] * n,
    }
    types = {
        "prompt_ids": pa.list_(pa.int32()),
        "completion_ids": pa.list_(pa.int32()),
        "behavior_logprobs": pa.list_(pa.float32()),
    }
    rio.write_table(conform(pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()}), EXAMPLES), path)
    return path


# --- sides -------------------------------------------------------------------------------------------


def run_rlcycle(name: str, out: Path, base: Path, examples: Path, args, **overrides) -> list[tuple[float, float]]:
    """(tokens, seconds) of each timed step of one `rlcycle train` run."""
    from rlcycle import io as rio
    from rlcycle.train import stage
    from rlcycle.train.config import TrainConfig

    cfg = TrainConfig(
        batch_size=args.batch,
        max_steps=args.steps,
        shuffle=False,
        micro_batch_tokens=args.micro_tokens,
        max_seq_len=args.micro_tokens,
        max_policy_lag=None,
        save_every=0,
        lr=1e-6,
        cpu=True,
        **{"precision": "fp32", **overrides},
    )
    stage.run(cfg, examples, base, out, overwrite=True, quiet=True)
    rows = rio.read_table(out / stage.METRICS_FILE).to_pylist()[args.warmup :]
    return [(r["tokens"], r["step_seconds"]) for r in rows]


def run_baseline(base: Path, rows: dict[str, list], args) -> list[tuple[float, float]]:
    """A plain padded HF loop over the same steps: (tokens, seconds) of each timed step."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    seqs = [p + c for p, c in zip(rows["prompt_ids"], rows["completion_ids"], strict=True)]
    out = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        idx = list(range(step * args.batch, (step + 1) * args.batch))
        n_loss = sum(len(rows["completion_ids"][i]) for i in idx)
        for k in range(0, len(idx), args.micro_size):
            part = idx[k : k + args.micro_size]
            width = max(len(seqs[i]) for i in part)
            ids = torch.zeros((len(part), width), dtype=torch.long)
            att = torch.zeros((len(part), width), dtype=torch.long)
            for j, i in enumerate(part):
                ids[j, : len(seqs[i])] = torch.tensor(seqs[i])
                att[j, : len(seqs[i])] = 1
            logp = F.log_softmax(model(input_ids=ids, attention_mask=att).logits.float(), -1)
            loss = 0.0
            for j, i in enumerate(part):
                p, c = len(rows["prompt_ids"][i]), rows["completion_ids"][i]
                tok = logp[j, torch.arange(p - 1, p + len(c) - 1), torch.tensor(c)]
                loss = loss - (1.0 if i % 2 == 0 else -1.0) * tok.sum()
            (loss / n_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((sum(len(seqs[i]) for i in idx), time.perf_counter() - t0))
    return out[args.warmup :]


# --- main --------------------------------------------------------------------------------------------


BASELINE = "baseline (plain HF, padded)"


def parse_args():
    ap = benchkit.parser(__doc__, runs=3, runs_help="interleaved runs per side")
    ap.add_argument("--model", help="checkpoint directory (default: the tiny model of `rlcycle init-model`)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="leading steps of each run not timed")
    ap.add_argument("--batch", type=int, default=16, help="rows per step")
    ap.add_argument("--turns", type=int, default=1, help="calls per session (2: second calls extend the first)")
    ap.add_argument("--micro-tokens", type=int, default=8192, help="rlcycle's micro_batch_tokens")
    ap.add_argument("--micro-size", type=int, default=8, help="the baseline's rows per forward")
    ap.add_argument("--grad-ckpt", action="store_true", help="add a gradient-checkpointing side")
    ap.add_argument("--bf16", action="store_true", help="add a bf16-autocast side (share_prefix on)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps (at least one timed step)")
    return args


def sides_of(args, root: Path, base: Path, rows: dict, examples: Path) -> dict:
    """name -> a function running one side's steps: [(tokens, seconds)] of its timed steps."""
    sides = {
        BASELINE: lambda: run_baseline(base, rows, args),
        "rlcycle, share_prefix off": lambda: run_rlcycle("off", root / "off", base, examples, args, share_prefix=False),
        "rlcycle, share_prefix on": lambda: run_rlcycle("on", root / "on", base, examples, args, share_prefix=True),
    }
    if args.grad_ckpt:
        sides["rlcycle, gradient_checkpointing"] = lambda: run_rlcycle(
            "gc", root / "gc", base, examples, args, gradient_checkpointing=True
        )
    if args.bf16:
        sides["rlcycle, share_prefix on, bf16"] = lambda: run_rlcycle(
            "bf16", root / "bf16", base, examples, args, share_prefix=True, precision="bf16"
        )
    return sides


def main() -> None:
    args = parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    from rlcycle.model_init import init_model

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="rlcycle-bench-train-") as tmp:
        root = Path(tmp)
        base = Path(args.model) if args.model else root / "tiny"
        if not args.model:
            init_model(base)
        rows = agent_rows(base, args.steps * args.batch, args.turns)
        sides = sides_of(args, root, base, rows, write_examples(root / "examples.arrow", rows))
        tps: dict[str, list[float]] = {k: [] for k in sides}
        sps: dict[str, list[float]] = {k: [] for k in sides}
        for rep in range(args.runs):  # interleaved, so a burst of load hits every side alike
            for name, side in sides.items():
                steps = side()
                tps[name].append(statistics.median(t / s for t, s in steps))
                sps[name].append(statistics.median(s for _, s in steps))
                benchkit.progress(f"  run {rep + 1} {name}: {tps[name][-1]:.0f} tokens/s, {sps[name][-1]:.2f} s/step")
    lens = [len(p) for p in rows["prompt_ids"]]
    comp = [len(c) for c in rows["completion_ids"]]
    title = (
        f"rlcycle train on agent rows: model {args.model or 'tiny default'}, {args.batch} rows/step, "
        f"{args.steps - args.warmup} timed of {args.steps} steps, turns {args.turns}; "
        f"prompt {min(lens)}-{max(lens)} tokens (median {int(np.median(lens))}), completion median "
        f"{int(np.median(comp))}"
    )
    tables = [
        benchkit.Table(title, "tokens/s", baseline=BASELINE, samples=tps),
        benchkit.Table("seconds per optimizer step", "s/step", baseline=BASELINE, samples=sps, higher_is_better=False),
    ]
    benchkit.emit(args, "bench_train", tables, notes(args, tps))


def notes(args, tps: dict[str, list[float]]) -> list[str]:
    """The ratios between rlcycle's own sides."""
    med = {k: statistics.median(v) for k, v in tps.items()}
    off, on = med["rlcycle, share_prefix off"], med["rlcycle, share_prefix on"]
    out = [f"share_prefix on / off: {on / off:.2f}x"]
    if args.grad_ckpt:
        out.append(f"gradient_checkpointing / share_prefix off: {med['rlcycle, gradient_checkpointing'] / off:.2f}x")
    if args.bf16:
        out.append(f"bf16 autocast / fp32 (share_prefix on): {med['rlcycle, share_prefix on, bf16'] / on:.2f}x")
    return out


if __name__ == "__main__":
    main()
