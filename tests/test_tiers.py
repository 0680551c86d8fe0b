"""The test tiers: the fast tier's marker expression, CI's full tier, optional packages under CI.

In: scripts/dev.sh's FAST_MARKERS, .ci/run, pyproject.toml's pytest settings, tests/optional.py.
Out: `dev.sh test --fast` deselects exactly the registered markers (pytest does not check the
names in `-m`: a typo there would silently run everything); CI filters nothing out; peft or ray
missing fails under CI=1 and skips with the install command elsewhere.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import tomllib
from optional import require

REPO = Path(__file__).resolve().parent.parent


def registered_markers() -> set[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"]
    return {m.split(":")[0].strip() for m in ini["markers"]}


def test_the_fast_tier_deselects_every_registered_marker_and_nothing_else():
    line = next(x for x in (REPO / "scripts" / "dev.sh").read_text().splitlines() if x.startswith("FAST_MARKERS="))
    expr = line.split("=", 1)[1].strip('"')
    names = re.findall(r"not (\w+)", expr)
    assert expr == " and ".join(f"not {n}" for n in names)  # only `not X and not Y ...`
    assert set(names) == registered_markers() == {"docker", "vllm", "ray", "clients", "slow"}


def test_a_present_package_is_imported():
    assert require("json") is json


def test_a_missing_package_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI must run the tests that need rlcycle_no_such_pkg"):
        require("rlcycle_no_such_pkg")


def test_a_missing_package_skips_with_the_install_command_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"ray is not installed .*pip install -e '\.\[ray\]'"):
        monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
        require("ray")


def test_ci_runs_the_full_tier():
    """CI (.ci/run) runs `dev.sh test` with no marker filter: the fast tier is a subset, never CI's."""
    ci = [x for x in (REPO / ".ci" / "run").read_text().splitlines() if x and not x.startswith("#")]
    assert ci[-1] == "exec bash scripts/dev.sh test"
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m" not in ini["addopts"].split()
