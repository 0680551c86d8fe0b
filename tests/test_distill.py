"""distill through the real CLI on tiny hand-made trajectories: every signal, credit, caps.

Golden numbers are worked out by hand in the comments. Advantages, monitors, determinism,
bad input and pipes are in test_distill_cli.py; the classifier and helpers in
test_distill_units.py.
"""

# ruff: noqa: F811  (dcli is a pytest fixture imported from distill_data)
from __future__ import annotations

import pyarrow as pa
import pytest
from distill_data import T0, by_sample, call, dcli, distill, episode  # noqa: F401


def test_edit_persistence(dcli, tmp_path):
    rows = episode("e1", [{"edit_lines_proposed": 4, "edit_lines_surviving": 3}, {}]) + episode(
        "e2", [{"edit_lines_proposed": 0, "edit_lines_surviving": 0}], start=T0 + 10_000
    )
    df, rep = distill(dcli, tmp_path, rows, "[signals.edit_persistence]\nweight = 2.0\ncenter = 0.5\n")
    # e1-t0: 2 * (3/4 - 0.5) = 0.5; e1-t1 made no edit, e2-t0 proposed 0 lines: no value -> 0.
    assert by_sample(df, "part_edit_persistence") == {"e1-t0": 0.5, "e1-t1": 0.0, "e2-t0": 0.0}
    assert by_sample(df, "reward") == by_sample(df, "part_edit_persistence")
    assert rep["signals"]["edit_persistence"]["coverage"] == 1


@pytest.mark.parametrize("credit", ["all", "final"])
def test_dissatisfied_followup_and_credit(dcli, tmp_path, credit):
    rows = (
        episode("A", 2, followup="no, revert that")
        + episode("B", 1, followup="thanks, works", start=T0 + 10_000)
        # after a clarifying question the follow-up is an answer, not a complaint: skipped
        + episode("C", [{"tool_calls": [call("ask_user")]}], followup="no, 0 is fine", start=T0 + 20_000)
    )
    df, rep = distill(dcli, tmp_path, rows, "[signals.dissatisfied_followup]\nweight = -1.0\n", "--credit", credit)
    parts = by_sample(df, "part_dissatisfied_followup")
    # all: every turn of A carries the complaint (-1); final: only A's last turn does.
    assert parts == {"A-t0": -1.0 if credit == "all" else 0.0, "A-t1": -1.0, "B-t0": 0.0, "C-t0": 0.0}
    # coverage: samples with a value after credit (A's two turns or one, B; never C).
    assert rep["signals"]["dissatisfied_followup"]["coverage"] == (3 if credit == "all" else 2)
    assert rep["signals"]["dissatisfied_followup"]["credit"] == credit


def test_feedback_sample_scope_stays_on_its_sample(dcli, tmp_path):
    rows = episode("E", 2, feedback=-1.0) + episode(
        "S", [{"feedback": 1.0, "feedback_scope": "sample", "feedback_kind": "accept"}, {}], start=T0 + 10_000
    )
    spec = '[signals.explicit_feedback]\nweight = 0.5\ncap = 1.0\ncredit = "final"\n'
    df, _ = distill(dcli, tmp_path, rows, spec)
    # E: episode thumbs-down on the final turn only (0.5 * -1); S: the accept stays on S-t0.
    assert by_sample(df, "part_explicit_feedback") == {"E-t0": 0.0, "E-t1": -0.5, "S-t0": 0.5, "S-t1": 0.0}


def test_sample_penalties(dcli, tmp_path):
    rows = (
        episode("L", [{"latency_ms": 6500.0}, {"latency_ms": 100_000.0}])
        + episode("T", [{"completion_ids": [7, 8, 9, 10, 11], "behavior_logprobs": [-0.1] * 5}], start=T0 + 10_000)
        + episode("I", [{"tool_calls": [call("run_shell", "invalid"), call("x", "invalid")]}, {}], start=T0 + 20_000)
        + episode(
            "R",
            [{"tool_calls": [call("run_tests", "timeout"), call("read_file", "error")], "n_tool_errors": 2}],
            start=T0 + 30_000,
        )
    )
    spec = """
[signals.latency]
weight = -0.05
budget_ms = 4000
clip = [0.0, 30.0]
[signals.tokens]
weight = -0.5
budget = 2
per = 1
[signals.invalid_tool_call]
weight = -1.0
[signals.tool_errors]
weight = -0.2
"""
    df, _ = distill(dcli, tmp_path, rows, spec)
    # latency: (6500 - 4000) / 1000 = 2.5 s * -0.05 = -0.125; 96 s clipped to 30 s -> -1.5.
    assert by_sample(df, "part_latency") == pytest.approx(
        {"L-t0": -0.125, "L-t1": -1.5, "T-t0": 0, "I-t0": 0, "I-t1": 0, "R-t0": 0}
    )
    # tokens: (5 - 2) / 1 = 3 * -0.5 = -1.5; two-token completions are within budget.
    assert by_sample(df, "part_tokens")["T-t0"] == -1.5 and by_sample(df, "part_tokens")["L-t0"] == 0
    # invalid calls: -1 each on the sample that emitted them; never spread to I-t1 (credit all).
    assert (by_sample(df, "part_invalid_tool_call")["I-t0"], by_sample(df, "part_invalid_tool_call")["I-t1"]) == (
        -2.0,
        0.0,
    )
    # a timeout and an error: 2 * -0.2.
    assert by_sample(df, "part_tool_errors")["R-t0"] == pytest.approx(-0.4)
    assert df.filter(df["sample_id"] == "I-t0")["excluded"].to_list() == [None]


CLARIFY = """
[signals.clarification]
weight = 1.0
target_rate = {target}
"""


def test_clarification_shaping(dcli, tmp_path):
    ask = {"tool_calls": [call("ask_user")]}
    rows = (
        # s1: asked, answered, and the episode the answer started succeeded (edit kept, thanks)
        episode("Q", [{}, ask], followup="yes, inclusive", session_id="s1", prompt=[11])
        + episode(
            "N",
            [{"edit_lines_proposed": 4, "edit_lines_surviving": 4}],
            followup="thanks, works",
            session_id="s1",
            start=T0 + 60_000,
            prompt=[12],
        )
        # s2: the answer says the task was clear; the next episode then failed
        + episode("C", [ask], followup="as I said, just do it", session_id="s2", start=T0 + 1000, prompt=[13])
        + episode("D", 1, followup="that's wrong, it still fails", session_id="s2", start=T0 + 70_000, prompt=[14])
        # s3: asked, never answered
        + episode("U", [ask], session_id="s3", start=T0 + 2000, prompt=[15])
        # s4/s5: the same prompt was solved elsewhere without asking: the task was clear
        + episode("P1", [ask], followup="ok", prompt=[9, 9], session_id="s4", start=T0 + 3000)
        + episode("P2", 1, feedback=1.0, prompt=[9, 9], session_id="s5", start=T0 + 4000)
    )
    df, rep = distill(dcli, tmp_path, rows, CLARIFY.format(target=1.0))
    parts = by_sample(df, "part_clarification")
    # Q: +0.5 (answered_success) on the asking turn only (credit final); C: clear -1;
    # U: nothing (0); P1: clear (peers) -1; episodes that did not ask have no value.
    assert parts == {
        "Q-t0": 0.0,
        "Q-t1": 0.5,
        "N-t0": 0.0,
        "C-t0": -1.0,
        "D-t0": 0.0,
        "U-t0": 0.0,
        "P1-t0": -1.0,
        "P2-t0": 0.0,
    }
    assert rep["signals"]["clarification"]["coverage"] == 4  # Q-t1, C, U, P1


def test_clarification_over_target_rate(dcli, tmp_path):
    ask = {"tool_calls": [call("ask_user")]}
    rows = []
    for i in range(4):  # 2 of 4 episodes ask: rate 0.5, target 0.25
        rows += episode(f"E{i}", [ask] if i < 2 else 1, session_id=f"s{i}", start=T0 + i * 1000)
    df, rep = distill(dcli, tmp_path, rows, CLARIFY.format(target=0.25))
    # excess = (0.5 - 0.25) / 0.5 = 0.5 of the questions are above target: -1 * 0.5 each.
    assert by_sample(df, "part_clarification") == {"E0-t0": -0.5, "E1-t0": -0.5, "E2-t0": 0.0, "E3-t0": 0.0}
    assert rep["per_policy_version"]["pa"]["clarification_rate"] == 0.5


def test_correctness_where_the_column_exists(dcli, tmp_path):
    rows = (
        episode("OK", [{}, {"tests_passed": True}])
        + episode("NO", [{"tests_passed": False}], start=T0 + 10_000)
        + episode("NA", 1, start=T0 + 20_000)
    )
    spec = "[signals.correctness]\nweight = 1.0\n"
    df, rep = distill(dcli, tmp_path, rows, spec, extra={"tests_passed": pa.bool_()})
    # the episode's last non-null tests_passed, on every turn (credit all): +1 / -1 / none.
    assert by_sample(df, "part_correctness") == {"OK-t0": 1.0, "OK-t1": 1.0, "NO-t0": -1.0, "NA-t0": 0.0}
    assert "tests_passed" in df.columns  # extra input columns are kept
    # without the column: nothing fails, the report says why the signal is empty
    df2, rep2 = distill(dcli, tmp_path, rows, spec)
    assert df2["part_correctness"].to_list() == [0.0] * 4
    assert any("tests_passed" in n for n in rep2["notes"])


def test_custom_signal_by_dotted_path(dcli, tmp_path):
    rows = episode("E", 3)
    spec = """
[signals.turn_bonus]
fn = "distill_data:turn_bonus"
weight = 2.0
columns = ["turn"]
params = { scale = 0.5 }
"""
    df, rep = distill(dcli, tmp_path, rows, spec)
    # 2.0 * 0.5 * turn
    assert by_sample(df, "part_turn_bonus") == {"E-t0": 0.0, "E-t1": 1.0, "E-t2": 2.0}
    assert rep["signals"]["turn_bonus"]["scope"] == "sample"


def test_share_cap(dcli, tmp_path):
    rows = []
    for i in range(3):
        rows += episode(f"F{i}", [{"feedback": 1.0, "feedback_scope": "sample"}], start=T0 + i * 1000, prompt=[i])
    rows += episode("I", [{"tool_calls": [call("x", "invalid")]}], start=T0 + 9000, prompt=[9])
    spec = """
[signals.explicit_feedback]
weight = 1.0
cap = 0.5
[signals.invalid_tool_call]
weight = -1.0
"""
    df, rep = distill(dcli, tmp_path, rows, spec)
    # |mass| feedback 3, invalid 1: feedback's share 0.75 > 0.5. With feedback capped, the new
    # total is 1 / (1 - 0.5) = 2, so feedback is scaled by 0.5 * 2 / 3 = 1/3: 1/3 per sample.
    fb = rep["signals"]["explicit_feedback"]
    assert fb["cap_scale"] == pytest.approx(1 / 3, abs=1e-6) and fb["share"] == pytest.approx(0.5)
    assert fb["share_before_cap"] == pytest.approx(0.75)
    assert by_sample(df, "reward") == pytest.approx({"F0-t0": 1 / 3, "F1-t0": 1 / 3, "F2-t0": 1 / 3, "I-t0": -1.0})
