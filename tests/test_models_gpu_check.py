"""`scripts/gpu_check.sh --dry-run`: the GPU check's every step, on CPU at tiny size.

It runs the tiny default model instead of SmolLM2 (whose conversion tests/test_gguf.py
covers), a two-step training loop, a one-repeat generation bench and the stand-in cycle's
plan (`cycle --dry-run`, which also validates the cycle config the real run uses).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_dry_run_runs_every_step_on_cpu(tmp_path):
    env = {
        **os.environ,
        "GPU_CHECK_DIR": str(tmp_path),
        "RLCYCLE_HOME": str(tmp_path / "home"),
        "RLCYCLE_VENV": str(Path(sys.executable).parent.parent),
    }
    r = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    train = next(x for x in lines if x.startswith("train: "))
    assert "cpu" in train and "2 steps x 2 x 128 tokens" in train and "tokens/s" in train
    assert "MFU n/a" in train  # no bf16 peak is claimed for a CPU
    assert any("ratio rlcycle batched / model.generate one at a time" in x for x in lines)
    cycle = next(x for x in lines if x.startswith("cycle: "))
    for stage in ("simulate", "collect", "distill", "train", "eval", "deploy"):
        assert f"{stage} planned" in cycle
    assert (tmp_path / "model" / "model.safetensors").exists() and lines[-1].startswith("gpu_check: done")
