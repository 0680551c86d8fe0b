"""rlcycle train end to end on a real (tiny) transformers Qwen2: update direction, masks,
filters, staleness, resume, accumulation, checkpoint loading and generation."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file
from train_data import VOCAB, make_base, make_rows, write_examples

from rlcycle import io as rio
from rlcycle.digest import file_sha256
from rlcycle.errors import InputError, RlcycleError
from rlcycle.train import checkpoint as C
from rlcycle.train import data as D
from rlcycle.train import stage
from rlcycle.train.config import TrainConfig


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("train") / "base")


@pytest.fixture(scope="module")
def base_id(base):
    return C.checkpoint_id(base)


@pytest.fixture(scope="module")
def examples(base, base_id):
    rows = make_rows(8, seed=1)
    return write_examples(base.parent / "examples.arrow", base, rows, versions=[base_id] * 8)


def tiny(**kw) -> TrainConfig:
    """Small, fast settings: 8-row global batches, small token budgets, fp32 on CPU."""
    defaults = dict(lr=1e-2, batch_size=8, micro_batch_tokens=64, max_seq_len=64, save_every=0)
    return TrainConfig(**{**defaults, **kw})


def weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def seq_logprob(model_dir, prompt, completion) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0], -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logp[pos, torch.tensor(completion)].sum().item()


def assert_same_weights(a, b, atol=0.0):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        if atol:
            torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(wa[k], wb[k]), k


def test_one_step_moves_logprobs_with_the_advantage(base, examples, tmp_path):
    out = tmp_path / "ck"
    result = stage.run(tiny(optimizer="sgd", lr=0.5, epochs=1), examples, base, out, quiet=True)
    assert result.steps == 1 and result.rows_used == 8
    rows = make_rows(8, seed=1)
    for p, c, a in zip(rows["prompt_ids"], rows["completion_ids"], rows["advantage"], strict=True):
        before, after = seq_logprob(base, p, c), seq_logprob(out, p, c)
        assert (after - before) * a > 0, (a, before, after)


def test_first_step_is_on_policy_and_metrics_are_logged(base, examples, tmp_path):
    # Behaviour logprobs were computed one sequence at a time; the packed forward must agree.
    stage.run(tiny(epochs=2, kl_coef=0.05), examples, base, tmp_path / "ck", quiet=True)
    table = rio.read_table(tmp_path / "ck" / stage.METRICS_FILE)
    first = table.slice(0, 1).to_pylist()[0]
    assert table.num_rows == 2 and table.schema.equals(stage.TRAIN_METRICS_SCHEMA, check_metadata=False)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert first["mismatch_kl"] == pytest.approx(0.0, abs=1e-5)
    assert first["ess"] == pytest.approx(1.0, abs=1e-5)
    assert first["clip_frac"] == 0.0 and first["padding_fraction"] < 0.2
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the base
    # on-policy: every sequence-level ratio e^Σlog r is 1 too (train_metrics reports its spread)
    assert (first["seq_ratio_min"], first["seq_ratio_max"]) == pytest.approx((1.0, 1.0), abs=1e-3)
    assert first["seq_log_ratio_std"] == pytest.approx(0.0, abs=1e-3)
    last = table.slice(1, 1).to_pylist()[0]
    assert last["kl_ref"] > 0 and last["mismatch_kl"] > 0  # the policy has moved from μ
    for key in ("loss", "grad_norm", "tokens_per_s", "clip_frac_high", "is_frac"):
        assert math.isfinite(last[key]), key
    assert 0 < first["peak_memory_gb"] <= last["peak_memory_gb"]  # the process's peak RSS so far


def test_checkpoint_loads_generates_and_records_lineage(base, base_id, examples, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "ck"
    result = stage.run(tiny(), examples, base, out, quiet=True)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert gen.shape[1] == ids.shape[1] + 5
    meta = json.loads((out / "rlcycle.json").read_text())
    assert meta["id"] == C.content_id(out) == C.checkpoint_id(out) == result.checkpoint_id
    assert meta["id"].startswith("sha256:")
    assert meta["parent"] == base_id and meta["lineage"] == [base_id, meta["id"]]
    assert meta["data"] == [{"path": str(examples), "sha256": file_sha256(examples)}]
    assert meta["config"]["objective"] == "ppo" and meta["metrics"]["steps"] == 1
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert not list(tmp_path.glob(".*")) and not (tmp_path / "ck.state").exists()


def test_lineage_orders_policy_versions(base, base_id, examples, tmp_path):
    # Train twice: the child's lineage is [base, first, second]. Rows logged by the base are one
    # version behind `first` (kept at lag 1) and two behind `second` (stale at lag 1).
    first = stage.run(tiny(), examples, base, tmp_path / "first", quiet=True)
    again = stage.run(tiny(), examples, tmp_path / "first", tmp_path / "second", quiet=True)
    assert again.rows_used == 8 and again.parent_id == first.checkpoint_id
    lineage = json.loads((tmp_path / "second" / "rlcycle.json").read_text())["lineage"]
    assert lineage == [base_id, first.checkpoint_id, again.checkpoint_id]
    with pytest.raises(InputError, match="stale=8"):
        stage.run(tiny(), examples, tmp_path / "second", tmp_path / "third", quiet=True)


def test_loss_mask_and_dropped_rows_change_nothing(base, base_id, tmp_path):
    """Masked completion tokens, excluded rows and zero-weight rows never reach the gradient.

    Run A trains on rows whose completions end with 3 extra, loss-masked tokens, plus an
    excluded row; run B on the same rows cut before those tokens. A causal model's earlier
    logits do not see later tokens, and masked tokens do not count in ν, so the updates agree.
    """
    rows = make_rows(6, seed=3, completion_len=(5, 9))
    cut = {**rows, "completion_ids": [c[:-3] for c in rows["completion_ids"]]}
    masks = [[1] * (len(c) - 3) + [0, 0, 0] for c in rows["completion_ids"]]
    extra = make_rows(1, seed=9)
    full = {k: rows[k] + extra[k] for k in rows}
    a = write_examples(
        tmp_path / "a.arrow",
        base,
        full,
        versions=[base_id] * 7,
        loss_mask=masks + [None],
        excluded=[None] * 6 + ["invalid"],
    )
    b = write_examples(tmp_path / "b.arrow", base, cut, versions=[base_id] * 6)
    cfg = tiny(batch_size=6, optimizer="sgd")
    ra = stage.run(cfg, a, base, tmp_path / "A", quiet=True)
    stage.run(cfg, b, base, tmp_path / "B", quiet=True)
    assert ra.dropped == {"excluded": 1} and ra.excluded_reasons == {"invalid": 1}
    assert_same_weights(tmp_path / "A", tmp_path / "B", atol=1e-6)


def test_sample_temperature_lines_up_with_tempered_logprobs(base, base_id, tmp_path):
    # The sampler logged logprobs of logits / 0.5: only with use_sample_temperature does the
    # trainer see the same distribution (ratio 1, no mismatch) on the first step.
    path = write_examples(
        tmp_path / "t.arrow", base, make_rows(4, seed=6), versions=[base_id] * 4, sample_temperature=0.5
    )
    for use, on_policy in ((True, True), (False, False)):
        stage.run(tiny(use_sample_temperature=use), path, base, tmp_path / f"ck{use}", quiet=True)
        first = rio.read_table(tmp_path / f"ck{use}" / stage.METRICS_FILE).to_pylist()[0]
        assert (first["mismatch_kl"] < 1e-6) is on_policy, first["mismatch_kl"]


def test_collate_scores_only_completion_tokens(base, examples):
    ex = D.load_examples([str(examples)], tiny(max_policy_lag=None), [], VOCAB)
    for packed, lines in ((True, [[0, 1], [2]]), (False, [[0], [1], [2]])):
        b = D.collate(ex, lines, {0: 1.0, 1: 1.0, 2: 1.0}, packed)
        comp = np.concatenate([ex.completion.row(r) for r in (0, 1, 2)])
        assert b.labels.tolist() == comp.tolist()
        # Each kept position is followed by the label it scores, and none scores a prompt token.
        nxt = torch.roll(b.input_ids, -1, dims=1)[b.keep]
        assert nxt.tolist() == comp.tolist()
        assert int(b.keep.sum()) == sum(len(ex.completion.row(r)) for r in (0, 1, 2))


def test_rows_are_filtered_and_counted(base, base_id, tmp_path):
    rows = make_rows(9, seed=4)
    versions = ["v0", "v1", "v2", base_id[:12], "v-unknown", base_id, base_id, base_id, base_id]
    path = write_examples(tmp_path / "x.arrow", base, rows, versions=versions)
    table = rio.read_table(path)
    lp = table["behavior_logprobs"].to_pylist()
    lp[6] = lp[6][:-1]  # one logprob short
    lp[7] = [float("nan")] + lp[7][1:]
    table = table.set_column(
        table.schema.get_field_index("behavior_logprobs"), "behavior_logprobs", pa.array(lp, pa.list_(pa.float32()))
    )
    rio.write_table(table, path)
    cfg = tiny(policy_versions=["v0", "v1", "v2", base_id], max_policy_lag=2)
    ex = D.load_examples([str(path)], cfg, cfg.policy_versions, VOCAB)
    # v0 is 3 behind the newest (dropped), v1 and v2 are within lag 2, a 12-char id prefix matches.
    assert dict(ex.dropped) == {
        "stale": 1,
        "unknown_policy_version": 1,
        "logprob_length_mismatch": 1,
        "bad_behavior_logprob": 1,
    }
    assert len(ex) == 5 and ex.rows_in == 9


def test_no_trainable_rows_is_a_clear_error(base, examples, tmp_path):
    with pytest.raises(InputError) as e:
        stage.run(tiny(policy_versions=["a", "b"]), examples, base, tmp_path / "ck", quiet=True)
    assert "unknown_policy_version=8" in e.value.message
    assert "max_policy_lag=none" in e.value.hint


def test_resume_after_a_stop_ends_with_the_same_weights(base, examples, tmp_path):
    cfg = dict(batch_size=2, epochs=2, save_every=2)  # 8 steps, AdamW
    stage.run(tiny(**cfg), examples, base, tmp_path / "straight", quiet=True)
    # Stop after step 5 as if killed: the newest state is step 4, so step 5 is redone.
    stopped = stage.run(tiny(**cfg, stop_after=5), examples, base, tmp_path / "resumed", quiet=True)
    assert stopped.stopped and stopped.output is None and not (tmp_path / "resumed").exists()
    assert (tmp_path / "resumed.state" / "step-000004").is_dir()
    result = stage.run(tiny(**cfg), examples, base, tmp_path / "resumed", quiet=True)
    assert result.resumed_from == 4 and result.steps == 8
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    a = rio.read_table(tmp_path / "straight" / stage.METRICS_FILE)
    b = rio.read_table(tmp_path / "resumed" / stage.METRICS_FILE)
    assert a["loss"].to_pylist() == b["loss"].to_pylist()


def test_state_of_another_run_is_refused(base, examples, tmp_path):
    stage.run(tiny(batch_size=2, save_every=1, stop_after=1), examples, base, tmp_path / "ck", quiet=True)
    with pytest.raises(InputError, match="another run"):
        stage.run(tiny(batch_size=2, lr=1e-3), examples, base, tmp_path / "ck", quiet=True)


@pytest.mark.parametrize("batching", ["bucketed", "padded"])
def test_accumulation_and_batching_do_not_change_the_update(base, examples, tmp_path, batching):
    # One forward pass per step vs several micro-batches (and padding instead of packing).
    stage.run(
        tiny(optimizer="sgd", micro_batch_tokens=512, max_seq_len=64), examples, base, tmp_path / "one", quiet=True
    )
    r = stage.run(
        tiny(optimizer="sgd", batching=batching, micro_batch_tokens=64, micro_batch_size=3),
        examples,
        base,
        tmp_path / "many",
        quiet=True,
    )
    m = rio.read_table(tmp_path / "many" / stage.METRICS_FILE).to_pylist()[0]
    assert m["micro_batches"] >= 3 and r.steps == 1
    assert_same_weights(tmp_path / "one", tmp_path / "many", atol=1e-6)


def test_gradient_checkpointing_gives_the_same_update(base, examples, tmp_path):
    stage.run(tiny(optimizer="sgd"), examples, base, tmp_path / "a", quiet=True)
    stage.run(tiny(optimizer="sgd", gradient_checkpointing=True), examples, base, tmp_path / "b", quiet=True)
    assert_same_weights(tmp_path / "a", tmp_path / "b", atol=1e-6)
    assert "gradient_checkpointing" not in json.loads((tmp_path / "b" / "config.json").read_text())


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "cispo"])
def test_every_objective_trains(base, examples, tmp_path, objective):
    r = stage.run(tiny(objective=objective, epochs=2), examples, base, tmp_path / "ck", quiet=True)
    assert r.steps == 2 and not r.skipped_steps and math.isfinite(r.summary["loss_last"])


def test_non_finite_steps_are_skipped_then_abort(base, examples, tmp_path, monkeypatch):
    from rlcycle.train import loss as L

    real = L.micro_loss

    def poisoned(b, s):
        loss, sums, maxes = real(b, s)
        return loss * float("nan"), sums * float("nan"), maxes

    monkeypatch.setattr(L, "micro_loss", poisoned)
    r = stage.run(tiny(batch_size=4, epochs=1, max_skipped_steps=2), examples, base, tmp_path / "ck", quiet=True)
    assert r.skipped_steps == [1, 2]
    assert_same_weights(base, tmp_path / "ck")  # nothing was applied
    with pytest.raises(RlcycleError, match="non-finite") as e:
        stage.run(tiny(batch_size=4, max_skipped_steps=1), examples, base, tmp_path / "ck2", quiet=True)
    assert "max_skipped_steps" in e.value.message


def test_existing_output_is_refused(base, examples, tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "file").write_text("x")
    with pytest.raises(InputError, match="already exists"):
        stage.run(tiny(), examples, base, tmp_path / "ck", quiet=True)
    r = stage.run(tiny(save_dtype="bf16"), examples, base, tmp_path / "ck", overwrite=True, quiet=True)
    assert not (tmp_path / "ck" / "file").exists() and r.checkpoint_id
    # Saved in bf16 (tied embeddings included) and loadable as it is.
    from transformers import AutoModelForCausalLM

    assert json.loads((tmp_path / "ck" / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "ck").dtype == torch.bfloat16


def test_dr_grpo_m_defaults_to_the_logged_max_new_tokens(base, base_id, tmp_path):
    rows = make_rows(4, seed=5)
    longest = max(len(c) for c in rows["completion_ids"])
    plain = write_examples(tmp_path / "a.arrow", base, rows, versions=[base_id] * 4)
    logged = write_examples(tmp_path / "b.arrow", base, rows, versions=[base_id] * 4, max_new_tokens=[32, 48, None, 32])
    cfg = tiny(objective="dr_grpo")
    ex_plain = D.load_examples([str(plain)], cfg, [base_id], VOCAB)
    ex_logged = D.load_examples([str(logged)], cfg, [base_id], VOCAB)
    assert D.max_completion_tokens(ex_plain, cfg) == longest  # nothing logged: the data's longest
    assert D.max_completion_tokens(ex_logged, cfg) == 48  # the sampler's limit (largest logged)
    assert D.max_completion_tokens(ex_logged, tiny(objective="dr_grpo", max_completion_tokens=7)) == 7
    # and it is the M of the constant normaliser: ν = 1 / (S · M)
    nu = D.normalisers(ex_logged, np.arange(4), "constant", D.max_completion_tokens(ex_logged, cfg))
    assert nu == pytest.approx([1 / (4 * 48)] * 4)


def test_greedy_and_truncated_samples_are_left_out_of_the_update(base, base_id, tmp_path):
    """A mixed log: sampled rows train; greedy rows (the gateway at temperature 0: the behaviour
    policy was a point mass, so no importance ratio exists for them; the logged log_softmax at
    T=1 would give a wrong one) and top_p < 1 rows are dropped and counted, so the update is
    exactly the one of the sampled rows alone."""
    rows = make_rows(6, seed=5)
    extra = make_rows(3, seed=8)
    mixed = {k: rows[k] + extra[k] for k in rows}
    a = write_examples(
        tmp_path / "mixed.arrow",
        base,
        mixed,
        versions=[base_id] * 9,
        greedy=[None] * 6 + [True, False, None],
        temperature=[1.0] * 6 + [1.0, 0.0, 1.0],
        top_p=[None] * 6 + [None, None, 0.9],
    )
    b = write_examples(tmp_path / "sampled.arrow", base, rows, versions=[base_id] * 6)
    cfg = tiny(batch_size=6, optimizer="sgd")
    ra = stage.run(cfg, a, base, tmp_path / "A", quiet=True)
    stage.run(cfg, b, base, tmp_path / "B", quiet=True)
    assert ra.dropped == {"greedy_sampling": 2, "truncated_sampling": 1}
    assert_same_weights(tmp_path / "A", tmp_path / "B", atol=1e-6)


def test_a_wide_sequence_ratio_spread_at_step_1_is_warned_about(capsys):
    stage._warn_sequence_spread({"seq_ratio_min": 0.27, "seq_ratio_max": 2.1, "mismatch_kl": 1.3e-3})
    err = capsys.readouterr().err
    assert "0.27-2.1" in err and "float32" in err
    stage._warn_sequence_spread({"seq_ratio_min": 0.9, "seq_ratio_max": 1.1, "mismatch_kl": 0.0})
    stage._warn_sequence_spread({"seq_ratio_min": None, "seq_ratio_max": None})
    assert capsys.readouterr().err == ""


def test_one_process_trains_in_fp32_then_bf16(base, examples, tmp_path, capsys):
    # Accelerate keeps one state per process; a process that trains again (a cycle's arms, a
    # bench's sides) with another precision gets it, and bf16 autocast passes the packing check.
    for precision in ("fp32", "bf16", "fp32"):
        out = tmp_path / precision
        result = stage.run(tiny(precision=precision), examples, base, out, overwrite=True)
        assert result.steps == 1
        want = "bf16" if precision == "bf16" else "no"
        assert f"precision={want}" in capsys.readouterr().err
        first = rio.read_table(out / stage.METRICS_FILE).to_pylist()[0]
        assert first["mismatch_kl"] == pytest.approx(0.0, abs=1e-2 if precision == "bf16" else 1e-5)
