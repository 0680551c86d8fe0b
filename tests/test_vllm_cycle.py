"""The whole cycle on a REAL vLLM (rlcycle/configs/vllm.toml, docs/vllm.md "The whole cycle on
vLLM"): simulate and eval sample from vLLM, train a LoRA adapter, deploy hot-loads it into the
same vLLM with the shipped hook, and the next cycle's simulate samples from that adapter.

The server is the session's one vLLM (conftest.py's `vllm` fixture: the tiny default model,
float32); under CI=1 a vLLM that cannot be installed or started fails, elsewhere it skips. The
sandboxes are real Docker containers. The config tests at the top need neither.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from rlcycle.cycle import Cycle, CycleConfig, load_config, stage_config
from rlcycle.deploy.stage import STAGE as DEPLOY
from rlcycle.evaluation.stage import STAGE as EVAL
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.registry import Registry, checkpoint_id
from rlcycle.policy.served import adapter_name
from rlcycle.prompts import events_with_full_prompts
from rlcycle.resources import tasks
from rlcycle.simulate.stage import STAGE as SIMULATE
from rlcycle.stage import RunLayout

URL = "http://127.0.0.1:8311"


# --- the shipped config ----------------------------------------------------------------------


def test_the_shipped_vllm_config_resolves(cli):
    r = cli(["cycle", "--config", "vllm", "--plan"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["serving_url"] == URL and plan["source"] == "simulate"
    assert plan["train"]["lora"]["r"] > 0 and plan["train"]["lora"]["continue_adapter"] is True
    assert "{serving_url}" in plan["deploy"]["hook"] and "deploy-vllm" in plan["deploy"]["hook"]
    # what the stages get: the server filled in, the hook's placeholders replaced
    c = load_config("vllm", ["serving_url=http://127.0.0.1:9999"])
    assert stage_config(c, SIMULATE).policy.server == stage_config(c, EVAL).policy.server == "http://127.0.0.1:9999"
    hook = stage_config(c, DEPLOY).hook
    assert hook == f"{sys.executable} -m rlcycle deploy-vllm --url http://127.0.0.1:9999 --tolerance 0.6 --relative"
    # production defaults are untouched: no server, in-process
    d = CycleConfig()
    assert (
        d.serving_url is None
        and stage_config(d, SIMULATE).policy.server is None
        and stage_config(d, EVAL).policy.server is None
    )


def test_serving_url_needs_a_lora_train_and_a_url(cli):
    r = cli(["cycle", "--config", "vllm", "--set", "train.lora.r=0", "--plan"])
    assert r.exit_code == 2 and "train.lora.r = 0" in r.error, r.output
    r = cli(["cycle", "--config", "vllm", "--set", "serving_url=localhost:8311", "--plan"])
    assert r.exit_code == 2 and "serving_url='localhost:8311'" in r.error, r.output
    r = cli(["cycle", "--set", "deploy.hook=x --url {serving_url}", "--plan"])
    assert r.exit_code == 2 and "serving_url is not set" in r.error, r.output


# --- two cycles on a real vLLM ---------------------------------------------------------------


def _events(layout: RunLayout) -> list[dict]:
    """The run's events, every completion's whole prompt rebuilt as `prompt_ids`."""
    return events_with_full_prompts([json.loads(line) for line in layout.file("events").read_text().splitlines()])


def _samples(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("completion_ids")]


def _config(vllm, home: Path, run_dir: Path) -> CycleConfig:
    """The shipped vllm config at test sizes, pointed at the session's vLLM and a temp home."""
    sets = [
        "simulate.episodes=4",
        "simulate.sandboxes=2",
        "simulate.runner.max_new_tokens=16",
        "simulate.runner.max_turns=2",
        "train.max_steps=1",
        "train.batch_size=4",
        "train.lr=5e-2",  # far enough from the base that its logprobs tell them apart
        "train.max_policy_lag=-1",
        "train.lora.r=8",
        "eval.max_tasks=5",
        "eval.sandboxes=2",
        "eval.runner.max_new_tokens=16",
        "eval.runner.max_turns=2",
        "deploy.hook_timeout_s=600",
    ]
    # the packaged suite: the shipped config names the SmolLM2 one, a path in the checkout
    flags = {"serving_url": vllm.url, "registry_home": str(home), "run_dir": str(run_dir), "tasks": str(tasks())}
    return load_config("vllm", sets, flags)


def test_two_cycles_on_vllm_the_second_samples_the_first_ones_adapter(vllm, docker_client, tmp_path, rlcycle_home):
    home = Path(rlcycle_home)
    reg = Registry(home / "registry")
    from rlcycle.deploy import register

    base_id = register(vllm.base, "production", reg)
    listed_before = {m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]}
    c1 = RunLayout(tmp_path / "c1")
    v1_name = None
    try:
        r1 = Cycle(_config(vllm, home, c1.root), quiet=True).run()
        assert r1.exit_code == 0 and r1.decision == "accept", r1.as_dict()
        v1 = checkpoint_id(c1.file("checkpoint"))
        v1_name = adapter_name(v1)
        # cycle 1 sampled the base from vLLM, eval ran both arms there, deploy loaded v1's adapter
        assert {e["policy_version"] for e in _samples(_events(c1))} == {base_id}
        verdict = json.loads(c1.file("verdict").read_text())
        assert verdict["config"]["policy"]["server"] == vllm.url  # both arms asked for on vLLM
        assert verdict["candidate_id"] == v1 and verdict["baseline_id"] == base_id
        assert r1.deployed == v1 and reg.aliases()["production"] == v1
        listed = {m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]}
        assert v1_name in listed

        # cycle 2: its simulate samples production = v1 from vLLM, i.e. v1's adapter
        c2 = RunLayout(tmp_path / "c2")
        r2 = Cycle(_config(vllm, home, c2.root), until_stage="simulate", quiet=True).run()
        assert r2.exit_code == 0, r2.as_dict()
        samples = _samples(_events(c2))
        assert samples and {e["policy_version"] for e in samples} == {v1}
        on = dict(v1=_policy(c1.file("checkpoint")), base=_policy(vllm.base))
        diffs = {k: _max_diff(samples[:3], p) for k, p in on.items()}
        assert diffs["v1"] < 1e-3 < 1e-2 < diffs["base"], diffs
    finally:  # leave the shared server as the other tests expect it: what it listed before
        for m in httpx.get(vllm.url + "/v1/models").json()["data"]:
            if m["id"] not in listed_before:
                httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": m["id"]}, timeout=60)


def _policy(path: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(path, HFPolicyConfig(device="cpu", dtype="float32", num_threads=1))


def _max_diff(samples: list[dict], model: HFPolicy) -> float:
    """Largest |logged - model's| logprob over the samples' completion tokens (at their T)."""
    worst = 0.0
    for e in samples:
        want = model.score(e["prompt_ids"], e["completion_ids"], temperature=e.get("temperature") or 1.0)
        worst = max(worst, *(abs(a - b) for a, b in zip(e["completion_logprobs"], want, strict=True)))
    return worst
