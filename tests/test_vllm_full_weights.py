"""A full-weight (non-LoRA) checkpoint onto a REAL vLLM: restart it on the new weights
(docs/vllm.md, "Full-weight checkpoints").

The deploy hook cannot hot-load full weights: it exits 2 and names the restart, and `deploy`
moves the registry back. The documented way: `rlcycle deploy` without that hook (production now
names the full checkpoint), then restart `rlcycle serve --policy production`,
which serves the new weights under their directory's root, so clients asking for
`URL#production` get the new checkpoint's id as policy_version and its logprobs.

This starts a vLLM of its own (the session's `vllm` fixture serves the base and is shared):
one more start, ~70 s here. Under CI=1 a vLLM that cannot start fails; elsewhere it skips.
"""

from __future__ import annotations

import os
import shlex
import sys

import pytest
from train_data import make_rows, write_examples

from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.open import PolicyConfig, open_policy
from rlcycle.policy.registry import Registry, checkpoint_id


@pytest.fixture(scope="module")
def full_ckpt(vllm, tmp_path_factory):
    """A full fine-tune of the session's base by train's stage (no adapter/)."""
    from rlcycle.train import stage
    from rlcycle.train.config import TrainConfig

    root = tmp_path_factory.mktemp("vllm-full")
    ex = write_examples(root / "ex.arrow", vllm.base, make_rows(8, seed=2), versions=[checkpoint_id(vllm.base)] * 8)
    cfg = TrainConfig(lr=5e-3, batch_size=8, micro_batch_tokens=64, max_seq_len=64, save_every=0, epochs=2)
    stage.run(cfg, str(ex), vllm.base, root / "full", quiet=True)
    assert not (root / "full" / "adapter").exists()
    return root / "full"


def test_a_full_weight_checkpoint_reaches_vllm_by_a_restart(vllm, full_ckpt, cli, rlcycle_home):
    from rlcycle.errors import RlcycleError
    from rlcycle.policy import vllm_serve

    registry = os.path.join(rlcycle_home, "registry")
    base_id, full_id = checkpoint_id(vllm.base), checkpoint_id(full_ckpt)
    assert cli(["registry", "add", str(vllm.base), "--alias", "production"]).exit_code == 0
    # the LoRA hook refuses full weights (exit 2, the restart named) and deploy moves production back
    hook = shlex.join([sys.executable, "-m", "rlcycle", "deploy-vllm", "--url", vllm.url])
    r = cli(["deploy", str(full_ckpt), "--force", "--hook", hook])
    assert r.exit_code == 1 and "has no LoRA adapter" in r.error and "restart vLLM" in r.error, r.output
    assert Registry(registry).aliases()["production"] == base_id
    # the documented way: deploy without that hook, then (re)start vLLM on production
    assert cli(["deploy", str(full_ckpt), "--force"]).exit_code == 0
    config = vllm_serve.VllmServeConfig(port=0, dtype="float32", kv_cache_gb=1, max_model_len=2048)
    try:
        server = vllm_serve.start("production", config, registry=registry)
    except RlcycleError as e:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM did not start: {e.message[:2000]}")
        pytest.skip(f"vLLM did not start: {e.message[:500]}")
    with server:
        assert server.target.checkpoint_id == full_id and not server.target.adapters  # its registry copy
        policy = open_policy(server.url + "#production", PolicyConfig(tokenizer=str(full_ckpt)), registry).policy
        local = HFPolicy.from_pretrained(full_ckpt, HFPolicyConfig(device="cpu", dtype="float32", num_threads=1))
        try:
            assert policy.policy_version == full_id != base_id
            prompt = list(range(5, 40))
            gen = policy.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))[0]
            want = local.score(prompt, gen.token_ids)
            assert max(abs(a - b) for a, b in zip(gen.logprobs, want, strict=True)) < 1e-3
        finally:
            policy.close()
