"""TrainConfig: every knob of `rlcycle train`, with help text and a default.

Precedence (rlcycle.config.resolve): defaults < `--config` TOML (`[train]` table or top level)
< `--set key=value` < explicit flags. `validate()` reports every problem at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcycle.config import cfg, check_range
from rlcycle.train.hints import HintLossConfig

OBJECTIVES = ("ppo", "grpo", "dr_grpo", "cispo")
NORMALIZATIONS = ("token", "sequence", "constant")
# The normalisation each objective uses unless `normalization` overrides it (see loss.py).
DEFAULT_NORMALIZATION = {"ppo": "token", "grpo": "sequence", "dr_grpo": "constant", "cispo": "token"}
IS_MODES = ("none", "truncate", "mask")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_ratio")
BATCHING = ("packed", "bucketed", "padded")
CONTEXT_PARALLEL = ("off", "accelerate", "ulysses")


@dataclass
class LoraConfig:
    """LoRA adapters via peft (`pip install 'rlcycle[lora]'`; docs/lora.md): `[train.lora]`, or
    `--set lora.r=16 --set lora.target_modules=q_proj,v_proj`. r = 0 (the default) is off: a
    full fine-tune."""

    r: int = cfg(0, help="LoRA rank (0 = off: full fine-tune).")
    alpha: float | None = cfg(None, help="LoRA scale alpha (the update is scaled by alpha / r; none = 2r).")
    dropout: float = cfg(0.0, help="Dropout on the LoRA path, in [0, 1).")
    target_modules: list[str] = cfg(
        ["all-linear"], help="Module names that get adapters (a comma list on --set), or all-linear."
    )
    # A chain's adapters stay deltas from its first base: what a server on one base needs.
    continue_adapter: bool = cfg(
        True,
        help="A base trained with LoRA continues its adapter, so every adapter of a chain is the "
        "delta from the chain's first base (false: a new adapter on the base's merged weights).",
    )

    @property
    def scale_alpha(self) -> float:
        """alpha in force: the setting, else 2r."""
        return float(2 * self.r if self.alpha is None else self.alpha)

    def validate(self) -> list[str]:
        p: list[str] = []
        check_range(p, self, "r", ge=0)
        check_range(p, self, "alpha", gt=0, finite=True, optional=True)
        check_range(p, self, "dropout", ge=0, lt=1)
        if not self.target_modules or not all(m.strip() for m in self.target_modules):
            p.append(
                f"target_modules={self.target_modules!r}: must be a non-empty list of module names (or all-linear)"
            )
        return p


@dataclass
class TrainConfig:
    # --- objective (loss.py has the math) ---------------------------------------------------
    objective: str = cfg("ppo", help="Loss variant: ppo, grpo, dr_grpo or cispo (see docs/train.md).")
    normalization: str | None = cfg(
        None,
        help="Override the objective's loss normalisation: token (sum / loss tokens in the global "
        "batch), sequence (per-sequence mean, then / sequences), constant (sum / (sequences x "
        "max_completion_tokens), Dr. GRPO).",
    )
    clip_low: float = cfg(0.2, help="PPO clip: ratios below 1 - clip_low stop pushing down (A < 0).")
    clip_high: float = cfg(
        0.2, help="PPO clip: ratios above 1 + clip_high stop pushing up (A > 0); 0.28 = DAPO clip-higher."
    )
    is_mode: str = cfg(
        "truncate",
        help="Off-policy importance-sampling safeguard on the ratio to the behaviour policy: "
        "none, truncate (cap the weight at is_cap, keep the gradient) or mask (drop tokens "
        "whose ratio is above is_cap or below is_floor).",
    )
    is_cap: float = cfg(2.0, help="Upper cap C of the importance ratio (truncate/mask; CISPO's 1 + eps_high).")
    is_floor: float = cfg(0.0, help="mask mode only: tokens with a ratio below this are masked too (0 = no floor).")
    max_completion_tokens: int = cfg(
        0,
        help="Dr. GRPO constant: the per-sequence token budget in the divisor (0 = the sampler's "
        "max_new_tokens when the examples carry it, else the longest completion in the data).",
    )
    kl_coef: float = cfg(0.0, help="Weight of the KL penalty to the base policy (0 = off; needs a second model copy).")
    kl_estimator: str = cfg(
        "k3",
        help="KL estimator on sampled tokens: k1, k2, k3 or k3_ratio (k3 x the importance ratio, TRL's; "
        "gradient of the reverse KL; see docs/train.md).",
    )
    use_sample_temperature: bool = cfg(
        False,
        help="Divide logits by each row's `temperature` column before log-softmax (set when the "
        "sampler logged tempered logprobs; vLLM's default logs raw ones).",
    )
    # --- data and staleness -----------------------------------------------------------------
    policy_versions: list[str] = cfg(
        [], help="Known policy versions, oldest first; empty: the base checkpoint's rlcycle.json lineage."
    )
    max_policy_lag: int | None = cfg(
        1, help="Drop rows from versions more than this many versions behind the newest (none or -1 = no check)."
    )
    max_seq_len: int | None = cfg(
        None,
        help="Rows longer than this (prompt + completion) are dropped and counted (too_long). none = the "
        "model's max_position_embeddings (no length limit when its config names none; docs/train.md).",
    )
    # --- batching ---------------------------------------------------------------------------
    batch_size: int = cfg(64, help="Rows per optimizer step across all processes (the global batch).")
    epochs: int = cfg(1, help="Passes over the examples.")
    max_steps: int | None = cfg(None, help="Stop after this many optimizer steps (none = epochs decide).")
    drop_last: bool = cfg(False, help="Drop the last, partial global batch of each epoch.")
    shuffle: bool = cfg(True, help="Shuffle rows each epoch (order from the seed, same for any process count).")
    batching: str = cfg(
        "packed",
        help="packed (sequences concatenated, no padding), bucketed (sorted by length, padded) or "
        "padded (schedule order, micro_batch_size rows; the naive baseline).",
    )
    micro_batch_tokens: int = cfg(
        8192, help="Token budget of one forward pass per process (packed/bucketed; padding counts)."
    )
    micro_batch_size: int = cfg(8, help="Rows per forward pass (padded batching only).")
    logprob_chunk_tokens: int = cfg(
        4096,
        help="Completion positions whose vocabulary-sized logits are computed at once; each chunk is "
        "recomputed in backward, so a long sequence never holds all its logits (0 = all at once).",
    )
    share_prefix: bool = cfg(
        True,
        help="Run the token prefix that all rows of a forward pass share (system prompt, tools) once, "
        "with gradient, and the rows' suffixes on its expanded KV cache: the same loss and gradient, "
        "far fewer tokens on agent data (docs/train.md). Off under gradient_checkpointing.",
    )
    min_shared_prefix: int = cfg(64, help="share_prefix: shortest common prefix (tokens) worth running once.")
    segments: bool = cfg(
        True,
        help="Train a run of a session's turns that extend one another (delta prompt layout) as one "
        "sequence, its last turn's context, scoring every turn's completion from it: the same loss, "
        "one forward per segment; the schedule then draws whole segments (docs/train.md, Segments). "
        "false: every row from its own context (per turn).",
    )
    # --- optimisation -----------------------------------------------------------------------
    optimizer: str = cfg("adamw", help="adamw or sgd.")
    lr: float = cfg(1e-6, help="Peak learning rate.")
    lr_schedule: str = cfg("constant", help="constant, linear (decay to 0) or cosine (to 0), after warmup.")
    warmup_steps: int = cfg(0, help="Linear warmup steps.")
    weight_decay: float = cfg(0.0, help="AdamW decoupled weight decay.")
    adam_beta1: float = cfg(0.9, help="AdamW beta1.")
    adam_beta2: float = cfg(0.999, help="AdamW beta2.")
    adam_eps: float = cfg(1e-8, help="AdamW epsilon.")
    max_grad_norm: float = cfg(1.0, help="Clip the global gradient norm to this (0 = measure only).")
    max_skipped_steps: int = cfg(3, help="Abort when more steps than this had a non-finite loss or gradient.")
    # --- precision and memory ---------------------------------------------------------------
    precision: str = cfg("auto", help="auto (bf16 autocast where the GPU supports it, else fp32), fp32 or bf16.")
    gradient_checkpointing: bool | str = cfg(
        "auto",
        help="Recompute activations in backward (less memory, ~30% slower): true, false, or auto (on "
        "for a forward pass of more than checkpoint_above_tokens tokens; docs/train.md).",
    )
    checkpoint_above_tokens: int | None = cfg(
        None,
        help="gradient_checkpointing = auto: checkpoint a forward pass with more token slots than this "
        "(none = micro_batch_tokens, so only a row longer than one pass is checkpointed).",
    )
    context_parallel: str = cfg(
        "off",
        help="Split one long sequence over devices: off, accelerate (torch context parallel with FSDP2) "
        "or ulysses (DeepSpeed Ulysses through Accelerate). Needs >= 2 GPUs and NCCL; docs/train.md.",
    )
    context_parallel_size: int = cfg(2, help="Devices one sequence is split over (context_parallel on).")
    attn_implementation: str = cfg("sdpa", help="transformers attention: sdpa, eager or flash_attention_2.")
    save_dtype: str = cfg("base", help="dtype of the saved weights: base (as the base checkpoint), fp32 or bf16.")
    cpu: bool = cfg(False, help="Train on CPU even when a GPU is visible.")
    lora: LoraConfig = cfg(LoraConfig(), help="LoRA adapters (lora.r > 0; see LoraConfig, docs/lora.md).")
    hints: HintLossConfig = cfg(
        HintLossConfig(), help="Hinted self-distillation on rows with a `hint` (hints.coef > 0; docs/hints.md)."
    )
    # --- reproducibility and resume ---------------------------------------------------------
    seed: int = cfg(0, help="Seed of the data order and every RNG.")
    save_every: int = cfg(50, help="Save resumable state every this many steps (0 = never).")
    state_dir: str | None = cfg(None, help="Where resumable state lives (default: OUT.state beside the checkpoint).")
    resume: bool = cfg(True, help="Resume from state_dir when it holds a run with the same config, data and base.")
    keep_state: bool = cfg(False, help="Keep state_dir after a successful run.")
    stop_after: int | None = cfg(
        None, help="Stop after this many steps as if killed, without a checkpoint (resume drills, tests)."
    )

    @property
    def lora_r(self) -> int:
        """The LoRA rank in force (0 = full fine-tune)."""
        return self.lora.r

    @property
    def lora_alpha(self) -> float:
        return self.lora.scale_alpha

    @property
    def shares_prefix(self) -> bool:
        """share_prefix in force: gradient checkpointing drops a layer's KV cache, so `true` turns it
        off (`auto` keeps it: a shared pass fits the budget and is never checkpointed)."""
        return self.share_prefix and self.gradient_checkpointing is not True

    @property
    def checkpoint_threshold(self) -> int:
        """gradient_checkpointing = auto: passes with more token slots than this are checkpointed."""
        return self.checkpoint_above_tokens or self.micro_batch_tokens

    @property
    def norm(self) -> str:
        """The loss normalisation in force: the override, else the objective's own."""
        return self.normalization or DEFAULT_NORMALIZATION.get(self.objective, "token")

    def validate(self) -> list[str]:
        p: list[str] = []
        _choice(p, "objective", self.objective, OBJECTIVES)
        if self.normalization is not None:
            _choice(p, "normalization", self.normalization, NORMALIZATIONS)
        _choice(p, "is_mode", self.is_mode, IS_MODES)
        _choice(p, "kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice(p, "batching", self.batching, BATCHING)
        _choice(p, "optimizer", self.optimizer, ("adamw", "sgd"))
        _choice(p, "lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        _choice(p, "precision", self.precision, ("auto", "fp32", "bf16"))
        _choice(p, "save_dtype", self.save_dtype, ("base", "fp32", "bf16"))
        check_range(p, self, ("clip_low", "is_floor"), ge=0, lt=1)
        check_range(p, self, "clip_high", ge=0)
        # A truncation cap inside the clip range would cut the PPO trust region itself.
        floor = 1.0 if self.objective == "cispo" else 1.0 + self.clip_high
        if self.is_mode != "none" and self.is_cap < floor:
            p.append(f"is_cap={self.is_cap}: must be >= {floor:g} (1 + clip_high; 1 for cispo)")
        check_range(
            p,
            self,
            ("batch_size", "epochs", "micro_batch_tokens", "micro_batch_size", "min_shared_prefix"),
            ge=1,
        )
        # A row longer than micro_batch_tokens is not refused: it runs alone in its own pass.
        check_range(p, self, ("max_seq_len", "checkpoint_above_tokens"), ge=1, optional=True)
        check_range(p, self, "logprob_chunk_tokens", ge=0)
        check_range(p, self, "context_parallel_size", ge=2)
        if not isinstance(self.gradient_checkpointing, bool) and self.gradient_checkpointing != "auto":
            p.append(f"gradient_checkpointing={self.gradient_checkpointing!r}: must be true, false or auto")
        _choice(p, "context_parallel", self.context_parallel, CONTEXT_PARALLEL)
        check_range(p, self, ("max_steps", "stop_after"), ge=1, optional=True)
        check_range(
            p,
            self,
            (
                "lr",
                "kl_coef",
                "max_grad_norm",
                "weight_decay",
                "warmup_steps",
                "max_completion_tokens",
                "save_every",
                "max_skipped_steps",
            ),
            ge=0,
            finite=True,
        )
        return p


def _choice(problems: list[str], name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        problems.append(f"{name}={value!r}: must be one of {', '.join(allowed)}")
