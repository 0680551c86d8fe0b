"""`rlcycle gateway` with real clients: the official `openai` SDK and httpx against uvicorn on loopback.

The model is the tiny random one `rlcycle init-model` makes (real transformers, in-process). The
tool-call tests need a model that writes tool calls, which a random one does not: there the
gateway runs in `--upstream` mode against a second gateway that serves a scripted `ReplayPolicy`
in-process over vLLM's /v1/completions (`_scripted_upstream`; a stand-in for the model only:
the gateways, the harness, the parser, the HTTP hop and the log are all real). Load, kill -9, alias-move and collect → distill → train
tests are in test_gateway_load.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from rlcycle.gateway import GatewayConfig, start
from rlcycle.harness.render import ChatRenderer
from rlcycle.policy.registry import Entry, Registry
from rlcycle.prompts import events_with_full_prompts

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


def read_events(log_dir: Path) -> list[dict]:
    """The log's events as written (completions in the delta layout: no `prompt_ids`)."""
    out = []
    for f in sorted(Path(log_dir).glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def read_full_events(log_dir: Path) -> list[dict]:
    """The log's events with every completion's whole prompt rebuilt as `prompt_ids`."""
    return events_with_full_prompts(read_events(log_dir))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny model registered as `production` in a registry of its own."""
    from rlcycle import model_init

    root = tmp_path_factory.mktemp("gw")
    model = model_init.run(model_init.InitModelConfig(seed=0), root / "m0").path
    reg = Registry(root / "registry")
    with reg.locked():
        cid = reg.add(model)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    return {"root": root, "model": Path(model), "registry": str(reg.root), "cid": cid}


def _start(world, log_dir, **kw):
    kw.setdefault("flush_interval_s", 0.05)
    return start(GatewayConfig(registry=world["registry"], log_dir=str(log_dir), port=0, **kw))


@pytest.fixture(scope="module")
def gateway(world):
    running = _start(world, world["root"] / "logs-main")
    yield running
    running.close()


def _client(running, **kw) -> openai.OpenAI:
    kw.setdefault("api_key", "unused")
    return openai.OpenAI(base_url=running.url + "/v1", max_retries=0, **kw)


def _events_of(running, sample_id: str) -> list[dict]:
    running.gateway.log.flush()
    # whole prompts rebuilt over the whole log first: a prompt's parent is another sample's event
    return [e for e in read_full_events(running.gateway.config.log_dir) if e.get("sample_id") == sample_id]


def test_plain_completion_is_logged_with_exact_ids(gateway, world):
    raw = _client(gateway).chat.completions.with_raw_response.create(
        model="production",
        messages=MSGS,
        max_tokens=6,
        seed=3,
        temperature=0.8,
        extra_headers={"X-Session-Id": "sess-1"},
    )
    resp = raw.parse()
    h = raw.headers
    assert h["x-checkpoint-id"] == world["cid"] and h["x-session-id"] == "sess-1"
    assert resp.choices[0].finish_reason in ("stop", "length") and resp.usage.completion_tokens >= 1
    [ev] = _events_of(gateway, h["x-sample-id"])
    renderer = ChatRenderer.from_pretrained(world["model"], tools=())
    assert ev["type"] == "completion" and ev["policy_version"] == world["cid"]
    assert ev["prompt_ids"] == renderer.render(MSGS, add_generation_prompt=True)
    assert len(ev["completion_ids"]) == len(ev["completion_logprobs"]) == resp.usage.completion_tokens
    assert resp.choices[0].message.content == renderer.completion_text(ev["completion_ids"])
    assert ev["session_id"] == "sess-1" and ev["episode_id"] == "sess-1-e0" and ev["turn"] == 0
    assert ev["sampling"] == {
        "temperature": 0.8,
        "top_p": 1.0,
        "top_k": None,
        "seed": 3,
        "max_tokens": 6,
        "truncated": False,
        "greedy": False,
        "stop": [],
        "n": 1,
        "parallel_tool_calls": True,
        "tool_choice": None,
        "prefill": "",
    }
    # the same seed gives the same sample (and a session id is made when none is sent)
    again = _client(gateway).chat.completions.with_raw_response.create(
        model="production", messages=MSGS, max_tokens=6, seed=3, temperature=0.8
    )
    assert again.headers["x-session-id"].startswith("gw-") and again.headers["x-session-id"] != "sess-1"
    [ev2] = _events_of(gateway, again.headers["x-sample-id"])
    assert ev2["completion_ids"] == ev["completion_ids"] and ev2["session_id"] == again.headers["x-session-id"]


def test_streaming_matches_the_plain_response(gateway):
    c = _client(gateway)
    plain = c.chat.completions.create(model="production", messages=MSGS, max_tokens=6, seed=5)
    stream = c.chat.completions.create(
        model="production", messages=MSGS, max_tokens=6, seed=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == plain.choices[0].finish_reason


def test_secrets_are_redacted_before_disk(gateway):
    r = httpx.post(
        gateway.url + "/v1/rlcycle/events",
        json={
            "type": "user_message",
            "session_id": "s-red",
            "episode_id": "s-red-e0",
            "text": "my key is sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX1234 ok",
        },
    )
    assert r.status_code == 200
    gateway.gateway.log.flush()
    [ev] = [e for e in read_events(gateway.gateway.config.log_dir) if e["session_id"] == "s-red"]
    assert ev["text"] == "my key is [REDACTED:openai_key] ok"
    raw = "".join(p.read_text() for p in Path(gateway.gateway.config.log_dir).glob("*.jsonl"))
    assert "sk-proj-ABCDEFGH" not in raw


@pytest.mark.parametrize(
    "body, param, status",
    [
        ({"messages": []}, "messages", 400),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", 400),
        ({"messages": MSGS, "top_p": 0.5}, "top_p", 400),
        ({"messages": MSGS, "top_k": 20}, "top_k", 400),
        ({"messages": MSGS, "tool_choice": "required", "tools": []}, "tool_choice", 400),
        ({"messages": MSGS, "max_tokens": 10**6}, "max_tokens", 400),
        ({"messages": MSGS, "temperature": "hot"}, "temperature", 400),
        ({"messages": MSGS, "n": 99}, "n", 400),
        ({"messages": MSGS, "top_logprobs": 2}, "top_logprobs", 400),
        ({"messages": MSGS, "response_format": {"type": "json_object"}}, "response_format", 400),
        (
            {"messages": MSGS, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": []},
            "tool_choice",
            400,
        ),
    ],
)
def test_bad_requests_name_the_field(gateway, body, param, status):
    with pytest.raises(openai.BadRequestError) as e:
        _client(gateway).chat.completions.create(
            model="m", messages=body["messages"], extra_body={k: v for k, v in body.items() if k != "messages"}
        )
    assert e.value.status_code == status and e.value.body["param"] == param, e.value.body


def test_bad_bodies_and_late_events(gateway):
    url = gateway.url
    before = gateway.gateway.log.stats.appended
    assert httpx.post(url + "/v1/chat/completions", content=b"{not json").status_code == 400
    big = httpx.post(url + "/v1/chat/completions", content=b"x" * (gateway.gateway.config.max_body_bytes + 1))
    assert big.status_code == 413
    bad = httpx.post(
        url + "/v1/rlcycle/events",
        json={
            "events": [
                {"type": "feedback", "session_id": "s", "episode_id": "e", "value": 0.5},
                {"type": "edit_outcome", "session_id": "s", "sample_id": "x", "call_id": "x-c0", "lines_proposed": 3},
            ]
        },
    )
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "events[1].lines_surviving"
    typed = httpx.post(
        url + "/v1/rlcycle/events", json={"type": "feedback", "session_id": "s", "episode_id": "e", "value": "great"}
    )
    assert typed.status_code == 422 and typed.json()["error"]["param"] == "events[0].value"
    wrong = httpx.post(url + "/v1/rlcycle/events", json={"type": "completion", "session_id": "s"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "events[0].type"
    assert gateway.gateway.log.stats.appended == before  # nothing of a refused batch is logged
    ok = httpx.post(
        url + "/v1/rlcycle/events",
        json=[{"type": "feedback", "session_id": "s", "episode_id": "e", "value": 1, "kind": "thumbs"}],
    )
    assert ok.status_code == 200 and ok.json()["accepted"] == 1


def test_idempotent_retries_log_once(gateway):
    url, body = gateway.url + "/v1/chat/completions", {"messages": MSGS, "max_tokens": 4}
    a = httpx.post(url, json=body, headers={"Idempotency-Key": "req-42"})
    b = httpx.post(url, json=body, headers={"Idempotency-Key": "req-42"})
    assert a.status_code == b.status_code == 200 and a.json() == b.json()
    assert len(_events_of(gateway, a.headers["x-sample-id"])) == 1
    # what the openai SDK sends when it retries after a timeout: the same body, retry count 1
    first = httpx.post(url, json={**body, "seed": 9}, headers={"x-stainless-retry-count": "0"})
    retry = httpx.post(url, json={**body, "seed": 9}, headers={"x-stainless-retry-count": "1"})
    assert retry.json() == first.json() and retry.headers["x-sample-id"] == first.headers["x-sample-id"]
    assert len(_events_of(gateway, first.headers["x-sample-id"])) == 1
    fresh = httpx.post(url, json={**body, "seed": 9}, headers={"x-stainless-retry-count": "0"})
    assert fresh.headers["x-sample-id"] != first.headers["x-sample-id"]  # a new request is a new sample


def test_api_key_is_required_and_checked(world, tmp_path):
    running = _start(world, tmp_path / "logs", api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            _client(running).chat.completions.create(model="m", messages=MSGS, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            _client(running, api_key="s3cre").models.list()
        ok = _client(running, api_key="s3cret").chat.completions.create(model="m", messages=MSGS, max_tokens=2)
        assert ok.choices[0].message.role == "assistant"
        assert httpx.get(running.url + "/health").text == "ok"
        assert httpx.post(running.url + "/v1/rlcycle/reload").status_code == 401
    finally:
        running.close()
    assert len(read_events(tmp_path / "logs")) == 1


def test_off_loopback_without_a_key_is_refused(cli, tmp_path):
    r = cli(["gateway", "--host", "0.0.0.0", "--log-dir", tmp_path / "logs"])
    assert r.exit_code == 2 and "api_key is required" in r.stderr


# --- tool calls: upstream mode in front of a gateway serving a scripted model ------------------

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
VALID = 'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "app.py"}}</tool_call>'
INVALID = 'Now this.\n<tool_call>{"name": "read_fil", "arguments": {"path": "app.py"}}</tool_call>'


def _scripted_upstream(world, policy):
    """A gateway serving a scripted `policy` in-process over /v1/completions, logging nothing; the
    world's model directory is listed as its root, as vLLM lists its --model (the gateway in front
    identifies the checkpoint by it)."""
    return start(GatewayConfig(port=0, logging=False), policy=policy, checkpoint=world["model"])


@pytest.fixture(scope="module")
def upstream_gateway(world):
    from rlcycle.policy.scripted import ReplayPolicy

    server = _scripted_upstream(world, ReplayPolicy(str(world["model"]), [VALID, INVALID]))
    running = _start(world, world["root"] / "logs-upstream", upstream=server.url)
    yield running
    running.close()
    server.close()


def test_tool_calls_are_parsed_and_invalid_ones_stay_text(upstream_gateway, world):
    c = _client(upstream_gateway)
    msgs = [{"role": "user", "content": "Fix app.py"}]
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=msgs, tools=[READ], max_tokens=64, extra_headers={"X-Session-Id": "tools-1"}
    )
    first = raw.parse().choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content == "Let me look."
    [call] = first.message.tool_calls
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "app.py"}
    [ev1] = _events_of(upstream_gateway, raw.headers["x-sample-id"])
    assert ev1["tool_calls"] == [{"call_id": call.id, "name": "read_file", "arguments": '{"path": "app.py"}'}]
    assert ev1["policy_version"] == world["cid"] and raw.headers["x-checkpoint-id"] == world["cid"]

    msgs2 = msgs + [
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "print('hi')"},
    ]
    raw2 = c.chat.completions.with_raw_response.create(
        model="m", messages=msgs2, tools=[READ], max_tokens=64, extra_headers={"X-Session-Id": "tools-1"}
    )
    second = raw2.parse().choices[0]
    assert second.finish_reason == "stop" and not second.message.tool_calls
    assert second.message.content == INVALID  # returned as text, never dropped
    evs = _events_of(upstream_gateway, raw2.headers["x-sample-id"])
    comp = next(e for e in evs if e["type"] == "completion")
    [result] = [e for e in evs if e["type"] == "tool_result"]
    assert result["status"] == "invalid" and result["call_id"] == comp["tool_calls"][0]["call_id"]
    assert "unknown_tool" in result["error"] and comp["turn"] == 1 and comp["episode_id"] == "tools-1-e0"
    # stored once: the second prompt is logged against the first sample it continues
    [raw_comp] = [
        e
        for e in read_events(upstream_gateway.gateway.config.log_dir)
        if e.get("sample_id") == comp["sample_id"] and e["type"] == "completion"
    ]
    assert "prompt_ids" not in raw_comp and raw_comp["prompt_parent"] == ev1["sample_id"]
    # token-exact multi-turn: the second prompt repeats the first prompt and the sampled ids
    assert (
        comp["prompt_ids"][: len(ev1["prompt_ids"]) + len(ev1["completion_ids"])]
        == ev1["prompt_ids"] + ev1["completion_ids"]
    )


def test_tool_calls_stream(upstream_gateway):
    stream = _client(upstream_gateway).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Fix it"}], tools=[READ], stream=True
    )
    chunks = [ch for ch in stream if ch.choices]
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["read_file"] and calls[0].id.endswith("-c0")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
