"""The policy interface: token ids in, token ids and per-token logprobs out.

Every generation backend (in-process transformers `hf.HFPolicy`, an OpenAI-compatible server
through `http.HTTPPolicy`) implements the `Policy` protocol; callers (the episode runner of
`simulate` and `eval`) never see which one they hold. `open.open_policy(ref)` picks one.

Seeds: with one `SamplingParams` whose `seed` is s, prompt i of a call is sampled with seed
s + i (`per_prompt()`); pass a list of `SamplingParams` to choose every prompt's seed yourself.
A prompt's sample depends only on (prompt, its params, the model, device and dtype), not on
the other prompts of the call (see hf.py for exactly what is guaranteed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from rlcycle.config import check_range
from rlcycle.errors import InputError

FINISH_STOP = "stop"  # a stop token was sampled (it is the last of token_ids)
FINISH_LENGTH = "length"  # max_new_tokens, or the model's context, ran out


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature 0 means greedy. `stop_token_ids` empty means the backend's defaults (the
    model's EOS and `<|im_end|>`); a sampled stop token is included in `token_ids`.
    `seed` None draws a fresh seed (not reproducible).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_range(problems, self, "max_new_tokens", ge=1)
        check_range(problems, self, "temperature", ge=0)  # NaN is out of every range
        check_range(problems, self, "top_p", gt=0, le=1)
        if problems:
            raise InputError(
                "bad SamplingParams: " + ", ".join(problems),
                hint="e.g. SamplingParams(max_new_tokens=256, temperature=1.0)",
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass
class Generation:
    """One completion: sampled ids (stop token included), their logprobs, why it ended.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution it was
    sampled from (the backend documents which; hf: after temperature and top-p).
    `latency_ms` is wall time from the call (or request) start until this completion ended.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    latency_ms: float


@runtime_checkable
class Policy(Protocol):
    """A generation backend."""

    name: str  # what production logs as policy_version when nothing better is known

    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        """One Generation per prompt, in order."""
        ...

    def close(self) -> None:
        """Release what the backend holds (threads, connections, memory)."""
        ...


def per_prompt(params: SamplingParams | Sequence[SamplingParams], n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: a list as given, or one spread with seeds s, s+1, ..."""
    if isinstance(params, SamplingParams):
        if params.seed is None:
            return [params] * n
        return [replace(params, seed=params.seed + i) for i in range(n)]
    out = list(params)
    if len(out) != n:
        raise InputError(
            f"{n} prompts but {len(out)} SamplingParams", hint="pass one SamplingParams, or one per prompt"
        )
    return out


def check_prompts(prompts: list[list[int]], vocab_size: int | None = None) -> None:
    """Raise InputError unless every prompt is a non-empty list of valid token ids."""
    problems = []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            problems.append(f"prompt {i} is empty")
        elif vocab_size is not None and any(not 0 <= t < vocab_size for t in p):
            problems.append(f"prompt {i} has token ids outside [0, {vocab_size})")
        if len(problems) >= 5:
            break
    if problems:
        raise InputError(
            "bad prompts: " + "; ".join(problems), hint="render prompts with rlcycle.harness.render.ChatRenderer"
        )
