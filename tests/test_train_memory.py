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
    assert memory.cpu_pressure((8.0, 24.0), 7.5) is None
    assert memory.cpu_pressure(None, 7.5) is None  # not Linux: nothing to read, no guess
    msg = memory.cpu_pressure((1.2, 24.0), 15.3)
    assert "1.2 of the host's 24.0 GB" in msg and "peaked at 15.3 GB" in msg and "micro_batch_tokens" in msg
