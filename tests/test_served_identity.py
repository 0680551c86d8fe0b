"""What a server serves names the data: policy_version, the adapter asked for, run ids.

Real gateways on loopback serving vLLM's /v1/completions and /v1/models (the tiny model
in-process, float32 and bfloat16, a second model under the same name); an adapter hot-loaded
through the runtime LoRA API, and the same rules, run against a real vLLM in tests/test_vllm.py.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlcycle.errors import InputError, RlcycleError
from rlcycle.gateway import GatewayConfig, start
from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.http import HTTPPolicy
from rlcycle.policy.manifest import write_manifest
from rlcycle.policy.open import PolicyConfig, open_policy
from rlcycle.policy.registry import Registry, checkpoint_id
from rlcycle.policy.served import adapter_name

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """a, b: two tiny models; lora: a checkpoint of a with a real peft adapter in OUT/adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcycle.model_init import init_model

    root = tmp_path_factory.mktemp("served")
    init_model(root / "a", seed=0)
    init_model(root / "b", seed=1)
    lora = root / "lora"
    shutil.copytree(root / "a", lora)
    torch.manual_seed(3)
    pm = get_peft_model(
        AutoModelForCausalLM.from_pretrained(root / "a"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.5)
    pm.save_pretrained(lora / "adapter")
    meta = json.loads((lora / "rlcycle.json").read_text())
    meta["id"] = write_manifest(lora).id  # its own checkpoint id: the adapter is part of it
    (lora / "rlcycle.json").write_text(json.dumps(meta))
    return {k: root / k for k in ("a", "b", "lora")}


@contextmanager
def _serving(policy, checkpoint=None):
    """The gateway serving `policy` as `m`; `checkpoint` (its directory) is listed as its root."""
    running = start(GatewayConfig(alias="m", port=0, logging=False), policy=policy, checkpoint=checkpoint)
    try:
        yield running
    finally:
        running.close()


def _server(path, dtype="float32", root=True):
    policy = HFPolicy.from_pretrained(path, HFPolicyConfig(device="cpu", dtype=dtype, num_threads=1))
    return _serving(policy, path if root else None)


def load_policy(ref: str, registry: str | None = None) -> HTTPPolicy:
    """An unidentified HTTPPolicy for `URL[#MODEL]` (what the opener builds before `identify`)."""
    from rlcycle.policy.http import HTTPPolicyConfig

    url, _, model = ref.partition("#")
    return HTTPPolicy(url, HTTPPolicyConfig(model=model or None, registry=registry))


def _identify(ref: str, **options) -> HTTPPolicy:
    p = load_policy(ref, **options)
    try:
        return p.identify()
    finally:
        p.close()


def test_policy_version_is_the_served_checkpoint_never_the_url(models):
    with _server(models["a"]) as srv:
        p = _identify(srv.url)
        cid = checkpoint_id(models["a"])
        assert (p.model, p.policy_version, p.checkpoint_id, p.name) == ("m", cid, cid, cid)
        r = open_policy(srv.url + "/v1", PolicyConfig(tokenizer=str(models["a"])))
        r.close()
        assert r.name == cid and r.checkpoint_id == cid and r.run_key == f"{cid}@{p.served_identity}"
        # the same server answers the same identity again
        assert _identify(srv.url).served_identity == p.served_identity


def test_a_name_no_checkpoint_stands_behind_is_logged_as_that_name_with_a_warning(models, capsys):
    with _server(models["a"], root=False) as srv:
        p = _identify(srv.url)
    assert p.policy_version == "m" and p.checkpoint_id is None and srv.url not in p.policy_version
    assert "staleness check" in capsys.readouterr().err


def test_another_server_behind_the_same_name_has_another_identity(models):
    ids = {}
    for key, path, dtype in (("a32", "a", "float32"), ("a16", "a", "bfloat16"), ("b32", "b", "float32")):
        with _server(models[path], dtype=dtype, root=False) as srv:
            ids[key] = _identify(srv.url).served_identity
    assert len(set(ids.values())) == 3, ids  # dtype and weights both show, under one name and no root


def test_an_alias_whose_adapter_is_not_served_is_refused_with_the_fix(models):
    """An alias asked for by URL#alias: its adapter must be listed; the gateway lists none, so the
    refusal names the adapter and the command that loads it. (Served once the hook has loaded it:
    tests/test_vllm.py, against a real vLLM's runtime LoRA API.)"""
    root = Path(os.environ["RLCYCLE_HOME"]) / "registry"
    reg = Registry(root)
    from rlcycle.policy.registry import Entry

    with reg.locked():
        cid = reg.add(models["lora"])
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    with _server(models["a"]) as srv:
        with pytest.raises(RlcycleError) as e:
            _identify(srv.url + "#production", registry=str(root))  # URL#MODEL
        assert adapter_name(cid) in e.value.message and "rlcycle deploy-vllm" in e.value.hint


def test_a_name_that_is_neither_listed_nor_known_names_what_is_listed(models):
    with _server(models["a"]) as srv:
        with pytest.raises(InputError, match="listed: m"):
            _identify(srv.url + "#nope")


def test_sampling_at_t_not_1_checks_once_that_logprobs_are_processed(models, capsys):
    from rlcycle.policy.scripted import ReplayPolicy
    from rlcycle.policy.served import logprobs_processed

    with _server(models["a"]) as srv:  # the gateway: the logprobs of the sampling distribution
        p = load_policy(srv.url)
        try:
            assert logprobs_processed(p, p.model) is True
            p.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.7, seed=1))
            assert p._logprobs_checked
        finally:
            p.close()
    # a server that cannot score prompts (a scripted one) cannot be checked: said, not refused
    with _serving(ReplayPolicy(str(models["a"]), ["hi"])) as srv:
        p = load_policy(srv.url)
        try:
            p.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, temperature=0.7, seed=1))
        finally:
            p.close()
    assert "cannot check which logprobs" in capsys.readouterr().err
