"""Benchmark checkpoint verification against `sha256sum` of the same files, in the same run.

What it measures, on one checkpoint directory (default: the tiny default model, made in a
temporary directory; the figure that matters is SmolLM2-135M's: `rlcycle init-model --preset
smollm2-135m -o /tmp/smol`, 542 MB, then pass `/tmp/smol`):
- baseline: `sha256sum` over every file the id counts (the cost of reading and hashing them,
  plus starting one process: tens of ms, which dominates on a small checkpoint);
- full: `verify_checkpoint(DIR, full=True)`, what deploy, rollback, the vLLM hook and
  `rlcycle registry verify` run (re-hash every file, recompute the id);
- cheap: `verify_checkpoint(DIR)`, what opening a checkpoint runs (stat every file, re-hash
  none while their mtimes are the manifest's); and again after `touch` of the largest file
  (same bytes, a new mtime: that file is re-hashed; its mtime is restored afterwards).
One untimed full pass first warms the page cache, so it measures hashing, not the disk. Full
verify costs what its bytes cost (linear in the checkpoint's size); cheap verify costs a stat
per file.

    .venv/bin/python scripts/bench_verify.py --runs 3 /tmp/smol
    .venv/bin/python scripts/bench_verify.py --runs 1 --json          # the tiny default model
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import benchkit

from rlcycle.model_init import init_model
from rlcycle.policy import manifest as M
from rlcycle.policy.registry import verify_checkpoint


def touched_cheap(ckpt: Path) -> float:
    """Seconds of one cheap verify after `touch` of the largest file (same bytes, new mtime: it
    is re-hashed); its recorded mtime is put back after."""
    m = M.read_manifest(ckpt)
    big = max(m.files.values(), key=lambda e: e.size)
    path = ckpt / big.name
    st = path.stat()
    try:
        path.touch()
        return benchkit.timed(verify_checkpoint, ckpt)[0]
    finally:
        os.utime(path, ns=(st.st_atime_ns, big.mtime_ns))


def measure(ckpt: Path, runs: int) -> tuple[benchkit.Table, int, int]:
    files = [str(p) for _, p in M.content_files(ckpt)]
    verify_checkpoint(ckpt, full=True)  # warm the page cache; fails loudly if the checkpoint changed
    samples: dict[str, list[float]] = {"sha256sum": [], "full verify": [], "cheap verify": [], "cheap, touched": []}
    for i in range(runs):
        benchkit.progress(f"bench_verify: run {i + 1}/{runs}")
        samples["sha256sum"].append(benchkit.timed(subprocess.run, ["sha256sum", *files], capture_output=True)[0])
        samples["full verify"].append(benchkit.timed(verify_checkpoint, ckpt, full=True)[0])
        samples["cheap verify"].append(benchkit.timed(verify_checkpoint, ckpt)[0])
        samples["cheap, touched"].append(touched_cheap(ckpt))
    table = benchkit.Table("verify", "seconds", "sha256sum", samples, higher_is_better=False)
    return table, len(files), sum(Path(f).stat().st_size for f in files)


def main() -> None:
    ap = benchkit.parser(__doc__, runs=3)
    ap.add_argument("checkpoint", type=Path, nargs="?", help="a checkpoint with a manifest (default: the tiny model)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint
        if ckpt is None:
            ckpt = Path(tmp) / "tiny"
            init_model(ckpt, seed=0)
        table, n, size = measure(ckpt, args.runs)
    benchkit.emit(args, "bench_verify", [table], notes=[f"{ckpt}: {n} files, {size / 1e6:.1f} MB"])


if __name__ == "__main__":
    main()
