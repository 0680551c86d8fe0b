"""The Responses API (`POST /v1/responses`) as agent SDKs use it, on top of chat completions.

In: a Responses body: `instructions`, `input` (a string, or items: messages with text parts,
`function_call`, `function_call_output`), function `tools`, `tool_choice`, `max_output_tokens`,
`temperature`, `top_p`, `parallel_tool_calls`, `text.format` and `stream`. Out: the chat
completions body it stands for (`to_chat`: then checked, sampled and logged exactly like a chat
request), and the `response` object (`response_object`) or its SSE events (`stream_events`:
response.created … output_text.delta … function_call_arguments.done … response.completed).

What is refused (400, naming the field): `previous_response_id` and `conversation` (the gateway
stores no responses: send the whole input, as openai-agents does by default), tools other than
functions (web_search, file_search, computer use: nothing here runs them), input items other
than messages and function calls/outputs (images, files, reasoning items — the gateway never
emits reasoning), and a `text.format` other than text (see chat.py: decoding is never
constrained). `store`, `include`, `reasoning`, `truncation`, `user`, `service_tier` and
`prompt_cache_key` do not change sampling and are accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any

from rlcycle.gateway.chat import BadRequest, Result, usage

IGNORED = ("store", "include", "reasoning", "truncation", "user", "service_tier", "prompt_cache_key")
TEXT_PARTS = ("input_text", "output_text", "text")


def _parts(content: Any, where: str) -> Any:
    """Responses content parts as chat text parts (other part types are left for chat to refuse)."""
    if not isinstance(content, list):
        return content
    out = []
    for j, p in enumerate(content):
        if isinstance(p, dict) and p.get("type") in TEXT_PARTS:
            out.append({"type": "text", "text": p.get("text")})
        elif isinstance(p, dict) and p.get("type") == "refusal":
            out.append({"type": "text", "text": p.get("refusal")})
        else:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise BadRequest(f"only text content parts are supported, got {kind!r}", f"{where}.content[{j}]")
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        msgs.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return msgs + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            msgs.append({"role": item.get("role"), "content": _parts(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":  # calls of one answer join its text
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            if isinstance(out, list):
                out = "".join(p.get("text", "") for p in _parts(out, where))
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": out})
        else:
            raise BadRequest(
                f"input items of type {kind!r} are not supported (messages, function_call and "
                "function_call_output are)",
                f"{where}.type",
            )
    return msgs


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise BadRequest(f"only function tools are supported, got {kind!r} (nothing here runs it)", f"tools[{i}]")
        out.append(
            {
                "type": "function",
                "function": {k: t[k] for k in ("name", "description", "parameters") if k in t},
            }
        )
    return out


def to_chat(body: Any) -> dict[str, Any]:
    """The chat-completions body a Responses body stands for (BadRequest names the field)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise BadRequest(f"{key} is not supported: the gateway stores no responses; send the whole input", key)
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt not in (None, {"type": "text"}):
        raise BadRequest(
            "text.format json_object/json_schema is refused: the gateway does not constrain decoding",
            "text.format",
        )
    chat: dict[str, Any] = {"messages": _messages(body), "model": body.get("model")}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    for src, dst in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("metadata", "metadata"),
        ("top_logprobs", "top_logprobs"),
        ("seed", "seed"),
        ("stream", "stream"),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    return chat


def _items(r: Result) -> list[dict[str, Any]]:
    content, tool_calls, _ = r.message()
    items: list[dict[str, Any]] = []
    if content:
        items.append(
            {
                "type": "message",
                "id": f"msg_{r.sample_id}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}],
            }
        )
    for tc in tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{tc['id']}",
                "call_id": tc["id"],
                "name": tc["function"]["name"],
                "arguments": tc["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def response_object(results: list[Result], model: str, body: dict[str, Any], status: str = "completed") -> dict:
    r = results[0]
    u = usage(results)
    done = status == "completed"
    incomplete = done and r.gen.finish_reason == "length" and not r.message()[1]
    return {
        "id": f"resp_{r.sample_id}",
        "object": "response",
        "created_at": r.created,
        "model": model,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "instructions": body.get("instructions"),
        "output": _items(r) if done else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"],
        }
        if done
        else None,
    }


def stream_events(results: list[Result], model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of a finished response, in the order the Responses API sends them."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **data: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **data})

    emit("response.created", response=response_object(results, model, body, "in_progress"))
    emit("response.in_progress", response=response_object(results, model, body, "in_progress"))
    for k, item in enumerate(_items(results[0])):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            emit("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            emit("response.content_part.added", output_index=k, item_id=item["id"], content_index=0, part=part)
            emit(
                "response.output_text.delta",
                output_index=k,
                item_id=item["id"],
                content_index=0,
                delta=text,
                logprobs=[],
            )
            emit(
                "response.output_text.done", output_index=k, item_id=item["id"], content_index=0, text=text, logprobs=[]
            )
            emit(
                "response.content_part.done",
                output_index=k,
                item_id=item["id"],
                content_index=0,
                part=item["content"][0],
            )
        else:
            emit("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", output_index=k, item_id=item["id"], delta=item["arguments"])
            emit(
                "response.function_call_arguments.done",
                output_index=k,
                item_id=item["id"],
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=k, item=item)
    final = response_object(results, model, body)
    emit("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
    return events


def sse(events: list[dict[str, Any]]) -> list[str]:
    return [f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events]
