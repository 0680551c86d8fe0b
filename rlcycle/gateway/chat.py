"""OpenAI chat completions ↔ rlcycle's harness: requests in, responses and events out.

In: a request body (`parse_request` checks it and names the field of any problem, as OpenAI's
`param`), then the sampled `Generation`. Out: the response object (`response_body`, OpenAI's
`chat.completion` with parsed `tool_calls`), its SSE chunks (`stream_chunks`) and the events it
is logged as (`completion_events`: one `completion`, plus one `tool_result` with status
`invalid` per invalid call, built by the writer `simulate` uses too:
`rlcycle.agent.events.completion_event`).

Rendering: the messages go through the harness's `ChatRenderer` with the request's tools (as
`ToolSpec`s), so `prompt_ids` are exactly the ids the model is given. An assistant message the
gateway produced earlier is rendered from the raw text the model wrote (remembered by its tool
call ids), so a multi-turn prompt repeats the model's own text, not a re-serialisation of it.

Tool calls are parsed by the shared harness parser against the request's tools. Valid calls
become `tool_calls` (id = the logged `call_id`); an invalid call stays in `content` as text, is
listed in the event's `tool_calls` and gets a `tool_result` event with status `invalid`.

What a request may change (the rule: *where the completion ends* or *what the prompt holds*,
never the per-token distribution behind the logged logprobs):
- `stop` strings and `parallel_tool_calls: false` end the completion at the first token whose
  decoded text completes a stop string (or the first call): the ids are cut there, never
  re-tokenised (`finish.py`);
- `tool_choice: "required"` or a named function prefills the call's opening into the prompt
  (logged in `prompt_ids`), the rest is sampled;
- `n > 1` draws n independent samples, each logged as its own completion (`choice_index`);
- `logprobs: true` returns the logged logprobs of the sampled tokens.
Refused, all problems listed at once: top_k, min_p, penalties, logit_bias, best_of, top_logprobs
> 0 (only the sampled token's logprob exists), response_format json (constrained decoding; the
gateway never constrains silently), and top_p < 1 unless the gateway runs with
`allow_truncated_sampling` (then logged as `sampling.truncated`; train drops those rows).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from rlcycle.agent import events
from rlcycle.errors import InputError
from rlcycle.gateway.config import GatewayConfig
from rlcycle.harness.parse import CLOSE, OPEN, ParsedCompletion
from rlcycle.harness.render import ChatRenderer
from rlcycle.harness.tools import ToolSpec
from rlcycle.policy.base import Generation, SamplingParams

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# Fields that must be neutral: anything else would change the distribution behind the logprobs.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
}
MAX_N = 16  # choices per request
MAX_STOP = 16  # stop strings per request (OpenAI allows 4; some clients send more)


class BadRequest(Exception):
    """A request refused with `status` (400 unless said), naming the offending `param`.

    `problems` lists every (param, message) found; the message names them all.
    """

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        problems: list[tuple[str | None, str]] | None = None,
    ):
        super().__init__(message)
        self.param, self.status = param, status
        self.problems = problems or [(param, message)]


class _Problems:
    """Collects what is wrong with a request so the 400 lists it all at once."""

    def __init__(self) -> None:
        self.items: list[tuple[str | None, str]] = []

    def run(self, fn: Any, *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except BadRequest as e:
            self.items += e.problems
            return default

    def raise_any(self) -> None:
        if not self.items:
            return
        if len(self.items) == 1:
            param, msg = self.items[0]
            raise BadRequest(msg, param, problems=self.items)
        text = f"{len(self.items)} problems: " + "; ".join(f"{p or 'body'}: {m}" for p, m in self.items)
        raise BadRequest(text, self.items[0][0], problems=self.items)


@dataclass
class ChatRequest:
    messages: list[dict[str, str]]
    tools: tuple[ToolSpec, ...]
    params: SamplingParams
    sampling: dict[str, Any]  # what is logged: every parameter that shapes the distribution
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # stop strings: the completion ends where one is completed
    n: int = 1  # independent choices, each logged as its own completion
    parallel_tool_calls: bool = True  # False: the completion ends after its first call
    prefill: str = ""  # text put after the generation prompt (tool_choice required / named)
    logprobs: bool = False  # return the sampled tokens' logprobs


# --- requests ----------------------------------------------------------------------------------


def parse_request(body: Any, config: GatewayConfig, raw_text: dict[str, str]) -> ChatRequest:
    """Check a chat-completions body; BadRequest lists every field that is wrong.

    `raw_text` maps tool-call ids the gateway returned to the model's raw completion text.
    """
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    bad = _Problems()
    for key, ok in NEUTRAL.items():
        if key in body and body[key] not in ok:
            bad.items.append(
                (
                    key,
                    f"{key}={json.dumps(body[key])[:80]} is not supported: it would change the "
                    "sampling distribution behind the logged logprobs",
                )
            )
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        bad.items.append(
            (
                "response_format",
                "response_format json_object/json_schema is refused: the gateway does not constrain "
                "decoding (that would change the sampling distribution behind the logged logprobs) and "
                "does not pretend to; ask for JSON in a message and parse the text",
            )
        )
    choice = body.get("tool_choice")
    tools = bad.run(_tools, body.get("tools"), choice, default=())
    prefill = bad.run(_prefill, choice, tools, default="")
    messages = bad.run(_messages, body.get("messages"), raw_text, default=[])
    params, sampling = bad.run(_params, body, config, default=(None, {}))
    stop = bad.run(_stop, body.get("stop"), default=())
    n = bad.run(_int, body, "n", 1, 1, MAX_N, default=1)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        bad.items.append(("parallel_tool_calls", "parallel_tool_calls must be true or false"))
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        bad.items.append(("logprobs", "logprobs must be true or false"))
    top = body.get("top_logprobs")
    if top not in (None, 0):
        bad.items.append(
            (
                "top_logprobs",
                "top_logprobs > 0 is not supported: only the sampled token's logprob is known (ask for logprobs: true)",
            )
        )
    opts = body.get("stream_options") or {}
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        bad.items.append(("metadata", "metadata must be an object of strings"))
    bad.raise_any()
    if config.redact and config.redact_inputs:
        from collections import Counter

        from rlcycle.collect.redact import patterns_with, redact_texts

        texts = redact_texts([m["content"] for m in messages], patterns_with(config.secret_patterns), Counter())
        messages = [{**m, "content": t or ""} for m, t in zip(messages, texts, strict=True)]
    sampling.update(
        stop=list(stop),
        n=n,
        parallel_tool_calls=parallel,
        tool_choice=choice,
        prefill=prefill,
    )
    model = body.get("model")
    return ChatRequest(
        messages,
        tools,
        params,
        sampling,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        model=model if isinstance(model, str) else None,
        metadata=meta,
        stop=stop,
        n=n,
        parallel_tool_calls=parallel,
        prefill=prefill,
        logprobs=logprobs,
    )


def _int(body: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(f"{key} must be an integer in [{lo}, {hi}], got {json.dumps(v)[:40]}", key)
    return v


def _stop(value: Any) -> tuple[str, ...]:
    """Stop strings: a string or a list of them (empty ones are ignored, as OpenAI does)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise BadRequest("stop must be a string or a list of strings", "stop")
    if len(items) > MAX_STOP:
        raise BadRequest(f"stop takes at most {MAX_STOP} strings, got {len(items)}", "stop")
    return tuple(dict.fromkeys(x for x in items if x))


def _prefill(choice: Any, tools: tuple[ToolSpec, ...]) -> str:
    """The text a forced tool call starts with: the tag, and for a named function its name.

    Put after the generation prompt, it is part of the prompt (logged in prompt_ids), so the
    sampled rest has the model's own distribution given that opening: exact, unlike a grammar.
    """
    if choice in (None, "auto", "none"):
        return ""
    if not tools:
        raise BadRequest("tool_choice forces a tool call, but the request has no tools", "tool_choice")
    if choice == "required":
        return OPEN
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        raise BadRequest(
            f"tool_choice names {json.dumps(name)}, which is not one of the request's tools", "tool_choice"
        )
    return OPEN + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


def _params(body: dict[str, Any], config: GatewayConfig) -> tuple[SamplingParams, dict[str, Any]]:
    def num(key: str, default: float, lo: float, hi: float) -> float:
        v = body.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise BadRequest(f"{key} must be a number in [{lo:g}, {hi:g}], got {json.dumps(v)[:40]}", key)
        return float(v)

    temperature = num("temperature", 1.0, 0.0, 2.0)
    top_p = num("top_p", 1.0, 1e-6, 1.0)
    if top_p < 1 and temperature > 0 and not config.allow_truncated_sampling:
        raise BadRequest(
            "top_p < 1 is refused: the returned logprobs would be those of the truncated "
            "distribution while train scores the full vocabulary (start the gateway with "
            "--set allow_truncated_sampling=true to accept it)",
            "top_p",
        )
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(key)
    if mt is None:
        mt = config.default_max_tokens
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest(f"{key} must be a positive integer", key)
    if mt > config.max_tokens_cap:
        raise BadRequest(f"{key}={mt} exceeds this gateway's cap {config.max_tokens_cap}", key)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed must be an integer", "seed")
    params = SamplingParams(max_new_tokens=mt, temperature=temperature, top_p=top_p, seed=seed)
    sampling = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": None,
        "seed": seed,
        "max_tokens": mt,
        "truncated": top_p < 1 and temperature > 0,
        "greedy": temperature == 0,  # argmax decoding: the behaviour policy is a point mass
    }
    return params, sampling


def _tools(tools: Any, choice: Any) -> tuple[ToolSpec, ...]:
    named = isinstance(choice, dict) and choice.get("type", "function") == "function"
    if choice not in (None, "auto", "none", "required") and not named:
        raise BadRequest(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if tools is None or choice == "none":
        return ()
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", "tools")
    specs = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise BadRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
        p = f.get("parameters") or {}
        props = p.get("properties") or {} if isinstance(p, dict) else None
        if not isinstance(props, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters.properties must be an object", f"tools[{i}].function.parameters"
            )
        # The strict parser checks a string JSON type; anything richer is accepted as any value.
        clean = {
            k: {kk: vv for kk, vv in (v if isinstance(v, dict) else {}).items() if kk != "type" or isinstance(vv, str)}
            for k, v in props.items()
        }
        req = p.get("required") or ()
        specs.append(
            ToolSpec(f["name"], str(f.get("description") or ""), clean, tuple(r for r in req if isinstance(r, str)))
        )
    return tuple(specs)


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest("only text content parts are supported", f"{where}.content[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest("content must be a string or a list of text parts", f"{where}.content")


def _messages(messages: Any, raw_text: dict[str, str]) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"role must be one of {', '.join(ROLES)}", f"{where}.role")
        role = ROLES[m["role"]]
        text = _content(m.get("content"), where)
        if role == "assistant" and m.get("tool_calls"):
            text = _assistant_text(text, m["tool_calls"], raw_text, where)
        out.append({"role": role, "content": text})
    return out


def _assistant_text(content: str, calls: Any, raw_text: dict[str, str], where: str) -> str:
    """The text an assistant message with tool calls stood for: the model's own, when known."""
    if not isinstance(calls, list):
        raise BadRequest("tool_calls must be a list", f"{where}.tool_calls")
    for c in calls:
        if isinstance(c, dict) and c.get("id") in raw_text:
            return raw_text[c["id"]]
    pieces = [content] if content else []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise BadRequest("a tool call needs function.name", f"{where}.tool_calls[{j}]")
        try:
            args = json.loads(f.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError):
            raise BadRequest("function.arguments must be a JSON string", f"{where}.tool_calls[{j}]") from None
        body = json.dumps({"name": f["name"], "arguments": args}, ensure_ascii=False)
        pieces.append(f"{OPEN}{body}{CLOSE}")
    return "\n".join(pieces)


def render_prompt(renderer: ChatRenderer, req: ChatRequest, cap: int) -> list[int]:
    """The prompt ids the model is given (what the event logs as prompt_ids), prefill included."""
    try:
        ids = renderer.render(req.messages, add_generation_prompt=True)
    except InputError as e:
        raise BadRequest(str(e), "messages") from None
    except Exception as e:  # a Jinja template error on these messages
        raise BadRequest(f"the chat template cannot render these messages: {e}", "messages") from None
    if req.prefill:
        ids = ids + renderer.encode(req.prefill)
    if len(ids) > cap:
        raise BadRequest(
            f"the prompt renders to {len(ids)} tokens, over this gateway's cap {cap}", "messages", status=400
        )
    return ids


# --- responses ----------------------------------------------------------------------------------


@dataclass
class Result:
    """One finished choice: what the response says and what the events log."""

    request_id: str
    sample_id: str
    session_id: str
    episode_id: str
    turn: int
    checkpoint_id: str
    role: str
    prompt_ids: list[int]
    gen: Generation  # the kept ids and logprobs (after stop strings)
    text: str  # what the client gets (prefill + text before a stop string)
    parsed: ParsedCompletion
    index: int = 0  # choice index (n > 1)
    cut: dict[str, Any] | None = None  # why the ids were cut short (finish.Finished.cut)
    logged_text: str | None = None  # decoded kept ids (completion_text); default `text`
    raw: str | None = None  # what the model wrote, prefill included (rendered on later turns)
    tokens: list[str] | None = None  # each kept id decoded alone (logprobs: true)
    id_rules: dict[str, str] = field(default_factory=dict)  # which rule gave session and episode
    parent_sample_id: str | None = None  # the earlier answer this request continues (episodes.py)
    api: str = "chat.completions"  # or "responses"
    created: int = field(default_factory=lambda: int(time.time()))

    def call_id(self, i: int) -> str:
        return events.call_id_of(self.sample_id, i)

    def message(self) -> tuple[str | None, list[dict[str, Any]], str]:
        """(content, tool_calls, finish_reason): valid calls lifted out, invalid ones left as text."""
        calls = [(i, c) for i, c in enumerate(self.parsed.calls) if c.valid]
        content = self.text
        for _, c in sorted(calls, key=lambda ic: -ic[1].span[0]):
            content = content[: c.span[0]] + content[c.span[1] :]
        tool_calls = [
            {"id": self.call_id(i), "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for i, c in calls
        ]
        if tool_calls:
            content = content.strip()
        reason = "tool_calls" if tool_calls else ("length" if self.gen.finish_reason == "length" else "stop")
        return (content or None) if tool_calls else content, tool_calls, reason

    def answer(self) -> dict[str, Any]:
        """The assistant message as the client gets it (and sends back on its next turn)."""
        content, tool_calls, _ = self.message()
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}

    def logprobs(self) -> dict[str, Any] | None:
        """OpenAI's `logprobs` of a choice: the logged logprob of every kept sampled token."""
        if self.tokens is None:
            return None
        return {
            "content": [
                {"token": t, "logprob": float(lp), "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                for t, lp in zip(self.tokens, self.gen.logprobs, strict=True)
            ],
            "refusal": None,
        }


def headers(results: list[Result]) -> dict[str, str]:
    """Response headers; with n > 1 the sample ids of all choices, comma-separated, in order."""
    r = results[0]
    return {
        "X-Session-Id": r.session_id,
        "X-Episode-Id": r.episode_id,
        "X-Sample-Id": ",".join(x.sample_id for x in results),
        "X-Checkpoint-Id": r.checkpoint_id,
        "X-Request-Id": r.request_id,
    }


def usage(results: list[Result]) -> dict[str, int]:
    n_in, n_out = len(results[0].prompt_ids), sum(len(r.gen.token_ids) for r in results)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def response_body(results: list[Result], model: str) -> dict[str, Any]:
    choices = []
    for r in results:
        content, tool_calls, reason = r.message()
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        choices.append({"index": r.index, "message": msg, "logprobs": r.logprobs(), "finish_reason": reason})
    r = results[0]
    return {
        "id": f"chatcmpl-{r.sample_id}",
        "object": "chat.completion",
        "created": r.created,
        "model": model,
        "system_fingerprint": r.checkpoint_id,
        "choices": choices,
        "usage": usage(results),
    }


def stream_chunks(results: list[Result], model: str, include_usage: bool) -> list[dict[str, Any]]:
    """The SSE chunks of finished choices (the backends do not stream tokens)."""
    r0 = results[0]
    base = {
        "id": f"chatcmpl-{r0.sample_id}",
        "object": "chat.completion.chunk",
        "created": r0.created,
        "model": model,
        "system_fingerprint": r0.checkpoint_id,
    }
    out = []
    for r in results:

        def chunk(delta: dict[str, Any], finish: str | None = None, lp: Any = None, i: int = r.index) -> dict[str, Any]:
            return {**base, "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        content, tool_calls, reason = r.message()
        out.append(chunk({"role": "assistant", "content": ""}))
        if content:
            out.append(chunk({"content": content}, lp=r.logprobs()))
        if tool_calls:
            out.append(chunk({"tool_calls": [{"index": k, **tc} for k, tc in enumerate(tool_calls)]}))
        out.append(chunk({}, reason, lp=None if content else r.logprobs()))  # logprobs once per choice
    if include_usage:
        out.append({**base, "choices": [], "usage": usage(results)})
    return out


def completion_events(r: Result, sampling: dict[str, Any], parent: events.Parent | None = None) -> list[dict[str, Any]]:
    """The `completion` event (and one `tool_result` per invalid call) in collect's schema,
    built by the one writer the simulator uses too (`rlcycle.agent.events.completion_event`).

    `sampling` is the request's record (`ChatRequest.sampling`, with this choice's seed): what
    the event names as the distribution behind its logprobs. `parent`: the earlier sample of the
    session the prompt is stored against (gateway/contexts.py; None: the whole prompt)."""
    ts_ms = time.time() * 1000
    calls = r.parsed.calls
    sample = events.Sample(
        r.session_id,
        r.episode_id,
        r.sample_id,
        r.turn,
        ts_ms,
        r.prompt_ids,
        r.gen.token_ids,
        r.gen.logprobs,
        r.text if r.logged_text is None else r.logged_text,
        [(c.name, c.arguments_json) for c in calls],
        r.gen.latency_ms,
    )
    # max_new_tokens is the request's limit: Dr. GRPO's M in train.
    served = events.Served(r.checkpoint_id, sampling["temperature"], sampling["max_tokens"])
    drawn = events.Drawn(sampling["greedy"], sampling["top_p"], sampling["seed"], sampling, r.gen.finish_reason, r.cut)
    call = events.GatewayCall(r.index, r.id_rules, r.parent_sample_id, r.api, r.request_id, r.role, r.parsed.n_unlisted)
    out = [events.completion_event(sample, served, drawn, call, parent=parent)]
    for i, c in enumerate(calls):
        if not c.valid:
            error = f"{c.code}: {c.reason}"
            out.append(events.tool_result_event(r.session_id, ts_ms, r.sample_id, r.call_id(i), "invalid", error, 0.0))
    return out
