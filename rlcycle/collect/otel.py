"""OpenTelemetry GenAI spans (OTLP/JSON export) as completion events.

In: one OTLP/JSON `ExportTraceServiceRequest` document, or one per line (the collector's file
exporter). Out: `Chunk`s of completion events, shaped exactly like JSON-lines events.

Mapping (GenAI semantic conventions, plus `rlcycle.*` extensions for what they do not carry):
- `event_id` = "otel:<traceId>:<spanId>"; `ts` = span start; `latency_ms` = span duration
- `session_id` = `gen_ai.conversation.id`; `episode_id` = `rlcycle.episode_id`, else the trace
- `sample_id` = `gen_ai.response.id`, else the span id; `turn` = `rlcycle.turn`, else the
  span's rank by start time within its episode
- `policy_version` = `rlcycle.policy_version`, else `gen_ai.request.model`
- `prompt_ids` / `completion_ids` / `completion_logprobs` = `rlcycle.*` arrays (spans without
  token ids are quarantined: rlcycle never re-tokenises text behind your back)
- `completion_text` / `tool_calls` from `gen_ai.output.messages` or `rlcycle.tool_calls`
Spans whose `gen_ai.operation.name` is not a model call (chat, text_completion,
generate_content) are not completions; each is counted in the quarantine with its reason.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import polars as pl

from rlcycle.collect.events import (
    JSON_SCHEMA,
    BadRecord,
    Chunk,
    empty_events,
    normalise,
    raw_text,
    rows_as_records,
    split_invalid,
)
from rlcycle.errors import InputError

MODEL_CALLS = ("chat", "text_completion", "generate_content")


# Python's json and the recursive attribute decoding below stop at the recursion limit.
TOO_DEEP = "nested too deeply (arrays/objects more than about 1,000 levels deep)"


def read_otel(data: bytes, name: str) -> Iterator[Chunk]:
    bad: list[BadRecord] = []
    docs = _documents(data, name, bad)
    events: list[dict[str, Any]] = []
    span_no = 0
    for doc in docs:
        for rs in doc.get("resourceSpans", []) or []:
            for ss in rs.get("scopeSpans", []) or []:
                for span in ss.get("spans", []) or []:
                    span_no += 1
                    try:
                        event, reason = _span_event(span)
                    except RecursionError:  # an attribute value nested past the limit
                        event, reason = {}, f"span {span.get('name')!r}: an attribute is {TOO_DEEP}"
                    if reason:
                        bad.append(BadRecord(name, span_no, reason, _span_text(span)))
                    else:
                        event["_line"] = span_no
                        events.append(event)
    _fill_turns(events)
    df = pl.DataFrame(events, schema={**JSON_SCHEMA, "_line": pl.Int64}) if events else None
    if df is None:
        yield Chunk(empty_events(), bad, bytes_read=len(data), lines_read=span_no)
        return
    good, rejected = split_invalid(normalise(df, name))
    yield Chunk(good, bad + rows_as_records(rejected), bytes_read=len(data), lines_read=span_no)


def _span_text(span: dict[str, Any]) -> str | None:
    """The span as its quarantine record; collect's stage caps it (with a marker, counted)."""
    try:
        return json.dumps(span)
    except RecursionError:
        return None


def _documents(data: bytes, name: str, bad: list[BadRecord]) -> list[dict[str, Any]]:
    """One document, or one per line; a line nested too deeply is quarantined (`line` = its line)."""
    try:
        return [json.loads(data)]
    except json.JSONDecodeError:
        deep = False
    except RecursionError:
        deep = True
    docs = []
    for i, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line))
        except RecursionError:
            bad.append(BadRecord(name, i, f"OTLP/JSON line {TOO_DEEP}", raw_text(line)))
        except json.JSONDecodeError as e:
            what = f"OTLP/JSON document {TOO_DEEP}" if deep else f"malformed OTLP/JSON ({e.msg})"
            raise InputError(
                f"{name}:{i}:{e.colno}: {what}", hint="export spans with the OTLP/JSON file exporter"
            ) from None
    return docs


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    return None


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in span.get("attributes", []) or []}


def _span_event(span: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    a = _attrs(span)
    op = a.get("gen_ai.operation.name")
    if op not in MODEL_CALLS:
        return {}, f"span {span.get('name')!r}: gen_ai.operation.name {op!r} is not a model call"
    start, end = int(span.get("startTimeUnixNano", 0)), int(span.get("endTimeUnixNano", 0))
    text, calls = _output(a)
    return {
        "event_id": f"otel:{span.get('traceId')}:{span.get('spanId')}",
        "type": "completion",
        "ts": str(start // 1_000_000) if start else None,
        "session_id": a.get("gen_ai.conversation.id"),
        "episode_id": a.get("rlcycle.episode_id") or span.get("traceId"),
        "sample_id": a.get("gen_ai.response.id") or span.get("spanId"),
        "turn": a.get("rlcycle.turn"),
        "policy_version": a.get("rlcycle.policy_version") or a.get("gen_ai.request.model"),
        "prompt_ids": a.get("rlcycle.prompt_ids"),
        "completion_ids": a.get("rlcycle.completion_ids"),
        "completion_logprobs": a.get("rlcycle.completion_logprobs"),
        "prompt_messages": _messages(a.get("gen_ai.input.messages")),
        "completion_text": text,
        "tool_calls": calls,
        "latency_ms": (end - start) / 1e6 if start and end else None,
        "temperature": a.get("gen_ai.request.temperature"),
        "max_new_tokens": a.get("gen_ai.request.max_tokens"),
    }, None


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _content(msg: dict[str, Any]) -> str:
    if isinstance(msg.get("content"), str):
        return msg["content"]
    parts = msg.get("parts") or []
    return "".join(p.get("content", "") for p in parts if p.get("type") == "text")


def _messages(value: Any) -> list[dict[str, str]] | None:
    msgs = _loads(value)
    if not isinstance(msgs, list):
        return None
    return [{"role": m.get("role"), "content": _content(m)} for m in msgs if isinstance(m, dict)]


def _output(a: dict[str, Any]) -> tuple[str | None, list[dict[str, str]] | None]:
    msgs = _loads(a.get("gen_ai.output.messages"))
    text = None
    calls = _loads(a.get("rlcycle.tool_calls"))
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
        text = _content(msgs[0])
        if calls is None:
            calls = [
                {
                    "call_id": p.get("id"),
                    "name": p.get("name"),
                    "arguments": p["arguments"]
                    if isinstance(p.get("arguments"), str)
                    else json.dumps(p.get("arguments")),
                }
                for p in msgs[0].get("parts") or []
                if p.get("type") == "tool_call"
            ]
    if isinstance(calls, list):
        for c in calls:
            if not isinstance(c.get("arguments"), str):
                c["arguments"] = json.dumps(c.get("arguments"))
    return text, calls if isinstance(calls, list) else None


def _fill_turns(events: list[dict[str, Any]]) -> None:
    """Spans without rlcycle.turn get their rank by start time within the episode."""
    by_episode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_episode[e["episode_id"]].append(e)
    for group in by_episode.values():
        if any(e["turn"] is None for e in group):
            for i, e in enumerate(sorted(group, key=lambda e: (e["ts"] or "", e["event_id"]))):
                if e["turn"] is None:
                    e["turn"] = i
