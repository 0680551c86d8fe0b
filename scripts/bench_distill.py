"""Benchmark `rlcycle distill` against a bare polars scan of the same trajectories file.

What it measures, in one run, on one synthetic `trajectories.arrow` (default 5M rows, cached
under bench_data/):
- scan (the baseline): `pl.scan_ipc(FILE).collect()` of every column (distill reads and writes
  every column, so the baseline materialises all of them too), then a row count;
- distill: the real command (rlcycle.cli.distill_cmd, as `rlcycle distill FILE -o OUT.arrow
  --spec sample_data/rewards.toml --quiet` runs it): every built-in signal, episode and
  session facts, caps, group baselines, monitors, reward_report.json, and the examples file.
  It writes to /dev/shm when there is one (`--out-dir` to change): the baseline writes
  nothing, so a slow disk would measure the disk, not the stage.
Each runs in its own subprocess `--runs` times (default 3), interleaved after one warm-up
scan; the tables (scripts/benchkit.py) show rows/s, with the ratio distill rows/s / scan
rows/s (target: >= 0.45, issue 36), and peak RSS: medians, min and max.

    .venv/bin/python scripts/bench_distill.py                        # 5M rows, 3 runs each
    .venv/bin/python scripts/bench_distill.py --rows 200000 --runs 1 # a quick look
    .venv/bin/python scripts/bench_distill.py --json                 # one JSON object

The synthetic trajectories follow collect's output: rows sorted by session, episode and turn,
1-5 turns per episode, ~2.5 episodes per session, a quarter of the episodes sharing their
turn-0 prompt with 3 others (GRPO-style groups), two policy versions, short token lists
(prompt 12-40 ids, completion 4-16), tool calls with statuses, edit outcomes, follow-ups and
feedback. Generated with numpy from a seed, straight into Arrow (no Python loop per row).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import benchkit
import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SYNTH_VERSION = 2  # bump when synth() changes, so a cached file is never stale
FOLLOWUPS = np.array(
    [
        "thanks, works",
        "no, revert that",
        "that's wrong, it still fails",
        "still broken on staging",
        "Getting IndexError from load",
        "yes, inclusive. go ahead",
        "perfect, thank you",
    ],
    dtype=object,
)
TOOLS = np.array(["read_file", "apply_patch", "run_tests", "write_file", "search", "finish", "ask_user"], dtype=object)
STATUSES = np.array(["ok", "ok", "ok", "ok", "error", "invalid", "timeout"], dtype=object)


def _ragged(rng: np.random.Generator, lengths: np.ndarray, values) -> pa.ListArray:
    """A list<values> column with the given row lengths."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values(int(offsets[-1])))


def _ids(prefix: str, idx: np.ndarray) -> pa.Array:
    """String ids like `ep_000123` without a Python loop (numpy fixed-width strings)."""
    return pa.array(np.char.add(prefix, np.char.zfill(idx.astype("U9"), 9)).astype(object))


def synth(n_rows: int, seed: int = 7) -> pa.Table:
    """`n_rows` trajectories (the `trajectories` contract), deterministic for a seed."""
    from rlcycle.schema import TRAJECTORIES, conform

    rng = np.random.default_rng(seed)
    lay = _layout(rng, n_rows)
    ep_of_row, ses_of_row, turn, final, n_ep = lay["ep"], lay["ses"], lay["turn"], lay["final"], lay["n_ep"]
    prompt, completion, logprobs = _token_lists(rng, lay)
    tool_calls, n_invalid, n_errors, edited = _tool_calls(rng, lay)
    proposed = np.where(edited, rng.integers(1, 40, size=n_rows), 0).astype(np.int32)
    surviving = (proposed * rng.random(n_rows)).astype(np.int32)
    has_outcome = edited & (rng.random(n_rows) < 0.9)
    fu_idx = rng.integers(0, len(FOLLOWUPS), size=n_ep)
    fu = np.where(rng.random(n_ep) < 0.6, FOLLOWUPS[fu_idx], None)[ep_of_row]
    fb_ep = np.where(rng.random(n_ep) < 0.15, rng.choice([-1.0, 1.0], size=n_ep), np.nan)[ep_of_row]
    cols = {
        "sample_id": _ids("smp_", np.arange(n_rows)),
        "episode_id": _ids("ep_", ep_of_row),
        "session_id": _ids("ses_", ses_of_row),
        "turn": pa.array(turn),
        "policy_version": pa.array(np.where(lay["version"] == 1, "policy-b", "policy-a").astype(object)),
        "ts": pa.array(lay["ts"], pa.timestamp("ms", tz="UTC")),
        "prompt_ids": prompt,
        "completion_ids": completion,
        "behavior_logprobs": logprobs,
        "tool_calls": tool_calls,
        "n_invalid_tool_calls": pa.array(n_invalid),
        "edit_lines_proposed": pa.array(proposed, mask=~has_outcome),
        "edit_lines_surviving": pa.array(surviving, mask=~has_outcome),
        "followup_text": pa.array(fu, pa.string()),
        "feedback": pa.array(fb_ep.astype(np.float32), mask=np.isnan(fb_ep)),
        "latency_ms": pa.array(rng.lognormal(7.0, 0.6, size=n_rows)),
        "is_final_turn": pa.array(final),
        "n_tool_errors": pa.array(n_errors),
        "edit_outcomes_missing": pa.array((edited & ~has_outcome).astype(np.int32)),
        "feedback_scope": pa.array(np.where(np.isnan(fb_ep), None, "episode"), pa.string()),
        "feedback_kind": pa.array(np.where(np.isnan(fb_ep), None, "thumbs"), pa.string()),
        "temperature": pa.array(np.full(n_rows, 1.0, dtype=np.float32)),
        "n_turns": pa.array(lay["n_turns"]),
    }
    return conform(pa.table(cols), TRAJECTORIES)


def _layout(rng: np.random.Generator, n_rows: int) -> dict:
    """Episodes of 1-5 turns until n_rows are covered; sessions of 1-4 episodes; 2 versions."""
    ep_turns = rng.integers(1, 6, size=n_rows // 2 + 8)
    n_ep = int(np.searchsorted(np.cumsum(ep_turns), n_rows)) + 1
    ep_turns = ep_turns[:n_ep]
    ep_turns[-1] -= int(ep_turns.sum() - n_rows)
    if ep_turns[-1] <= 0:  # the last episode absorbed the overshoot
        ep_turns[-1] = 1
        ep_turns[-2] -= int(ep_turns.sum() - n_rows)
    ep_of_row = np.repeat(np.arange(n_ep), ep_turns)
    turn = (np.arange(n_rows) - np.repeat(np.cumsum(ep_turns) - ep_turns, ep_turns)).astype(np.int32)
    final = np.repeat(np.cumsum(ep_turns) - 1, ep_turns) == np.arange(n_rows)
    ses_of_ep = np.maximum(np.cumsum(rng.random(n_ep) < 0.4) - 1, 0)
    ses_of_row = ses_of_ep[ep_of_row]
    version_of_ses = (rng.random(ses_of_ep[-1] + 1) < 0.5).astype(np.int8)
    ts = 1_796_033_700_000 + ep_of_row.astype(np.int64) * 997 + turn * 2000
    return {
        "ep": ep_of_row,
        "ses": ses_of_row,
        "turn": turn,
        "final": final,
        "n_ep": n_ep,
        "version": version_of_ses[ses_of_row],
        "ts": ts,
        "n_turns": ep_turns[ep_of_row].astype(np.int32),
    }


def _token_lists(rng: np.random.Generator, lay: dict) -> tuple[pa.ListArray, pa.ListArray, pa.ListArray]:
    """Prompt ids, completion ids and logprobs; a quarter of the episodes share a turn-0 prompt
    with 3 others (GRPO-style groups)."""
    ep_of_row, turn = lay["ep"], lay["turn"]
    prompt_seed = ep_of_row.copy()
    grouped = (ep_of_row // 4) % 4 == 0
    prompt_seed[grouped] = (ep_of_row[grouped] // 4) * 4
    p_len = (12 + turn * 6 + prompt_seed % 7).astype(np.int32)
    c_len = rng.integers(4, 17, size=turn.size).astype(np.int32)
    prompt = _ragged(rng, p_len, lambda k: pa.array(rng.integers(8, 4096, size=k, dtype=np.int32)))
    # Turn-0 prompts of one group must be identical: rebuild them from the group seed.
    first = turn == 0
    if first.any():
        vals = prompt.values.to_numpy(zero_copy_only=False).copy()
        starts = prompt.offsets.to_numpy()[:-1]
        for j in range(int(p_len[first].max())):  # every id of a turn-0 prompt, from its seed
            rows = first & (p_len > j)
            x = prompt_seed[rows].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(j)
            x ^= x >> np.uint64(31)  # splitmix64: distinct seeds give distinct prompts
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(29)
            vals[starts[rows] + j] = (x % np.uint64(4088)).astype(np.int32) + 8
        prompt = pa.ListArray.from_arrays(prompt.offsets, pa.array(vals))
    completion = _ragged(rng, c_len, lambda k: pa.array(rng.integers(8, 4096, size=k, dtype=np.int32)))
    logprobs = _ragged(rng, c_len, lambda k: pa.array(-rng.exponential(0.5, size=k).astype(np.float32)))
    return prompt, completion, logprobs


def _tool_calls(rng: np.random.Generator, lay: dict):
    """0-2 calls per sample, the final turn ending with finish or (5%) ask_user; the newer
    version breaks 3% of its calls, the older 1%. Returns the column and per-sample counts."""
    final, n_rows = lay["final"], lay["turn"].size
    n_calls = rng.integers(0, 3, size=n_rows).astype(np.int32)
    n_calls[final] = np.maximum(n_calls[final], 1)
    k = int(n_calls.sum())
    call_row = np.repeat(np.arange(n_rows), n_calls)
    last_call = np.cumsum(n_calls) - 1
    name_idx = rng.integers(0, 5, size=k)
    name_idx[last_call[final]] = np.where(rng.random(int(final.sum())) < 0.05, 6, 5)
    invalid_p = np.where(lay["version"][call_row] == 1, 0.03, 0.01)
    status = np.where(rng.random(k) < invalid_p, 5, rng.integers(0, 5, size=k))
    status[name_idx >= 5] = 0
    calls = pa.StructArray.from_arrays(
        [
            _ids("c", np.arange(k)),
            pa.array(TOOLS[name_idx]),
            pa.array(np.full(k, '{"path": "a.py"}', dtype=object)),
            pa.array(STATUSES[status]),
        ],
        names=["call_id", "name", "arguments", "status"],
    )
    per_row = lambda mask: np.bincount(call_row, weights=mask, minlength=n_rows)  # noqa: E731
    edited = per_row(((name_idx == 1) | (name_idx == 3)) & (status == 0)) > 0
    return (
        _ragged(rng, n_calls, lambda _: calls),
        per_row(status == 5).astype(np.int32),
        per_row((status == 4) | (status == 6)).astype(np.int32),
        edited,
    )


def ensure_data(n_rows: int, root: Path, seed: int) -> Path:
    """The synthetic trajectories file for (n_rows, seed), generated once and cached."""
    path = root / f"trajectories_{n_rows}_s{seed}_v{SYNTH_VERSION}.arrow"
    if path.exists():
        return path
    print(f"generating {n_rows:,} synthetic trajectories into {path} ...", file=sys.stderr)
    from rlcycle.io import write_table

    start = time.perf_counter()
    table = synth(n_rows, seed)
    # Batches of 256k rows, as collect writes them (one batch per partition/flush).
    write_table(pa.Table.from_batches(table.to_batches(max_chunksize=1 << 18)), path)
    print(f"  {time.perf_counter() - start:.1f}s, {path.stat().st_size / 1e9:.2f} GB", file=sys.stderr)
    return path


# The bare scan: every column of the same file, materialised, then counted.
SCAN = """
import sys, polars as pl
df = pl.scan_ipc(sys.argv[1]).collect()
print(df.height)
"""


def checked(cmd: list[str]) -> benchkit.Process:
    """One subprocess through the harness (from the repository root); a failure stops the bench."""
    proc = benchkit.run_process(cmd, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return proc


def parse_args():
    ap = benchkit.parser(__doc__, runs=3, runs_help="runs of each side")
    ap.add_argument("--rows", type=int, default=5_000_000, help="synthetic trajectories (default 5M)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", type=Path, default=REPO / "bench_data", help="where the input is cached")
    ap.add_argument("--spec", type=Path, default=REPO / "sample_data" / "rewards.toml")
    ap.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where distill writes (default: /dev/shm when it exists, else --data): "
        "the stage's work, not the disk's write bandwidth, is what is compared",
    )
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    path = ensure_data(args.rows, args.data, args.seed)
    shm = Path("/dev/shm")
    out_dir = args.out_dir or (shm if shm.is_dir() and os.access(shm, os.W_OK) else args.data)
    out = out_dir / f"rlcycle_bench_examples_{args.rows}.arrow"
    report = out_dir / "rlcycle_bench_reward_report.json"
    py = sys.executable
    scan_cmd = [py, "-c", SCAN, str(path)]
    distill_cmd = [py, "-m", "rlcycle", "distill", str(path), "-o", str(out), "--spec", str(args.spec)]
    distill_cmd += ["--report", str(report), "--quiet"]
    checked(scan_cmd)  # warm the page cache so neither side pays for the first read from disk
    runs: dict[str, list[benchkit.Process]] = {"scan (baseline)": [], "rlcycle distill": []}
    for k in range(args.runs):  # interleaved, so drift (thermal, page cache) hits both alike
        scan = checked(scan_cmd)
        assert int(scan.stdout.strip()) == args.rows, scan.stdout
        runs["scan (baseline)"].append(scan)
        # The previous run's output goes first, outside the timing: renaming onto an existing
        # 1 GB file frees its pages inside the rename (0.1 s on tmpfs), a cost of the old file.
        out.unlink(missing_ok=True)
        runs["rlcycle distill"].append(checked(distill_cmd))
        benchkit.progress(
            f"bench_distill: run {k + 1}: scan {scan.seconds:.1f} s, distill {runs['rlcycle distill'][-1].seconds:.1f} s"
        )
    extra = {
        "rows": args.rows,
        "file_gb": round(path.stat().st_size / 1e9, 3),
        "output": str(out),
        "output_gb": round(out.stat().st_size / 1e9, 3),
    }
    for extra_file in (out, Path(f"{out}.config.json"), report):
        extra_file.unlink(missing_ok=True)
    title = f"{args.rows:,} trajectories ({extra['file_gb']} GB); distill writes {extra['output_gb']} GB to {out_dir}"
    speed = benchkit.Table(
        title,
        "rows/s",
        baseline="scan (baseline)",
        samples={k: [args.rows / p.seconds for p in v] for k, v in runs.items()},
    )
    rss = benchkit.Table(
        "peak RSS",
        "MB",
        baseline="scan (baseline)",
        samples={k: [p.rss_mb for p in v] for k, v in runs.items()},
        higher_is_better=False,
    )
    benchkit.emit(args, "bench_distill", [speed, rss], ["target: distill >= 0.45x the scan's rows/s (issue 36)"], extra)


if __name__ == "__main__":
    main()
