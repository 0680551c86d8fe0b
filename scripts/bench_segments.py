"""Tokens run forward per unique token trained, segments vs per turn (issue 36 item 2's budget).

Builds the 60-turn log shape directly as a delta-layout examples.arrow (rlcycle/prompts.py):
`--sessions` sessions of `--turns` turns; turn 0's prompt is a `--system`-token system prompt
(the same in every session) plus the task, and every turn adds `--turn-tokens` tokens
(`--generated` of them the completion, the rest tool output appended to the next prompt), so
turn t+1's prompt extends turn t's context token for token. The base is a tiny Qwen2 (random
weights, 65,536 positions, so no row is too long).

Per mode, train's own step plan over one whole epoch (data.plan_step; nothing is run for it):
tokens run forward (a segment once, a shared prefix once, no padding), the unique tokens of
the rows trained (segments.unique_tokens over every kept row) and their ratio. Modes:

    segments              train's default: a session's turns are one sequence
    per_turn              segments=false, share_prefix=false: every row from its own context
    per_turn+prefix       segments=false, share_prefix=true: rows of a pass share their prefix

One step takes one session (batch_size = turns). `--time-steps N` (N > 0) then runs N real
optimizer steps of each mode through `rlcycle.train.stage.run` and reports seconds per step
(train_metrics' step_seconds): keep the shape small on a CPU, since the per-turn steps run
sum over turns of t x turn-tokens tokens each.

    .venv/bin/python scripts/bench_segments.py                              # the 60-turn log: ratios
    .venv/bin/python scripts/bench_segments.py --sessions 2 --turns 8 --time-steps 1
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import benchkit
import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VOCAB = 4096
MODES = {
    "segments": {"segments": True, "share_prefix": False},
    "per_turn": {"segments": False, "share_prefix": False},
    "per_turn+prefix": {"segments": False, "share_prefix": True},
}


def make_base(path: Path) -> Path:
    """`rlcycle init-model`'s tiny model (its tokenizer's 4,096 ids) with 65,536 positions."""
    from rlcycle import model_init

    return Path(model_init.run(model_init.InitModelConfig(seed=0, max_position_embeddings=65536), path).path)


def write_log(path: Path, sessions: int, turns: int, system: int, turn_tokens: int, generated: int, seed: int) -> dict:
    """The delta-layout examples file; returns its shape."""
    from rlcycle import io as rio

    rng = np.random.default_rng(seed)
    sys_ids = rng.integers(5, VOCAB, system).tolist()
    cols: dict[str, list] = {
        k: []
        for k in (
            "sample_id",
            "session_id",
            "prompt_parent",
            "prompt_shared",
            "prompt_added",
            "completion_ids",
            "behavior_logprobs",
            "advantage",
        )
    }
    tool = turn_tokens - generated
    for s in range(sessions):
        adv = float(rng.choice([-1.0, 1.0]))
        ctx_len = 0
        for t in range(turns):
            # Turn 0: the system prompt and the task; then the tool output of the previous call.
            added = sys_ids + rng.integers(5, VOCAB, tool).tolist() if t == 0 else rng.integers(5, VOCAB, tool).tolist()
            comp = rng.integers(5, VOCAB, generated).tolist()
            cols["sample_id"].append(f"s{s}t{t}")
            cols["session_id"].append(f"s{s}")
            cols["prompt_parent"].append(f"s{s}t{t - 1}" if t else None)
            cols["prompt_shared"].append(ctx_len)
            cols["prompt_added"].append(added)
            cols["completion_ids"].append(comp)
            cols["behavior_logprobs"].append([-8.3] * generated)  # ~log(1/4096): ratios near 1
            cols["advantage"].append(adv)
            ctx_len += len(added) + len(comp)
    n = len(cols["sample_id"])
    types = {
        "prompt_shared": pa.int32(),
        "prompt_added": pa.list_(pa.int32()),
        "completion_ids": pa.list_(pa.int32()),
        "behavior_logprobs": pa.list_(pa.float32()),
        "advantage": pa.float32(),
    }
    table = pa.table({k: pa.array(v, types.get(k)) for k, v in cols.items()})
    table = table.append_column("prompt_ids", pa.nulls(n, pa.list_(pa.int32())))
    table = table.append_column("policy_version", pa.nulls(n, pa.string()))
    rio.write_table(table, path)
    return {"sessions": sessions, "turns": turns, "rows": n, "last_context": ctx_len}


def config_of(mode: str, turns: int, **kw):
    from rlcycle.train.config import TrainConfig

    return TrainConfig(
        batch_size=turns, shuffle=False, max_policy_lag=None, save_every=0, min_shared_prefix=64, **MODES[mode], **kw
    )


def plan(path: Path, mode: str, turns: int) -> dict:
    """Tokens run forward over one epoch, from train's own step plan (no forward is run)."""
    from rlcycle.train import data as D
    from rlcycle.train import segments as SG
    from rlcycle.train.prefix import SharedPass

    config = config_of(mode, turns, max_seq_len=65536)
    ex = D.load_examples([str(path)], config, [], VOCAB)
    schedule = D.Schedule(len(ex), config, ex.segments)
    m = D.max_completion_tokens(ex, config)
    seq_len = ex.seq_len
    forward, sequences = 0, 0
    for k in range(schedule.n_steps):
        p = D.plan_step(ex, schedule, k, config, 1, 0, m)
        sequences += p.sequences
        for batch in p.micro:  # as collate's Batch.forward: a shared prefix once, no padding
            if isinstance(batch, SharedPass):
                forward += batch.prefix + sum(int(seq_len[r]) - batch.prefix for r in batch.rows)
            else:
                forward += sum(int(seq_len[r]) for line in batch for r in line)
    unique = SG.unique_tokens(ex, np.arange(len(ex)))
    return {
        "rows": len(ex),
        "steps": schedule.n_steps,
        "sequences": sequences,
        "forward_tokens": forward,
        "unique_tokens": unique,
        "ratio": forward / unique,
    }


def time_steps(path: Path, base: Path, mode: str, turns: int, steps: int, work: Path) -> dict:
    from rlcycle import io as rio
    from rlcycle.train import stage

    config = config_of(mode, turns, max_steps=steps, lr=1e-5)
    stage.run(config, str(path), base, work / f"out-{mode}", quiet=True, overwrite=True)
    rows = rio.read_table(work / f"out-{mode}" / stage.METRICS_FILE).to_pylist()
    secs = [r["step_seconds"] for r in rows]
    return {
        "step_seconds": secs,
        "seconds_per_step": float(np.median(secs)),
        "forward_tokens_per_step": [r["forward_tokens"] for r in rows],
        "unique_tokens_per_step": [r["unique_tokens"] for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    ap = benchkit.parser(__doc__.split("\n\n")[0], runs=1, runs_help="timed train runs per mode (with --time-steps)")
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--turn-tokens", type=int, default=1000, help="tokens each turn adds (completion + tool output)")
    ap.add_argument("--generated", type=int, default=200, help="of which the completion")
    ap.add_argument("--system", type=int, default=400, help="system prompt tokens, shared by every session")
    ap.add_argument("--time-steps", type=int, default=0, help="real optimizer steps to time per mode (0: none)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench_segments-"))
    try:
        path = work / "examples.arrow"
        shape = write_log(path, a.sessions, a.turns, a.system, a.turn_tokens, a.generated, a.seed)
        out = {"shape": shape, "plan": {m: plan(path, m, a.turns) for m in modes}}
        if a.time_steps > 0:
            base = make_base(work / "base")
            out["timed"] = {}
            for m in modes:  # --runs timed runs; the median of their per-run median s/step
                runs = [time_steps(path, base, m, a.turns, a.time_steps, work) for _ in range(a.runs)]
                out["timed"][m] = {
                    **runs[-1],
                    "seconds_per_step": float(np.median([r["seconds_per_step"] for r in runs])),
                }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    s = shape
    print(
        f"{s['sessions']} sessions x {s['turns']} turns ({a.turn_tokens} tokens a turn, {a.generated} generated; "
        f"{a.system}-token system prompt), {s['rows']} rows, last context {s['last_context']:,} tokens"
    )
    print(
        f"{'mode':<17} {'steps':>5} {'sequences':>9} {'forward tokens':>15} {'unique tokens':>14} {'ratio':>7}  s/step"
    )
    for m in modes:
        p = out["plan"][m]
        t = out.get("timed", {}).get(m)
        secs = f"{t['seconds_per_step']:.2f}" if t else "-"
        print(
            f"{m:<17} {p['steps']:>5} {p['sequences']:>9} {p['forward_tokens']:>15,} {p['unique_tokens']:>14,} "
            f"{p['ratio']:>6.2f}x  {secs}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
