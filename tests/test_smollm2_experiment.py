"""The SmolLM2 experiment's smoke test (issue 25, item 5; docs/closed_loop.md section 6): its
configuration resolves for every run, and its first simulate request reaches a real vLLM.

Not the experiment (an hour of both cores): `PLAN=1 scripts/smollm2_experiment.sh` resolves every
run's config without a model or a server, and the experiment's config file, pointed at the
session's vLLM (conftest.py's `vllm` fixture: the tiny model, since converting SmolLM2 and starting
vLLM on it would cost minutes of CI), runs the first cycle's simulate there. Under CI=1 a vLLM
that cannot start fails; elsewhere it skips.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

from conftest import REPO

from experiments.closed_loop import run as loop
from rlcycle.cycle import Cycle
from rlcycle.distill.spec import load_spec
from rlcycle.policy.registry import Registry
from rlcycle.resources import tasks
from rlcycle.stage import RunLayout

CONFIG = REPO / "experiments" / "closed_loop" / "smollm2.toml"
REWARDS = REPO / "experiments" / "closed_loop" / "smollm2_rewards.toml"


def test_the_smollm2_plan_resolves_every_run(tmp_path):
    env = {**os.environ, "PLAN": "1", "SMOL_DIR": str(tmp_path / "smol")}
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", "scripts/smollm2_experiment.sh", "3", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    runs = [x.strip().split(":")[0] for x in lines if x.startswith("  ") and ": seed " in x]
    assert runs == [
        "v0/measure",
        "v0/measure-heldout",
        "treatment/cycle-1",
        "treatment/cycle-2",
        "treatment/measure",
        "treatment/measure-heldout",
        "control/cycle-1",
        "control/cycle-2",
        "control/measure",
        "control/measure-heldout",
    ]
    first = json.loads(r.stdout[r.stdout.index("{") :])  # the first run's resolved cycle config
    assert first["serving_url"] == "http://127.0.0.1:8311" and first["train"]["lora"]["r"] == 16
    assert "deploy-vllm" in first["deploy"]["hook"] and first["simulate"]["runner"]["temperature"] == 0.7
    assert first["reward_spec"] == str(REWARDS) and first["train"]["save_every"] == 4
    assert not out.exists()  # a plan writes no run


def test_a_missing_reward_spec_stops_the_script_before_anything_runs(tmp_path):
    env = {**os.environ, "PLAN": "1", "SMOL_DIR": str(tmp_path / "smol"), "REWARDS": str(tmp_path / "nope.toml")}
    r = subprocess.run(
        ["bash", "scripts/smollm2_experiment.sh", "3", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "nope.toml: no such file" in r.stderr
    assert not (tmp_path / "smol").exists() and not (tmp_path / "out").exists()


def test_the_smollm2_reward_spec_is_the_bundled_one_less_latency():
    bundled, ours = (dataclasses.asdict(load_spec(p)) for p in (REPO / "sample_data" / "rewards.toml", REWARDS))
    assert ours["distill"] == bundled["distill"]
    assert ours["signals"] == [s for s in bundled["signals"] if s["name"] != "latency"]
    assert len(ours["signals"]) == len(bundled["signals"]) - 1


def test_the_smollm2_config_samples_from_vllm(vllm, docker_client, tmp_path, rlcycle_home):
    from rlcycle.deploy import register

    home = Path(rlcycle_home)
    base_id = register(vllm.base, "production", Registry(home / "registry"))
    run_dir = tmp_path / "treatment" / "cycle-1"
    sets = [f"serving_url={vllm.url}", "simulate.runner.max_new_tokens=8", "simulate.runner.max_turns=1"]
    cfg = loop.cycle_config(run_dir, home, "treatment", 3001, 1, str(tasks()), True, sets, str(CONFIG))
    result = Cycle(cfg, until_stage="simulate", quiet=True).run()
    assert result.exit_code == 0, result.as_dict()
    events = [json.loads(x) for x in RunLayout(run_dir).file("events").read_text().splitlines()]
    samples = [e for e in events if e.get("completion_ids")]
    assert samples and {e["policy_version"] for e in samples} == {base_id}
    assert all(len(e["completion_logprobs"]) == len(e["completion_ids"]) for e in samples)
    assert {e["temperature"] for e in samples} == {0.7}  # the experiment's sampling, served by vLLM
