"""Where a completion ends: stop strings and `parallel_tool_calls: false`, cut on token boundaries.

In: the renderer, the sampled `Generation` (ids, logprobs) and the request's rules (stop
strings, whether more than one tool call may stand, the prefilled opening of a forced call).
Out: a `Finished`: the ids and logprobs kept (what is logged), the text the client gets, the
parsed calls and why it ended.

The rule (exact for the logged logprobs): the backend samples as usual; the completion then
ends at the *first token whose decoded text completes a stop string* (or completes the first
tool call, when parallel calls are off). Every kept token was drawn from the model's own
distribution given the tokens before it, and whether to stop is decided from those tokens
only, so the kept ids are a sample of the policy with a stopping rule: their logged logprobs
are exactly right, and the tokens the backend drew after the stopping point are discarded
(counted in `cut.sampled_tokens`). The ids are cut, never re-tokenised: the logged
`completion_ids` run through the token that completed the stop string, and `completion_text`
is their decoded text; the client gets the text before the stop string, as OpenAI returns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlcycle.harness.parse import ParsedCompletion, parse_completion
from rlcycle.harness.render import ChatRenderer
from rlcycle.harness.tools import ToolSpec
from rlcycle.policy.base import Generation


@dataclass
class Finished:
    """One choice after its stopping rules: what is returned and what is logged."""

    gen: Generation  # the kept ids and logprobs (finish_reason "stop" when a rule cut it)
    raw: str  # prefill + decoded text of the kept ids: what the model wrote (next turns repeat it)
    text: str  # what the client gets: `raw` without a matched stop string and what followed it
    parsed: ParsedCompletion
    cut: dict[str, Any] | None = None  # {"rule", "string", "sampled_tokens"} when a rule cut it
    logged_text: str = ""  # decoded kept ids (the event's completion_text)
    extra: dict[str, Any] = field(default_factory=dict)


def _decode(renderer: ChatRenderer, ids: Sequence[int]) -> str:
    return renderer.tokenizer.decode(list(ids), skip_special_tokens=False)


def _first_token(renderer: ChatRenderer, ids: Sequence[int], done: Any) -> int:
    """The smallest k such that `done(decoded ids[:k])`, given that done(all ids) holds.

    Binary search (decoding is monotone: a longer prefix decodes to an extension, except for a
    partial UTF-8 character, hence the linear check downwards afterwards).
    """
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if done(_decode(renderer, ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    while lo > 1 and done(_decode(renderer, ids[: lo - 1])):
        lo -= 1
    return lo


def _earliest(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits) if hits else None


def finish(
    renderer: ChatRenderer,
    gen: Generation,
    tools: tuple[ToolSpec, ...],
    stop: Sequence[str] = (),
    parallel_tool_calls: bool = True,
    prefill: str = "",
) -> Finished:
    """Apply the stopping rules to one sampled completion (see the module docstring)."""
    ids, lps = list(gen.token_ids), list(gen.logprobs)
    body = renderer.completion_text(ids)
    cut: dict[str, Any] | None = None
    hit = _earliest(body, stop) if stop else None
    if hit is not None:
        k = _first_token(renderer, ids, lambda t: _earliest(t, stop) is not None)
        ids, lps = ids[:k], lps[:k]
        body = renderer.completion_text(ids)
        pos, string = _earliest(body, stop)
        shown = body[:pos]
        cut = {"rule": "stop", "string": string, "sampled_tokens": len(gen.token_ids)}
    else:
        shown = body
    parsed = parse_completion(prefill + shown, tools)
    if not parallel_tool_calls and len(parsed.calls) > 1:
        end = parsed.calls[0].span[1] - len(prefill)  # where the first call closes, in `body`
        want = body[:end]
        k = _first_token(renderer, ids, lambda t: t.startswith(want))
        ids, lps = ids[:k], lps[:k]
        body = renderer.completion_text(ids)
        shown = body[:end]
        parsed = parse_completion(prefill + shown, tools)
        cut = {"rule": "parallel_tool_calls", "string": None, "sampled_tokens": len(gen.token_ids)}
    reason = "stop" if cut is not None else gen.finish_reason
    kept = Generation(ids, lps, reason, gen.latency_ms)
    return Finished(kept, prefill + body, prefill + shown, parsed, cut, body)
