r"""The policy-gradient objectives of `rlcycle train`, on flat per-token tensors.

Notation, for one completion token t of example i (only completion tokens are ever scored;
prompt tokens, tool outputs and user text are context):

    ℓ_t  = log π_θ(y_t | x, y_<t)       current policy, with gradient
    b_t  = log μ(y_t | x, y_<t)         behaviour policy: the logprob the sampler logged
    r_t  = exp(ℓ_t - b_t)               importance ratio to the behaviour policy
    A_i  = advantage of example i        (from distill; the same for all tokens of i)
    c_t  = m_t · w_i · ν_i               coefficient: loss mask m_t ∈ {0,1}, row weight w_i,
                                         normaliser ν_i (below)
    sg(·) = stop-gradient (.detach())

The behaviour policy plays PPO's "old policy": it is the policy that produced the samples, so
the trust region is measured from it. When the logs are on-policy and the sampler matches the
trainer, r_t = 1 at the start; stale versions and sampler/trainer mismatch show up as r_t ≠ 1,
which the clip and the importance-sampling (IS) safeguard below keep bounded. log r_t is clamped
to [-20, 20] before exp so a wild token cannot overflow; under `truncate` the clamp is
straight-through (value clamped, gradient kept), so such a token still gets min(r, C)·∇ℓ; under
`none` and `mask` its gradient is zero.

**IS safeguard** (`is_mode`, cap C = `is_cap`, floor F = `is_floor`):

    none      r̃_t = r_t
    truncate  r̃_t = r_t · sg(min(r_t, C) / r_t)        value min(r_t, C), gradient min(r_t, C)·∇ℓ_t
    mask      r̃_t = r_t, and m_t ← m_t · 1[F ≤ sg(r_t) ≤ C]

Truncation keeps the token's gradient with a bounded weight (truncated IS, Yao et al. 2025);
masking drops it (masked IS). Masked tokens still count in the normaliser, which is fixed
before the step (that is what makes the update layout-independent, see below).

**Objectives** (`objective`):

    ppo / grpo / dr_grpo   L_t = -min(r̃_t · A_i, clip(r_t, 1-ε_lo, 1+ε_hi) · A_i)
    cispo                  L_t = -sg(ŵ_t) · A_i · exp(ℓ_t - sg(ℓ_t)),   ŵ_t = r̃_t as above
                                 (value -ŵ_t·A_i, gradient -ŵ_t·A_i·∇ℓ_t)

PPO's clip zeroes the gradient of tokens that already moved past the trust region in the
direction of their advantage (A > 0 and r > 1+ε_hi, or A < 0 and r < 1-ε_lo): those are the
"clip fractions" logged. For A < 0 the unclipped branch grows with r without bound; the IS cap
C ≥ 1+ε_hi bounds it (the same job as dual-clip PPO, keeping a bounded gradient instead of none).
CISPO (MiniMax-M1) never drops a token's gradient: it clips the *weight* instead, so rare,
high-ratio tokens (often the "forking" tokens of a reasoning path) still learn; with no lower
bound, that is REINFORCE with truncated importance weights min(r, C).

**Normalisation** (`normalization`, default by objective): ν_i makes the update a fixed
function of the *global* batch (all micro-batches of all processes), computed from the step's
schedule before any forward pass, so gradient accumulation and the process count change
nothing but float summation order:

    token     (ppo, cispo)  ν = 1 / Σ_{j in batch} Σ_t m_jt       token mean over the global batch
    sequence  (grpo)        ν_i = 1 / (n_i · S)                   GRPO: mean over each sequence's
                                                                  n_i loss tokens, then over S rows
    constant  (dr_grpo)     ν = 1 / (S · M)                       Dr. GRPO: a constant, M =
                                                                  max_completion_tokens

Dr. GRPO (Liu et al. 2025) removes GRPO's 1/n_i, which biases towards short correct and long
wrong answers; its other half (no std-normalised advantages) belongs to distill.

**Optional KL to the base policy** (`kl_coef` β > 0, `kl_estimator`), with δ_t = ℓ_t - sg(ℓ^ref_t):

    k1 = δ_t          k2 = δ_t² / 2          k3 = exp(-δ_t) - 1 + δ_t   (Schulman's estimators)
    k3_ratio = r_t · k3_t   (r_t with gradient; TRL's GRPO KL term)
    L_t ← L_t + β · k_t

estimated on the tokens the behaviour policy sampled (not re-sampled from π_θ). Gradients, in
expectation over on-policy samples: k1 → 0; k2 → ∇KL(π_θ‖π_ref) (reverse KL); k3 →
∇KL(π_ref‖π_θ) (forward KL: ∇k3 = (1 - π_ref/π_θ)∇ℓ); k3_ratio → ∇KL(π_θ‖π_ref), off-policy too
(∇(r·k3) = r·δ·∇ℓ). Tokens off the loss (mask 0, IS-masked) get L_t = 0 by selection, so an
overflowing KL term there cannot turn the loss into NaN.

**The micro-batch loss** is Σ_t c_t · L_t. Summed over every micro-batch of every process it is
the global objective; under DDP/FSDP, whose all-reduce *averages* gradients, the training loop
multiplies each micro-batch loss by the world size so the reduced gradient is the global sum.

Logged per step (sums over loss tokens here; the loop reduces and divides):
ratio mean/min/max, mean log r, the behaviour→current mismatch KL(μ‖π_θ) ≈ mean(r - 1 - log r)
(k3 on μ's samples), the effective sample size ESS = (Σr)² / (n·Σr²) ∈ (0, 1], clip fractions,
the IS-safeguard fraction, and k3 to the base policy when KL is on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlcycle.train import hints as H
from rlcycle.train.config import TrainConfig

# Bounds on log r before exp: e^20 ≈ 5e8 is far past any cap, and exp() cannot overflow.
LOG_RATIO_CLAMP = 20.0

# Per-step statistics, summed over loss tokens (then over micro-batches and processes).
SUM_STATS = (
    "tokens",  # loss tokens (m_t = 1 before the IS mask)
    "loss",  # Σ c_t·L_t: the objective itself
    "pg_loss",  # Σ c_t·L^pg_t
    "kl_loss",  # Σ c_t·β·k_t
    "ratio",  # Σ r_t
    "ratio_sq",  # Σ r_t²  (ESS)
    "log_ratio",  # Σ log r_t
    "mismatch_k3",  # Σ (r_t - 1 - log r_t): KL(μ‖π_θ) estimate
    "clip_low",  # tokens where the PPO clip stopped a push down (A < 0, r < 1-ε_lo)
    "clip_high",  # tokens where the PPO clip stopped a push up (A > 0, r > 1+ε_hi)
    "is_clipped",  # tokens truncated (r > C) or masked (r outside [F, C]) by the IS safeguard
    "kl_ref",  # Σ k3 to the base policy (0 when KL is off)
    # Per sequence i: ρ_i = Σ_t m_t log r_t, the log of the sequence-level ratio e^ρ_i that a
    # sequence-level IS weight would use. Token-level mismatch_kl hides how token noise adds up
    # along a sequence: bf16 serving (|Δ| ~0.04 per token) spans e^ρ ~0.3-2 over 64 tokens.
    "seqs",  # sequences with at least one loss token
    "seq_log_ratio",  # Σ_i ρ_i
    "seq_log_ratio_sq",  # Σ_i ρ_i²
)
# reduced with max; min r = -max(-r)
MAX_STATS = ("ratio_max", "neg_ratio_min", "seq_log_ratio_max", "neg_seq_log_ratio_min")


@dataclass(frozen=True)
class LossSettings:
    """The loss knobs of a TrainConfig, frozen (what `token_losses` needs)."""

    objective: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    is_mode: str = "truncate"
    is_cap: float = 2.0
    is_floor: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    # Hinted self-distillation (hints.py has the math); 0 = off.
    hint_coef: float = 0.0
    hint_mode: str = "rlsd"
    hint_gap_clip: float = 2.0
    hint_is_cap: float = 2.0

    @classmethod
    def from_config(cls, c: TrainConfig) -> LossSettings:
        h = c.hints
        return cls(
            c.objective, c.clip_low, c.clip_high, c.is_mode, c.is_cap, c.is_floor, c.kl_coef, c.kl_estimator,
            h.coef, h.mode, h.gap_clip, h.is_cap,
        )  # fmt: skip


@dataclass
class TokenBatch:
    """One micro-batch as flat per-token tensors over its completion tokens (all shape [T])."""

    logp: torch.Tensor  # ℓ_t, float32, with gradient
    behavior_logp: torch.Tensor  # b_t
    advantage: torch.Tensor  # A_i broadcast to tokens
    coef: torch.Tensor  # c_t = m_t · w_i · ν_i (0 on masked tokens)
    mask: torch.Tensor  # m_t as float (1 = loss token)
    ref_logp: torch.Tensor | None = None  # ℓ^ref_t when KL is on
    row: torch.Tensor | None = None  # int64: the sequence (0..n-1 in this batch) of each token
    teacher_logp: torch.Tensor | None = None  # ℓ^T_t of the hinted teacher (hints.py), no gradient
    hinted: torch.Tensor | None = None  # 1 on tokens of rows with a hint and a teacher
    hint_term: torch.Tensor | None = None  # λ·L^H_t, set by micro_loss (for the hint metrics)


def kl_estimate(delta: torch.Tensor, estimator: str, log_r: torch.Tensor | None = None) -> torch.Tensor:
    """Schulman's k1/k2/k3 on δ = log π_θ - log π_ref at sampled tokens (per token).

    `k3_ratio` is k3 times the importance ratio r = exp(log_r) to the behaviour policy, with
    gradient through r (TRL's GRPO KL): its gradient is the reverse KL's even off-policy.
    """
    if estimator == "k1":
        return delta  # unbiased for KL's value, high variance, can be negative
    if estimator == "k2":
        return 0.5 * delta.pow(2)  # biased, low variance; its gradient is the KL's on-policy
    # k3 = (π_ref/π_θ) - 1 - log(π_ref/π_θ) with log(π_ref/π_θ) = -δ: unbiased and >= 0.
    k3 = torch.expm1(-delta) + delta
    if estimator == "k3_ratio":
        if log_r is None:
            raise ValueError("k3_ratio needs the log-ratio to the behaviour policy")
        return torch.exp(log_r) * k3
    return k3


def _clamp_log_ratio(log_r: torch.Tensor, straight_through: bool) -> torch.Tensor:
    """log r clamped to ±LOG_RATIO_CLAMP in value; with `straight_through` its gradient stays 1."""
    clamped = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if not straight_through:
        return clamped
    return log_r + (clamped - log_r).detach()


def token_losses(b: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token losses L_t (before c_t) and the 0/1 indicator tensors the stats need.

    Tokens outside the loss (m_t = 0, or dropped by the IS mask) get L_t = 0 by *selection*
    (torch.where on a sanitised input), never by multiplying by 0: an overflowing term there
    (inf) would otherwise turn the loss and its gradient into NaN.
    """
    # truncate: straight-through clamp, so a token past the clamp keeps the gradient
    # min(r, C)·∇ℓ the truncation promises (the clamp only guards exp against overflow).
    log_r = _clamp_log_ratio(b.logp - b.behavior_logp, s.is_mode == "truncate")
    r = torch.exp(log_r)
    r_sg = r.detach()
    adv = b.advantage
    # IS safeguard on the ratio to the behaviour policy.
    keep = torch.ones_like(r_sg)
    if s.is_mode == "truncate":
        capped = r_sg > s.is_cap
        # r · sg(min(r, C)/r): the value is min(r, C) and the gradient min(r, C)·∇ℓ.
        r_tilde = r * (r_sg.clamp(max=s.is_cap) / r_sg)
    elif s.is_mode == "mask":
        capped = (r_sg > s.is_cap) | (r_sg < s.is_floor)
        keep = (~capped).to(r.dtype)
        r_tilde = r
    else:
        capped = torch.zeros_like(r_sg, dtype=torch.bool)
        r_tilde = r
    flags = {"is_clipped": capped.to(r.dtype)}
    if s.objective == "cispo":
        # The weight carries no gradient; exp(ℓ - sg ℓ) is 1 in value and ∇ℓ in gradient.
        weight = r_tilde.detach()
        pg = -weight * adv * torch.exp(b.logp - b.logp.detach())
        flags["clip_low"] = torch.zeros_like(r_sg)
        flags["clip_high"] = torch.zeros_like(r_sg)
    else:
        clipped = r.clamp(1.0 - s.clip_low, 1.0 + s.clip_high)
        # The pessimistic (min) of the unclipped and the clipped surrogate.
        pg = -torch.minimum(r_tilde * adv, clipped * adv)
        # Where the clip is active its branch is the min and the gradient is zero.
        flags["clip_low"] = ((adv < 0) & (r_sg < 1.0 - s.clip_low)).to(r.dtype)
        flags["clip_high"] = ((adv > 0) & (r_sg > 1.0 + s.clip_high)).to(r.dtype)
    on = (b.mask > 0) & (keep > 0)
    pg = torch.where(on, pg, torch.zeros_like(pg))
    if s.hint_coef > 0 and b.teacher_logp is not None:  # hinted tokens: the blend of hints.py
        pg, flags["hint"] = H.hint_losses(pg, b.logp, b.teacher_logp, b.hinted, adv, log_r, on, s)
    kl = torch.zeros_like(pg)
    if s.kl_coef > 0 and b.ref_logp is not None:
        # Select before the estimator: exp(-δ) of a masked token may overflow, and inf·0 (value)
        # or 0·inf (the gradient through torch.where) is NaN.
        delta = torch.where(on, b.logp - b.ref_logp.detach(), torch.zeros_like(pg))
        kl = s.kl_coef * kl_estimate(delta, s.kl_estimator, torch.where(on, log_r, torch.zeros_like(pg)))
        kl = torch.where(on, kl, torch.zeros_like(kl))
    flags.update(log_r=log_r.detach(), r=r_sg, pg=pg.detach(), kl=kl.detach())
    return pg + kl, flags


def micro_loss(b: TokenBatch, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ_t c_t·L_t with gradient, SUM_STATS vector, MAX_STATS vector) for one micro-batch."""
    per_token, f = token_losses(b, s)
    b.hint_term = f.get("hint")
    loss = (b.coef * per_token).sum()
    with torch.no_grad():
        m = b.mask
        r, log_r = f["r"], f["log_r"]
        on = m > 0
        rho = sequence_log_ratios(b, torch.where(on, log_r, torch.zeros_like(log_r)))
        k3_ref = torch.zeros_like(r)
        if b.ref_logp is not None:  # on loss tokens only (a masked token's k3 may be inf)
            k3_ref = torch.where(on, kl_estimate(torch.where(on, b.logp.detach() - b.ref_logp, 0.0), "k3"), 0.0)
        sums = torch.stack(
            [
                m.sum(),
                loss.detach(),
                (b.coef * f["pg"]).sum(),
                (b.coef * f["kl"]).sum(),
                (m * r).sum(),
                (m * r * r).sum(),
                (m * log_r).sum(),
                (m * (torch.expm1(log_r) - log_r)).sum(),  # r - 1 - log r, computed stably
                (m * f["clip_low"]).sum(),
                (m * f["clip_high"]).sum(),
                (m * f["is_clipped"]).sum(),
                (m * k3_ref).sum(),
                *_seq_sums(rho),
            ]
        )
        big = torch.tensor(float("-inf"), dtype=r.dtype, device=r.device)
        maxes = torch.stack(
            [
                torch.where(on, r, big).max() if r.numel() else big,
                torch.where(on, -r, big).max() if r.numel() else big,
                rho.max() if rho.numel() else big,
                (-rho).max() if rho.numel() else big,
            ]
        )
    return loss, sums.float(), maxes.float()


def sequence_log_ratios(b: TokenBatch, log_r: torch.Tensor) -> torch.Tensor:
    """ρ_i = Σ_t m_t log r_t of every sequence with a loss token (empty without `row`)."""
    if b.row is None or not b.row.numel():
        return log_r.new_zeros(0)
    n = int(b.row.max()) + 1
    rho = log_r.new_zeros(n).index_add_(0, b.row, b.mask * log_r)
    has = log_r.new_zeros(n).index_add_(0, b.row, b.mask) > 0
    return rho[has]


def _seq_sums(rho: torch.Tensor) -> list[torch.Tensor]:
    return [rho.new_tensor(float(rho.numel())), rho.sum(), (rho * rho).sum()]


def summarize(sums: torch.Tensor, maxes: torch.Tensor) -> dict[str, float | None]:
    """Per-step metrics from the reduced SUM_STATS and MAX_STATS vectors."""
    s = dict(zip(SUM_STATS, sums.tolist(), strict=True))
    mx = dict(zip(MAX_STATS, maxes.tolist(), strict=True))
    n = s["tokens"]
    if n <= 0:
        return {"loss": s["loss"], "pg_loss": s["pg_loss"], "kl_loss": s["kl_loss"]}
    return {
        "loss": s["loss"],
        "pg_loss": s["pg_loss"],
        "kl_loss": s["kl_loss"],
        "ratio_mean": s["ratio"] / n,
        "ratio_min": -mx["neg_ratio_min"],
        "ratio_max": mx["ratio_max"],
        "log_ratio_mean": s["log_ratio"] / n,
        "mismatch_kl": s["mismatch_k3"] / n,
        # Kish's effective sample size of the token weights r, as a fraction of n.
        "ess": (s["ratio"] ** 2) / (n * s["ratio_sq"]) if s["ratio_sq"] > 0 else None,
        "clip_frac_low": s["clip_low"] / n,
        "clip_frac_high": s["clip_high"] / n,
        "clip_frac": (s["clip_low"] + s["clip_high"]) / n,
        "is_frac": s["is_clipped"] / n,
        "kl_ref": s["kl_ref"] / n,
        **_seq_ratio(s, mx),
    }


def _seq_ratio(s: dict[str, float], mx: dict[str, float]) -> dict[str, float | None]:
    """The spread of the sequence-level ratios e^ρ_i: min, max, and the std of ρ."""
    k = s["seqs"]
    if k <= 0:
        return {"seq_ratio_min": None, "seq_ratio_max": None, "seq_log_ratio_std": None}
    mean = s["seq_log_ratio"] / k
    var = max(0.0, s["seq_log_ratio_sq"] / k - mean * mean)
    clamp = lambda x: math.exp(max(-LOG_RATIO_CLAMP, min(LOG_RATIO_CLAMP, x)))  # noqa: E731
    return {
        "seq_ratio_min": clamp(-mx["neg_seq_log_ratio_min"]),
        "seq_ratio_max": clamp(mx["seq_log_ratio_max"]),
        "seq_log_ratio_std": math.sqrt(var),
    }
