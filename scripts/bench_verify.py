"""Benchmark checkpoint verification against `sha256sum` of the same files, in the same run.

What it measures, on one checkpoint directory (e.g. SmolLM2-135M from `rlcycle init-model
--preset smollm2-135m -o /tmp/smol`, 538 MB of float32 weights):
- baseline: `sha256sum` over every file the id counts (the cost of reading and hashing them);
- full: `verify_checkpoint(DIR, full=True)`, what deploy, rollback, the vLLM hook and
  `rlcycle registry verify` run (re-hash every file, recompute the id);
- cheap: `verify_checkpoint(DIR)`, what opening a checkpoint runs (stat every file, re-hash
  none while their mtimes are the manifest's); and again after `touch` of the weights file
  (same bytes, a new mtime: that file is re-hashed; its mtime is restored afterwards).
Each `--runs` times in this process, after one untimed full pass that warms the page cache (so
it measures hashing, not the disk); the table shows the median and the ratio to the baseline.

    .venv/bin/python scripts/bench_verify.py /tmp/smol
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from rlcycle.policy import manifest as M
from rlcycle.policy.registry import verify_checkpoint


def timed(fn, runs: int) -> float:
    """Median wall seconds of `runs` calls of fn()."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def touched(ckpt: Path, runs: int) -> float:
    """Cheap verify after `touch` of the largest file (same bytes, new mtime: it is re-hashed);
    its recorded mtime is put back after."""
    m = M.read_manifest(ckpt)
    big = max(m.files.values(), key=lambda e: e.size)
    path = ckpt / big.name
    st = path.stat()
    try:
        path.touch()
        return timed(lambda: verify_checkpoint(ckpt), runs)
    finally:
        os.utime(path, ns=(st.st_atime_ns, big.mtime_ns))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path, help="A checkpoint directory with a manifest.")
    ap.add_argument("--runs", type=int, default=3, help="Timed runs of each (median reported).")
    args = ap.parse_args()
    files = [str(p) for _, p in M.content_files(args.checkpoint)]
    verify_checkpoint(args.checkpoint, full=True)  # warm the page cache; fails loudly if changed
    size = sum(Path(f).stat().st_size for f in files)
    rows = {
        "sha256sum (baseline)": timed(lambda: subprocess.run(["sha256sum", *files], capture_output=True), args.runs),
        "full verify": timed(lambda: verify_checkpoint(args.checkpoint, full=True), args.runs),
        "cheap verify": timed(lambda: verify_checkpoint(args.checkpoint), args.runs),
        "cheap, weights touched": touched(args.checkpoint, args.runs),
    }
    base = rows["sha256sum (baseline)"]
    print(f"{args.checkpoint}: {len(files)} files, {size / 1e6:.0f} MB; median of {args.runs}")
    for name, s in rows.items():
        print(f"  {name:<22} {s * 1e3:10.2f} ms  {size / 1e6 / s:9.0f} MB/s  {s / base:8.4f}x baseline")


if __name__ == "__main__":
    main()
