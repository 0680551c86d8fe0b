"""Golden numbers for rlcycle/train/loss.py, computed by hand in the comments.

The fixed batch: two sequences, three completion tokens.

    token  seq  A    π_θ   μ (behaviour)  r = π_θ/μ
    t1     a    +1   0.5   0.4            1.25
    t2     a    +1   0.3   0.3            1.0
    t3     b    -1   0.2   0.1            2.0

ε_lo = ε_hi = 0.2 throughout.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlcycle.train.loss import LossSettings, TokenBatch, kl_estimate, micro_loss, summarize

PI = [0.5, 0.3, 0.2]
MU = [0.4, 0.3, 0.1]
ADV = [1.0, 1.0, -1.0]


def batch(coef, ref=None, weight_b=1.0) -> TokenBatch:
    logp = torch.tensor([math.log(p) for p in PI], dtype=torch.float64, requires_grad=True)
    c = torch.tensor(coef, dtype=torch.float64) * torch.tensor([1.0, 1.0, weight_b], dtype=torch.float64)
    return TokenBatch(
        logp=logp,
        behavior_logp=torch.tensor([math.log(p) for p in MU], dtype=torch.float64),
        advantage=torch.tensor(ADV, dtype=torch.float64),
        coef=c,
        mask=torch.ones(3, dtype=torch.float64),
        ref_logp=None if ref is None else torch.tensor([math.log(p) for p in ref], dtype=torch.float64),
    )


TOKEN = [1 / 3] * 3  # token normalisation: ν = 1 / 3 loss tokens


def loss_and_grad(b: TokenBatch, s: LossSettings):
    loss, sums, maxes = micro_loss(b, s)
    loss.backward()
    return loss.item(), b.logp.grad.tolist(), summarize(sums, maxes)


def test_ppo_no_is_correction():
    # t1: A>0, r=1.25 > 1.2: min(1.25, 1.2) = 1.2 -> L = -1.2, clipped (gradient 0)
    # t2: A>0, r=1.0:        L = -1.0,  dL/dℓ = -A·r = -1
    # t3: A<0, r=2.0:        min(-2, -1.2) = -2 -> L = +2, dL/dℓ = -A·r = +2
    # loss = (-1.2 - 1.0 + 2.0) / 3 = -0.0666...; grads = [0, -1/3, 2/3]
    loss, grad, m = loss_and_grad(batch(TOKEN), LossSettings(is_mode="none"))
    assert loss == pytest.approx(-0.2 / 3)
    assert grad == pytest.approx([0.0, -1 / 3, 2 / 3])
    assert m["clip_frac_high"] == pytest.approx(1 / 3)  # t1
    assert m["clip_frac_low"] == 0.0
    assert m["is_frac"] == 0.0


def test_ppo_truncated_is():
    # C = 1.5: t3's unclipped branch uses min(r, C) = 1.5: min(-1.5, -1.2) = -1.5 -> L = +1.5,
    # gradient min(r, C) = 1.5 (kept, bounded). loss = (-1.2 - 1 + 1.5)/3 = -0.2333...
    loss, grad, m = loss_and_grad(batch(TOKEN), LossSettings(is_mode="truncate", is_cap=1.5))
    assert loss == pytest.approx(-0.7 / 3)
    assert grad == pytest.approx([0.0, -1 / 3, 0.5])
    assert m["is_frac"] == pytest.approx(1 / 3)


def test_ppo_masked_is():
    # C = 1.5: t3 (r = 2) is masked: L = 0, gradient 0; it still counts in ν (1/3).
    # loss = (-1.2 - 1.0) / 3 = -0.7333...
    loss, grad, m = loss_and_grad(batch(TOKEN), LossSettings(is_mode="mask", is_cap=1.5))
    assert loss == pytest.approx(-2.2 / 3)
    assert grad == pytest.approx([0.0, -1 / 3, 0.0])
    assert m["is_frac"] == pytest.approx(1 / 3)


def test_grpo_sequence_normalisation():
    # ν_a = 1/(n_a·S) = 1/(2·2) = 1/4, ν_b = 1/(1·2) = 1/2 (S = 2 sequences)
    # loss = (-1.2 - 1.0)/4 + 2.0/2 = -0.55 + 1.0 = 0.45
    loss, grad, _ = loss_and_grad(batch([0.25, 0.25, 0.5]), LossSettings(objective="grpo", is_mode="none"))
    assert loss == pytest.approx(0.45)
    assert grad == pytest.approx([0.0, -0.25, 1.0])


def test_dr_grpo_constant_normalisation():
    # ν = 1/(S·M) = 1/(2·4) with M = 4 max tokens: loss = (-1.2 - 1.0 + 2.0)/8 = -0.025
    loss, _, _ = loss_and_grad(batch([1 / 8] * 3), LossSettings(objective="dr_grpo", is_mode="none"))
    assert loss == pytest.approx(-0.025)


def test_cispo():
    # ŵ = sg(min(r, C)) with C = 1.5: [1.25, 1.0, 1.5]; L = -ŵ·A = [-1.25, -1.0, +1.5]
    # loss = (-1.25 - 1.0 + 1.5)/3 = -0.25; dL/dℓ = -ŵ·A (no token is dropped): [-1.25, -1, 1.5]/3
    loss, grad, m = loss_and_grad(batch(TOKEN), LossSettings(objective="cispo", is_mode="truncate", is_cap=1.5))
    assert loss == pytest.approx(-0.25)
    assert grad == pytest.approx([-1.25 / 3, -1 / 3, 0.5])
    assert m["clip_frac"] == 0.0 and m["is_frac"] == pytest.approx(1 / 3)


def test_weight_multiplies_the_token_loss():
    # weight 0.5 on sequence b: t3's term 2.0/3 becomes 1.0/3: loss = (-1.2 - 1.0 + 1.0)/3 = -0.4
    loss, grad, _ = loss_and_grad(batch(TOKEN, weight_b=0.5), LossSettings(is_mode="none"))
    assert loss == pytest.approx(-0.4)
    assert grad[2] == pytest.approx(1 / 3)


def test_kl_estimators_to_the_base():
    # π_ref = [0.5, 0.6, 0.1]: δ = ℓ - ℓ_ref = [0, -ln 2, +ln 2]
    # k3 = e^-δ - 1 + δ: [0, 2 - 1 - ln2, 0.5 - 1 + ln2] = [0, 0.306853, 0.193147], sum = 0.5
    # β = 0.1: the KL part of the loss = 0.1·0.5/3 = 0.016667 on top of the PPO loss -0.066667
    ref = [0.5, 0.6, 0.1]
    loss, _, m = loss_and_grad(batch(TOKEN, ref=ref), LossSettings(is_mode="none", kl_coef=0.1, kl_estimator="k3"))
    assert m["kl_loss"] == pytest.approx(0.1 * 0.5 / 3)
    assert loss == pytest.approx(-0.2 / 3 + 0.1 * 0.5 / 3)
    assert m["kl_ref"] == pytest.approx(0.5 / 3)
    delta = torch.tensor([0.0, -math.log(2), math.log(2)])
    assert kl_estimate(delta, "k1").sum().item() == pytest.approx(0.0, abs=1e-7)  # Σδ = 0
    assert kl_estimate(delta, "k2").sum().item() == pytest.approx(math.log(2) ** 2)  # 2·½(ln2)²


def test_logged_statistics():
    # mismatch KL(μ‖π_θ) ≈ mean(r - 1 - ln r) = (0.25 - ln1.25 + 0 + 1 - ln2)/3 = 0.111236
    # ESS = (Σr)²/(n·Σr²) = 4.25²/(3·6.5625) = 0.917460; ratio mean 4.25/3, min 1, max 2
    _, _, m = loss_and_grad(batch(TOKEN), LossSettings(is_mode="none"))
    assert m["mismatch_kl"] == pytest.approx((0.25 - math.log(1.25) + 1 - math.log(2)) / 3)
    assert m["ess"] == pytest.approx(4.25**2 / (3 * 6.5625))
    assert (m["ratio_mean"], m["ratio_min"], m["ratio_max"]) == pytest.approx((4.25 / 3, 1.0, 2.0))


def test_sequence_level_ratio_spread():
    # seq a: ρ = ln 1.25 + ln 1.0 = ln 1.25; seq b: ρ = ln 2 -> e^ρ spans 1.25..2,
    # std of ρ = |ln 2 - ln 1.25| / 2
    b = batch(TOKEN)
    b.row = torch.tensor([0, 0, 1])
    _, _, m = loss_and_grad(b, LossSettings(is_mode="none"))
    assert (m["seq_ratio_min"], m["seq_ratio_max"]) == pytest.approx((1.25, 2.0))
    assert m["seq_log_ratio_std"] == pytest.approx((math.log(2) - math.log(1.25)) / 2)
    # a masked token is not in its sequence's sum; a sequence with no loss token is not counted
    b = batch(TOKEN)
    b.row, b.mask = torch.tensor([0, 0, 1]), torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    _, _, m = loss_and_grad(b, LossSettings(is_mode="none"))
    assert (m["seq_ratio_min"], m["seq_ratio_max"], m["seq_log_ratio_std"]) == pytest.approx((1.0, 1.0, 0.0))
    # without row ids (a caller of the loss alone) there is no sequence statistic
    _, _, m = loss_and_grad(batch(TOKEN), LossSettings(is_mode="none"))
    assert m["seq_ratio_min"] is None


def test_masked_tokens_contribute_nothing():
    # A loss-masked token has c_t = 0 and m_t = 0: no loss, no gradient, not in the stats.
    b = batch(TOKEN)
    b.coef = b.coef * torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    b.mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    loss, grad, m = loss_and_grad(b, LossSettings(is_mode="none"))
    assert loss == pytest.approx(-2.2 / 3)
    assert grad[2] == 0.0
    assert m["ratio_max"] == pytest.approx(1.25)


def test_overflowing_kl_on_a_masked_token_is_not_nan():
    # t3 is loss-masked and its δ = ℓ - ℓ_ref = ln 0.2 - 0 - 100 < -88.7: exp(-δ) overflows
    # float32 (inf). Masking by multiplication gave inf·0 = NaN in the loss, the kl stat and the
    # gradient; selection keeps the loss that of t1, t2 alone.
    logp = torch.tensor([math.log(p) for p in PI], dtype=torch.float32, requires_grad=True)
    ref = torch.tensor([math.log(0.5), math.log(0.6), math.log(0.2) + 100.0], dtype=torch.float32)
    b = TokenBatch(
        logp=logp,
        behavior_logp=torch.tensor([math.log(p) for p in MU], dtype=torch.float32),
        advantage=torch.tensor(ADV, dtype=torch.float32),
        coef=torch.tensor([1 / 3, 1 / 3, 0.0]),
        mask=torch.tensor([1.0, 1.0, 0.0]),
        ref_logp=ref,
    )
    assert math.isinf(kl_estimate((logp - ref)[2:], "k3").item())  # the overflow is real
    for est in ("k1", "k2", "k3", "k3_ratio"):
        logp.grad = None
        loss, sums, maxes = micro_loss(b, LossSettings(is_mode="none", kl_coef=0.1, kl_estimator=est))
        loss.backward()
        m = summarize(sums, maxes)
        assert math.isfinite(loss.item()) and math.isfinite(m["kl_loss"]) and math.isfinite(m["kl_ref"]), est
        assert torch.isfinite(logp.grad).all() and logp.grad[2].item() == 0.0, est
    # k3 on t1, t2 (δ = 0, -ln 2): 0 + (2 - 1 - ln 2); k3_ref is over loss tokens (2)
    assert m["kl_ref"] == pytest.approx((1 - math.log(2)) / 2, rel=1e-5)


def test_k3_ratio_is_k3_times_the_importance_ratio():
    # k3_ratio_t = r_t · k3_t, r_t = π_θ/μ = [1.25, 1, 2] with gradient through both factors:
    # ∂(r·k3)/∂ℓ = r·k3 + r·(1 - e^{-δ}) = r·δ   (k3 + 1 - e^{-δ} = δ)
    ref = [0.5, 0.6, 0.1]
    r = [p / q for p, q in zip(PI, MU, strict=True)]
    delta = [math.log(p / q) for p, q in zip(PI, ref, strict=True)]
    k3 = [math.exp(-d) - 1 + d for d in delta]
    beta = 0.1
    b = batch(TOKEN, ref=ref)
    b.advantage = torch.zeros(3, dtype=torch.float64)  # the KL term alone
    loss, grad, m = loss_and_grad(b, LossSettings(is_mode="none", kl_coef=beta, kl_estimator="k3_ratio"))
    assert loss == pytest.approx(beta * sum(ri * ki for ri, ki in zip(r, k3, strict=True)) / 3)
    assert grad == pytest.approx([beta * ri * di / 3 for ri, di in zip(r, delta, strict=True)])
    # plain k3's gradient is (1 - e^{-δ}) per token (forward KL's direction)
    b = batch(TOKEN, ref=ref)
    b.advantage = torch.zeros(3, dtype=torch.float64)
    _, grad3, _ = loss_and_grad(b, LossSettings(is_mode="none", kl_coef=beta, kl_estimator="k3"))
    assert grad3 == pytest.approx([beta * (1 - math.exp(-d)) / 3 for d in delta])


def test_truncate_keeps_the_gradient_past_the_log_ratio_clamp():
    # t3 with log r = 25 > 20 (the clamp) and A = -1: truncate caps the weight at C = 2, so the
    # token's loss is +C·|A|·ν and its gradient C·|A|·ν = 2/3, not 0 (a hard clamp's).
    b = batch(TOKEN)
    b.behavior_logp = b.behavior_logp.clone()
    b.behavior_logp[2] = b.logp.detach()[2] - 25.0
    loss, grad, m = loss_and_grad(b, LossSettings(is_mode="truncate", is_cap=2.0))
    assert grad[2] == pytest.approx(2.0 / 3)
    assert loss == pytest.approx((-1.2 - 1.0 + 2.0) / 3)
    assert m["ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-6)  # the value is clamped
    # none: the clamp stops the gradient (documented); the value stays finite
    b.logp.grad = None
    _, grad_none, _ = loss_and_grad(b, LossSettings(is_mode="none"))
    assert grad_none[2] == 0.0
