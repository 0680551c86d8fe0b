"""Prove a suite's tasks in sandboxes: the reference solution passes, doing nothing fails.

What goes in: loaded `Task`s and a `SandboxPool`. What comes out: one `TaskCheck` per task,
in the order given. For each task, in one sandbox:

1. reference run: repo/ in, the reference script's edits replayed (`write_file` as written,
   `replace_in_file` on the file's one occurrence, `apply_patch` through GNU patch, as the
   calls say), the visible tests run (a failure there is a warning: the agent's `run_tests`
   would report it), then `grade` -> must be `pass`;
2. reset, do-nothing run: repo/ in, `grade` -> must be `fail` (an `error` is reported too).

    from rlcycle.sandbox import SandboxPool
    with SandboxPool(size=2) as pool:
        checks = check_suite(load_suite("sample_data/tasks"), pool)
    [c.task_id for c in checks if not c.ok]

Replaying the script (not just copying solution/) proves the calls a reference policy and the
warm-start replay, diffs included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlcycle.errors import RlcycleError
from rlcycle.sandbox.sandbox import Sandbox, Status
from rlcycle.tasks.grade import GradeResult, GradeStatus, grade, prepare_workspace
from rlcycle.tasks.reference import reference_calls
from rlcycle.tasks.suite import GRADER_DIR, Task

PATCH_FILE = f"{GRADER_DIR}/reference.diff"


@dataclass
class TaskCheck:
    """The two runs of one task and what is wrong with it (empty `problems`: the task is sound)."""

    task_id: str
    reference: GradeResult
    noop: GradeResult
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        found = []
        if self.reference.status is not GradeStatus.PASS:
            found.append(f"reference solution: {self.reference.status.value}: {self.reference.reason}")
        if self.noop.status is not GradeStatus.FAIL:
            found.append(f"doing nothing: {self.noop.status.value} (must fail): {self.noop.reason}")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "ok": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 3),
            "reference": self.reference.to_dict(),
            "noop": self.noop.to_dict(),
        }


def check_suite(
    tasks: list[Task],
    pool: Any,
    workers: int | None = None,
    on_result: Callable[[TaskCheck], None] | None = None,
    visible: bool = True,
) -> list[TaskCheck]:
    """`check_task` for every task over `pool` (`workers` at once, default the pool's size).

    `on_result` is called with each TaskCheck as it finishes (progress lines); `visible=False`
    skips running the visible tests on the solution (a third of the time)."""

    def one(task: Task) -> TaskCheck:
        start = time.monotonic()
        try:
            with pool.acquire() as sb:
                check = check_task(task, sb, visible)
        except RlcycleError as e:  # no sandbox could be had: infrastructure, both runs
            err = GradeResult(task.id, GradeStatus.ERROR, reason=f"sandbox: {e.message}")
            check = TaskCheck(task.id, err, err)
        check.seconds = time.monotonic() - start
        if on_result is not None:
            on_result(check)
        return check

    with ThreadPoolExecutor(max_workers=workers or getattr(pool, "size", 2)) as ex:
        return list(ex.map(one, tasks))


def check_task(task: Task, sandbox: Sandbox, visible: bool = True) -> TaskCheck:
    """The reference run and the do-nothing run of `task` in `sandbox` (reset in between).

    `visible`: also run `task.run_tests_command` on the solution (a warning when it fails)."""
    warnings: list[str] = []
    prepare_workspace(task, sandbox)
    broken = replay_edits(task, sandbox)
    if broken:
        reference = GradeResult(task.id, GradeStatus.FAIL, reason=f"reference script: {broken}")
    else:
        if visible:
            r = sandbox.exec(task.run_tests_command, timeout=task.timeout_s)
            if r.status is not Status.OK:
                warnings.append(
                    f"run_tests_command does not pass on the solution ({r.status.value}, exit {r.exit_code})"
                )
        reference = grade(task, sandbox)
    sandbox.reset()
    prepare_workspace(task, sandbox)
    noop = grade(task, sandbox)
    return TaskCheck(task.id, reference, noop, warnings)


def replay_edits(task: Task, sandbox: Sandbox) -> str | None:
    """Apply the reference script's edit calls in the workspace; None, or what went wrong."""
    for call in reference_calls(task):
        args = call.arguments
        if call.name == "write_file":
            sandbox.write_files({args["path"]: args["content"]})
        elif call.name == "replace_in_file":
            current = sandbox.read_files([args["path"]])[args["path"]]
            before = current.decode() if current is not None else ""
            if before.count(args["old"]) != 1:
                return f"replace_in_file {args['path']}: the old text occurs {before.count(args['old'])} times"
            sandbox.write_files({args["path"]: before.replace(args["old"], args["new"], 1)})
        elif call.name == "apply_patch":
            sandbox.write_files({PATCH_FILE: args["patch"]})
            r = sandbox.exec(
                ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-i", PATCH_FILE], timeout=30
            )
            sandbox.exec(["rm", "-f", PATCH_FILE], timeout=30)
            if r.status is not Status.OK:
                return f"apply_patch {args['path']} did not apply: {(r.stdout + r.stderr).strip()[-300:]}"
    return None
