"""train's hinted self-distillation (rlcycle/train/hints.py, docs/hints.md): the splice in token
space, the teacher with an empty hint, a hint that states the answer on a model trained to use
it, the term's gradient against a hand computation, and a run through the CLI."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
from train_data import make_base, write_examples

from rlcycle.train import data as D
from rlcycle.train import hints as H
from rlcycle.train import loop
from rlcycle.train.config import TrainConfig
from rlcycle.train.loss import LossSettings, TokenBatch, micro_loss


def test_splice_goes_before_the_last_assistant_header():
    header, block = np.array([9, 8]), np.array([50, 51, 52])
    prompt = np.array([1, 9, 8, 3, 4, 9, 8])
    assert H.splice(prompt, header, block).tolist() == [1, 9, 8, 3, 4, 50, 51, 52, 9, 8]
    # Not at the end (a template that appends after the header): the last occurrence still.
    assert H.splice(np.array([1, 9, 8, 3]), header, block).tolist() == [1, 50, 51, 52, 9, 8, 3]
    assert H.splice(np.array([1, 2, 3]), header, block) is None
    assert H.splice(prompt, header, np.zeros(0, np.int64)).tolist() == prompt.tolist()  # empty hint: as is


def test_splicer_renders_the_hint_as_one_user_message(tmp_path):
    base = make_base(tmp_path / "base")
    sp = H.Splicer.from_pretrained(base)
    tok = sp.renderer.tokenizer
    assert tok.decode(sp.header.tolist()) == "<|im_start|>assistant\n"
    assert tok.decode(sp.block("keep {} for empty files").tolist()) == (
        "<|im_start|>user\nkeep {} for empty files<|im_end|>\n"
    )
    assert H.ngram_overlap(np.array([1, 2, 3, 4]), np.array([9, 2, 3, 4, 7]), 3) == 0.5


def _examples(tmp_path, base, hints, n=4, seed=0):
    """Examples whose prompts end with the assistant header (as logged agent prompts do)."""
    header = H.Splicer.from_pretrained(base).header.tolist()
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(5, 4000, 6).tolist() + header for _ in range(n)]
    comps = [rng.integers(5, 4000, 5).tolist() for _ in range(n)]
    rows = {"prompt_ids": prompts, "completion_ids": comps, "advantage": [1.0, -1.0] * (n // 2)}
    return write_examples(tmp_path / "ex.arrow", base, rows, hint=hints)


def test_empty_hint_teacher_equals_student(tmp_path, one_thread):
    base = make_base(tmp_path / "base")
    path = _examples(tmp_path, base, ["", "", None, ""])
    config = TrainConfig(cpu=True, max_policy_lag=None)
    ex = D.load_examples([str(path)], config, [], 4096)
    hr = H.prepare(ex, ex.hint, H.Splicer.from_pretrained(base), 3)
    assert hr.with_hint == 3 and hr.no_header == 0
    model = loop.load_model(base, config, trainable=False)
    lines = [[0, 1, 2, 3]]  # one packed line: the student's usual pass
    batch = D.collate(ex, lines, dict.fromkeys(range(4), 1.0), packed=True)
    with torch.no_grad():
        student = loop.completion_logprobs(model, batch, "cpu")
    teacher, hinted = H.teacher_logprobs(model, ex, hr, H.batch_rows(lines), "cpu")
    on = hinted > 0
    assert int(on.sum()) == sum(len(ex.completion.row(r)) for r in (0, 1, 3))
    # Measured here (fp32, CPU, packed student vs the teacher's one-row pass): ~1e-6.
    assert float((teacher - student)[on].abs().max()) < 1e-4


def _copy_model(seed=0):
    """A tiny Qwen2 trained to copy: after [Q, (HINT, a, END), H1, H2] it answers `a` when the
    hint block is there, and a random answer otherwise (so the hint carries the answer)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        ans = torch.randint(16, 48, (2 * B,), generator=g)
        hinted = torch.stack([torch.tensor([Q, HINT, 0, END, H1, H2, 0]) for _ in range(B)])
        hinted[:, 2], hinted[:, 6] = ans[:B], ans[:B]
        plain = torch.stack([torch.tensor([Q, H1, H2, 0, PAD, PAD, PAD]) for _ in range(B)])
        plain[:, 3] = ans[B:]
        logits = model(torch.cat([hinted, plain])).logits
        # Only the answer position is trained: index 5 predicts hinted[6], index 2 predicts plain[3].
        loss = torch.nn.functional.cross_entropy(logits[:B, 5], hinted[:, 6]) + torch.nn.functional.cross_entropy(
            logits[B:, 2], plain[:, 3]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


Q, HINT, END, H1, H2, PAD = 1, 2, 3, 4, 5, 6
STEPS, B = 150, 32


def test_hint_that_states_the_answer_raises_the_teachers_logprob(one_thread):
    model = _copy_model()
    answers = list(range(16, 48, 4))
    prompts = [np.array([Q, H1, H2])] * len(answers)
    comps = [np.array([a]) for a in answers]
    ex = D.Examples(
        D.Ragged(np.concatenate(prompts), np.arange(len(answers) + 1) * 3),
        D.Ragged(np.concatenate(comps), np.arange(len(answers) + 1)),
        np.zeros(len(answers), np.float32), None, np.zeros(len(answers)), np.ones(len(answers)), None,
    )  # fmt: skip
    header = np.array([H1, H2])
    teacher_prompts = [H.splice(p, header, np.array([HINT, a, END])) for p, a in zip(prompts, answers, strict=True)]
    hr = H.HintRows(teacher_prompts, np.zeros(len(answers)))
    rows = list(range(len(answers)))
    teacher, hinted = H.teacher_logprobs(model, ex, hr, rows, "cpu")
    batch = D.collate(ex, [[r] for r in rows], dict.fromkeys(rows, 1.0), packed=False)
    with torch.no_grad():
        student = loop.completion_logprobs(model, batch, "cpu")
    assert hinted.tolist() == [1.0] * len(answers)
    # Without the hint the answer is one of 32 (log 1/32 = -3.5); with it, near certain.
    assert float(student.mean()) < -2.5 and float(teacher.mean()) > -0.5
    assert bool((teacher > student + 2.0).all())


@pytest.mark.parametrize("mode", ["distill", "rlsd"])
def test_hint_term_gradient_matches_hand_computation(mode):
    lam, g, cap = 0.25, 1.0, 2.0
    s = LossSettings(objective="ppo", is_cap=cap, hint_coef=lam, hint_mode=mode, hint_gap_clip=g, hint_is_cap=cap)
    logp = torch.tensor([-1.0, -2.0, -0.5, -1.5, -3.0, -0.7], dtype=torch.float64, requires_grad=True)
    behavior = torch.tensor(
        [-1.1, -1.8, -0.5, -2.5, -3.0, -0.6], dtype=torch.float64
    )  # r = 1.105, .819, 1, 2.72, 1, .905
    teacher = torch.tensor([-0.5, -4.0, -0.5, -1.0, -1.0, -0.2], dtype=torch.float64)  # gaps .5, -2, 0, .5, 2, .5
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -0.5, 2.0], dtype=torch.float64)
    hinted = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    coef = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64)
    mask = torch.ones(6, dtype=torch.float64)
    tb = TokenBatch(logp, behavior, adv, coef, mask, teacher_logp=teacher, hinted=hinted)
    loss, _, _ = micro_loss(tb, s)
    (grad,) = torch.autograd.grad(loss, logp)
    # By hand, per token t (values as floats, formulas of hints.py and loss.py):
    want = []
    for t in range(6):
        r = float(np.exp(logp[t].item() - behavior[t].item()))
        a = adv[t].item()
        clipped = (a > 0 and r > 1.2) or (a < 0 and r < 0.8)
        d_pg = 0.0 if clipped else -a * min(r, cap)  # PPO with truncated IS
        gap = float(np.clip(teacher[t].item() - logp[t].item(), -g, g))
        w = min(r, cap)
        d_h = -w * gap if mode == "distill" else -w * a * float(np.exp(np.sign(a) * gap))
        d = (1 - lam) * d_pg + lam * d_h if hinted[t] else d_pg
        want.append(coef[t].item() * d)
    assert grad.tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)
    if mode == "rlsd":  # sign safety: on hinted tokens the gradient never opposes the reward
        for t in range(5):
            assert np.sign(grad[t].item()) in (0.0, -np.sign(adv[t].item()))


def test_train_cli_runs_the_hint_term_and_logs_its_metrics(cli, tmp_path):
    base = make_base(tmp_path / "base")
    hint = "parse() must return [] for an empty string"
    path = _examples(tmp_path, base, [hint, None, hint, None])
    for teacher in ("current",):  # behavior: the smoke test (test_hints_smoke.py)
        out = tmp_path / f"ck-{teacher}"
        args = ["train", path, "--base", base, "-o", out, "--json", "--set", "max_policy_lag=-1"]
        args += ["--set", "hints.coef=0.5", "--set", f"hints.teacher={teacher}", "--set", "batch_size=4"]
        r = cli(args)
        assert r.exit_code == 0, r.output
        assert "train: hints on 2 of 4 rows (teacher " in r.stderr
        m = pl.read_ipc(json.loads(r.stdout)["metrics_path"]).row(0, named=True)
        assert m["hint_rows_frac"] == 0.5 and m["hint_tokens"] == 10
        assert m["hint_gap_mean"] is not None and m["hint_gap_p99"] >= m["hint_gap_mean"]
        assert 0 <= m["hint_clip_frac"] <= 1 and m["hint_ngram_overlap"] == 0.0
    r = cli(
        ["train", path, "--base", base, "-o", tmp_path / "x", "--set", "hints.coef=0.5", "--set", "hints.teacher=base"]
    )
    assert r.exit_code == 2 and "hints.teacher=base needs LoRA" in r.output


def test_lora_base_teacher_disables_the_adapter(cli, tmp_path):
    """teacher=base: the training model with its adapter off. At step 1 a fresh adapter is zero, so
    the base teacher is the starting model and, with an empty hint, the gap is exactly the
    packing/precision noise: ~0."""
    base = make_base(tmp_path / "base")
    path = _examples(tmp_path, base, ["", "", "", ""])
    args = ["train", path, "--base", base, "-o", tmp_path / "ck", "--json", "--set", "max_policy_lag=-1"]
    args += ["--set", "hints.coef=0.5", "--set", "hints.teacher=base", "--set", "lora.r=4", "--set", "batch_size=4"]
    r = cli(args)
    assert r.exit_code == 0, r.output
    m = pl.read_ipc(json.loads(r.stdout)["metrics_path"]).row(0, named=True)
    assert m["hint_rows_frac"] == 1.0 and abs(m["hint_gap_mean"]) < 1e-4
