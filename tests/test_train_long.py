"""Long sequences in train (rlcycle/train/longseq.py): chunked logprobs equal the unchunked ones,
a row longer than one pass trains, max_seq_len comes from the model, checkpointing by length,
and context parallelism refused where it cannot run. Tiny Qwen2, short rows, small chunks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from train_data import VOCAB, make_base, write_examples

from rlcycle.config import resolve
from rlcycle.train import checkpoint as C
from rlcycle.train import data as D
from rlcycle.train import longseq as LS
from rlcycle.train import loop, stage
from rlcycle.train import loss as L
from rlcycle.train import prefix as PX
from rlcycle.train.config import TrainConfig

LONG = 150  # the long row: longer than the 64-token pass budget below, within the model's 256 positions


def rows(seed: int = 0) -> dict[str, list]:
    """Six short rows sharing a 20-token system prompt, and one long row (LONG tokens)."""
    rng = np.random.default_rng(seed)
    system = rng.integers(5, VOCAB, 20).tolist()
    prompts = [system + rng.integers(5, VOCAB, rng.integers(3, 8)).tolist() for _ in range(6)]
    comps = [rng.integers(5, VOCAB, rng.integers(4, 9)).tolist() for _ in range(6)]
    prompts.append(rng.integers(5, VOCAB, LONG - 40).tolist())
    comps.append(rng.integers(5, VOCAB, 40).tolist())
    return {"prompt_ids": prompts, "completion_ids": comps, "advantage": [1.0, -1.0] * 3 + [1.0]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("long") / "base", tie=False)  # 256 positions


@pytest.fixture(scope="module")
def examples(base):
    return write_examples(base.parent / "ex.arrow", base, rows(), versions=[C.checkpoint_id(base)] * 7)


def cfg(**kw) -> TrainConfig:
    defaults = dict(lr=0.5, optimizer="sgd", batch_size=7, micro_batch_tokens=64, save_every=0, min_shared_prefix=8)
    return TrainConfig(**{**defaults, **kw})


def model_of(base):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()


def load(examples, config):
    return D.load_examples([str(examples)], config, [], VOCAB)


# --- chunked logprobs ------------------------------------------------------------------------------


def batches(ex):
    """An ordinary packed pass over every row, and a shared-prefix pass over the six short rows."""
    coef = {r: 0.1 for r in range(len(ex))}
    plain = D.collate(ex, [[r] for r in range(len(ex))], coef, True)
    shared = D.collate(ex, PX.SharedPass(list(range(6)), PX.common_prefix(ex, list(range(6)))), coef, False)
    return plain, shared


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_chunked_logprobs_and_gradient_equal_the_unchunked(base, examples, checkpointing):
    ex = load(examples, cfg(max_policy_lag=None, max_seq_len=256))
    model = model_of(base)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    settings = L.LossSettings()
    plain, shared = batches(ex)
    # Checkpointing drops a layer's KV cache, so shared passes run without it (TrainConfig.shares_prefix).
    for batch in [plain] if checkpointing else [plain, shared]:
        assert batch.labels.numel() > 7  # several chunks of 7, the last one partial
        whole = loop.completion_logprobs(model, batch, "cpu", 0)
        chunked = loop.completion_logprobs(model, batch, "cpu", 7)
        torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)

        def grads(logp, b=batch):
            tb = L.TokenBatch(logp, b.behavior, b.advantage, b.coef, b.mask)
            return torch.autograd.grad(L.micro_loss(tb, settings)[0], params)

        gw, gc = grads(whole), grads(chunked)
        norm = max(g.abs().max().item() for g in gw)
        assert norm > 1e-4  # a real gradient, so agreeing is not trivial
        for x, y in zip(gc, gw, strict=True):
            torch.testing.assert_close(x, y, atol=1e-6 * max(norm, 1.0), rtol=1e-4)


def test_chunked_logprobs_honour_the_sample_temperature(base):
    # The temperature divides each chunk's logits, as it does the unchunked ones.
    model = model_of(base)
    head = LS.output_head(model)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 32, generator=g)
    labels = torch.randint(0, VOCAB, (11,), generator=g)
    temp = torch.full((11,), 0.7)
    want = torch.log_softmax(head(hidden).float() / 0.7, -1)[torch.arange(11), labels]
    torch.testing.assert_close(LS.chunked_logprobs(head, hidden, labels, temp, 4), want, atol=1e-5, rtol=0)
    # and a wrong temperature is visible at that tolerance
    assert (LS.chunked_logprobs(head, hidden, labels, None, 4) - want).abs().max() > 1e-3


# --- a row longer than one pass ------------------------------------------------------------------


def test_a_row_longer_than_the_pass_budget_runs_alone(base, examples):
    c = cfg(max_policy_lag=None)
    ex = load(examples, c)
    assert ex.dropped.get("too_long", 0) == 0 and len(ex) == 7  # max_seq_len none: no limit in load
    assert int(ex.seq_len[6]) == LONG > c.micro_batch_tokens
    plan = D.plan_step(ex, D.Schedule(len(ex), c), 0, c, 1, 0, 8)
    alone = [p for p in plan.micro if not isinstance(p, PX.SharedPass) and 6 in [r for ln in p for r in ln]]
    assert alone == [[[6]]]  # its own pass, nothing packed beside it
    planned = [r for p in plan.micro for r in (p.rows if isinstance(p, PX.SharedPass) else [x for ln in p for x in ln])]
    assert sorted(planned) == list(range(7))


def test_a_long_row_trains_to_the_same_update_as_one_big_pass(base, examples, tmp_path):
    # Budget 64: the long row runs alone, chunked (5 positions) and checkpointed (auto);
    # budget 512, no chunks, no checkpointing: everything in one pass. The same SGD update.
    small = stage.run(cfg(logprob_chunk_tokens=5), examples, base, tmp_path / "small", quiet=True)
    stage.run(
        cfg(micro_batch_tokens=512, logprob_chunk_tokens=0, gradient_checkpointing=False),
        examples,
        base,
        tmp_path / "big",
        quiet=True,
    )
    assert small.rows_used == 7 and "too_long" not in small.dropped
    w0, a, b = (load_file(str(p / "model.safetensors")) for p in (base, tmp_path / "small", tmp_path / "big"))
    assert max((a[k] - w0[k]).abs().max().item() for k in w0) > 1e-3  # the update is real
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    meta = json.loads((tmp_path / "small" / "rlcycle.json").read_text())
    assert meta["config"]["max_seq_len"] == 256  # resolved from the model and saved


# --- max_seq_len from the model --------------------------------------------------------------------


def test_max_seq_len_defaults_to_the_models_positions(base, tmp_path):
    rng = np.random.default_rng(3)
    data = {
        "prompt_ids": [rng.integers(5, VOCAB, 250).tolist(), rng.integers(5, VOCAB, 10).tolist()],
        "completion_ids": [rng.integers(5, VOCAB, 10).tolist(), rng.integers(5, VOCAB, 5).tolist()],
        "advantage": [1.0, -1.0],
    }
    ex = write_examples(tmp_path / "ex.arrow", base, data, versions=[C.checkpoint_id(base)] * 2)
    r = stage.run(cfg(batch_size=2), ex, base, tmp_path / "out", quiet=True)
    assert r.dropped == {"too_long": 1} and r.rows_used == 1  # 260 > the model's 256 positions
    r = stage.run(cfg(batch_size=2, max_seq_len=300), ex, base, tmp_path / "explicit", quiet=True)
    assert r.dropped == {} and r.rows_used == 2  # an explicit value still rules
    r = stage.run(cfg(batch_size=2, max_seq_len=16), ex, base, tmp_path / "short", quiet=True)
    assert r.dropped == {"too_long": 1}


def test_a_model_config_without_a_context_length_sets_no_limit():
    assert LS.model_max_len(SimpleNamespace(max_position_embeddings=4096, n_positions=1024)) == 4096
    assert LS.model_max_len(SimpleNamespace(n_positions=1024)) == 1024  # GPT-2's name
    said = []
    c = LS.resolve_max_seq_len(TrainConfig(), SimpleNamespace(config=SimpleNamespace()), said.append)
    assert c.max_seq_len is None and "no row is dropped for length" in said[0]
    assert LS.resolve_max_seq_len(TrainConfig(max_seq_len=9), None, said.append).max_seq_len == 9


# --- gradient checkpointing by length ------------------------------------------------------------------


def test_gradient_checkpointing_auto_checkpoints_only_passes_over_the_threshold(base, examples):
    c = cfg(max_policy_lag=None)
    assert c.gradient_checkpointing == "auto" and c.shares_prefix  # auto keeps prefix sharing
    ex = load(examples, c)
    coef = {r: 1.0 for r in range(7)}
    long, short = D.collate(ex, [[6]], coef, True), D.collate(ex, [[0]], coef, True)
    shared = D.collate(ex, PX.SharedPass([0, 1], PX.common_prefix(ex, [0, 1])), coef, False)
    assert long.input_ids.numel() > 64 >= short.input_ids.numel()
    assert LS.wants_checkpointing(c, long) and not LS.wants_checkpointing(c, short)
    assert not LS.wants_checkpointing(c, shared)  # shared passes fit the budget and keep their KV cache
    assert LS.wants_checkpointing(cfg(checkpoint_above_tokens=16), short)  # the threshold is a key
    assert LS.wants_checkpointing(cfg(gradient_checkpointing=True), short)
    assert not LS.wants_checkpointing(cfg(gradient_checkpointing=False), long)
    # set_checkpointing flips the layers' flags of a model prepared once.
    model = loop.load_model(base, c)
    layers = [m for m in model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    assert layers and not any(m.gradient_checkpointing for m in layers)
    LS.set_checkpointing(model, True)
    assert all(m.gradient_checkpointing for m in layers)


@pytest.mark.parametrize(("value", "want"), [("auto", "auto"), ("true", True), ("false", False), ("on", True)], ids=str)
def test_gradient_checkpointing_takes_a_bool_or_auto(value, want, tmp_path):
    assert resolve(TrainConfig, sets=[f"gradient_checkpointing={value}"]).gradient_checkpointing == want
    toml = tmp_path / "t.toml"
    toml.write_text("gradient_checkpointing = true\n")
    assert resolve(TrainConfig, toml).gradient_checkpointing is True
    with pytest.raises(Exception, match="gradient_checkpointing='sometimes': must be true, false or auto"):
        resolve(TrainConfig, sets=["gradient_checkpointing=sometimes"])


# --- context parallelism --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "needs"),
    [
        ("accelerate", [">= 2 CUDA GPUs", "NCCL", "FSDP2", "a launch of a multiple of context_parallel_size=2"]),
        ("ulysses", [">= 2 CUDA GPUs", "NCCL", "DeepSpeed installed", "FlashAttention", "flash_attention_2"]),
    ],
)
def test_context_parallel_is_refused_up_front_on_this_machine(cli, base, examples, tmp_path, mode, needs):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this refusal is for machines without 2 GPUs")
    out = tmp_path / "out"
    r = cli(["train", examples, "--base", base, "-o", out, "--set", f"context_parallel={mode}"])
    assert r.exit_code == 2, r.output
    assert f"context_parallel='{mode}'" in r.error and "Hint:" in r.error
    for need in needs:
        assert need in r.error, need
    assert not out.exists()  # refused before anything was written


def test_context_parallel_config_is_built_when_the_requirements_hold():
    # What the Accelerator would get (not run here: it needs GPUs).
    pc = LS.parallelism_config(TrainConfig(context_parallel="accelerate", context_parallel_size=2), 4)
    assert (pc.cp_size, pc.dp_shard_size, pc.cp_backend) == (2, 2, "torch")
    pc = LS.parallelism_config(TrainConfig(context_parallel="ulysses", attn_implementation="flash_attention_2"), 2)
    assert (pc.sp_size, pc.sp_backend, pc.sp_handler.sp_attn_implementation) == (2, "deepspeed", "flash_attention_2")
    assert LS.parallelism_config(TrainConfig(), 1) is None
    assert LS.context_parallel_missing(TrainConfig()) == []


class ShardingStandIn:
    """Stands in for Accelerate's context parallel, which cannot run here (no GPUs): it shards
    every buffer along dim 1 in place, as `maybe_context_parallel` does (contiguous halves here;
    torch balances 2 x cp chunks, which the bookkeeping below does not depend on)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def maybe_context_parallel(self, buffers, buffer_seq_dims, no_restore_buffers):
        import contextlib

        for b in buffers:
            n = b.shape[1] // self.size
            b.data = b.data[:, self.rank * n : (self.rank + 1) * n].clone()
        return contextlib.nullcontext()


def test_context_parallel_pass_shards_every_per_token_tensor_alike(base, examples):
    # The bookkeeping of loop.py's accelerate path: the cp ranks' local tokens are the pass's
    # tokens, each with its own label, behaviour logprob, advantage, coefficient and row.
    c = cfg(max_policy_lag=None, context_parallel="accelerate", context_parallel_size=2)
    ex = load(examples, c)
    coef = {r: 0.5 + r for r in range(7)}
    whole = D.collate(ex, [[6]], coef, True)  # the long row alone: sharded
    parts = []
    for rank in range(2):
        with LS.context_parallel_pass(ShardingStandIn(rank, 2), whole, c) as b:
            assert b.input_ids.shape[1] == (LONG + 3) // 4 * 2  # padded to 2 x cp chunks, halved
            assert b.keep.sum() == b.labels.numel() == b.coef.numel()
            parts.append(b)
    for name in ("labels", "behavior", "advantage", "coef", "mask", "row"):
        torch.testing.assert_close(torch.cat([getattr(p, name) for p in parts]), getattr(whole, name), msg=name)
    assert sum(p.tokens for p in parts) == whole.tokens
    # A pass of several packed sequences runs whole on every cp rank, counted 1/cp each time.
    packed = D.collate(ex, [[0, 1]], coef, True)
    with LS.context_parallel_pass(ShardingStandIn(0, 2), packed, c) as b:
        torch.testing.assert_close(b.coef * 2, packed.coef)
        assert b.input_ids is packed.input_ids
    with LS.context_parallel_pass(None, whole, cfg()) as b:  # off: the batch as it is
        assert b is whole
