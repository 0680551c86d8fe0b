r"""Hinted self-distillation: the model *with* the user's hint teaches the model *without* it.

In:  the examples' `hint` column (distill's hints.py: the follow-up's hint on the turn it
     answers), the base checkpoint's tokenizer, and `hints.*` of TrainConfig (HintLossConfig).
Out: per micro-batch, the teacher's logprobs of the sampled completion tokens of every hinted
     row (TokenBatch.teacher_logp, .hinted), the loss term (`hint_losses`, called by
     loss.token_losses), and the per-step metrics (`HintStats`).

**The teacher's input, in token space.** The target row's prompt ids end with the assistant
header of the turn being scored (`<|im_start|>assistant\n` in ChatML). The hint becomes one
user message, rendered by the chat template *on its own* (the difference of two renders, as the
harness appends text: rlcycle/harness/render.py), and its ids are spliced in right before the
last occurrence of the header ids:

    teacher = prompt[:h] + ids(<|im_start|>user\n{hint}<|im_end|>\n) + prompt[h:] + completion

The completion's ids are the logged ones, never re-tokenised; the prompt's ids are never
re-tokenised either. A prompt without the header is left out of the term (counted). An empty
hint splices nothing: the teacher then sees exactly the student's input.

**The teacher's weights** (`teacher`), always without gradient:
    behavior  the checkpoint train starts from, frozen (the version that served the examples when
              they are on-policy: with LoRA, the base with the served adapter merged; a second
              model copy, shared with the KL reference when kl_coef > 0)
    base      LoRA only: the training model with its adapter disabled (the chain's first base;
              no extra memory)
    current   the training model itself, under no_grad (what SDPO/OPSD use; no extra memory,
              but the teacher drifts with the student)

**The term** on hinted tokens (target-span tokens of rows with a hint and a teacher), with
ℓ_t the student's logprob (gradient), ℓ^T_t the teacher's, r_t the ratio to the behaviour
policy (loss.py), λ = `coef`, g = `gap_clip`, C = `is_cap`:

    Δ_t = sg(ℓ^T_t - ℓ_t)                 the teacher-student gap on the sampled token
    Δ̂_t = clip(Δ_t, -g, g)               per-token clip (a hint that names a token the student
                                          never writes gives Δ ~ 10+ nats: bounded)
    w_t = sg(min(r_t, C))                  truncated importance weight to the sampler
    ψ_t = exp(ℓ_t - sg ℓ_t)                value 1, gradient ∇ℓ_t

    distill  L^H_t = -w_t · Δ̂_t · ψ_t     sampled-token reverse KL: E_π[(ℓ - ℓ^T)∇ℓ] = ∇KL(π‖π^T),
                                          here IS-corrected for the sampler μ ≠ π
    rlsd     L^H_t = -w_t · A_i · exp(sign(A_i)·Δ̂_t) · ψ_t
                                          sign-safe (RLSD): the reward's advantage A_i sets the
                                          direction, the teacher only the size: a token the teacher
                                          prefers is pushed up harder when A > 0, a token it
                                          dislikes is pushed down harder when A < 0, and no token
                                          ever moves against its reward

    L_t = (1 - λ)·L^PG_t + λ·L^H_t on hinted tokens, L^PG_t elsewhere (then × c_t as every loss).

`distill` with λ = 1 is pure distillation: the reward no longer matters on those tokens, which is
what 2026's results warn about (docs/hints.md): opt-in only. The default is `rlsd`.

**Metrics** per step: hint_rows_frac (rows of the global batch with a hint and a teacher),
hint_gap_mean and hint_gap_p99 (Δ over hinted tokens; p99 from a 0.02-nat histogram over
[-16, 16], reduced over processes), hint_clip_frac (share of hinted tokens with |Δ| > g),
hint_loss (Σ c·λ·L^H) and hint_ngram_overlap (mean share of a hint's token n-grams that occur
in its row's completion: a leak check, high = the hint restates what the model wrote).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError

MODES = ("rlsd", "distill")
TEACHERS = ("behavior", "base", "current")
HIST_LO, HIST_HI, HIST_BINS = -16.0, 16.0, 1600  # 0.02-nat bins for the gap's p99


@dataclass
class HintLossConfig:
    """Hinted self-distillation (`[train.hints]`, `--set hints.coef=0.5`; docs/hints.md)."""

    coef: float = cfg(0.0, help="λ: weight of the hint term on hinted tokens, in [0, 1] (0 = off, the default).")
    mode: str = cfg(
        "rlsd",
        help="rlsd (sign-safe: the reward sets each token's direction, the teacher its size) or distill "
        "(sampled-token reverse KL to the hinted teacher; λ = 1 is pure distillation).",
    )
    teacher: str = cfg(
        "behavior",
        help="Teacher weights: behavior (the starting checkpoint, frozen; a second copy), base (LoRA: the "
        "adapter disabled) or current (the training model, no gradient).",
    )
    gap_clip: float = cfg(2.0, help="Per-token clip g of the teacher-student gap (nats).")
    is_cap: float = cfg(2.0, help="Cap C of the importance weight min(π/μ, C) on the hint term.")
    role: str = cfg("user", help="Role of the message the hint is spliced in as.")
    ngram: int = cfg(3, help="Token n-gram length of the hint-completion overlap metric (a leak check).")

    @property
    def on(self) -> bool:
        return self.coef > 0

    def validate(self) -> list[str]:
        p: list[str] = []
        check_range(p, self, "coef", ge=0, le=1)
        check_range(p, self, ("gap_clip",), gt=0, finite=True)
        check_range(p, self, ("is_cap",), ge=1, finite=True)
        check_range(p, self, ("ngram",), ge=1)
        if self.mode not in MODES:
            p.append(f"mode={self.mode!r}: must be one of {', '.join(MODES)}")
        if self.teacher not in TEACHERS:
            p.append(f"teacher={self.teacher!r}: must be one of {', '.join(TEACHERS)}")
        return p


def check(config, lora_r: int) -> None:
    """Settings the hint term cannot run with, refused up front."""
    h = config.hints
    if not h.on:
        return
    problems = []
    if h.teacher == "base" and lora_r <= 0:
        problems.append(
            "hints.teacher=base needs LoRA (lora.r > 0): without an adapter there is no base to fall back to"
        )
    if config.context_parallel != "off":
        problems.append("hints with context_parallel: the teacher pass is not split over devices")
    if problems:
        raise InputError("; ".join(problems), hint="--set hints.teacher=behavior, or context_parallel=off")


# --- tokens ---------------------------------------------------------------------------------------


@dataclass
class Splicer:
    """The assistant header's ids, and a hint's message ids, from the chat template."""

    renderer: object  # rlcycle.harness.render.ChatRenderer
    header: np.ndarray
    role: str = "user"

    @classmethod
    def from_pretrained(cls, path, role: str = "user") -> Splicer:
        from rlcycle.harness.render import ChatRenderer

        r = ChatRenderer.from_pretrained(path)
        base = [{"role": "user", "content": "x"}]
        plain, gen = r.render_text(base), r.render_text(base, add_generation_prompt=True)
        if not gen.startswith(plain) or gen == plain:
            raise InputError(f"{path}: the chat template's generation prompt does not extend the conversation")
        return cls(r, np.array(r.encode(gen[len(plain) :]), np.int64), role)

    def block(self, hint: str) -> np.ndarray:
        """The ids of the hint as one message, as the template renders it after a user turn."""
        if not hint:
            return np.zeros(0, np.int64)
        base = [{"role": "user", "content": "x"}]
        plain = self.renderer.render_text(base)
        more = self.renderer.render_text([*base, {"role": self.role, "content": hint}])
        if not more.startswith(plain):
            raise InputError("the chat template re-renders history when a message is added: no hint splice")
        return np.array(self.renderer.encode(more[len(plain) :]), np.int64)


def splice(prompt: np.ndarray, header: np.ndarray, block: np.ndarray) -> np.ndarray | None:
    """`block` inserted before the last occurrence of `header` in `prompt` (None: no header)."""
    if not block.size:
        return prompt
    h = len(header)
    if h == 0 or len(prompt) < h:
        return None
    if np.array_equal(prompt[-h:], header):  # the usual case: the prompt ends with the header
        at = len(prompt) - h
    else:
        windows = np.lib.stride_tricks.sliding_window_view(prompt, h)
        hits = np.flatnonzero((windows == header).all(axis=1))
        if not hits.size:
            return None
        at = int(hits[-1])
    return np.concatenate([prompt[:at], block, prompt[at:]])


def ngram_overlap(hint: np.ndarray, completion: np.ndarray, n: int) -> float:
    """Share of the hint's token n-grams that occur in the completion (0 for a short hint)."""
    if len(hint) < n or len(completion) < n:
        return 0.0
    grams = {tuple(hint[i : i + n]) for i in range(len(hint) - n + 1)}
    seen = {tuple(completion[i : i + n]) for i in range(len(completion) - n + 1)}
    return len(grams & seen) / len(grams)


@dataclass
class HintRows:
    """Per example row: the teacher's prompt (None: no hint, or no header) and the overlap."""

    prompts: list[np.ndarray | None]
    overlap: np.ndarray  # float per row (NaN without a hint)
    with_hint: int = 0  # rows whose `hint` is not null
    no_header: int = 0  # of them, prompts without the assistant header (left out)


def prepare(ex, hints: list[str | None] | None, splicer: Splicer, n: int) -> HintRows:
    """The teacher prompts of every hinted row of `ex` (Examples; `hints` aligned with its rows)."""
    rows = len(ex)
    prompts: list[np.ndarray | None] = [None] * rows
    overlap = np.full(rows, np.nan)
    out = HintRows(prompts, overlap)
    for r, hint in enumerate(hints or []):
        if hint is None:
            continue
        out.with_hint += 1
        block = splicer.block(hint)
        spliced = splice(ex.prompt.row(r), splicer.header, block)
        if spliced is None:
            out.no_header += 1
            continue
        prompts[r] = spliced
        overlap[r] = ngram_overlap(block, ex.completion.row(r), n)
    return out


# --- the teacher pass ----------------------------------------------------------------------------


def batch_rows(lines, ex=None) -> list[int]:
    """The example rows of one forward pass in the order collate flattens their completions
    (data.collate): a segment's sequence (its last row) scores every member, in order."""
    rows = getattr(lines, "rows", None)  # a SharedPass
    rows = list(rows) if rows is not None else [r for line in lines for r in line]
    if ex is None or getattr(ex, "segments", None) is None:
        return rows
    return [m for r in rows for m in ex.members(r)]


def teacher_logprobs(model, ex, hr: HintRows, rows: list[int], device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ℓ^T per completion token of the pass, 1 on hinted tokens), flat in collate's order, or
    None when no row of the pass has a teacher prompt. One forward per hinted row, no gradient;
    only the completion positions reach the head (`logits_to_keep`)."""
    lens = [len(ex.completion.row(r)) for r in rows]
    if not any(hr.prompts[r] is not None for r in rows):
        return None
    logp = torch.zeros(sum(lens), dtype=torch.float32, device=device)
    hinted = torch.zeros_like(logp)
    o = 0
    with torch.no_grad():
        for r, n in zip(rows, lens, strict=True):
            prompt = hr.prompts[r]
            if prompt is not None:
                comp = ex.completion.row(r)
                ids = torch.from_numpy(np.concatenate([prompt, comp]).astype(np.int64))[None].to(device)
                logits = model(input_ids=ids, use_cache=False, logits_to_keep=n + 1).logits[0, :-1].float()
                if ex.temperature is not None:
                    logits = logits / float(ex.temperature[r])
                labels = torch.from_numpy(comp.astype(np.int64)).to(device)
                logp[o : o + n] = -torch.nn.functional.cross_entropy(logits, labels, reduction="none")
                hinted[o : o + n] = 1.0
            o += n
    return logp, hinted


# --- the loss term -------------------------------------------------------------------------------


def hint_losses(pg, logp, teacher_logp, hinted, advantage, log_r, on, s) -> tuple[torch.Tensor, torch.Tensor]:
    """(the blended per-token loss, λ·L^H per token) for LossSettings `s` (module docstring).

    `pg` is L^PG (0 off the loss), `on` the tokens in the loss; tokens not hinted keep L^PG."""
    gap = (teacher_logp - logp).detach()
    gap_hat = gap.clamp(-s.hint_gap_clip, s.hint_gap_clip)
    w = torch.exp(log_r.detach()).clamp(max=s.hint_is_cap)
    psi = torch.exp(logp - logp.detach())
    if s.hint_mode == "distill":
        term = -w * gap_hat * psi
    else:
        term = -w * advantage * torch.exp(torch.sign(advantage) * gap_hat) * psi
    use = on & (hinted > 0)
    term = torch.where(use, term, torch.zeros_like(term))
    lam = s.hint_coef
    blended = torch.where(use, (1.0 - lam) * pg + lam * term, pg)
    return blended, (lam * term).detach()


# --- metrics -------------------------------------------------------------------------------------


class HintStats:
    """Per-step hint metrics: local sums and a gap histogram, reduced over processes at the end."""

    def __init__(self, device, gap_clip: float):
        self.device, self.g = device, gap_clip
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # tokens, Σgap, clipped, loss
        self.hist = torch.zeros(HIST_BINS, dtype=torch.float64, device=self.device)

    def observe(self, tb) -> None:
        """Add one micro-batch (a TokenBatch with teacher fields) to the step's sums."""
        if tb.teacher_logp is None:
            return
        with torch.no_grad():
            use = (tb.hinted > 0) & (tb.mask > 0)
            gap = (tb.teacher_logp - tb.logp.detach())[use].double()
            loss = (tb.coef.double() * tb.hint_term.double()).sum() if tb.hint_term is not None else 0.0
            self.sums += torch.stack(
                [
                    gap.new_tensor(float(gap.numel())),
                    gap.sum(),
                    (gap.abs() > self.g).double().sum(),
                    gap.new_tensor(float(loss)),
                ]
            )
            self.hist += torch.histc(gap.clamp(HIST_LO, HIST_HI), HIST_BINS, HIST_LO, HIST_HI)

    def metrics(self, acc, hr: HintRows, rows: np.ndarray) -> dict:
        """The step's metrics (every process calls it: the reduce is a collective)."""
        sums, hist = acc.reduce(self.sums, "sum").cpu(), acc.reduce(self.hist, "sum").cpu()
        self.reset()
        hinted = [r for r in rows if hr.prompts[int(r)] is not None]
        n = float(sums[0])
        out = {
            "hint_rows_frac": len(hinted) / max(len(rows), 1),
            "hint_tokens": int(n),
            "hint_gap_mean": float(sums[1]) / n if n else None,
            "hint_gap_p99": _quantile(hist, 0.99) if n else None,
            "hint_clip_frac": float(sums[2]) / n if n else None,
            "hint_loss": float(sums[3]),
            "hint_ngram_overlap": float(np.mean([hr.overlap[int(r)] for r in hinted])) if hinted else None,
        }
        return out


def _quantile(hist: torch.Tensor, q: float) -> float:
    """The q-quantile of a histogram over [HIST_LO, HIST_HI] (the upper edge of its bin)."""
    cum = torch.cumsum(hist, 0)
    k = int(torch.searchsorted(cum, q * float(cum[-1])))
    return HIST_LO + (min(k, HIST_BINS - 1) + 1) * (HIST_HI - HIST_LO) / HIST_BINS
