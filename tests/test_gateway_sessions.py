"""Sessions and episodes without client changes (issue 24): the bearer key, the `/s/<session>/v1`
base URL, and episode continuation by message prefix, whatever user messages come between.

The rule unit tests run on `Episodes` alone; the end-to-end ones on a real gateway (tiny random
model, in-process) with the official `openai` SDK sending no session headers at all.
"""

from __future__ import annotations

import openai

from rlcycle.gateway.episodes import Episodes, key_session
from tests.test_gateway import _events_of, _start, world  # noqa: F401  (fixture)

SYS = {"role": "system", "content": "You are an agent."}


def _asst(text, calls=None):
    m = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return m


def _answered(ep, msgs, session, answer, sample_id, episode=None, rule="header"):
    s, e, turn, rules, parent = ep.resolve(msgs, session, rule if session else "new", episode, "gw-new")
    ep.record(msgs, s, e, turn, [(sample_id, answer)])
    return s, e, turn, rules, parent


def test_an_agent_loop_is_one_episode_whatever_the_user_messages_between():
    ep = Episodes()
    task = [SYS, {"role": "user", "content": "Fix the bug."}]
    a0 = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"}'}}],
    }
    assert _answered(ep, task, None, a0, "s0")[:4] == ("gw-new", "gw-new-e0", 0, {"session": "new", "episode": "new"})
    # mini-swe-agent's format error is a *user* message; the arguments re-serialised with other spacing
    a0_back = {**a0, "tool_calls": [{"function": {"name": "bash", "arguments": '{"command":"ls"}'}}]}
    step1 = task + [a0_back, {"role": "user", "content": "Format error: use one bash block."}]
    s, e, turn, rules, parent = _answered(ep, step1, None, _asst("ok"), "s1")
    assert (s, e, turn, parent) == ("gw-new", "gw-new-e0", 1, "s0") and rules == {
        "session": "continuation",
        "episode": "continuation",
    }
    # smolagents' observation (a user message with parts), the answer re-sent as its own text
    step2 = step1 + [_asst("ok"), {"role": "user", "content": [{"type": "text", "text": "Observation: a.py"}]}]
    assert _answered(ep, step2, None, _asst("done"), "s2")[1:3] == ("gw-new-e0", 2)
    # a client that rewrote the answer still continues (most recent match), with no parent match on content
    step3 = step2 + [_asst("DONE (edited by the client)"), {"role": "user", "content": "next"}]
    assert _answered(ep, step3, None, _asst("x"), "s3")[1:3] == ("gw-new-e0", 3)


def test_few_shot_turns_start_at_episode_0_and_a_new_task_is_a_new_episode():
    ep = Episodes()
    shots = [SYS] + [m for k in range(3) for m in ({"role": "user", "content": f"ex {k}"}, _asst(f"ans {k}"))]
    first = shots + [{"role": "user", "content": "real task"}]
    assert _answered(ep, first, "aider", _asst("a"), "x0")[1:3] == ("aider-e0", 0)  # not e3
    other = [SYS, {"role": "user", "content": "another task"}]
    assert _answered(ep, other, "aider", _asst("b"), "x1")[1:3] == ("aider-e1", 0)
    # the same messages in another explicit session never continue this one
    assert (
        _answered(ep, first + [_asst("a"), {"role": "user", "content": "go"}], "other", _asst("c"), "x2")[1]
        == "other-e0"
    )


def test_the_same_task_twice_is_told_apart_by_the_answer_the_client_sent_back():
    ep = Episodes()
    task = [SYS, {"role": "user", "content": "same"}]
    e_a = _answered(ep, task, None, _asst("A"), "a0")
    e_b = _answered(ep, task, None, _asst("B"), "b0")
    assert e_a[1] != e_b[1]  # two fresh sessions, two episodes
    cont = _answered(ep, task + [_asst("A"), {"role": "user", "content": "obs"}], None, _asst("A2"), "a1")
    assert cont[:3] == (e_a[0], e_a[1], 1) and cont[4] == "a0"
    cont = _answered(ep, task + [_asst("B"), {"role": "user", "content": "obs"}], None, _asst("B2"), "b1")
    assert cont[:3] == (e_b[0], e_b[1], 1) and cont[4] == "b0"


def test_key_sessions():
    assert key_session("Bearer sk-alice", None, {"sk-alice": "alice"}, False) == "alice"
    assert key_session("Bearer shared", "shared", {}, True) is None  # the shared key names no session
    k = key_session("Bearer run-17", None, {}, True)
    assert k.startswith("key-") and "run-17" not in k and k == key_session("Bearer run-17", None, {}, True)
    assert key_session("Bearer run-17", None, {}, False) is None


def test_sdk_without_headers_base_url_prefix_and_session_keys(world, tmp_path):  # noqa: F811
    running = _start(world, tmp_path / "logs", session_keys={"sk-bob": "bob"}, api_key="shared")
    try:
        # the session in the base URL; an agent loop with a tool result and a user message between
        c = openai.OpenAI(base_url=running.url + "/s/run-42/v1", api_key="shared", max_retries=0)
        msgs = [SYS, {"role": "user", "content": "Fix it."}]
        ids = []
        for k in range(3):
            raw = c.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=3, seed=k)
            ids.append(raw.headers["x-sample-id"])
            assert raw.headers["x-session-id"] == "run-42"
            msgs = msgs + [
                {"role": "assistant", "content": raw.parse().choices[0].message.content},
                {"role": "user", "content": f"observation {k}"},
            ]
        evs = [next(e for e in _events_of(running, s) if e["type"] == "completion") for s in ids]
        assert [(e["session_id"], e["episode_id"], e["turn"]) for e in evs] == [
            ("run-42", "run-42-e0", t) for t in range(3)
        ]
        assert [e["id_rules"] for e in evs] == [{"session": "path", "episode": "new"}] + [
            {"session": "path", "episode": "continuation"}
        ] * 2
        assert evs[1]["parent_sample_id"] == ids[0] and evs[2]["parent_sample_id"] == ids[1]
        # a per-user key is accepted and names the session; a wrong key is refused
        bob = openai.OpenAI(base_url=running.url + "/v1", api_key="sk-bob", max_retries=0)
        raw = bob.chat.completions.with_raw_response.create(model="m", messages=msgs[:2], max_tokens=2)
        assert raw.headers["x-session-id"] == "bob"
        ev = next(e for e in _events_of(running, raw.headers["x-sample-id"]) if e["type"] == "completion")
        assert ev["id_rules"] == {"session": "key", "episode": "new"}
        try:
            openai.OpenAI(base_url=running.url + "/v1", api_key="sk-eve", max_retries=0).models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        # the header still wins
        raw = bob.chat.completions.with_raw_response.create(
            model="m", messages=msgs[:2], max_tokens=2, extra_headers={"X-Session-Id": "explicit"}
        )
        assert raw.headers["x-session-id"] == "explicit" and raw.headers["x-episode-id"] == "explicit-e0"
    finally:
        running.close()
