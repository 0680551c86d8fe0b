"""What a user would say is wrong: a follow-up from the hidden tests' failure, and short first messages.

What goes in: the grader's output tail (pytest's, `GradeResult.output`) and a task. What comes
out: text the simulated user (`rlcycle.agent.user`, `followup_style = "informative"`) writes.

A real user who tries the change sees the call that misbehaves and what it did: "evaluate('1.5 * 2')
raises ValueError: invalid literal for int() with base 10: '1.5'", "add(2, 3) returns -1". That
is what `failure_detail` reads off pytest's first failure:

    an exception   the test line's call (the left side of its assert, or the statement) and the
                   exception's last `E` line: "<call> raises <Error>: <message>"
    an assert      pytest's "+ where <value> = <call>" line, or the test line's left side (a
                   name assigned in the test is replaced by the call it was assigned from):
                   "<call> returns <value>"

It never says the fix, nor the expected value (the right side of the assert): a user knows what
they got, and the hint must carry what the instruction lacked, not the answer. Values are cut
to `MAX_VALUE` characters. Output that shows no failure (a collection error, a timeout) gives
None, and the user falls back to a canned complaint.

`brief_instruction(task)`: the first message as users often write it, the task's `brief` when it
has one, else its instruction up to the first ':' or sentence end ("Decimal numbers don't work.")
— so a follow-up then tells the model what the first message left out.
"""

from __future__ import annotations

import re

MAX_VALUE = 120
# Each keeps a complaint phrase of the follow-up classifier (rlcycle.distill.followup), so an
# informative follow-up scores as dissatisfied exactly as a canned one does.
TEMPLATES = (
    "that's wrong, it still fails: {detail}",
    "still broken: {detail}",
    "doesn't work: {detail}",
    "it still fails. {detail}",
)
_BLOCK = re.compile(r"^_{3,} (\S+) _{3,}$", re.M)
_EXC = re.compile(r"^E\s+((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b.*)$")
_WHERE = re.compile(r"^E\s+\+\s+where (.+?) = (.+)$")
_ASSERT = re.compile(
    r"^E\s+(?:AssertionError: )?assert (.+?)\s*(?:==|!=|<=|>=|<|>| is not | is | not in | in )\s*(.+)$"
)


def failure_detail(output: str) -> str | None:
    """What the user saw go wrong, from pytest's output (module docstring), or None."""
    if not output:
        return None
    blocks = _BLOCK.split(output)
    if len(blocks) < 3:
        return None
    body = blocks[2].split("short test summary info")[0]  # the first failure's block
    lines = body.splitlines()
    test_line = next((ln[1:].strip() for ln in lines if ln.startswith(">")), "")
    e_lines = [ln for ln in lines if ln.startswith("E ")]
    exc = next((m.group(1) for ln in reversed(e_lines) if (m := _EXC.match(ln))), None)
    if exc is not None and not exc.startswith("AssertionError"):
        call = _call_of(test_line, lines)
        return _cut(f"{call} raises {exc}" if call else f"it raises {exc}")
    where = next((m for ln in e_lines if (m := _WHERE.match(ln))), None)
    if where is not None:
        return _cut(f"{where.group(2).strip()} returns {_value(where.group(1))}")
    got = next((m for ln in e_lines if (m := _ASSERT.match(ln))), None)
    call = _call_of(test_line, lines)
    if got is not None and call:
        return _cut(f"{call} returns {_value(got.group(1))}")
    return None


def _call_of(test_line: str, lines: list[str]) -> str:
    """The expression the test line checks: the left side of its assert (a local name replaced
    by the call assigned to it in the test), or the statement itself."""
    text = test_line.removeprefix("assert ").strip()
    text = re.split(r"\s(?:==|!=|<=|>=|<|>|is not|is|not in|in)\s", text, maxsplit=1)[0].strip()
    if re.fullmatch(r"[A-Za-z_]\w*", text):  # `x = add(1, 1)` earlier in the test
        assigned = [m.group(1) for ln in lines if (m := re.match(rf"^\s+{text}\s*=\s*(.+)$", ln))]
        text = assigned[-1].strip() if assigned else ""
    return text if "(" in text else ""


def _value(v: str) -> str:
    return v.strip()[:MAX_VALUE]


def _cut(s: str) -> str:
    return s if len(s) <= 2 * MAX_VALUE else s[: 2 * MAX_VALUE].rsplit(" ", 1)[0] + " ..."


def informative_followup(detail: str, k: int) -> str:
    """A complaint that says what the user saw (template `k`, modulo their count)."""
    return TEMPLATES[k % len(TEMPLATES)].format(detail=detail)


def brief_instruction(task) -> str:
    """The task's first message as an underspecified user writes it (module docstring)."""
    brief = getattr(task, "brief", None)
    if brief:
        return brief
    text = task.instruction.strip()
    cut = re.search(r"[:.!?](?:\s|$)", text)
    if cut is None or cut.end() >= len(text):
        return text
    head = text[: cut.start()].rstrip()
    return head + ("." if text[cut.start()] == ":" else text[cut.start()])
