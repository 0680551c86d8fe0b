"""experiments/hints/precondition.py's bookkeeping (issue 37 item 4; docs/hints.md): which first
attempts give a pair, what a run records about the rest, and the paired summary. No sandbox, no
model: the sessions are EpisodeResults made here (the SmolLM2 run is documented, not in CI)."""

from __future__ import annotations

from conftest import SAMPLE

from experiments.hints import precondition as pre
from rlcycle.agent.feedback import brief_instruction
from rlcycle.agent.runner import EpisodeResult
from rlcycle.tasks import load_suite


def _result(task_id: str, status: str, edited: bool, followup: str | None, attempt: int = 0) -> EpisodeResult:
    events = [{"type": "completion"}]
    if followup is not None:
        events.append({"type": "user_message", "text": followup})
    return EpisodeResult(
        task_id=task_id, cluster="c", policy="p", attempt=attempt, status=status, reward=float(status == "pass"),
        turns=3, n_tool_calls=3, n_invalid_tool_calls=0, edited=edited, asked_clarification=False, tokens=10,
        latency_ms=1.0, end_reason="max_turns", events=events,
    )  # fmt: skip


def _results() -> list[EpisodeResult]:
    return [
        _result("calc-decimals", "pass", True, "thanks"),
        _result("calc-decimals", "fail", False, "you didn't change anything?", attempt=1),
        _result("calc-power", "fail", True, "still broken: evaluate('2 ^ 3') raises ValueError: bad token '^'"),
        _result("calc-power", "fail", True, "still broken, the tests fail", attempt=1),
        _result("calc-parentheses", "error", False, None),
    ]


def test_only_failures_whose_followup_says_something_give_pairs():
    tasks = {t.id: t for t in load_suite(SAMPLE / "tasks")}
    config = pre.simulate_config(None, 0.5)
    pairs = pre.hint_pairs(_results(), tasks, config, seed=0, min_words=3, symptoms={})
    assert [(p["task_id"], p["attempt"]) for p in pairs] == [("calc-power", 0)]
    assert pairs[0]["hint"].startswith("still broken: evaluate('2 ^ 3')")
    assert pairs[0]["first"] in (tasks["calc-power"].instruction, brief_instruction(tasks["calc-power"]))


def test_first_attempt_rows_say_why_there_are_few_pairs():
    rows = pre.first_attempts(_results(), min_words=3, symptoms={})
    assert [r["informative"] for r in rows] == [False, False, True, False, False]
    assert pre.first_counts(rows) == {
        "pass": 1,
        "fail": 3,
        "error": 1,
        "fail_with_followup": 3,
        "fail_informative": 1,
    }


def test_a_symptom_replaces_the_complaint_only_when_nothing_changed():
    symptoms = {"calc-decimals": "tokenize(\"1.5*2\") returns ['1', '.', '5']", "calc-power": "evaluate('2 ^ 3') fails"}
    rows = pre.first_attempts(_results(), min_words=3, symptoms=symptoms)
    unchanged = rows[1]
    assert 'tokenize("1.5*2") returns' in unchanged["followup"] and unchanged["informative"]
    assert rows[0]["followup"] == "thanks"  # a pass keeps its own
    assert rows[3]["followup"] == "still broken, the tests fail"  # it edited: the user's words stand
    assert pre.first_counts(rows)["fail_informative"] == 2


def test_the_summary_pairs_by_session_and_needs_the_interval_above_zero():
    pairs = [{"id": f"t.p{i}", "without": [False], "with": [i < 6]} for i in range(10)]
    r = pre.summarize(pairs, first_attempts=20)
    assert (r["usable_pairs"], r["pass_without"], r["pass_with"]) == (10, 0.0, 0.6)
    assert r["mcnemar"]["with_only"] == 6 and r["mcnemar"]["without_only"] == 0
    assert r["ci95"][0] > 0 and r["verdict"] == "hinted better"
    flat = pre.summarize(
        [{"id": "t.p0", "without": [True], "with": [True]}, {"id": "t.p1", "without": [None], "with": [True]}], 2
    )
    assert flat["usable_pairs"] == 1 and flat["verdict"].startswith("not shown")
