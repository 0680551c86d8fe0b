"""LoRA training (`lora.r > 0`, peft) on the tiny real Qwen2: merged checkpoint + adapter files.

What is checked: lr 0 leaves the merged model equal to the base; a few LoRA steps move the
logprobs of the fixed batch in the direction a full fine-tune does; OUT/adapter loads with
peft and gives the merged model's logits; resume gives the uninterrupted weights; bad keys
and a missing peft are clear errors.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from optional import require
from safetensors.torch import load_file
from train_data import make_base, make_rows, write_examples

from rlcycle.errors import InputError, RlcycleError
from rlcycle.policy.manifest import read_manifest
from rlcycle.policy.registry import verify_checkpoint
from rlcycle.train import checkpoint as C
from rlcycle.train import stage
from rlcycle.train.config import LoraConfig, TrainConfig

require("peft")

LORA = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_base(root / "base")
    rows = make_rows(8, seed=1)
    ex = write_examples(root / "ex.arrow", base, rows, versions=[C.checkpoint_id(base)] * 8)
    return base, ex, rows


def tiny(**kw) -> TrainConfig:
    defaults = dict(lr=1e-2, batch_size=8, micro_batch_tokens=64, max_seq_len=64, save_every=0)
    return TrainConfig(**{**defaults, **kw})


def weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def token_logprobs(model, rows) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for p, c in zip(rows["prompt_ids"], rows["completion_ids"], strict=True):
            logp = torch.log_softmax(model(torch.tensor([p + c])).logits[0].float(), -1)
            pos = torch.arange(len(p) - 1, len(p) + len(c) - 1)
            out.append(logp[pos, torch.tensor(c)])
    return out


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def mean_logprob_by_sign(path, rows) -> tuple[float, float]:
    """(mean logprob of A > 0 tokens, of A < 0 tokens) under the checkpoint at `path`."""
    lps = token_logprobs(load(path), rows)
    pos = torch.cat([lp for lp, a in zip(lps, rows["advantage"], strict=True) if a > 0])
    neg = torch.cat([lp for lp, a in zip(lps, rows["advantage"], strict=True) if a < 0])
    return pos.mean().item(), neg.mean().item()


def write_toml(path, lora: dict, **top) -> str:
    lines = ["[train]"] + [f"{k} = {json.dumps(v)}" for k, v in top.items()] + ["", "[train.lora]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in lora.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def trained(inputs, tmp_path_factory):
    """A full fine-tune and a LoRA run (through the CLI) of 3 steps on the same fixed batch."""
    from conftest import run_cli

    base, ex, _ = inputs
    root = tmp_path_factory.mktemp("runs")
    full = stage.run(tiny(epochs=3), ex, base, root / "full", quiet=True)
    toml = write_toml(
        root / "lora.toml",
        {"r": 4, "target_modules": ["q_proj", "v_proj"]},
        lr=5e-2,
        batch_size=8,
        micro_batch_tokens=64,
        max_seq_len=64,
        save_every=0,
        epochs=3,
    )
    r = run_cli(
        [
            "train",
            str(ex),
            "--base",
            str(base),
            "-o",
            str(root / "lora"),
            "--config",
            toml,
            "--json",
        ]
    )
    assert r.exit_code == 0, r.output
    return full, json.loads(r.stdout), root


def test_lr_zero_leaves_the_merged_model_equal_to_the_base(inputs, tmp_path):
    base, ex, _ = inputs
    r = stage.run(tiny(lr=0.0, lora=LORA), ex, base, tmp_path / "ck", quiet=True)
    w0, w1 = weights(base), weights(tmp_path / "ck")
    assert w0.keys() == w1.keys()  # merged: the base's own parameter names, no lora_A/lora_B
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    adapter = tmp_path / "ck" / stage.ADAPTER_DIR
    assert sorted(p.name for p in adapter.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    meta = json.loads((tmp_path / "ck" / "rlcycle.json").read_text())
    assert meta["adapter"] == {
        "dir": "adapter",
        "r": 4,
        "alpha": 8.0,
        "target_modules": ["q_proj", "v_proj"],
        "base": {"id": C.checkpoint_id(base), "path": str(base.resolve())},
    }
    assert meta["config"]["lora"]["r"] == 4 and meta["id"] == r.checkpoint_id == C.content_id(tmp_path / "ck")
    # the id covers the merged weights and the adapter (rlcycle/policy/manifest.py), not the metrics
    listed = set(read_manifest(tmp_path / "ck").files)
    assert {"model.safetensors", "adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= listed
    assert "train_metrics.arrow" not in listed and verify_checkpoint(tmp_path / "ck", full=True).id == r.checkpoint_id


def test_lora_steps_move_logprobs_like_a_full_fine_tune(inputs, trained):
    base, _, rows = inputs
    full, lora, root = trained
    pos0, neg0 = mean_logprob_by_sign(base, rows)
    pos_f, neg_f = mean_logprob_by_sign(root / "full", rows)
    pos_l, neg_l = mean_logprob_by_sign(root / "lora", rows)
    # Same sign of change as the full fine-tune: A > 0 tokens up, A < 0 tokens down.
    assert pos_f > pos0 and neg_f < neg0
    assert pos_l > pos0 and neg_l < neg0
    # and the loss on the fixed batch falls over the steps in both runs
    assert full.summary["loss_last"] < full.summary["loss_first"]
    assert lora["summary"]["loss_last"] < lora["summary"]["loss_first"]
    # only the adapters trained: the merged update is low-rank in the targeted layers only
    w0, wl = weights(base), weights(root / "lora")
    changed = {k for k in w0 if not torch.equal(w0[k], wl[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
    delta = wl["model.layers.0.self_attn.q_proj.weight"] - w0["model.layers.0.self_attn.q_proj.weight"]
    assert torch.linalg.matrix_rank(delta, atol=1e-6).item() <= 4


def test_adapter_loads_with_peft_and_gives_the_merged_logits(inputs, trained):
    from peft import PeftModel

    base, _, rows = inputs
    root = trained[2]
    adapter_dir = root / "lora" / stage.ADAPTER_DIR
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    peft_model = PeftModel.from_pretrained(load(base), str(adapter_dir)).eval()
    merged = load(root / "lora")
    ids = torch.tensor([rows["prompt_ids"][0] + rows["completion_ids"][0]])
    with torch.no_grad():
        a, b, b0 = peft_model(ids).logits, merged(ids).logits, load(base)(ids).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (a - b0).abs().max().item() > 1e-4  # the adapter is not a no-op


def test_resume_with_lora_ends_with_the_same_weights(inputs, tmp_path):
    base, ex, _ = inputs
    cfg = dict(batch_size=4, epochs=1, lora=LORA)
    stage.run(tiny(**cfg), ex, base, tmp_path / "a", quiet=True)
    r = stage.run(tiny(**cfg, save_every=1, stop_after=1), ex, base, tmp_path / "b", quiet=True)
    assert r.stopped and not (tmp_path / "b").exists()
    r = stage.run(tiny(**cfg, save_every=1), ex, base, tmp_path / "b", quiet=True)
    assert r.resumed_from == 1
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ad_a = load_file(str(tmp_path / "a" / "adapter" / "adapter_model.safetensors"))
    ad_b = load_file(str(tmp_path / "b" / "adapter" / "adapter_model.safetensors"))
    assert ad_a.keys() == ad_b.keys() and all(torch.equal(ad_a[k], ad_b[k]) for k in ad_a)


def test_bad_lora_keys_exit_2(cli, inputs, tmp_path):
    base, ex, _ = inputs
    bad = [
        ({"r": -1}, "lora.r=-1: must be >= 0"),
        ({"r": 4, "target_modules": ["nope_proj"]}, "lora.target_modules=nope_proj"),
        ({"r": 4, "rank": 8}, "unknown key 'lora.rank'"),
        ({"r": 4, "dropout": 1.5}, "lora.dropout=1.5: must be in [0, 1)"),
        ({"r": 4, "target_modules": "q_proj"}, "lora.target_modules='q_proj': expected a list"),
    ]
    for i, (lora, message) in enumerate(bad):
        toml = write_toml(tmp_path / f"bad{i}.toml", lora, batch_size=8, micro_batch_tokens=64, max_seq_len=64)
        r = cli(["train", ex, "--base", base, "-o", tmp_path / f"ck{i}", "--config", toml])
        assert r.exit_code == 2, r.output
        assert message in r.error, r.error
        assert not (tmp_path / f"ck{i}").exists()
    # the unknown module's error names the model's real linear layers
    with pytest.raises(InputError) as e:
        stage.run(tiny(lora=LoraConfig(r=4, target_modules=["nope_proj"])), ex, base, tmp_path / "x", quiet=True)
    assert "q_proj" in e.value.hint


def test_missing_peft_is_a_clear_error(inputs, tmp_path, monkeypatch):
    base, ex, _ = inputs
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now raises ImportError
    with pytest.raises(RlcycleError) as e:
        stage.run(tiny(lora=LORA), ex, base, tmp_path / "ck", quiet=True)
    assert "needs peft" in e.value.message and "pip install 'rlcycle[lora]'" in e.value.hint


def test_lora_off_by_default_and_r_zero_is_a_full_fine_tune():
    from rlcycle.config import resolve

    assert TrainConfig().lora_r == 0 and resolve(TrainConfig, sets=["lora.r=0"]).lora == TrainConfig().lora
    sets = ["lora.r=16", "lora.target_modules=q_proj,v_proj", "lora.alpha=32", "lora.dropout=0.05"]
    c = resolve(TrainConfig, sets=sets)
    assert c.lora == LoraConfig(r=16, alpha=32.0, dropout=0.05, target_modules=["q_proj", "v_proj"])
    assert c.lora_r == 16 and c.lora_alpha == 32.0
    assert TrainConfig(lora=LoraConfig(r=8)).lora_alpha == 16.0  # alpha defaults to 2r
    assert resolve(TrainConfig, sets=["lora.alpha=none", "lora.r=2"]).lora_alpha == 4.0


@pytest.mark.slow
def test_two_processes_with_lora_equal_one_process(cli, inputs, tmp_path):
    # The multi-process contract of tests/test_train_multiprocess.py, with adapters: SGD, so the
    # update is the gradient itself; 2 torchrun processes through the CLI == 1 with accumulation.
    base, ex, _ = inputs
    common = dict(optimizer="sgd", lr=0.5, batch_size=3, epochs=1, max_seq_len=24, save_every=0)
    stage.run(
        tiny(**common, micro_batch_tokens=24, lora=LORA),
        ex,
        base,
        tmp_path / "one",
        quiet=True,
    )
    toml = write_toml(
        tmp_path / "two.toml", {"r": 4, "target_modules": ["q_proj", "v_proj"]}, **common, micro_batch_tokens=512
    )
    r = cli(
        [
            "train",
            ex,
            "--base",
            base,
            "-o",
            tmp_path / "two",
            "--config",
            toml,
            "--processes",
            "2",
            "--quiet",
        ]
    )
    assert r.exit_code == 0, r.output
    w0, w1, w2 = weights(base), weights(tmp_path / "one"), weights(tmp_path / "two")
    assert max((w1[k] - w0[k]).abs().max().item() for k in w0) > 1e-4  # the update is real
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-5, rtol=1e-4, msg=k)
    a1 = load_file(str(tmp_path / "one" / "adapter" / "adapter_model.safetensors"))
    a2 = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    for k in a1:
        torch.testing.assert_close(a1[k], a2[k], atol=1e-5, rtol=1e-4, msg=k)


def test_set_dotted_keys_reach_the_lora_table(tmp_path):
    """`--set lora.r=16 --set lora.target_modules=q_proj,v_proj` (the issue's names) merge into
    the table over the file's `[train.lora]`, and the cycle's `--set train.lora.r=8` too."""
    from rlcycle.config import resolve
    from rlcycle.cycle import CycleConfig

    toml = write_toml(tmp_path / "t.toml", {"r": 2, "dropout": 0.1})
    c = resolve(TrainConfig, toml, ["lora.r=16", "lora.target_modules=q_proj,v_proj"], section="train")
    assert c.lora == LoraConfig(r=16, dropout=0.1, target_modules=["q_proj", "v_proj"])
    assert resolve(TrainConfig, None, ["lora.r=16"]).lora_alpha == 32.0
    with pytest.raises(InputError, match="unknown key 'lora.rank'"):
        resolve(TrainConfig, None, ["lora.rank=16"])
    cyc = resolve(CycleConfig, None, ["train.lora.r=8", "train.lr=1e-4"])
    assert cyc.train.lr == 1e-4 and cyc.train.max_steps == CycleConfig().train.max_steps
    assert cyc.train.lora_r == 8


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_chained_runs_continue_one_adapter_on_the_first_base(inputs, tmp_path):
    # Cycle 2 trains from cycle 1's merged checkpoint; a LoRA server keeps the FIRST base loaded,
    # so cycle 2's adapter must be the delta from that base, not from cycle 1's merged weights.
    from peft import PeftModel

    base, ex, rows = inputs
    one = tmp_path / "one"
    stage.run(tiny(lora=LORA, epochs=2), ex, base, one, quiet=True)
    rows2 = make_rows(8, seed=5)
    ex2 = write_examples(tmp_path / "ex2.arrow", one, rows2, versions=[C.checkpoint_id(one)] * 8)
    two, zero, fresh = tmp_path / "two", tmp_path / "zero", tmp_path / "fresh"
    stage.run(tiny(lora=LORA, epochs=2), ex2, one, two, quiet=True)
    stage.run(tiny(lora=LORA, lr=0.0), ex2, one, zero, quiet=True)
    stage.run(tiny(lora=dataclasses.replace(LORA, continue_adapter=False)), ex2, one, fresh, quiet=True)

    meta = json.loads((two / C.RLCYCLE_JSON).read_text())["adapter"]
    assert meta["base"]["id"] == C.checkpoint_id(base)
    cfg = json.loads((two / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(base.resolve())
    ids = torch.tensor([rows2["prompt_ids"][0] + rows2["completion_ids"][0]])
    served = PeftModel.from_pretrained(load(base), str(two / "adapter")).eval()  # first base + adapter 2
    torch.testing.assert_close(_logits(served, ids), _logits(load(two), ids), atol=1e-5, rtol=1e-5)
    assert (_logits(load(two), ids) - _logits(load(one), ids)).abs().max() > 1e-4  # cycle 2 moved it

    # lr 0: the continued adapter is cycle 1's, and the merged model is cycle 1's (float rounding).
    a1 = load_file(str(one / "adapter" / "adapter_model.safetensors"))
    a0 = load_file(str(zero / "adapter" / "adapter_model.safetensors"))
    assert a1.keys() == a0.keys() and all(torch.equal(a1[k], a0[k]) for k in a1)
    w1, w0 = weights(one), weights(zero)
    for k in w1:
        torch.testing.assert_close(w0[k], w1[k], atol=1e-6, rtol=1e-6, msg=k)

    # continue_adapter = false: a new adapter, the delta from cycle 1's merged weights.
    meta = json.loads((fresh / C.RLCYCLE_JSON).read_text())["adapter"]
    assert meta["base"]["id"] == C.checkpoint_id(one)
    served = PeftModel.from_pretrained(load(one), str(fresh / "adapter")).eval()
    torch.testing.assert_close(_logits(served, ids), _logits(load(fresh), ids), atol=1e-5, rtol=1e-5)


def test_an_adapter_that_cannot_be_continued_is_a_clear_error(cli, inputs, tmp_path):
    base, ex, _ = inputs
    one = tmp_path / "one"
    stage.run(tiny(lora=LORA), ex, base, one, quiet=True)
    ex2 = write_examples(tmp_path / "ex2.arrow", one, make_rows(8, seed=5), versions=[C.checkpoint_id(one)] * 8)
    r = cli(
        [
            "train",
            ex2,
            "--base",
            one,
            "-o",
            tmp_path / "two",
            "--set",
            "lora.r=8",
            "--set",
            "lora.target_modules=q_proj,v_proj",
            "--set",
            "batch_size=8",
            "--set",
            "max_seq_len=64",
            "--set",
            "micro_batch_tokens=64",
        ]
    )
    assert r.exit_code == 2, r.output
    assert "cannot continue" in r.error and "r=4 (now 8)" in r.error and "continue_adapter=false" in r.error
    assert not (tmp_path / "two").exists()
    from rlcycle.config import resolve

    with pytest.raises(InputError, match="lora.continue_adapter='maybe': expected true or false"):
        resolve(TrainConfig, sets=["lora.r=4", "lora.continue_adapter=maybe"])
