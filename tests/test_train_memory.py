"""Training memory's rules (rlcycle/train/memory.py) on given numbers; through `rlcycle train`
in tests/test_train_cli.py."""

from __future__ import annotations

import pytest
from train_data import MEMINFO

from rlcycle.train import memory


def test_meminfo_is_parsed_in_gb():
    assert memory.parse_meminfo(MEMINFO.format(avail=12288000)) == pytest.approx((12.582912, 25.165824))
    assert memory.parse_meminfo("MemTotal: 1 kB\n") is None  # an old kernel without MemAvailable


def test_cpu_rule_warns_below_the_available_share():
    assert memory.cpu_pressure((8.0, 24.0, "host"), 7.5) is None
    assert memory.cpu_pressure(None, 7.5) is None  # not Linux: nothing to read, no guess
    msg = memory.cpu_pressure((1.2, 24.0, "host"), 15.3)
    assert "1.2 of the host's 24.0 GB" in msg and "peaked at 15.3 GB" in msg and "micro_batch_tokens" in msg


def _cgroup(root, limit: str, current: int, inactive_file: int):
    root.mkdir(exist_ok=True)
    (root / "memory.max").write_text(limit + "\n")
    (root / "memory.current").write_text(f"{current}\n")
    (root / "memory.stat").write_text(f"anon 1000\ninactive_file {inactive_file}\nactive_file 5\n")
    return root


def test_a_cgroup_limit_below_the_host_is_what_counts(tmp_path, monkeypatch):
    # 8 GB limit, 7.5 GB charged of which 0.5 GB is reclaimable page cache: 1 GB available
    cg = _cgroup(tmp_path / "cg", str(8 * 10**9), 75 * 10**8, 5 * 10**8)
    assert memory.cgroup_memory(cg) == pytest.approx((1.0, 8.0))
    assert memory.cgroup_memory(_cgroup(tmp_path / "nolimit", "max", 10**9, 0)) is None
    assert memory.cgroup_memory(tmp_path / "absent") is None  # cgroup v1, or not Linux
    fake = tmp_path / "meminfo"
    fake.write_text(MEMINFO.format(avail=20_000_000))  # the host: 20.5 of 25.2 GB available
    monkeypatch.setattr(memory, "MEMINFO", fake)
    monkeypatch.setattr(memory, "CGROUP", cg)
    assert memory.host_memory() == (pytest.approx(1.0), pytest.approx(8.0), "cgroup limit")
    assert "only 1.0 of the cgroup limit's 8.0 GB" in memory.cpu_pressure(memory.host_memory(), 5.0)
    monkeypatch.setattr(memory, "CGROUP", tmp_path / "absent")
    assert memory.host_memory()[2] == "host"
