"""The strict tool-call parser: every call in a completion, each valid or invalid with a reason.

What goes in: the text of one completion (decoded from the sampled ids, stop token removed;
`ChatRenderer.completion_text()` does that). What comes out: a `ParsedCompletion` with the
free text before the first call (`content`) and every call, in order, as a `ToolCall` with
`valid` and, when invalid, a `code` and a human `reason`.

A call is `<tool_call>{"name": "...", "arguments": {...}}</tool_call>` (whitespace inside the
tags is allowed). It is invalid when:

    code              meaning
    bad_json          the body is not JSON (also NaN/Infinity, duplicate keys, huge integers)
    not_an_object     the body is JSON but not {"name": ..., "arguments": ...} (or has other keys)
    unknown_tool      `name` is not one of the harness tools
    bad_arguments     `arguments` is not a JSON object (a JSON *string* of an object is refused)
    missing_argument  a required argument is absent
    extra_argument    an argument the tool does not define
    wrong_type        an argument of the wrong JSON type
    invalid_unicode   a string holds a lone surrogate (cannot be encoded as UTF-8)
    unterminated      no `</tool_call>` before the end of the text or the next `<tool_call>`
    text_after_call   anything but whitespace after `</tool_call>` (the call is still listed)
    stray_close       a `</tool_call>` without an opening tag
    too_many_calls    beyond `max_calls` calls in one completion (not even parsed)
    too_deep          JSON nested deeper than `max_depth`
    too_long          the completion or a call body is longer than the configured limit

`arguments` may be omitted only for a tool that takes no arguments (`run_tests`).

Hostile outputs cost bounded work: the text is capped at `max_chars`, tags are found with
monotone `str.find` pointers (linear in the text), nesting depth is checked by a linear scan
*before* `json.loads` (so no RecursionError), integers longer than Python's 4300-digit limit
are refused by `json`, at most `max_calls + LISTED_EXTRA` calls are listed (the rest are
counted in `n_unlisted`, all invalid), and each raw body kept for logging is capped.

Invalid calls are data, not noise: distill turns them into negative examples (docs/design.md,
reward hack 1), so a completion is never "repaired" here.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from rlcycle.harness.tools import TOOLS, ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
LISTED_EXTRA = 32  # calls listed beyond max_calls before the rest are only counted
RAW_CAP = 65_536  # characters of an invalid call's raw body kept for logging

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on the work the parser does on one completion."""

    max_calls: int = 8
    max_chars: int = 2_000_000
    max_call_chars: int = 1_000_000
    max_depth: int = 32


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` of a completion.

    `arguments_json` is what production logs as the call's `arguments` string: canonical JSON
    of the parsed arguments when they parsed, else the raw body (capped at RAW_CAP chars).
    `span` is (start, end) of the call in the completion text, tags included.
    """

    index: int
    name: str | None
    arguments: dict[str, Any] | None
    arguments_json: str
    valid: bool
    code: str | None = None
    reason: str | None = None
    span: tuple[int, int] = (0, 0)

    def as_log(self, call_id: str) -> dict[str, str | None]:
        """The `tool_calls` item of a `completion` event: {call_id, name, arguments}."""
        return {"call_id": call_id, "name": self.name, "arguments": self.arguments_json}


@dataclass(frozen=True)
class ParsedCompletion:
    """Everything in one completion: the text before the first call, and every call."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    n_unlisted: int = 0  # calls past the listing cap: counted, all invalid

    @property
    def n_calls(self) -> int:
        return len(self.calls) + self.n_unlisted

    @property
    def n_invalid(self) -> int:
        return sum(not c.valid for c in self.calls) + self.n_unlisted

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c.valid]

    @property
    def all_valid(self) -> bool:
        """True when there is at least one call and every call is valid."""
        return bool(self.calls) and self.n_invalid == 0


@dataclass
class _Scan:
    """Monotone cursors over the text so finding every tag stays linear."""

    text: str
    _next: dict[str, int] = field(default_factory=dict)

    def find(self, tag: str, start: int) -> int:
        cached = self._next.get(tag)
        if cached is None or (cached != -1 and cached < start):
            cached = self.text.find(tag, start)
            self._next[tag] = cached
        return cached


def parse_completion(
    text: str, tools: tuple[ToolSpec, ...] = TOOLS, limits: ParseLimits | None = None
) -> ParsedCompletion:
    """Parse every tool call in `text`; never raises on any input string."""
    limits = limits or ParseLimits()
    by_name = {t.name: t for t in tools}
    if len(text) > limits.max_chars:
        return _too_long(text, limits)
    scan = _Scan(text)
    first = scan.find(OPEN, 0)
    content = text if first == -1 else text[:first]
    calls: list[ToolCall] = []
    unlisted = 0
    stray = content.find(CLOSE)
    if stray != -1:
        calls.append(
            _invalid(
                0,
                content[stray : stray + len(CLOSE)],
                "stray_close",
                "</tool_call> without an opening <tool_call>",
                (stray, stray + len(CLOSE)),
            )
        )
    pos = first
    while pos != -1:
        index = len(calls) + unlisted
        call, pos = _next_call(text, scan, pos, index, by_name, limits)
        if len(calls) < limits.max_calls + LISTED_EXTRA:
            calls.append(call)
        else:
            unlisted += 1
    return ParsedCompletion(content=content, calls=tuple(calls), n_unlisted=unlisted)


def _next_call(
    text: str, scan: _Scan, pos: int, index: int, by_name: dict[str, ToolSpec], limits: ParseLimits
) -> tuple[ToolCall, int]:
    """The call opening at `pos`, and where the next one opens (-1 when none)."""
    start = pos + len(OPEN)
    end = scan.find(CLOSE, start)
    nxt = scan.find(OPEN, start)
    if end == -1 or (nxt != -1 and nxt < end):
        stop = len(text) if nxt == -1 else nxt
        where = "before the end of the completion" if nxt == -1 else "before the next <tool_call>"
        return _invalid(
            index, text[start:stop], "unterminated", f"<tool_call> has no </tool_call> {where}", (pos, stop)
        ), nxt
    span = (pos, end + len(CLOSE))
    if index >= limits.max_calls:
        call = _invalid(
            index, text[start:end], "too_many_calls", f"more than {limits.max_calls} tool calls in one completion", span
        )
    else:
        call = check_call(text[start:end], index, by_name, limits, span)
    after = end + len(CLOSE)
    nxt = scan.find(OPEN, after)
    gap = text[after:] if nxt == -1 else text[after:nxt]
    if gap.strip() and call.code != "too_many_calls":
        what = "</tool_call> without an opening tag" if CLOSE in gap else repr(gap.strip()[:40])
        call = _replace(call, "text_after_call", f"text after the call: {what}")
    return call, nxt


def check_call(
    body: str,
    index: int = 0,
    by_name: dict[str, ToolSpec] | None = None,
    limits: ParseLimits | None = None,
    span: tuple[int, int] = (0, 0),
) -> ToolCall:
    """Validate the JSON body of one call (the text between the tags)."""
    limits = limits or ParseLimits()
    by_name = by_name if by_name is not None else {t.name: t for t in TOOLS}
    if len(body) > limits.max_call_chars:
        return _invalid(
            index, body, "too_long", f"call body is {len(body):,} chars (limit {limits.max_call_chars:,})", span
        )
    depth = _json_depth(body, limits.max_depth)
    if depth > limits.max_depth:
        return _invalid(index, body, "too_deep", f"JSON nested deeper than {limits.max_depth}", span)
    try:
        obj = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        return _invalid(index, body, "bad_json", f"bad JSON: {str(e)[:200]}", span)
    if not isinstance(obj, dict) or "name" not in obj or set(obj) - {"name", "arguments"}:
        got = sorted(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
        return _invalid(
            index, body, "not_an_object", f'expected {{"name": ..., "arguments": {{...}}}}, got {got}', span
        )
    name = obj["name"]
    if not isinstance(name, str) or name not in by_name:
        close = difflib.get_close_matches(str(name)[:100], list(by_name), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return _invalid(
            index,
            body,
            "unknown_tool",
            f"unknown tool {str(name)[:100]!r}{hint}",
            span,
            name=name if isinstance(name, str) else None,
        )
    tool = by_name[name]
    if "arguments" in obj:
        args = obj["arguments"]
        problems = _argument_problems(tool, args)
    elif tool.properties:
        args, problems = None, [("missing_argument", f"{name}: no 'arguments' object")]
    else:
        args, problems = {}, []
    if problems:
        code, reason = problems[0][0], "; ".join(p[1] for p in problems)
        return _invalid(index, body, code, reason, span, name=name)
    return ToolCall(index, name, args, json.dumps(args, ensure_ascii=False), True, span=span)


def _argument_problems(tool: ToolSpec, args: Any) -> list[tuple[str, str]]:
    """Every problem of `args` against the tool's schema, as (code, reason)."""
    if not isinstance(args, dict):
        return [("bad_arguments", f"{tool.name}: 'arguments' must be a JSON object, got {type(args).__name__}")]
    out: list[tuple[str, str]] = []
    for key in tool.required:
        if key not in args:
            out.append(("missing_argument", f"{tool.name}: missing argument {key!r}"))
    for key, value in args.items():
        spec = tool.properties.get(key)
        if spec is None:
            out.append(("extra_argument", f"{tool.name}: unknown argument {key[:100]!r}"))
            continue
        expected = _JSON_TYPES.get(spec.get("type", ""), (object,))
        # bool is an int in Python; JSON keeps them apart.
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            out.append(
                ("wrong_type", f"{tool.name}: argument {key!r} must be {spec.get('type')}, got {_json_type(value)}")
            )
        elif not _encodable(value):
            out.append(("invalid_unicode", f"{tool.name}: argument {key!r} has a lone surrogate"))
    return out


def _json_depth(body: str, cap: int) -> int:
    """Maximum bracket nesting outside strings; stops counting once past `cap` (linear)."""
    depth = best = 0
    in_str = escaped = False
    for ch in body:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > best:
                best = depth
                if best > cap:
                    return best
        elif ch in "]}":
            depth -= 1
    return best


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:100]!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _encodable(value: Any) -> bool:
    """False when a string (anywhere inside `value`) cannot be encoded as UTF-8."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _json_type(value: Any) -> str:
    for name, types in _JSON_TYPES.items():
        if isinstance(value, types) and not (isinstance(value, bool) and name != "boolean"):
            return name
    return type(value).__name__


def _invalid(index: int, raw: str, code: str, reason: str, span: tuple[int, int], name: str | None = None) -> ToolCall:
    raw = raw[:RAW_CAP].encode("utf-8", "replace").decode("utf-8")
    return ToolCall(index, name, None, raw, False, code, reason, span)


def _replace(call: ToolCall, code: str, reason: str) -> ToolCall:
    """Mark an otherwise parsed call invalid (its name and arguments stay for logging)."""
    if call.valid:
        return ToolCall(call.index, call.name, call.arguments, call.arguments_json, False, code, reason, call.span)
    return ToolCall(
        call.index,
        call.name,
        call.arguments,
        call.arguments_json,
        False,
        call.code,
        f"{call.reason}; {reason}",
        call.span,
    )


def _too_long(text: str, limits: ParseLimits) -> ParsedCompletion:
    """A completion over `max_chars`: its calls are not parsed; any tag makes one invalid call."""
    first = text.find(OPEN)
    content = (text if first == -1 else text[:first])[: limits.max_chars]
    if first == -1 and CLOSE not in text:
        return ParsedCompletion(content=content)
    call = _invalid(
        0,
        "",
        "too_long",
        f"completion is {len(text):,} chars (limit {limits.max_chars:,}); calls not parsed",
        (max(first, 0), len(text)),
    )
    return ParsedCompletion(content=content, calls=(call,))
