"""Shared-prefix forward passes (rlcycle/train/prefix.py): the same logprobs, the same gradient,
the same update as running every row whole, on a real (tiny) transformers Qwen2.

Rows look like agent calls: one 40-token "system prompt" every row starts with, a few tokens of
their own, a completion; plus a second turn that extends a first turn's prompt, a row that
repeats another's prompt (a GRPO group), and a row that shares nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from optional import require
from safetensors.torch import load_file
from train_data import VOCAB, make_base, write_examples

from rlcycle import io as rio
from rlcycle.errors import RlcycleError
from rlcycle.train import checkpoint as C
from rlcycle.train import data as D
from rlcycle.train import loop, stage
from rlcycle.train import loss as L
from rlcycle.train import prefix as PX
from rlcycle.train.config import TrainConfig

SYSTEM = 40


def agent_rows(n: int, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    system = rng.integers(5, VOCAB, SYSTEM).tolist()
    prompts = [system + rng.integers(5, VOCAB, rng.integers(2, 9)).tolist() for _ in range(n - 3)]
    prompts.append(prompts[0] + rng.integers(5, VOCAB, 6).tolist())  # turn 2 of row 0's session
    prompts.append(list(prompts[1]))  # a second sample of row 1's prompt
    prompts.append(rng.integers(5, VOCAB, 12).tolist())  # shares nothing
    comps = [rng.integers(5, VOCAB, rng.integers(2, 7)).tolist() for _ in prompts]
    adv = [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
    return {"prompt_ids": prompts, "completion_ids": comps, "advantage": adv}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # Untied embeddings: a token seen only in the prefix gets an embedding gradient only
    # through the prefix forward (with tied ones, the output layer would give it one anyway).
    return make_base(tmp_path_factory.mktemp("prefix") / "base", tie=False)


@pytest.fixture(scope="module")
def examples(base):
    return write_examples(base.parent / "examples.arrow", base, agent_rows(10), versions=[C.checkpoint_id(base)] * 10)


def cfg(**kw) -> TrainConfig:
    defaults = dict(lr=1e-2, batch_size=10, micro_batch_tokens=256, max_seq_len=128, save_every=0, min_shared_prefix=8)
    return TrainConfig(**{**defaults, **kw})


def model_of(base):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()


def load(examples, config):
    return D.load_examples([str(examples)], config, [], VOCAB)


def test_grouping_covers_every_row_once_within_the_budget(base, examples):
    c = cfg(max_policy_lag=None)
    ex = load(examples, c)
    rows = list(range(len(ex)))
    passes = D.forward_passes(ex, rows, c)
    shared = [p for p in passes if isinstance(p, PX.SharedPass)]
    plain = [r for p in passes if not isinstance(p, PX.SharedPass) for line in p for r in line]
    assert shared and sorted([r for p in shared for r in p.rows] + plain) == rows
    assert 9 in plain  # the row that shares nothing is packed as before
    for p in shared:
        assert len(p.rows) >= 2 and p.prefix >= c.min_shared_prefix
        assert p.prefix == PX.common_prefix(ex, p.rows)
        lens = [int(ex.seq_len[r]) for r in p.rows]
        assert p.prefix + len(p.rows) * (max(lens) - p.prefix) <= c.micro_batch_tokens
        first = ex.prompt.row(p.rows[0])[: p.prefix]
        for r in p.rows:  # a real common prefix, ending before the row's last prompt token
            assert (ex.prompt.row(r)[: p.prefix] == first).all() and p.prefix < len(ex.prompt.row(r))
    # A tight budget cuts the group into several passes; every row is still planned once.
    tight = cfg(max_policy_lag=None, micro_batch_tokens=128)
    passes = D.forward_passes(ex, rows, tight)
    got = [r for p in passes for r in (p.rows if isinstance(p, PX.SharedPass) else [x for ln in p for x in ln])]
    assert sorted(got) == rows and sum(isinstance(p, PX.SharedPass) for p in passes) >= 2


def test_nested_prompts_share_the_longer_prefix(base, examples):
    # Rows 0 and 7 (turn 2 of row 0's session), 1 and 8 (the same prompt): alone, each pair
    # shares far more than the system prompt, and its pass runs all of it once.
    ex = load(examples, cfg(max_policy_lag=None))
    assert PX.common_prefix(ex, [0, 7]) == len(ex.prompt.row(0)) - 1  # capped: row 0 keeps 1 prompt token
    assert PX.common_prefix(ex, [1, 8]) == len(ex.prompt.row(1)) - 1
    assert PX.common_prefix(ex, [0, 1, 7]) == SYSTEM
    (p,), rest = PX.shared_passes(ex, [0, 7, 9], ex.seq_len, 256, 8)
    assert p.rows == [7, 0] and p.prefix == len(ex.prompt.row(0)) - 1 and rest == [9]
    # A minimum above the common prefix: nothing shared.
    assert PX.shared_passes(ex, [0, 7], ex.seq_len, 256, 64) == ([], [0, 7])


def shared_and_plain(ex, rows, model, **collate_kw):
    coef = {r: 0.1 for r in rows}
    p = PX.SharedPass(rows, PX.common_prefix(ex, rows))
    shared = D.collate(ex, p, coef, False, **collate_kw)
    plain = D.collate(ex, [[r] for r in rows], coef, False, **collate_kw)
    return shared, plain


def test_logprobs_and_gradient_equal_the_unshared_forward(base, examples):
    ex = load(examples, cfg(max_policy_lag=None))
    model = model_of(base)
    rows = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    shared, plain = shared_and_plain(ex, rows, model)
    assert shared.prefix_ids is not None and shared.prefix_ids.numel() >= SYSTEM
    assert shared.labels.tolist() == plain.labels.tolist()  # the same tokens, in the same order
    assert shared.tokens == plain.tokens  # metrics count every row's whole sequence
    assert shared.input_ids.numel() < plain.input_ids.numel() // 2  # and the forward runs far fewer
    a = loop.completion_logprobs(model, shared, "cpu")
    b = loop.completion_logprobs(model, plain, "cpu")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # The gradient of the step's loss (loss.py, unchanged) through the shared prefix.
    settings = L.LossSettings()
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(batch, logp):
        tb = L.TokenBatch(logp, batch.behavior, batch.advantage, batch.coef, batch.mask)
        return torch.autograd.grad(L.micro_loss(tb, settings)[0], params)

    ga, gb = grads(shared, a), grads(plain, b)
    norm = max(g.abs().max().item() for g in gb)
    assert norm > 1e-4  # a real gradient, so agreeing is not trivial
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6 * max(norm, 1.0), rtol=1e-4)
    # The prefix's own share of the gradient is there (detaching it, as a no_grad prefix
    # does, changes the embedding gradient of the prefix tokens).
    emb = model.get_input_embeddings().weight
    g_emb = ga[[i for i, p in enumerate(params) if p is emb][0]]
    only_prefix = sorted(set(shared.prefix_ids.tolist()) - set(shared.input_ids.flatten().tolist()))
    assert only_prefix and g_emb[only_prefix].abs().max() > 0


def test_a_wrong_prefix_or_position_is_caught(base, examples):
    # The 1e-5 comparison above can fail: a changed prefix token or positions that restart at 0
    # (the suffix scored as if it began the sequence) move the logprobs.
    ex = load(examples, cfg(max_policy_lag=None))
    model = model_of(base)
    shared, plain = shared_and_plain(ex, [0, 1, 2, 3], model)
    want = loop.completion_logprobs(model, plain, "cpu").detach()
    bad = D.collate(ex, PX.SharedPass([0, 1, 2, 3], shared.prefix_ids.numel()), {r: 1.0 for r in range(4)}, False)
    bad.prefix_ids = bad.prefix_ids.clone()
    bad.prefix_ids[3] = (bad.prefix_ids[3] + 1) % VOCAB
    assert (loop.completion_logprobs(model, bad, "cpu").detach() - want).abs().max() > 1e-4  # 10x the tolerance
    bad = D.collate(ex, PX.SharedPass([0, 1, 2, 3], shared.prefix_ids.numel()), {r: 1.0 for r in range(4)}, False)
    bad.position_ids = bad.position_ids - shared.prefix_ids.numel()
    assert (loop.completion_logprobs(model, bad, "cpu").detach() - want).abs().max() > 1e-4  # 10x the tolerance


def weights(path):
    return load_file(str(path / "model.safetensors"))


def assert_close_weights(a, b, atol=1e-6):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=0, msg=k)


def metrics(out):
    return rio.read_table(out / stage.METRICS_FILE).to_pylist()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"batching": "bucketed", "micro_batch_tokens": 128},
        {"batching": "padded", "micro_batch_size": 4},
        {"kl_coef": 0.1, "objective": "grpo"},  # the reference model runs shared passes too
    ],
    ids=["packed", "bucketed", "padded", "kl"],
)
def test_a_step_with_shared_prefixes_equals_the_unshared_step(base, examples, tmp_path, extra):
    common = dict(optimizer="sgd", lr=0.5, **extra)
    c = cfg(**common, max_policy_lag=None)
    plan = D.plan_step(load(examples, c), D.Schedule(10, c), 0, c, 1, 0, 8)
    assert any(isinstance(p, PX.SharedPass) for p in plan.micro)  # the step does share
    on = stage.run(cfg(**common), examples, base, tmp_path / "on", quiet=True)
    stage.run(cfg(**common, share_prefix=False), examples, base, tmp_path / "off", quiet=True)
    w0, w1 = weights(base), weights(tmp_path / "on")
    assert max((w1[k] - w0[k]).abs().max().item() for k in w0) > 1e-3  # the update is real
    assert_close_weights(tmp_path / "on", tmp_path / "off")
    (m_on,), (m_off,) = metrics(tmp_path / "on"), metrics(tmp_path / "off")
    assert m_on["loss"] == pytest.approx(m_off["loss"], abs=1e-6)
    assert m_on["grad_norm"] == pytest.approx(m_off["grad_norm"], rel=1e-5)
    assert m_on["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy data scores as sampled
    if extra.get("kl_coef"):
        assert m_on["kl_ref"] == pytest.approx(m_off["kl_ref"], abs=1e-7)
    # Metrics keep their meaning: every row's tokens are counted, whatever ran once.
    assert (
        m_on["tokens"]
        == m_off["tokens"]
        == sum(
            len(p) + len(c) for p, c in zip(agent_rows(10)["prompt_ids"], agent_rows(10)["completion_ids"], strict=True)
        )
    )
    assert m_on["loss_tokens"] == m_off["loss_tokens"] and 0 <= m_on["padding_fraction"] < 1
    assert on.steps == 1


def test_gradient_checkpointing_turns_sharing_off(base, examples, tmp_path):
    c = cfg(max_policy_lag=None, gradient_checkpointing=True)
    assert c.share_prefix and not c.shares_prefix
    ex = load(examples, c)
    assert not any(isinstance(p, PX.SharedPass) for p in D.forward_passes(ex, list(range(len(ex))), c))
    stage.run(cfg(optimizer="sgd", lr=0.5, gradient_checkpointing=True), examples, base, tmp_path / "gc", quiet=True)
    stage.run(cfg(optimizer="sgd", lr=0.5), examples, base, tmp_path / "on", quiet=True)
    assert_close_weights(tmp_path / "gc", tmp_path / "on")


def test_resume_with_shared_prefixes_ends_with_the_same_weights(base, examples, tmp_path):
    common = dict(batch_size=4, epochs=2, save_every=2)  # 6 steps, AdamW, shuffled
    stage.run(cfg(**common), examples, base, tmp_path / "straight", quiet=True)
    stopped = stage.run(cfg(**common, stop_after=3), examples, base, tmp_path / "resumed", quiet=True)
    assert stopped.stopped
    result = stage.run(cfg(**common), examples, base, tmp_path / "resumed", quiet=True)
    assert result.resumed_from == 2 and result.steps == 6
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lora_with_shared_prefixes_equals_lora_without(base, examples, tmp_path):
    require("peft")
    from rlcycle.train.config import LoraConfig

    lora = LoraConfig(r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    common = dict(optimizer="sgd", lr=0.5, lora=lora, seed=3)
    stage.run(cfg(**common), examples, base, tmp_path / "on", quiet=True)
    stage.run(cfg(**common, share_prefix=False), examples, base, tmp_path / "off", quiet=True)
    assert_close_weights(tmp_path / "on", tmp_path / "off")


@pytest.mark.slow
def test_two_processes_with_shared_prefixes_equal_one(cli, tmp_path):
    # DDP sees two forwards (prefix, suffixes) before one backward; the reduced gradient must
    # still be the global one: 2 processes x shared passes == 1 process without sharing.
    base = make_base(tmp_path / "base")
    ex = write_examples(tmp_path / "ex.arrow", base, agent_rows(10, seed=2), versions=[C.checkpoint_id(base)] * 10)
    common = dict(
        optimizer="sgd",
        lr=0.5,
        batch_size=10,
        epochs=1,
        max_seq_len=128,
        save_every=0,
        micro_batch_tokens=256,
        min_shared_prefix=8,
    )
    stage.run(TrainConfig(**common, share_prefix=False), ex, base, tmp_path / "one", quiet=True)
    # What each process will plan: shared passes on both ranks.
    c = TrainConfig(**common, max_policy_lag=None)
    exs = D.load_examples([str(ex)], c, [], VOCAB)
    for share in D.split_over_processes(np.arange(10), exs.seq_len, 2):
        assert any(isinstance(p, PX.SharedPass) for p in D.forward_passes(exs, share, c))
    args = ["train", str(ex), "--base", str(base), "-o", str(tmp_path / "two"), "--processes", "2", "--quiet"]
    for k, v in common.items():
        args += ["--set", f"{k}={v}"]
    result = cli(args)
    assert result.exit_code == 0, result.output
    (m1,), (m2,) = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert m2["world_size"] == 2 and m1["tokens"] == m2["tokens"]
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-5, rtol=1e-4, msg=k)


def test_config_checks_the_minimum():
    assert any("min_shared_prefix=0" in p for p in TrainConfig(min_shared_prefix=0).validate())
    assert TrainConfig().share_prefix and TrainConfig().shares_prefix


def test_fsdp_turns_sharing_off_and_says_so():
    # Every FSDP forward is an all-gather: the prefix forward would be a collective that a
    # process running an ordinary pass never joins. No FSDP here, so the decision is checked.
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    said = []
    fsdp = SimpleNamespace(distributed_type=DistributedType.FSDP)
    off = stage._fsdp_without_sharing(fsdp, TrainConfig(), said.append)
    assert not off.shares_prefix and said and "FSDP" in said[0]
    ddp = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU)
    assert stage._fsdp_without_sharing(ddp, TrainConfig(), said.append).shares_prefix and len(said) == 1


class _CrossAttending(torch.nn.Module):
    """A model whose packed sequences attend to each other: an explicit all-ones attention mask
    makes transformers ignore the position-id restarts (what an attention kernel without
    packed-sequence support does)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, **kw):
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kw)


def test_packing_check_passes_honest_packing_in_fp32_and_bf16_and_fails_a_leak(base):
    model = model_of(base).eval()
    assert loop.check_packing(model, "cpu", VOCAB, loop.PACKING_KL["fp32"]) < 1e-6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert loop.check_packing(model, "cpu", VOCAB, loop.PACKING_KL["bf16"]) <= loop.PACKING_KL["bf16"]
    with pytest.raises(RlcycleError, match="KL up to .* does not honour position-id restarts") as e:
        loop.check_packing(_CrossAttending(model), "cpu", VOCAB, loop.PACKING_KL["fp32"])
    assert "batching=bucketed" in e.value.hint
    # Under bf16 the limit is bf16's noise: this random-weight model's leak (KL 3.7e-3; its
    # predictions barely depend on context) is below it, a pretrained model's (4.7) far above.
