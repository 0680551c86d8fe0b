"""The events both producers write, byte for byte: the simulator's `SessionLog` (what the runner
logs for every sample) and the gateway serving real requests in-process.

Golden files (tests/golden/events_*.jsonl) were captured from the code *before* the two
hand-written event dicts became one writer (`rlcycle.agent.events`, issue 36), and regenerated
once when prompts became stored once (issue 36 item 1: each completion's `prompt_ids` replaced
by `prompt_parent`/`prompt_shared`/`prompt_added` in its place, nothing else changed, every
rebuilt prompt equal to the old one); every line is
compared as the bytes both logs write (`json.dumps(..., ensure_ascii=False, separators=(",",
":"))`), so key order counts. What cannot repeat is normalised before the comparison and only
that: the gateway's wall-clock `ts` and measured `latency_ms`. The simulator's clock is
simulated, so its `ts` is compared as it is.

Three producers' paths: `SessionLog` driven directly (exact time, no Docker), a scripted episode
through the runner in a real Docker sandbox (`run_episodes`, with the simulated user's late
signals; there tool durations are measured too, so `ts`, `latency_ms`, `duration_ms` and
`observed_after_s` are normalised), and the gateway serving a scripted `ReplayPolicy` (a
stand-in for the model only: the gateway, the harness, the parser, the HTTP hop and the log are
real); an `Idempotency-Key` per request makes its sample ids repeatable. Regenerate only on
purpose, with RLCYCLE_WRITE_GOLDEN=1 and PYTHONPATH pointing at the code whose bytes are wanted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from rlcycle.agent.events import SessionLog, SimClock, parse_time_ms
from rlcycle.agent.runner import RunnerConfig, run_episodes
from rlcycle.gateway import GatewayConfig, start
from rlcycle.policy.scripted import ReplayPolicy

GOLDEN = Path(__file__).resolve().parent / "golden"
WRITE = os.environ.get("RLCYCLE_WRITE_GOLDEN") == "1"

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
TWO_CALLS = (
    'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "app.py"}}</tool_call>\n'
    '<tool_call>{"name": "read_fil", "arguments": {"path": "app.py"}}</tool_call>'
)
SCRIPT = {
    "Fix app.py": [TWO_CALLS, "Fixed it. DONE and then some rambling"],
    "resp": ['Looking.\n<tool_call>{"name": "read_file", "arguments": {"path": "b.py"}}</tool_call>'],
}


def _line(ev: dict) -> str:
    return json.dumps(ev, ensure_ascii=False, separators=(",", ":"))


def _check(name: str, events: list[dict]) -> None:
    path = GOLDEN / name
    lines = [_line(e) for e in events]
    if WRITE:
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    want = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(want), f"{name}: {len(lines)} events, golden has {len(want)}"
    for i, (got, exp) in enumerate(zip(lines, want, strict=True)):
        assert got == exp, f"{name} line {i + 1} differs:\n got {got[:400]}\nwant {exp[:400]}"


# --- the simulator ------------------------------------------------------------------------------


def _session(pair_key: str | None, max_new_tokens: int | None) -> list[dict]:
    """One scripted session through SessionLog, as the runner drives it: two episodes (a
    clarification answer starts the second), calls ok / error / invalid, late signals."""
    log = SessionLog(
        "run1-t1-a0",
        "ckpt-0a1b",
        SimClock(parse_time_ms("2026-12-01T00:00:00Z")),
        0.7,
        max_new_tokens=max_new_tokens,
        pair_key=pair_key,
    )
    sid, cids = log.completion(
        [1, 2, 3],
        [4, 5, 6],
        [-0.5, -0.25, -1.0 / 3],
        "Next: edit.\n<tool_call>…</tool_call>",
        [("edit_file", '{"path": "a.py"}'), (None, "{bad"), ("ask_user", '{"question": "Which?"}')],
        1234.5678,
        [1, 1, 1],
    )
    log.tool_result(sid, cids[0], "ok", None, 250.0004, edit_lines=3)
    log.tool_result(sid, cids[1], "invalid", "bad_json: not JSON", 0.0)
    log.tool_result(sid, cids[2], "ok", None, 0.5)
    log.user_message("The second one, ünïcode.", 60_000, next_episode=True)
    sid2, cids2 = log.completion([1, 2, 3, 4, 5, 6, 7], [8, 9], [0.0, -2.5], "done", [("finish", "{}")], 10.0, [1, 1])
    log.tool_result(sid2, cids2[0], "error", "timeout after 30 s", 30_000.0)
    log.user_message("thanks", 5_000, next_episode=False)
    log.feedback(1, 1_000)
    log.edit_outcome(sid, cids[0], 3, 2, log.clock.now_ms + 7_200_000, log.clock.now_ms)
    return log.events


def test_simulator_events_are_byte_identical_to_the_golden():
    _check("events_simulator.jsonl", _session("s0-t1-a0", 256) + _session(None, None))


def _normalised(events: list[dict], measured: tuple[str, ...]) -> list[dict]:
    """The events with each measured value replaced in place (so the key order is kept)."""
    out = []
    for ev in events:
        ev = dict(ev)
        for k in measured:
            if k in ev:
                ev[k] = "TS" if k == "ts" else 0.0
        out.append(ev)
    return out


@pytest.fixture(scope="module")
def pool(docker_client):
    from rlcycle.sandbox import SandboxPool

    with SandboxPool(size=1) as p:
        yield p


def test_runner_events_are_byte_identical_to_the_golden(pool, tmp_path):
    """tests/test_runner.py's replayed trajectory (read, an invalid patch, a patch, a shell call,
    finish) with the simulated user: every event the runner logs, in order."""
    from rlcycle.policy.scripted import load_tokenizer
    from tests.test_runner import REPLAY, make_suite

    task = make_suite(tmp_path)[0]
    policy = ReplayPolicy(load_tokenizer(None), REPLAY, name="replay-1")
    config = RunnerConfig(temperature=0.7, run_id="golden")
    [r] = run_episodes(policy, "replay-1", [task], pool, config, seed=0, simulate_user=True)
    assert r.status == "pass" and r.turns == len(REPLAY)
    measured = ("ts", "latency_ms", "duration_ms", "observed_after_s")
    _check("events_runner.jsonl", _normalised(r.events, measured))


# --- the gateway --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    policy = ReplayPolicy(None, SCRIPT)
    log_dir = tmp_path_factory.mktemp("golden-gw")
    running = start(GatewayConfig(port=0, log_dir=str(log_dir), flush_interval_s=0.05), policy=policy)
    yield running
    running.close()


def _post(running, path: str, body: dict, key: str) -> httpx.Response:
    headers = {"Idempotency-Key": key, "X-Session-Id": "golden"}
    r = httpx.post(running.url + path, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _gateway_events(running) -> list[dict]:
    """A tool-calling turn (one valid call, one invalid), its continuation with a stop string and
    n=2, and a Responses API request; the log read back as written."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix app.py"}]
    body = {"model": "m", "messages": msgs, "tools": [READ], "max_tokens": 64, "seed": 7, "temperature": 0.7}
    first = _post(running, "/v1/chat/completions", body, "golden-1").json()["choices"][0]["message"]
    follow = msgs + [
        {k: v for k, v in first.items() if v is not None},
        {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "print('hi')"},
    ]
    body2 = {**body, "messages": follow, "stop": ["DONE"], "n": 2, "logprobs": True}
    _post(running, "/v1/chat/completions", body2, "golden-2")
    resp = {
        "model": "m",
        "instructions": "Be brief.",
        "input": "resp",
        "tools": [{"type": "function", **READ["function"]}],
    }
    _post(running, "/v1/responses", resp, "golden-3")
    running.gateway.log.flush()
    events = []
    for f in sorted(Path(running.gateway.config.log_dir).glob("*.jsonl")):
        events += [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
    return _normalised(events, ("ts", "latency_ms"))  # wall clock and measured time: all that cannot repeat


def test_gateway_events_are_byte_identical_to_the_golden(gateway):
    events = _gateway_events(gateway)
    assert [e["type"] for e in events] == ["completion", "tool_result", "completion", "completion", "completion"]
    _check("events_gateway.jsonl", events)


# --- the writer's own rules ----------------------------------------------------------------------


def test_drawn_refuses_a_sampling_record_that_contradicts_it():
    from rlcycle.agent.events import Drawn

    record = {"temperature": 0.7, "top_p": 1.0, "seed": 3, "greedy": False}
    assert Drawn(False, 1.0, 3, record, "stop", None).seed == 3
    with pytest.raises(ValueError, match="seed"):
        Drawn(False, 1.0, 4, record, "stop", None)  # the event would name two seeds


def test_only_the_writer_lays_out_prompts_and_completions():
    """No producer module builds completion fields by hand again: the keys appear as string
    literals only in rlcycle/agent/events.py (where `prompt_fields` is the prompt's one place:
    the delta layout, `prompt_parent`/`prompt_shared`/`prompt_added`; `prompt_ids` is never
    written by a producer)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "rlcycle"
    keys = {"prompt_ids", "prompt_parent", "prompt_shared", "prompt_added", "completion_ids", "completion_logprobs"}
    found = []
    for part in ("agent", "gateway", "simulate", "rollout", "evaluation"):
        for path in sorted((root / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Dict):
                    named = {k.value for k in node.keys if isinstance(k, ast.Constant)} & keys
                    if named:
                        found.append((path.relative_to(root).as_posix(), sorted(named)))
    assert found == [
        ("agent/events.py", ["prompt_added", "prompt_parent", "prompt_shared"]),
        ("agent/events.py", ["completion_ids", "completion_logprobs"]),
    ]
