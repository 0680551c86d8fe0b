"""Executing the harness tools in a sandbox: one parsed tool call in, one `ToolOutcome` out.

What goes in: a `ToolCall` from `rlcycle.harness.parse_completion`, the `Sandbox` of the episode,
the `Task` (for `run_tests`) and a timeout. What comes out: a `ToolOutcome` with the production
`tool_result` status, the text the model sees next (its `tool` message), the error line that is
logged, the duration, and, for an edit that applied, how many lines it proposed.

    outcome = execute(call, sandbox, task, timeout_s=30)
    outcome.status, outcome.output, outcome.error, outcome.lines_proposed

Statuses (the `tool_result.status` of docs/design.md) say whether the *tool* did its job, not whether
the command it ran succeeded:

    status    when
    ok        the tool ran; a shell command or test run that exits non-zero is still ok (its
              exit code is in the output: a failing test run is information, not a tool error)
    error     the tool could not do it: missing file, patch does not apply, replace_in_file's
              old text missing or not unique (nothing changed then), bad regex, path
              outside the workspace, out of memory, a call after a terminal call (not run)
    invalid   the call did not parse (never executed; the parser's reason goes back to the model)
    timeout   the command was killed at its timeout

An infrastructure failure (the sandbox broke: executor dead or silent) is never a status: it
raises `SandboxBroken`, and the runner retries the whole episode on a fresh sandbox, so a broken
container is never blamed on the model.

`run_tests` runs the task's *visible* test command (`Task.run_tests_command`, by default pytest
over the workspace); the hidden tests are only copied in by the grader after the episode.
"""

from __future__ import annotations

import difflib
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rlcycle.errors import InputError
from rlcycle.harness.parse import ToolCall
from rlcycle.harness.tools import REPLACED
from rlcycle.sandbox.sandbox import ExecResult, Sandbox, SandboxError, Status, check_relpath
from rlcycle.tasks.suite import GRADER_DIR, Task

MAX_LISTED_FILES = 1000  # list_files output is cut after this many paths
MAX_SEARCH_MATCHES = 200  # search output is cut after this many lines
READ_MAX_BYTES = 1 << 20  # read_file refuses files larger than this
SKIPPED_DIRS = ("__pycache__", ".git", ".pytest_cache", GRADER_DIR)


class SandboxBroken(Exception):
    """The sandbox failed under a tool call (infrastructure): retry the episode elsewhere."""


@dataclass
class ToolOutcome:
    """What one tool call did.

    `output` is the content of the `tool` message the model sees next; `error` is the one-line
    reason logged in the `tool_result` event (None when ok); `lines_proposed` is set only for an
    edit that applied (added or changed lines), which later gets an `edit_outcome`.
    """

    status: str  # ok / error / invalid / timeout
    output: str
    error: str | None = None
    duration_ms: float = 0.0
    lines_proposed: int | None = None

    @property
    def edited(self) -> bool:
        return self.lines_proposed is not None


def invalid(call: ToolCall) -> ToolOutcome:
    """The outcome of a call that did not parse: not executed, the reason goes to the model."""
    reason = f"invalid tool call ({call.code}): {call.reason}"
    return ToolOutcome("invalid", f"Error: {reason}", reason)


def not_run(call: ToolCall, after: str) -> ToolOutcome:
    """A valid call that came after a terminal call (`finish`, `ask_user`) in one completion."""
    reason = f"not run: it came after {after}, which ends your turn"
    return ToolOutcome("error", f"Error: {reason}", reason)


def execute(call: ToolCall, sandbox: Sandbox, task: Task, timeout_s: float = 30.0) -> ToolOutcome:
    """Run one call in `sandbox`; raises SandboxBroken when the sandbox itself failed."""
    if not call.valid:
        return invalid(call)
    start = time.perf_counter()
    fn = _TOOLS.get(call.name or "")
    if fn is None:  # terminal tools (finish, ask_user) have nothing to run in the sandbox
        outcome = ToolOutcome("ok", "")
    else:
        try:
            outcome = fn(sandbox, call.arguments or {}, task, timeout_s)
        except InputError as e:  # a path that would leave the workspace
            outcome = _error(e.message)
        except SandboxError as e:
            if sandbox.broken:
                raise SandboxBroken(e.message) from None
            outcome = _error(e.message)  # refused by the executor: symlink escape, disk full
    outcome.duration_ms = (time.perf_counter() - start) * 1000.0
    return outcome


# --- the tools ----------------------------------------------------------------------------


def _read_file(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    path = check_relpath(args["path"])
    data = sb.read_files([path], max_bytes=READ_MAX_BYTES)[path]
    if data is None:
        return _error(f"{path}: no such file")
    return ToolOutcome("ok", data.decode("utf-8", errors="replace"))


def _write_file(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    path, content = check_relpath(args["path"]), args["content"]
    old = sb.read_files([path], max_bytes=READ_MAX_BYTES)[path]
    sb.write_files({path: content})
    lines = added_lines(old.decode("utf-8", errors="replace") if old is not None else "", content)
    verb = "Created" if old is None else "Wrote"
    n = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    return ToolOutcome("ok", f"{verb} {path} ({n} lines).", lines_proposed=lines)


def _apply_patch(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    """GNU patch on the named file: a dry run first, so a patch that fails changes nothing."""
    path, patch = check_relpath(args["path"]), args["patch"]
    diff = f"{GRADER_DIR}/patch-{uuid.uuid4().hex[:8]}.diff"  # removed in the same command
    sb.write_files({diff: patch if patch.endswith("\n") else patch + "\n"})
    flags = "--batch --forward --no-backup-if-mismatch --reject-file=-"
    # Naming the file makes patch ignore the ---/+++ names (with or without a/ b/ prefixes).
    # A creation diff (--- /dev/null) needs the file to exist first.
    create = 'grep -q "^--- /dev/null" "$D" && [ ! -e "$F" ] && touch "$F"; '
    cmd = (
        f'{create}patch --dry-run {flags} -i "$D" "$F" >/dev/null 2>&1 '
        f'&& patch {flags} -i "$D" "$F"; rc=$?; rm -f "$D"; exit $rc'
    )
    r = sb.exec(["sh", "-c", cmd], timeout=timeout_s, env={"D": diff, "F": "./" + path})
    _raise_if_broken(r)
    if r.status is Status.OK:
        return ToolOutcome("ok", f"Applied the patch to {path}.", lines_proposed=patch_added_lines(patch))
    # Rerun as a dry run to show the model why (the first run's output was silenced).
    sb.write_files({diff: patch if patch.endswith("\n") else patch + "\n"})
    why = sb.exec(
        ["sh", "-c", f'patch --dry-run {flags} -i "$D" "$F"; rm -f "$D"'],
        timeout=timeout_s,
        env={"D": diff, "F": "./" + path},
    )
    _raise_if_broken(why)
    detail = (why.stdout + why.stderr).strip()[-2000:]
    return _error(f"the patch does not apply to {path}", detail)


def _replace_in_file(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    """Replace the one occurrence of `old`; zero or several occurrences change nothing."""
    path, old, new = check_relpath(args["path"]), args["old"], args["new"]
    if not old:
        return _error("`old` is empty: give the exact text to replace")
    if old == new:
        return _error("`old` and `new` are the same: nothing would change")
    data = sb.read_files([path], max_bytes=READ_MAX_BYTES)[path]
    if data is None:
        return _error(f"{path}: no such file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _error(f"{path}: not UTF-8 text (use write_file or apply_patch)")
    n = text.count(old)
    if n == 0:
        return _error(f"the old text does not occur in {path}", _closest_line(text, old))
    if n > 1:
        return _error(
            f"the old text occurs {n} times in {path}; include neighbouring lines so that it occurs exactly once"
        )
    result = text.replace(old, new, 1)
    sb.write_files({path: result})
    return ToolOutcome("ok", REPLACED.format(path=path), lines_proposed=added_lines(text, result))


def _closest_line(text: str, old: str) -> str:
    """The file's line most like the first line of `old`, to show the model what is there."""
    first = old.strip("\n").split("\n", 1)[0]
    lines = [line for line in text.splitlines() if line.strip()]
    close = difflib.get_close_matches(first, lines, n=1, cutoff=0.5)
    return f"The closest line is:\n{close[0]}" if close else ""


def _list_files(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    path = check_relpath(args["path"])
    prune = " -o ".join(f"-name {d}" for d in SKIPPED_DIRS)
    cmd = f'find "./$P" \\( {prune} \\) -prune -o -type f -print | sed "s|^\\./||" | sort'
    r = sb.exec(
        ["sh", "-c", f'[ -d "./$P" ] || {{ echo "no such directory" >&2; exit 2; }}; {cmd}'],
        timeout=timeout_s,
        env={"P": path},
    )
    _raise_if_broken(r)
    if r.status is not Status.OK:
        return _exec_error(r, f"{path}: no such directory")
    files = [f.removeprefix("./") for f in r.stdout.splitlines() if f]
    out = "\n".join(files[:MAX_LISTED_FILES]) or "(no files)"
    if len(files) > MAX_LISTED_FILES:
        out += f"\n[... {len(files) - MAX_LISTED_FILES} more files ...]"
    return ToolOutcome("ok", out)


def _search(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    path = check_relpath(args["path"])
    argv = [
        "rg",
        "--line-number",
        "--no-heading",
        "--color",
        "never",
        "--max-columns",
        "300",
        "--glob",
        f"!{GRADER_DIR}",
        "-e",
        args["pattern"],
        "--",
        path,
    ]
    r = sb.exec(argv, timeout=timeout_s)
    _raise_if_broken(r)
    if r.exit_code == 1 and r.status is Status.NONZERO:
        return ToolOutcome("ok", "(no matches)")
    if r.status is not Status.OK:
        return _exec_error(r, f"search failed: {r.stderr.strip()[:300]}")
    lines = [line.removeprefix("./") for line in r.stdout.splitlines()]
    out = "\n".join(lines[:MAX_SEARCH_MATCHES])
    if len(lines) > MAX_SEARCH_MATCHES:
        out += f"\n[... {len(lines) - MAX_SEARCH_MATCHES} more matches ...]"
    return ToolOutcome("ok", out)


def _run_shell(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    return _command(sb.exec(args["command"], timeout=timeout_s), timeout_s)


def _run_tests(sb: Sandbox, args: dict, task: Task, timeout_s: float) -> ToolOutcome:
    limit = max(timeout_s, task.timeout_s)
    return _command(sb.exec(task.run_tests_command, timeout=limit), limit)


_TOOLS: dict[str, Callable[[Sandbox, dict, Task, float], ToolOutcome]] = {
    "read_file": _read_file,
    "write_file": _write_file,
    "apply_patch": _apply_patch,
    "replace_in_file": _replace_in_file,
    "list_files": _list_files,
    "search": _search,
    "run_shell": _run_shell,
    "run_tests": _run_tests,
}


# --- helpers ------------------------------------------------------------------------------


def _command(r: ExecResult, timeout_s: float) -> ToolOutcome:
    """A shell command's result as the model sees it: output, then the exit code."""
    _raise_if_broken(r)
    text = format_exec(r)
    if r.status is Status.TIMEOUT:
        return ToolOutcome(
            "timeout", f"{text}\n[killed: timed out after {timeout_s:g}s]", f"timed out after {timeout_s:g}s"
        )
    if r.status is Status.OOM:
        return ToolOutcome("error", f"{text}\n[killed: out of memory]", "out of memory")
    return ToolOutcome("ok", text)


def format_exec(r: ExecResult) -> str:
    """stdout, stderr (when any) and the exit code of a command, as one text."""
    parts = [r.stdout.rstrip("\n")] if r.stdout else []
    if r.stderr:
        parts.append(r.stderr.rstrip("\n"))
    if r.exit_code is not None:
        parts.append(f"[exit code: {r.exit_code}]")
    return "\n".join(parts)


def _exec_error(r: ExecResult, reason: str) -> ToolOutcome:
    if r.status is Status.TIMEOUT:
        return ToolOutcome("timeout", "Error: timed out", "timed out")
    return _error(reason)


def _error(reason: str, detail: str = "") -> ToolOutcome:
    return ToolOutcome("error", f"Error: {reason}" + (f"\n{detail}" if detail else ""), reason)


def _raise_if_broken(r: ExecResult) -> None:
    if r.status is Status.INFRA:
        raise SandboxBroken(r.error or "the sandbox stopped answering")


def added_lines(old: str, new: str) -> int:
    """Lines of `new` that are added or changed relative to `old` (what an edit proposes)."""
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))


def patch_added_lines(patch: str) -> int:
    """`+` lines inside the hunks of a unified diff. Hunk headers (`@@ -a,b +c,d @@`) say how
    many lines each hunk holds, so a removed line that reads like a file header is counted
    right; a hunk without counts runs until the next header."""
    n, old_left, new_left = 0, 0, 0
    for line in patch.splitlines():
        m = _HUNK.match(line)
        if m:
            old_left = int(m.group(1)) if m.group(1) is not None else 1
            new_left = int(m.group(2)) if m.group(2) is not None else 1
            continue
        if old_left <= 0 and new_left <= 0:
            continue  # between hunks: file headers, `diff` lines, "\ No newline" notes
        if line.startswith("+"):
            n, new_left = n + 1, new_left - 1
        elif line.startswith("-"):
            old_left -= 1
        elif line.startswith(" ") or line == "":
            old_left, new_left = old_left - 1, new_left - 1
    return n


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
