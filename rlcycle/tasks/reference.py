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
3. one edit per solution file: `apply_patch` with a unified diff when that is shorter than the
   file, else `write_file` with the whole content (always for new files);
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

    `apply_patch` when the diff is shorter than the new content, else `write_file`."""
    if old is not None and old != new:
        patch = unified_diff(path, old, new)
        if patch is not None and len(patch) < len(new):
            return ScriptedCall("apply_patch", {"path": path, "patch": patch})
    return ScriptedCall("write_file", {"path": path, "content": new})


def unified_diff(path: str, old: str, new: str) -> str | None:
    """A `git diff`-style unified diff of one file (`a/`/`b/` prefixes, 3 lines of context).

    None when either side lacks a final newline: difflib would write a hunk that `patch`
    misreads, and `write_file` is the honest edit then."""
    if (old and not old.endswith("\n")) or (new and not new.endswith("\n")):
        return None
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}",
    )  # fmt: skip
    return "".join(lines)


def _summary(task: Task, changed: list[str]) -> str:
    files = ", ".join(changed)
    if task.ambiguous:
        return f"Changed {files} as you described; the tests pass."
    return f"Changed {files} to do what you asked; the tests pass."
