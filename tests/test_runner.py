"""The episode runner against the real Docker sandbox: exact events of a replayed trajectory,
batching, clarifications, limits, infrastructure retries, and the shipped suite's reference
solutions (pass) and do-nothing runs (fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcycle.agent.events import parse_time_ms
from rlcycle.agent.runner import RunnerConfig, run_episodes
from rlcycle.agent.user import ANNOYED, SATISFIED
from rlcycle.harness import ChatRenderer, initial_messages
from rlcycle.policy.base import Generation
from rlcycle.policy.scripted import DoNothingPolicy, ReferencePolicy, ReplayPolicy, load_tokenizer
from rlcycle.prompts import DELTA_COLUMNS, events_with_full_prompts
from rlcycle.tasks import Task, load_suite, write_task

pytestmark = pytest.mark.docker
SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
PATCH = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"


def make_suite(root: Path) -> list[Task]:
    """Two tiny tasks: a one-line fix (clear) and a new function (ambiguous)."""
    write_task(
        Task(
            id="calc-add",
            instruction="Fix add() in calc.py: it subtracts instead of adding.",
            cluster="calc",
            difficulty=1,
            repo={"calc.py": CALC},
            hidden_tests={"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
            solution={"calc.py": CALC.replace("a - b", "a + b")},
        ),
        root,
    )
    write_task(
        Task(
            id="greet",
            instruction="Add a greet function to greet.py.",
            cluster="text",
            difficulty=1,
            ambiguous=True,
            clarification_question="What should greet return?",
            clarification_answer="greet(name) returns 'Hello, NAME!'",
            repo={"README.md": "demo\n"},
            hidden_tests={
                "test_greet.py": "from greet import greet\n\n\ndef test_greet():\n    assert greet('Bo') == 'Hello, Bo!'\n"
            },
            solution={"greet.py": "def greet(name):\n    return f'Hello, {name}!'\n"},
        ),
        root,
    )
    return load_suite(root)


def tool(name: str, note: str = "", **arguments) -> str:
    return f"{note}<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scrub(events: list[dict]) -> list[dict]:
    """Events without what is measured (latency, duration) or derived from it (ts, the time
    from an edit to its outcome)."""
    measured = ("ts", "latency_ms", "duration_ms", "observed_after_s")
    return [{k: v for k, v in e.items() if k not in measured} for e in events]


def without_delta(events: list[dict]) -> list[dict]:
    """Events without the delta layout's keys (once `prompt_ids` holds the whole prompt)."""
    return [{k: v for k, v in e.items() if k not in DELTA_COLUMNS} for e in events]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("suite"))


@pytest.fixture(scope="module")
def pool(docker_client):
    from rlcycle.sandbox import SandboxPool

    with SandboxPool(size=2) as p:
        yield p


# --- the replayed trajectory, event by event -------------------------------------------------

REPLAY = [
    tool("read_file", "Let me look.\n", path="calc.py"),
    tool("apply_patch", "Fixing.\n", path="calc.py"),  # invalid: no patch argument
    tool("apply_patch", path="calc.py", patch=PATCH),
    tool("run_shell", command="python3 -c 'from calc import add; print(add(2, 3))'"),
    tool("finish", "Done.\n", summary="add() adds now."),
]
# What the model sees after each call (the `tool` messages), exactly.
OUTPUTS = [
    CALC,
    "Error: invalid tool call (missing_argument): apply_patch: missing argument 'patch'",
    "Applied the patch to calc.py.",
    "5\n[exit code: 0]",
]


def expected_events(tok, task: Task, session: str, pair_key: str) -> list[dict]:
    """The events of REPLAY, built independently of the runner: each prompt is a *full*
    render of the conversation so far (the runner extends its prompts incrementally)."""
    renderer = ChatRenderer(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    messages = initial_messages(task.instruction)
    ep = f"{session}-e0"
    events = []
    for turn, text in enumerate(REPLAY):
        sample, call = f"{ep}-t{turn}", f"{ep}-t{turn}-c0"
        ids = tok(text, add_special_tokens=False)["input_ids"] + [im_end]
        body = json.loads(text[text.index("<tool_call>") + 11 : text.index("</tool_call>")])
        events.append(
            {
                "event_id": f"{sample}-completion",
                "type": "completion",
                "session_id": session,
                "episode_id": ep,
                "sample_id": sample,
                "turn": turn,
                "policy_version": "replay-1",
                "prompt_ids": renderer.render(messages, add_generation_prompt=True),
                "completion_ids": ids,
                "completion_logprobs": [0.0] * len(ids),
                "completion_text": text,
                "tool_calls": [
                    {
                        "call_id": call,
                        "name": body["name"],
                        "arguments": json.dumps(body["arguments"]) if turn != 1 else json.dumps(body),
                    }
                ],
                "temperature": 0.7,
                "max_new_tokens": RunnerConfig().max_new_tokens,
                "pair_key": pair_key,  # the same session across runs: s{seed}-{task}-a{attempt}
                "loss_mask": [1] * len(ids),
            }
        )
        status, error = (
            ("invalid", "invalid tool call (missing_argument): apply_patch: missing argument 'patch'")
            if turn == 1
            else ("ok", None)
        )
        events.append(
            {
                "event_id": f"{call}-result",
                "type": "tool_result",
                "session_id": session,
                "sample_id": sample,
                "call_id": call,
                "status": status,
                "error": error,
            }
        )
        messages = messages + [{"role": "assistant", "content": text}]
        if turn < len(OUTPUTS):
            messages.append({"role": "tool", "content": OUTPUTS[turn]})
    return events


def test_a_replayed_trajectory_gives_exactly_the_expected_events(tok, suite, pool):
    task = suite[0]
    policy = ReplayPolicy(tok, REPLAY, name="replay-1")
    config = RunnerConfig(temperature=0.7, run_id="t")
    [r] = run_episodes(policy, "replay-1", [task], pool, config, seed=0, simulate_user=True)
    assert (r.status, r.end_reason, r.turns, r.n_tool_calls, r.n_invalid_tool_calls) == ("pass", "finish", 5, 5, 1)
    assert (
        r.edited
        and not r.asked_clarification
        and r.tokens == sum(len(e["completion_ids"]) for e in r.events if e["type"] == "completion")
    )
    session = "t-calc-add-a0"
    ep = f"{session}-e0"
    # The simulated user's late signals, from the seeded user (golden values).
    late = [
        {
            "event_id": f"{ep}-user",
            "type": "user_message",
            "session_id": session,
            "episode_id": ep,
            "text": SATISFIED[1],
        },
        {
            "event_id": f"{ep}-t2-c0-outcome",
            "type": "edit_outcome",
            "session_id": session,
            "sample_id": f"{ep}-t2",
            "call_id": f"{ep}-t2-c0",
            "lines_proposed": 1,
            "lines_surviving": 1,
        },
    ]
    # Compared on whole prompts, rebuilt from the delta layout the runner logs (each completion
    # stored against the session's previous sample).
    comps = [e for e in r.events if e["type"] == "completion"]
    assert all("prompt_ids" not in e for e in comps)
    assert [e["prompt_parent"] for e in comps] == [None] + [e["sample_id"] for e in comps[:-1]]
    assert (
        without_delta(scrub(events_with_full_prompts(r.events)))
        == expected_events(tok, task, session, f"s0-{task.id}-a0") + late
    )
    delay = r.events[-1]["observed_after_s"]
    # Time: RFC 3339, never backwards within the session; the outcome comes hours later.
    ts = [parse_time_ms(e["ts"]) for e in r.events]
    assert ts[0] >= parse_time_ms(config.start) and ts[:-1] == sorted(ts[:-1])
    assert 3600 <= delay <= 5 * 3600 + 60
    assert abs((ts[-1] - ts[5]) / 1000 - delay) < 0.01  # edit at the apply_patch result
    assert all(e["latency_ms"] >= 0 for e in r.events if e["type"] == "completion")


def test_generation_is_batched_over_live_sessions_and_seeds_are_per_session(tok, suite, pool):
    calls = []

    class Recorder:
        name, tokenizer = "rec", tok

        def __init__(self):
            self.inner = DoNothingPolicy(tok)

        def generate(self, prompts, params):
            calls.append([p.seed for p in params])
            return self.inner.generate(prompts, params)

        def close(self):
            pass

    results = run_episodes(Recorder(), "rec", suite, pool, RunnerConfig(concurrency=2), attempts=2, seed=3)
    assert [r.status for r in results] == ["fail"] * 4
    assert [(r.task_id, r.attempt) for r in results] == [("calc-add", 0), ("greet", 0), ("calc-add", 1), ("greet", 1)]
    assert [len(c) for c in calls] == [2, 2]  # two sessions per generate call
    seeds = [s for c in calls for s in c]
    assert len(set(seeds)) == 4  # every session samples with its own seed


def test_clarifying_questions_are_answered_or_annoy_and_can_end_the_session(tok, suite, pool):
    ask = tool("ask_user", question="Which behaviour exactly?")
    policy = ReplayPolicy(tok, {t.instruction: [ask, tool("finish", summary="ok")] for t in suite})
    results = run_episodes(policy, "ask", suite, pool, RunnerConfig(run_id="q"), simulate_user=True)
    for r in results:
        assert r.asked_clarification and r.episodes == 2 and r.end_reason == "finish"
        answer = next(e for e in r.events if e["type"] == "user_message")
        assert answer["episode_id"].endswith("-e0")
        second = [e for e in r.events if e["type"] == "completion"][1]
        assert second["episode_id"].endswith("-e1") and second["turn"] == 0
    clear, ambiguous = results
    assert next(e["text"] for e in clear.events if e["type"] == "user_message") in ANNOYED
    assert next(e["text"] for e in ambiguous.events if e["type"] == "user_message") == suite[1].clarification_answer
    [r] = run_episodes(policy, "ask", suite[:1], pool, RunnerConfig(max_clarifications=0))
    assert (r.end_reason, r.turns, r.status, r.episodes) == ("ask_user", 1, "fail", 1)


def test_limits_end_the_session(tok, suite, pool):
    task = suite[:1]
    reader = ReplayPolicy(tok, [tool("read_file", path="calc.py")] * 10)
    [r] = run_episodes(reader, "loop", task, pool, RunnerConfig(max_turns=3))
    assert (r.end_reason, r.turns, r.status) == ("max_turns", 3, "fail")
    [r] = run_episodes(reader, "loop", task, pool, RunnerConfig(max_total_tokens=40))
    assert r.end_reason == "max_tokens" and r.tokens >= 40 and r.turns < 10
    chatty = ReplayPolicy(tok, ["I think the bug is in add()."])
    [r] = run_episodes(chatty, "chat", task, pool, RunnerConfig())
    assert (r.end_reason, r.turns, r.n_tool_calls) == ("no_tool_call", 1, 0)

    class Full:  # the prompt already fills the model's context
        name, tokenizer = "full", tok

        def generate(self, prompts, params):
            return [Generation([], [], "length", 0.0) for _ in prompts]

        def close(self):
            pass

    [r] = run_episodes(Full(), "full", task, pool, RunnerConfig())
    assert (r.end_reason, r.turns, r.status, r.events) == ("max_tokens", 0, "fail", [])
    # ... or the runner knows the limit first, and the model is never asked.
    # (the limit: the first prompt plus room for about one more turn, whatever the prompt's size)
    [r] = run_episodes(reader, "loop", task, pool, RunnerConfig(max_turns=1))
    limit = len(next(e for e in events_with_full_prompts(r.events) if e["type"] == "completion")["prompt_ids"]) + 150
    [r] = run_episodes(reader, "loop", task, pool, RunnerConfig(max_prompt_tokens=limit))
    assert (r.end_reason, r.status) == ("max_tokens", "fail") and 1 <= r.turns < 10
    assert len([e for e in events_with_full_prompts(r.events) if e["type"] == "completion"][-1]["prompt_ids"]) < limit


def test_calls_after_a_terminal_call_are_not_run(tok, suite, pool):
    text = tool("finish", summary="done") + tool("write_file", path="calc.py", content="x = 1\n")
    [r] = run_episodes(ReplayPolicy(tok, [text]), "p", suite[:1], pool, RunnerConfig())
    results = [(e["status"], e["error"]) for e in r.events if e["type"] == "tool_result"]
    assert results == [("ok", None), ("error", "not run: it came after finish, which ends your turn")]
    assert not r.edited and r.status == "fail"


class KillsExecutor:
    """Kills the sandbox's executor on its first `kills` sessions' first call, then replays
    the reference solution (an infrastructure failure the model did not cause, for the test)."""

    def __init__(self, tok, tasks, kills):
        self.name, self.tokenizer, self.kills = "killer", tok, kills
        self.ref = ReferencePolicy(tok, tasks)
        self.kill = ReplayPolicy(tok, [tool("run_shell", command="kill -9 $PPID; sleep 5")])

    def generate(self, prompts, params):
        if self.kills > 0:
            self.kills -= 1
            return self.kill.generate(prompts, params)
        return self.ref.generate(prompts, params)

    def close(self):
        pass


def test_a_broken_sandbox_is_retried_on_a_fresh_one_then_reported_as_error(tok, suite, pool):
    task = suite[:1]
    [r] = run_episodes(KillsExecutor(tok, task, 1), "k", task, pool, RunnerConfig(retries=1))
    assert (r.status, r.tries, r.error) == ("pass", 2, None)
    assert not any("kill -9" in e.get("completion_text", "") for e in r.events)  # broken try: gone
    assert [e["turn"] for e in r.events if e["type"] == "completion"] == [0, 1, 2, 3]
    [r] = run_episodes(KillsExecutor(tok, task, 5), "k", task, pool, RunnerConfig(retries=1))
    assert (r.status, r.end_reason, r.tries, r.events) == ("error", "error", 2, [])
    assert "infrastructure" in r.error and r.reward == 0.0
    [r] = run_episodes(DoNothingPolicy(tok), "n", task, pool, RunnerConfig())  # the pool healed
    assert r.status == "fail"


# --- the shipped suite ----------------------------------------------------------------------


@pytest.mark.slow
def test_reference_passes_every_shipped_task_and_doing_nothing_passes_none(tok, docker_client):
    from rlcycle.sandbox import SandboxPool

    tasks = load_suite(SAMPLE / "tasks")
    assert len(tasks) >= 5
    with SandboxPool(size=4) as big:
        config = RunnerConfig(concurrency=4)
        ref = run_episodes(ReferencePolicy(tok), "scripted:reference", tasks, big, config)
        nothing = run_episodes(DoNothingPolicy(tok), "scripted:nothing", tasks, big, config)
    assert [(r.task_id, r.status) for r in ref if r.status != "pass"] == []
    assert all(r.end_reason == "finish" and r.edited and r.n_invalid_tool_calls == 0 for r in ref)
    assert [r.asked_clarification for r in ref] == [t.ambiguous for t in tasks]
    assert [(r.task_id, r.status) for r in nothing if r.status != "fail"] == []
    assert all(r.turns == 1 and not r.edited for r in nothing)


def test_a_grader_that_cannot_judge_is_an_error_without_a_retry(tok, suite, pool):
    import dataclasses

    broken = dataclasses.replace(suite[0], test_command="no-such-test-runner")  # exit 127
    [r] = run_episodes(DoNothingPolicy(tok), "n", [broken], pool, RunnerConfig(), simulate_user=True)
    assert (r.status, r.end_reason, r.tries, r.events) == ("error", "error", 1, [])
    assert r.error.startswith("grading: the task's test command is broken")
