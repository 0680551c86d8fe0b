"""Training memory: each step's peak in train_metrics.arrow, and the warning when the host is
nearly full (rlcycle/train/memory.py), through `rlcycle train` on a tiny model."""

from __future__ import annotations

import polars as pl
import pytest
from train_data import make_base, make_rows, write_examples

from rlcycle.train import checkpoint as C
from rlcycle.train import memory

MEMINFO = """MemTotal:       24576000 kB
MemFree:          512000 kB
MemAvailable:    {avail} kB
Buffers:            1024 kB
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mem")
    base = make_base(root / "base")
    ex = write_examples(root / "ex.arrow", base, make_rows(8, seed=3), versions=[C.checkpoint_id(base)] * 8)
    return base, ex


def test_meminfo_is_parsed_in_gb():
    assert memory.parse_meminfo(MEMINFO.format(avail=12288000)) == pytest.approx((12.582912, 25.165824))
    assert memory.parse_meminfo("MemTotal: 1 kB\n") is None  # an old kernel without MemAvailable


def test_cpu_rule_warns_below_the_available_share():
    assert memory.cpu_pressure((8.0, 24.0), 7.5) is None
    assert memory.cpu_pressure(None, 7.5) is None  # not Linux: nothing to read, no guess
    msg = memory.cpu_pressure((1.2, 24.0), 15.3)
    assert "1.2 of the host's 24.0 GB" in msg and "peaked at 15.3 GB" in msg and "micro_batch_tokens" in msg


@pytest.mark.parametrize("avail_kb, warned", [(1_000_000, True), (12_000_000, False)])
def test_train_records_peak_memory_and_warns_once_on_a_full_host(cli, inputs, tmp_path, monkeypatch, avail_kb, warned):
    fake = tmp_path / "meminfo"
    fake.write_text(MEMINFO.format(avail=avail_kb))
    monkeypatch.setattr(memory, "MEMINFO", fake)
    base, ex = inputs
    r = cli(["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "batch_size=2", "--set", "lr=1e-3"])
    assert r.exit_code == 0, r.output
    steps = pl.read_ipc(tmp_path / "ck" / "train_metrics.arrow")
    assert steps.height == 4
    peaks = steps["peak_memory_gb"].to_list()
    assert peaks[0] > 0.01 and peaks == sorted(peaks)  # a process peak only grows
    assert r.stderr.count("is still available") == (1 if warned else 0)
    if warned:
        assert "step 1: only 1.0 of the host's 25.2 GB is still available" in r.stderr
    assert f"  memory         peak {peaks[-1]:.4g} GB" in r.stderr
