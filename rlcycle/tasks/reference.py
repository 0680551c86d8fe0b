"""A task's reference solution as the tool calls an agent would make, episode by episode.

What goes in: a `Task`. What comes out: the episodes a good agent goes through, each started by
a user message and ended by a terminal tool call (`ask_user` or `finish`):

    from rlcycle.tasks import load_suite, reference_script
    for ep in reference_script(task):
        ep.user_message            # the instruction, or the clarification answer
        [c.name for c in ep.calls] # e.g. ['read_file', 'ask_user'] then
                                   #      ['apply_patch', 'run_tests', 'finish']

The script, for every task:
1. `read_file` each file the solution changes that exists in repo/ (look before you edit);
2. an ambiguous task: `ask_user` with `clarification_question` — the episode ends; the next
   one starts with the user's `clarification_answer`;
3. one edit per solution file: `replace_in_file` (old -> new, the shortest unique text
   around the change) when the file changes in one place, else `apply_patch` with a unified diff when
   that is shorter than the file, else `write_file` with the whole content (always for new
   files);
4. `run_tests`, then `finish` with a one-line summary.

A scripted "reference policy" replays these calls (its tool results do not change the script),
and the warm-start turns them into demonstrations. Tool names and argument names are those of
`rlcycle.harness.tools` (tests/test_tasks.py checks every call of every shipped task against
them), and `rlcycle tasks check --grade` replays the edits of the script, diffs included.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from rlcycle.tasks.suite import Task

DEFAULT_QUESTION = (
    "This request can be read more than one way. Which exact behaviour do you want "
    "(format, names, and what happens at the edges)?"
)


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of the reference script: a harness tool name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON string production logs carry (`tool_calls[].arguments`)."""
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_dict(self) -> dict[str, Any]:
        """{"name": ..., "arguments": {...}}: the body of a `<tool_call>` in the harness format."""
        return {"name": self.name, "arguments": dict(self.arguments)}


@dataclass
class ReferenceEpisode:
    """One episode of the script: the user message that starts it and the calls, in order.

    The last call is terminal (`ask_user` or `finish`): it hands control back to the user."""

    user_message: str
    calls: list[ScriptedCall]


def reference_script(task: Task) -> list[ReferenceEpisode]:
    """The reference solution of `task` as episodes of tool calls (see the module docstring)."""
    changed = sorted(task.solution)
    reads = [ScriptedCall("read_file", {"path": p}) for p in changed if p in task.repo]
    edits = [edit_call(p, task.repo.get(p), task.solution[p]) for p in changed]
    work = edits + [
        ScriptedCall("run_tests"),
        ScriptedCall("finish", {"summary": _summary(task, changed)}),
    ]
    if task.ambiguous:
        question = task.clarification_question or DEFAULT_QUESTION
        return [
            ReferenceEpisode(task.instruction, reads + [ScriptedCall("ask_user", {"question": question})]),
            ReferenceEpisode(task.clarification_answer or "", work),
        ]
    return [ReferenceEpisode(task.instruction, reads + work)]


def reference_calls(task: Task) -> list[ScriptedCall]:
    """Every call of `reference_script(task)`, flattened, in order."""
    return [c for ep in reference_script(task) for c in ep.calls]


def edit_call(path: str, old: str | None, new: str) -> ScriptedCall:
    """The edit that turns `old` (None: the file does not exist) into `new`.

    `replace_in_file` for a change in one place (see `replacement`) when that is no longer
    than the diff, else `apply_patch` when the diff is shorter than the new content, else
    `write_file`."""
    if old is not None and old != new:
        pair = replacement(old, new)
        patch = unified_diff(path, old, new)
        if pair is not None and (patch is None or len(pair[0]) + len(pair[1]) <= len(patch)):
            return ScriptedCall("replace_in_file", {"path": path, "old": pair[0], "new": pair[1]})
        if patch is not None and len(patch) < len(new):
            return ScriptedCall("apply_patch", {"path": path, "patch": patch})
    return ScriptedCall("write_file", {"path": path, "content": new})


def replacement(old: str, new: str, max_chars: int = 400) -> tuple[str, str] | None:
    """(old text, new text) such that replacing the one occurrence of the first in `old` by the
    second gives `new`, as short as that can be; None when the changed stretch (everything
    between the first and the last difference) is over `max_chars`.

    The changed stretch is what lies between the longest common prefix and suffix of the two
    texts, widened to whole words (identifiers, numbers, runs of punctuation), then by one more
    word at a time (leftwards first, a word's leading spaces with it) until the old text occurs
    exactly once: `>` -> `>=`, `Helo` -> `Hello`, `port=8` -> `port=2`, `, n` -> `, n + 1`."""
    if old == new:
        return None
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    q = 0  # common suffix length, not overlapping the prefix in either text
    while q < min(len(old), len(new)) - p and old[-1 - q] == new[-1 - q]:
        q += 1
    a0, a1 = _word_start(old, p), _word_end(old, len(old) - q)
    while a1 - a0 <= max_chars:
        b0, b1 = a0, len(new) - (len(old) - a1)
        piece = old[a0:a1]
        if piece.strip() and old.count(piece) == 1:
            return piece, new[b0:b1]
        if a0 > 0:
            a0 = _word_start(old, _skip_spaces_left(old, a0) - 1)
        elif a1 < len(old):
            a1 = _word_end(old, _skip_spaces_right(old, a1) + 1)
        else:
            return None
    return None


def _kind(ch: str) -> int:
    return 0 if ch.isspace() else 1 if (ch.isalnum() or ch == "_") else 2


def _word_start(text: str, i: int) -> int:
    """`i` moved left to the start of the word it is inside (a word: same-kind characters)."""
    i = max(0, min(i, len(text)))
    if 0 < i < len(text) and _kind(text[i - 1]) == _kind(text[i]) != 0:
        k = _kind(text[i])
        while i > 0 and _kind(text[i - 1]) == k:
            i -= 1
    return i


def _word_end(text: str, i: int) -> int:
    """`i` moved right to the end of the word it is inside."""
    i = max(0, min(i, len(text)))
    if 0 < i < len(text) and _kind(text[i - 1]) == _kind(text[i]) != 0:
        k = _kind(text[i - 1])
        while i < len(text) and _kind(text[i]) == k:
            i += 1
    return i


def _skip_spaces_left(text: str, i: int) -> int:
    while i > 0 and text[i - 1] in " \t":
        i -= 1
    return i


def _skip_spaces_right(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def unified_diff(path: str, old: str, new: str) -> str | None:
    """A `git diff`-style unified diff of one file (`a/`/`b/` prefixes, 3 lines of context).

    None when either side lacks a final newline: difflib would write a hunk that `patch`
    misreads, and `write_file` is the honest edit then."""
    if (old and not old.endswith("\n")) or (new and not new.endswith("\n")):
        return None
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(lines)


def _summary(task: Task, changed: list[str]) -> str:
    files = ", ".join(changed)
    if task.ambiguous:
        return f"Changed {files} as you described; the tests pass."
    return f"Changed {files} to do what you asked; the tests pass."
