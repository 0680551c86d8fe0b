"""What agent frameworks send, accepted exactly (issue 24): stop strings, n > 1, forced tool calls,
`parallel_tool_calls: false`, logprobs, content parts, assistant turns without content, tool
descriptions in the prompt; and what is refused: every bad field at once, OpenAI's error shape
for unknown routes, one stderr line and a per-field count per refusal.

The tiny random model (in-process, real transformers) checks the exact-ids rules on sampled
soup; where a known text is needed (a stop string inside a scripted "Thought/Observation" step,
two tool calls in one completion, the rest of a forced call) the gateway runs `--upstream`
against a second gateway serving a scripted `ReplayPolicy` over /v1/completions (a stand-in for
the model only: the gateways, harness, parser, HTTP hop and log are real).
"""

from __future__ import annotations

import json

import httpx
import polars as pl
import pytest

from rlcycle.harness.render import ChatRenderer
from tests.test_gateway import _client, _events_of, _scripted_upstream, _start, world  # noqa: F401  (fixture)

MSGS = [{"role": "user", "content": "Say hi."}]
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
SCRIPT = {
    "smol": ["Thought: list the files\nCode: ls\nObservation: made up by the model\nThought: more"],
    "two calls": [
        'Both.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n'
        '<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}</tool_call>'
    ],
    "resp": ['Looking.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', "All done."],
    "forced": ['{"command": "ls -la"}}</tool_call>'],
}


@pytest.fixture(scope="module")
def gw(world):  # noqa: F811
    running = _start(world, world["root"] / "logs-requests")
    yield running
    running.close()


@pytest.fixture(scope="module")
def scripted(world):  # noqa: F811
    from rlcycle.policy.scripted import ReplayPolicy

    server = _scripted_upstream(world, ReplayPolicy(str(world["model"]), SCRIPT))
    running = _start(world, world["root"] / "logs-scripted", upstream=server.url)
    yield running
    running.close()
    server.close()


def _one(running, sample_id):
    return next(e for e in _events_of(running, sample_id) if e["type"] == "completion")


def test_stop_string_cuts_the_sampled_ids_exactly(gw, world):  # noqa: F811
    c = _client(gw)
    kw = dict(model="m", messages=MSGS, max_tokens=24, seed=11, temperature=1.0)
    full = c.chat.completions.with_raw_response.create(**kw)
    text = full.parse().choices[0].message.content
    ev_full = _one(gw, full.headers["x-sample-id"])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip() and len(text) > 6, text
    cut = c.chat.completions.with_raw_response.create(**kw, stop=[stop, "never-there"])
    choice = cut.parse().choices[0]
    assert choice.message.content == text[: text.find(stop)] and choice.finish_reason == "stop"
    ev = _one(gw, cut.headers["x-sample-id"])
    ids = ev["completion_ids"]
    # the logged ids are the sampled ones through the first token that completes the stop string
    renderer = ChatRenderer.from_pretrained(world["model"], tools=())
    assert (
        ids == ev_full["completion_ids"][: len(ids)]
        and ev["completion_logprobs"] == ev_full["completion_logprobs"][: len(ids)]
    )
    assert stop in renderer.tokenizer.decode(ids) and stop not in renderer.tokenizer.decode(ids[:-1])
    assert ev["completion_text"] == renderer.completion_text(ids)  # decoded ids, never re-tokenised
    assert ev["sampling"]["stop"] == [stop, "never-there"] and ev["finish_reason"] == "stop"
    assert ev["cut"] == {"rule": "stop", "string": stop, "sampled_tokens": len(ev_full["completion_ids"])}


def test_n_choices_are_logged_each_with_its_index_and_logprobs_are_returned(gw):
    raw = _client(gw).chat.completions.with_raw_response.create(
        model="m", messages=MSGS, max_tokens=5, n=3, seed=2, logprobs=True
    )
    resp = raw.parse()
    ids = raw.headers["x-sample-id"].split(",")
    assert [ch.index for ch in resp.choices] == [0, 1, 2] and len(set(ids)) == 3
    evs = [_one(gw, s) for s in ids]
    assert [e["choice_index"] for e in evs] == [0, 1, 2] and [e["seed"] for e in evs] == [2, 3, 4]
    assert len({e["episode_id"] for e in evs}) == 1 and len({tuple(e["prompt_ids"]) for e in evs}) == 1
    for ch, ev in zip(resp.choices, evs, strict=True):
        assert [t.logprob for t in ch.logprobs.content] == pytest.approx(ev["completion_logprobs"])
    assert resp.usage.completion_tokens == sum(len(e["completion_ids"]) for e in evs)


def test_greedy_is_logged_as_greedy_and_collect_carries_it(gw, cli, tmp_path):
    c = _client(gw)
    raw = c.chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=4, temperature=0)
    sampled = c.chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=4)
    ev = _one(gw, raw.headers["x-sample-id"])
    assert ev["greedy"] is True and ev["sampling"]["greedy"] is True and ev["temperature"] == 0
    r = cli(["collect", gw.gateway.config.log_dir, "-o", tmp_path / "t.arrow"])
    assert r.exit_code == 0, r.output
    traj = pl.read_ipc(tmp_path / "t.arrow")
    greedy = dict(zip(traj["sample_id"], traj["greedy"], strict=True))
    assert greedy[raw.headers["x-sample-id"]] is True and greedy[sampled.headers["x-sample-id"]] is False
    assert traj.filter(pl.col("sample_id") == sampled.headers["x-sample-id"])["top_p"].to_list() == [1.0]


def test_content_parts_and_assistant_turns_without_content(gw):
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "List files."}]},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "x1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "x1", "content": "a.py"},
    ]
    r = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": [BASH], "max_tokens": 3}
    )
    assert r.status_code == 200, r.text
    ev = _one(gw, r.headers["x-sample-id"])
    text = ChatRenderer(gw.gateway.models.primary.tokenizer).tokenizer.decode(ev["prompt_ids"])
    assert "Be brief." in text and "The bash command to execute" in text and '"required": ["command"]' in text


def test_scripted_stop_parallel_calls_and_forced_call(scripted):
    c = _client(scripted)
    # smolagents: stop at "Observation:"; the model's made-up observation is not returned or logged past it
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "smol"}], stop=["Observation:", "Calling tools:"]
    )
    assert raw.parse().choices[0].message.content == "Thought: list the files\nCode: ls\n"
    ev = _one(scripted, raw.headers["x-sample-id"])
    assert ev["completion_text"].endswith("Observation:") or "Observation:" in ev["completion_text"]
    assert "made up" not in ev["completion_text"]
    # parallel_tool_calls false: the completion ends after the first call
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "two calls"}], tools=[BASH], parallel_tool_calls=False
    )
    ch = raw.parse().choices[0]
    assert [json.loads(t.function.arguments) for t in ch.message.tool_calls] == [{"command": "ls"}]
    ev = _one(scripted, raw.headers["x-sample-id"])
    assert ev["cut"]["rule"] == "parallel_tool_calls" and ev["completion_text"].rstrip().endswith("</tool_call>")
    assert "pwd" not in ev["completion_text"]
    # a named tool_choice: the call's opening is prefilled into the prompt, the rest sampled
    raw = c.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "forced"}],
        tools=[BASH],
        tool_choice={"type": "function", "function": {"name": "bash"}},
    )
    ch = raw.parse().choices[0]
    assert ch.finish_reason == "tool_calls" and json.loads(ch.message.tool_calls[0].function.arguments) == {
        "command": "ls -la"
    }
    ev = _one(scripted, raw.headers["x-sample-id"])
    tok = scripted.gateway.models.primary.tokenizer
    assert tok.decode(ev["prompt_ids"]).endswith('<tool_call>{"name": "bash", "arguments": ')
    assert not ev["completion_text"].startswith("<tool_call>")  # the prefill is prompt, not completion


def test_every_bad_field_is_listed_and_counted(gw, capfd):
    body = {
        "model": "m",
        "messages": MSGS,
        "top_k": 5,
        "n": 99,
        "top_logprobs": 3,
        "response_format": {"type": "json_object"},
    }
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"User-Agent": "smolagents-test/1"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert {p["param"] for p in err["problems"]} == {"top_k", "n", "top_logprobs", "response_format"}
    assert err["message"].startswith("4 problems:") and "does not constrain" in err["message"]
    [line] = [x for x in capfd.readouterr().err.splitlines() if "refused 400" in x]
    fields = line.split(" field=")[1].split()[0].split(",")
    assert sorted(fields) == sorted(["top_k", "n", "top_logprobs", "response_format"])
    assert 'user-agent="smolagents-test/1"' in line
    stats = httpx.get(gw.url + "/v1/rlcycle/stats").json()
    assert stats["refused_by_field"]["top_k"] >= 1 and stats["refused_by_status"]["400"] >= 1
    # an unknown route: OpenAI's error shape, not FastAPI's {"detail": ...}
    r = httpx.post(gw.url + "/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "route" and "detail" not in r.json()
    assert httpx.get(gw.url + "/v1/rlcycle/stats").json()["refused_by_field"]["route"] >= 1


RESP_BASH = {"type": "function", **BASH["function"]}


def test_responses_api_function_call_round_trip_and_stream(scripted):
    c = _client(scripted)
    first = c.responses.with_raw_response.create(
        model="m", instructions="Be brief.", input=[{"role": "user", "content": "resp"}], tools=[RESP_BASH]
    )
    resp = first.parse()
    kinds = [o.type for o in resp.output]
    assert kinds == ["message", "function_call"] and resp.output[0].content[0].text == "Looking."
    call = resp.output[1]
    assert call.name == "bash" and json.loads(call.arguments) == {"command": "ls"} and resp.status == "completed"
    ev1 = _one(scripted, first.headers["x-sample-id"])
    assert ev1["api"] == "responses" and resp.usage.output_tokens == len(ev1["completion_ids"])
    # the SDK's next turn: the output items back, plus the function output; streamed this time
    follow = [{"role": "user", "content": "resp"}] + [o.model_dump(exclude_none=True) for o in resp.output]
    follow.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.py"})
    with c.responses.stream(model="m", instructions="Be brief.", input=follow, tools=[RESP_BASH]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events and final.output_text == "All done."
    sample = final.id.removeprefix("resp_")
    ev2 = _one(scripted, sample)
    assert ev2["episode_id"] == ev1["episode_id"] and ev2["turn"] == 1 and ev2["parent_sample_id"] == ev1["sample_id"]
    assert ev2["id_rules"] == {"session": "continuation", "episode": "continuation"}
    # token-exact: the second prompt repeats the first prompt and the sampled ids
    n = len(ev1["prompt_ids"]) + len(ev1["completion_ids"])
    assert ev2["prompt_ids"][:n] == ev1["prompt_ids"] + ev1["completion_ids"]


def test_responses_api_refusals_name_the_field(gw):
    r = httpx.post(
        gw.url + "/v1/responses",
        json={"model": "m", "input": "hi", "previous_response_id": "resp_x", "tools": [{"type": "web_search"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    r = httpx.post(gw.url + "/v1/responses", json={"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"


def test_stream_with_n_choices_and_logprobs_matches_the_log(gw):
    stream = _client(gw).chat.completions.create(
        model="m", messages=MSGS, max_tokens=4, n=2, seed=7, logprobs=True, stream=True
    )
    text: dict[int, str] = {0: "", 1: ""}
    lps: dict[int, list[float]] = {0: [], 1: []}
    for ch in stream:
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
            lps[c.index] += [t.logprob for t in (c.logprobs.content if c.logprobs else [])]
    raw = _client(gw).chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=4, n=2, seed=7)
    plain = raw.parse()
    assert [text[0], text[1]] == [c.message.content for c in plain.choices]
    evs = [_one(gw, s) for s in raw.headers["x-sample-id"].split(",")]
    assert [lps[0], lps[1]] == [pytest.approx(e["completion_logprobs"]) for e in evs]
