"""Runner pieces that need no Docker engine: scripted policies, the simulated user, event
building, edit line counts, config validation, seeds and ids."""

from __future__ import annotations

import json
import random

import pytest

from rlcycle.agent.events import SessionLog, SimClock, iso, parse_time_ms
from rlcycle.agent.runner import RunnerConfig, default_run_id, derive_seed, run_episodes, summarize
from rlcycle.agent.tools_exec import added_lines, patch_added_lines
from rlcycle.agent.user import (
    ANNOYED,
    DISSATISFIED_FAILED,
    DISSATISFIED_NOTHING,
    SATISFIED,
    Reaction,
    SessionOutcome,
    SimulatedUser,
    UserConfig,
)
from rlcycle.errors import InputError
from rlcycle.harness import ChatRenderer, initial_messages, parse_completion
from rlcycle.policy.scripted import (
    DoNothingPolicy,
    ReferencePolicy,
    ReplayPolicy,
    load_tokenizer,
    make,
)
from rlcycle.tasks import Task, reference_calls


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def task(**kw) -> Task:
    base = dict(
        id="t1",
        instruction="Fix add().",
        cluster="c",
        difficulty=1,
        repo={"calc.py": "def add(a, b):\n    return a - b\n"},
        hidden_tests={"test_x.py": "def test():\n    pass\n"},
        solution={"calc.py": "def add(a, b):\n    return a + b\n"},
    )
    return Task(**{**base, **kw})


# --- scripted policies ----------------------------------------------------------------------


def test_scripted_policies_read_the_step_and_task_off_the_prompt(tok):
    renderer = ChatRenderer(tok)
    t1, t2 = task(), task(id="t2", instruction="Add greet().", solution={"greet.py": "x = 1\n"})
    ref = ReferencePolicy(tok, [t1, t2])
    tr = renderer.new_transcript(initial_messages(t1.instruction))
    texts = []
    for _ in range(len(reference_calls(t1)) + 1):
        [gen] = ref.generate([tr.prompt_ids()], [])
        assert gen.logprobs == [0.0] * len(gen.token_ids) and gen.finish_reason == "stop"
        assert gen.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        turn = tr.add_completion(gen.token_ids, gen.logprobs)
        texts.append(turn.text)
        tr.add_tool_results(["ok"])
    names = [parse_completion(t).calls[0].name for t in texts]
    assert names == [c.name for c in reference_calls(t1)] + ["finish"]  # then finish for good
    # Another task's prompt gets its own script, whatever else is in the batch.
    other = renderer.new_transcript(initial_messages(t2.instruction)).prompt_ids()
    gens = ref.generate([other, tr.prompt_ids()], [])
    assert parse_completion(renderer.completion_text(gens[0].token_ids)).calls[0].name == "write_file"
    assert parse_completion(renderer.completion_text(gens[1].token_ids)).calls[0].name == "finish"


def test_replay_and_do_nothing_policies(tok):
    renderer = ChatRenderer(tok)
    prompt = renderer.new_transcript(initial_messages("Fix add().")).prompt_ids()
    [g] = ReplayPolicy(tok, ["hello"]).generate([prompt], [])
    assert renderer.completion_text(g.token_ids) == "hello"
    [g] = ReplayPolicy(tok, {"Fix add().": ["a"], "other": ["b"]}).generate([prompt], [])
    assert renderer.completion_text(g.token_ids) == "a"
    [g] = DoNothingPolicy(tok).generate([prompt], [])
    parsed = parse_completion(renderer.completion_text(g.token_ids))
    assert parsed.all_valid and parsed.calls[0].name == "finish"
    assert make("scripted:nothing", tok).name == "scripted:nothing"
    with pytest.raises(InputError):
        make("scripted:genius", tok)


# --- the simulated user ---------------------------------------------------------------------


def test_the_simulated_user_follows_the_rules_and_is_seeded():
    user = SimulatedUser(UserConfig(feedback_rate=1.0, feedback_noise=0.0))
    rng = random.Random(0)
    assert user.answer(task(ambiguous=True, clarification_answer="A"), rng) == ("A", True)
    text, warranted = user.answer(task(), rng)
    assert text in ANNOYED and not warranted
    ok = user.react(SessionOutcome(True, True, "finish"), rng)
    assert ok.followup in SATISFIED and ok.kind == "satisfied" and ok.feedback == 1.0
    bad = user.react(SessionOutcome(False, True, "finish"), rng)
    assert bad.followup in DISSATISFIED_FAILED and bad.feedback == -1.0
    idle = user.react(SessionOutcome(False, False, "max_turns"), rng)
    assert idle.followup in DISSATISFIED_NOTHING and idle.kind == "dissatisfied_nothing"
    assert user.surviving(7, True, rng) == 7
    assert all(0 <= user.surviving(7, False, rng) <= 3 for _ in range(50))
    a, b = random.Random(5), random.Random(5)
    assert [user.react(SessionOutcome(False, True, "finish"), a) for _ in range(5)] == [
        user.react(SessionOutcome(False, True, "finish"), b) for _ in range(5)
    ]
    silent = SimulatedUser(UserConfig(followup_rate=0.0, feedback_rate=0.0))
    assert silent.react(SessionOutcome(True, True, "finish"), rng) == Reaction(None, "none", None)
    assert UserConfig(feedback_rate=2.0, edit_delay_min_h=3, edit_delay_max_h=1).validate() == [
        "feedback_rate=2.0: must be in [0, 1]",
        "edit_delay_min_h..edit_delay_max_h: need 0 <= min <= max",
    ]


# --- events -------------------------------------------------------------------------------


def test_session_log_ids_time_and_episodes():
    log = SessionLog("s", "p1", SimClock(parse_time_ms("2026-12-01T00:00:00Z")), 1.0)
    sid, cids = log.completion(
        [1, 2], [3, 4], [-0.5, -0.25], "x", [("read_file", "{}"), (None, "{bad")], 1500.0, [1, 1]
    )
    assert (sid, cids) == ("s-e0-t0", ["s-e0-t0-c0", "s-e0-t0-c1"])
    log.tool_result(sid, cids[0], "ok", None, 250.0, edit_lines=3)
    log.user_message("answer", 60_000, next_episode=True)
    sid2, _ = log.completion([1], [5], [0.0], "y", [], 10.0, [1])
    assert sid2 == "s-e1-t0"
    e = log.events
    assert [x["ts"] for x in e] == [
        "2026-12-01T00:00:01.500Z",
        "2026-12-01T00:00:01.750Z",
        "2026-12-01T00:01:01.750Z",
        "2026-12-01T00:01:01.760Z",
    ]
    assert e[0]["tool_calls"][1] == {"call_id": "s-e0-t0-c1", "name": None, "arguments": "{bad"}
    assert e[2] == {
        "event_id": "s-e0-user",
        "type": "user_message",
        "ts": e[2]["ts"],
        "session_id": "s",
        "episode_id": "s-e0",
        "text": "answer",
    }
    assert log.edits == [("s-e0-t0", "s-e0-t0-c0", 3, parse_time_ms(e[1]["ts"]))]
    out = log.edit_outcome(
        "s-e0-t0", "s-e0-t0-c0", 3, 2, parse_time_ms(e[1]["ts"]) + 7_200_000, parse_time_ms(e[1]["ts"])
    )
    assert out["observed_after_s"] == 7200.0 and out["ts"] == "2026-12-01T02:00:01.750Z"
    assert iso(0) == "1970-01-01T00:00:00.000Z" and parse_time_ms("1970-01-01T00:00:01+00:00") == 1000
    json.dumps(log.events)  # JSON-ready


def test_edit_line_counts():
    assert added_lines("a\nb\n", "a\nB\nc\n") == 2
    assert added_lines("", "x\ny") == 2 and added_lines("same\n", "same\n") == 0
    patch = "--- a/x\n+++ b/x\n@@ -1,2 +1,3 @@\n a\n--- looks like a header\n+++ b\n+c\n"
    assert patch_added_lines(patch) == 2  # the removed "-- ..." line is not a header
    assert patch_added_lines("--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n") == 2
    assert patch_added_lines("not a diff") == 0


# --- config, seeds, ids, summaries ------------------------------------------------------------


def test_runner_config_validation_and_bad_calls():
    bad = RunnerConfig(max_turns=0, temperature=-1, top_p=0, start="yesterday", retries=-1)
    assert len(bad.validate()) == 5
    with pytest.raises(InputError, match="max_turns=0"):
        run_episodes(None, "p", [task()], None, bad)
    with pytest.raises(InputError, match="no tasks"):
        run_episodes(None, "p", [], None, RunnerConfig())

    class NoTokenizer:
        name = "remote"

    with pytest.raises(InputError, match="no tokenizer"):
        run_episodes(NoTokenizer(), "p", [task()], object(), RunnerConfig())


def test_seeds_and_run_ids_are_stable_and_distinct():
    assert derive_seed(0, "t1", 0, 0) == derive_seed(0, "t1", 0, 0) < 2**63
    assert len({derive_seed(0, "t1", a, k) for a in range(3) for k in range(3)}) == 9
    c = RunnerConfig()
    assert default_run_id("p", 0, c, [task()]) == default_run_id("p", 0, RunnerConfig(concurrency=9), [task()])
    others = {
        default_run_id("q", 0, c),
        default_run_id("p", 1, c),
        default_run_id("p", 0, RunnerConfig(temperature=0.5)),
        default_run_id("p", 0, c),
    }
    assert len(others) == 4


def test_summarize_leaves_errors_out_of_the_rates():
    from rlcycle.agent.runner import EpisodeResult

    def r(status, invalid=0, ask=False):
        return EpisodeResult(
            "t", "c", "p", 0, status, 1.0 if status == "pass" else 0.0, 2, 4, invalid, True, ask, 10, 5.0, "finish", []
        )

    s = summarize([r("pass", 1), r("fail", 0, True), r("error", 4)])
    assert (s["episodes"], s["passed"], s["errors"], s["pass_rate"]) == (3, 1, 1, 0.5)
    assert (s["invalid_call_rate"], s["clarification_rate"], s["mean_latency_ms"]) == (1 / 8, 0.5, 2.5)
