"""The simulated user who says what is wrong (rlcycle/agent/feedback.py, docs/hints.md): the
symptom read off real pytest output (never the expected value), the follow-up still scoring as
a complaint, the canned style unchanged, and underspecified first messages."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from rlcycle.agent import feedback
from rlcycle.agent.user import SessionOutcome, SimulatedUser, UserConfig
from rlcycle.distill import followup
from rlcycle.tasks import load_suite

TASKS = Path(__file__).resolve().parent.parent / "rlcycle" / "data" / "tasks"
CODE = """
def evaluate(s):
    return int(s.split()[0])


def add(a, b):
    return a - b
"""
TESTS = {
    "exc": 'from calc import evaluate\n\n\ndef test_dec():\n    assert evaluate("1.5 * 2") == 3\n',
    "where": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "local": "from calc import add\n\n\ndef test_kw():\n    x = add(1, 1)\n    assert x == 2\n",
    "pass": "from calc import add\n\n\ndef test_ok():\n    assert add(1, 0) == 1\n",
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Real pytest output (as the grader runs it) for each kind of failure."""
    root = tmp_path_factory.mktemp("pt")
    (root / "calc.py").write_text(CODE)
    out = {}
    for name, test in TESTS.items():
        d = root / name
        d.mkdir()
        (d / f"test_{name}.py").write_text(test)
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(d)],
            cwd=root,
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        out[name] = r.stdout + r.stderr
    return out


def test_the_symptom_is_read_off_the_failure_never_the_expected_value(outputs):
    assert feedback.failure_detail(outputs["exc"]) == (
        "evaluate(\"1.5 * 2\") raises ValueError: invalid literal for int() with base 10: '1.5'"
    )
    assert feedback.failure_detail(outputs["where"]) == "add(2, 3) returns -1"
    assert feedback.failure_detail(outputs["local"]) == "add(1, 1) returns 0"
    assert feedback.failure_detail(outputs["pass"]) is None
    assert feedback.failure_detail("") is None
    for name in ("where", "local"):  # the expected values (5, 2) are what the user does not say
        detail = feedback.failure_detail(outputs[name])
        assert " 5" not in detail and " 2" not in detail.split("returns")[1]


def _followup(style: str, output: str, seed: int = 0) -> str:
    user = SimulatedUser(UserConfig(followup_style=style))
    return user.react(SessionOutcome(False, True, "finish", output), random.Random(seed)).followup


def test_informative_follow_ups_are_complaints_and_canned_stays_canned(outputs):
    texts = [_followup("informative", outputs["where"], seed) for seed in range(8)]
    assert all("add(2, 3) returns -1" in t for t in texts)
    scores = followup.score_texts(pl.Series(texts), None).to_list()
    assert scores == [-1.0] * len(texts)
    # Same seed, canned style: the old line; the random stream is not shifted by the style.
    for seed in range(8):
        canned = _followup("canned", outputs["where"], seed)
        informative = _followup("informative", outputs["where"], seed)
        assert "returns" not in canned
        assert informative.endswith("add(2, 3) returns -1")
    # Nothing to tell (no failure block): the canned line, in either style.
    assert _followup("informative", "collection error", 3) == _followup("canned", "collection error", 3)


def test_underspecified_first_messages():
    tasks = {t.id: t for t in load_suite(TASKS)}
    t = tasks["calc-decimals"]
    assert feedback.brief_instruction(t) == "Decimal numbers don't work."
    user = SimulatedUser(UserConfig(underspecified_rate=1.0))
    assert user.first_message(t, random.Random(0)) == "Decimal numbers don't work."
    assert SimulatedUser().first_message(t, random.Random(0)) == t.instruction
    half = SimulatedUser(UserConfig(underspecified_rate=0.5))
    got = [half.first_message(t, random.Random(s)) for s in range(40)]
    assert 5 < sum(g != t.instruction for g in got) < 35
    for task in tasks.values():  # every brief is shorter than, and a prefix of, its instruction
        brief = feedback.brief_instruction(task)
        assert len(brief) <= len(task.instruction) and task.instruction.startswith(brief[:-1])
    assert UserConfig(followup_style="chatty").validate()


def test_a_task_brief_is_read_and_written(tmp_path):
    from rlcycle.tasks.suite import task_toml, write_task

    t = next(t for t in load_suite(TASKS) if t.id == "calc-decimals")
    t.brief = "1.5 * 2 breaks"
    assert 'brief = "1.5 * 2 breaks"' in task_toml(t)
    write_task(t, tmp_path)
    back = load_suite(tmp_path)[0]
    assert back.brief == "1.5 * 2 breaks" and feedback.brief_instruction(back) == "1.5 * 2 breaks"


# The grader's pytest in the sandbox image writes a failed list compare this way (a real tail).
SANDBOX_TAIL = """FF                                                                       [100%]
=================================== FAILURES ===================================
_____________________________ test_decimal_tokens ______________________________

    def test_decimal_tokens():
>       assert tokenize("1.5*2") == ["1.5", "*", "2"]
E       AssertionError: assert ['1', '.', '5', '*', '2'] == ['1.5', '*', '2']
E         At index 0 diff: '1' != '1.5'

hidden_tests/test_decimals.py:5: AssertionError
"""


def test_the_sandbox_form_of_a_failed_assert():
    assert feedback.failure_detail(SANDBOX_TAIL) == "tokenize(\"1.5*2\") returns ['1', '.', '5', '*', '2']"
