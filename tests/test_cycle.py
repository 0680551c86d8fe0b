"""`rlcycle cycle` end to end on the sample data with the tiny default model (real sandboxes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlcycle.cli.options import registry_dir
from rlcycle.policy.registry import Registry

pytestmark = pytest.mark.docker


# The demo's train sizes and bootstrap on the packaged logs, with a lighter eval than the demo's,
# to keep the suite quick; the stages are the same.
FAST = (
    '[cycle]\nsource = "logs"\nbootstrap = true\n'
    "[cycle.train]\nmax_steps = 2\nbatch_size = 8\nlr = 1e-5\nmax_policy_lag = -1\nsave_every = 1\n"
    "[cycle.eval]\nattempts = 1\nmax_tasks = 6\nrunner = {max_new_tokens = 16, max_turns = 2}\n"
    "sandboxes = 2\ngates = {min_paired_tasks = 5, latency_noise_ms = 10000.0}\n"
)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "cycle.toml"
    path.write_text(FAST)
    return path


def cycle(cli, run_dir, fast, *extra):
    return cli(["cycle", "--run-dir", run_dir, "--config", fast, "--json", "-q", *extra])


def sub_cycle(run_dir, home, fast, *extra, env_extra=None):
    env = dict(os.environ, RLCYCLE_HOME=str(home), **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "rlcycle", "cycle", "--run-dir", str(run_dir), "--config", str(fast), "-q", *extra],
        env=env,
        capture_output=True,
        text=True,
    )


def test_full_cycle_then_rerun_is_cached(cli, tmp_path, docker_client, fast):
    run = tmp_path / "run"
    r = cycle(cli, run, fast)
    assert r.exit_code == 0, r.error + r.output
    s = json.loads(r.stdout)
    assert [x["status"] for x in s["stages"]] == ["ran"] * 5
    assert s["decision"] == "accept" and s["deployed"]
    reg = Registry(registry_dir())
    assert reg.aliases()["production"] == s["deployed"] and "previous" in reg.aliases()
    for stage in ("collect", "distill", "train", "eval", "deploy"):
        assert (run / stage / "manifest.json").exists()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(reg.resolve("production"))
    again = json.loads(cycle(cli, run, fast).stdout)
    assert [x["status"] for x in again["stages"]] == ["cached"] * 4 + ["up_to_date"]
    assert Registry(registry_dir()).history().num_rows == 2  # register + one promote: the rerun changed nothing
    plan = json.loads(cycle(cli, run, fast, "--dry-run", "--force").stdout)
    assert [x["status"] for x in plan["stages"]] == ["planned"] * 5


@pytest.fixture(scope="module")
def reference_id(tmp_path_factory, fast, docker_client):
    """The checkpoint an uninterrupted cycle trains (training is deterministic)."""
    tmp = tmp_path_factory.mktemp("ref")
    assert sub_cycle(tmp / "run", tmp / "home", fast, "--until", "train").returncode == 0
    return json.loads((tmp / "run" / "train" / "manifest.json").read_text())["result"]["checkpoint_id"]


@pytest.mark.parametrize("crash", ["cycle:train", "after-state:promote"])
def test_a_crashed_cycle_resumes_to_the_same_result(tmp_path, docker_client, crash, rlcycle_home, fast, reference_id):
    run = tmp_path / "run"
    r = sub_cycle(run, rlcycle_home, fast, env_extra={"RLCYCLE_CRASH_AT": crash})
    assert r.returncode == -signal.SIGKILL
    r = sub_cycle(run, rlcycle_home, fast, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    statuses = {x["name"]: x["status"] for x in s["stages"]}
    assert statuses["collect"] == statuses["distill"] == "cached"
    # the same checkpoint as an uninterrupted cycle, and a valid registry that serves it
    assert Registry(registry_dir()).aliases()["production"] == reference_id
    assert Registry(registry_dir()).history().num_rows == Registry(registry_dir()).state()["seq"]


def test_a_second_cycle_is_refused_and_a_dead_holders_lock_is_taken_over(cli, tmp_path, rlcycle_home, fast):
    code = (
        "import sys, time; from pathlib import Path; from rlcycle.cycle import CycleLock; "
        "l = CycleLock(Path(sys.argv[1])); l.__enter__(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(rlcycle_home)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = cycle(cli, tmp_path / "run", fast, "--dry-run")
        assert r.exit_code == 1 and "another cycle is running (pid" in r.error
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert cycle(cli, tmp_path / "run", fast, "--dry-run").exit_code == 0  # the kernel released it


def test_a_refused_gate_deploys_nothing(cli, tmp_path, docker_client):
    cfg = tmp_path / "cycle.toml"
    cfg.write_text(FAST)
    r = cli(
        [
            "cycle",
            "--run-dir",
            tmp_path / "run",
            "--config",
            cfg,
            "--set",
            "eval.gates.latency_budget_ms=0.001",
            "--json",
            "-q",
        ]
    )
    assert r.exit_code == 3, r.error
    s = json.loads(r.stdout)
    assert s["decision"] == "refuse" and s["deployed"] is None
    assert [x["name"] for x in s["stages"]] == ["collect", "distill", "train", "eval"]
    production = Registry(registry_dir()).aliases()["production"]
    assert production == json.loads((tmp_path / "run" / "run.json").read_text())["base_id"]


def test_bad_cycle_config_lists_every_problem(cli, tmp_path):
    cfg = tmp_path / "cycle.toml"
    cfg.write_text("[cycle]\nsource = 'kafka'\nrun_dri = 'x'\n")
    r = cli(["cycle", "--config", cfg, "--dry-run"])
    assert r.exit_code == 2 and "run_dri" in r.error
    cfg.write_text("[cycle]\nsource = 'kafka'\n")
    r = cli(["cycle", "--config", cfg, "--dry-run"])
    assert r.exit_code == 2 and "source='kafka'" in r.error
    r = cli(["cycle", "--from", "nowhere", "--dry-run"])
    assert r.exit_code == 2
