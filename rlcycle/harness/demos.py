"""Demonstrations: a task's reference solution rendered as a Transcript, for warm-starting.

What goes in: a task (`rlcycle.tasks.Task`) and a `ChatRenderer`. What comes out: a
`Transcript` whose assistant turns are the reference tool calls, one call per turn, exactly as
the policy would have to sample them (`<tool_call>{json}</tool_call><|im_end|>`, tokenised
canonically), with `mask` = 1 on those tokens only.

Tool outputs are synthesised from the task files instead of running a sandbox (they are masked
out of the loss and only give the next turn its context): `read_file` returns the file,
`replace_in_file` what the executor answers, `apply_patch`/`write_file` a one-line confirmation,
`run_tests` a pass line and exit code 0 (`RUN_TESTS_OK`). An ambiguous task's `ask_user` ends
the first episode; the clarification answer starts the next, in the same
transcript, as production continues a session.
"""

from __future__ import annotations

import json
from typing import Any

from rlcycle.harness.prompt import initial_messages
from rlcycle.harness.render import ChatRenderer, Transcript
from rlcycle.harness.tools import REPLACED, TERMINAL_TOOLS

# What a passing `run_tests` shows in a demo: a line, then the exit code, as the executor
# formats every command. A suite whose run_tests_command prints "ok: all tests passed" (the
# edit suite's does) gives the policy exactly this text in production too.
RUN_TESTS_OK = "ok: all tests passed\n[exit code: 0]"


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one tool call, as the system prompt asks for it."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def synthetic_output(task: Any, name: str, arguments: dict[str, Any]) -> str:
    """A plausible tool result without a sandbox (see the module docstring)."""
    path = arguments.get("path", "")
    if name == "read_file":
        return task.repo.get(path, f"error: {path}: no such file")
    if name == "replace_in_file":
        return REPLACED.format(path=path)
    if name in ("apply_patch", "write_file"):
        return f"ok: {path} updated"
    if name == "run_tests":
        return RUN_TESTS_OK
    if name == "list_files":
        return "\n".join(sorted(task.repo))
    return "ok"


def reference_transcript(task: Any, renderer: ChatRenderer) -> Transcript:
    """The reference episodes of `task` as one transcript (see the module docstring)."""
    from rlcycle.tasks import reference_script

    stop = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    episodes = reference_script(task)
    tr: Transcript | None = None
    for ep in episodes:
        if tr is None:
            tr = renderer.new_transcript(initial_messages(ep.user_message))
        else:
            tr.add_user(ep.user_message)
        for call in ep.calls:
            ids = renderer.encode(call_text(call.name, call.arguments)) + [stop]
            tr.add_completion(ids)
            if call.name in TERMINAL_TOOLS:
                break
            tr.add_tool_results([synthetic_output(task, call.name, call.arguments)])
    assert tr is not None, f"task {task.id} has no reference episodes"
    return tr
