"""Grade a task in a sandbox after the agent finished: copy the hidden tests in, run them, judge.

What goes in: a `Task`, a `Sandbox` whose /workspace holds what the agent left (start it with
`prepare_workspace(task, sb)`), and optionally a timeout. What comes out: a `GradeResult` with
status `pass`, `fail` or `error`, the passed/failed/error test counts and why.

    from rlcycle.sandbox import SandboxPool
    from rlcycle.tasks import apply_solution, grade, load_suite, prepare_workspace

    task = load_suite("sample_data/tasks")[0]
    with SandboxPool(size=1) as pool, pool.acquire() as sb:
        prepare_workspace(task, sb)       # repo/ -> /workspace
        ...                               # the agent works (or apply_solution(task, sb))
        result = grade(task, sb)          # hidden_tests/ copied in only now
        result.status, result.passed, result.failed, result.reason

`error` is an infrastructure failure, never the model's fault, so eval can leave it out of the
score instead of counting it as a failure (docs/design.md, eval "must never"):

    what happened                                        status  reason
    sandbox broke (executor dead, write refused)         error   sandbox: ...
    test command outlived timeout_s + grace (killed)     error   harness timeout
    pytest internal/usage error, exit 126/127            error   the task's test command is broken
    every test passed (at least one ran)                 pass
    a test failed, or did not collect (SyntaxError...)   fail    tests failed / collection error
    the code under test hung past timeout_s              fail    deadline (timed_out=True)
    the code under test ran out of memory                fail    out of memory

Why a hang in the code under test is `fail`: a policy that writes an endless loop on tasks it
expects to fail would otherwise turn its failures into unscored errors (the reward hack of
discarded invalid calls, docs/design.md). Pytest runs get an in-process deadline plugin at timeout_s
(PYTEST_PLUGINS); it exits with DEADLINE_EXIT before the harness timeout kills the command. A
command that is not Python (or blocks signals) hits only the harness timeout: `error`.

Threat model of grading (what is and is not covered):
- covered: tests the agent put at `hidden_tests/` are deleted before the real ones are copied;
  a `pytest.ini` is written into `hidden_tests/` (unless the task ships one), so pytest takes
  its rootdir and confcutdir from there and ignores the agent's `pytest.ini`/`conftest.py`/
  `setup.cfg` at the workspace root (no `addopts = --co`, no report-rewriting hooks).
- not covered: the agent's code runs inside the tests, so it can monkeypatch, shadow modules
  (`pytest.py` in the workspace root) or kill the runner. Treat `pass` as strong evidence, not
  proof, and keep the isolation of the sandbox itself (docs/sandbox.md) as the hard boundary.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from rlcycle.errors import RlcycleError
from rlcycle.sandbox.sandbox import WORKSPACE, ExecResult, Sandbox, Status
from rlcycle.tasks.suite import GRADER_DIR, HIDDEN_DIR, Task

OUTPUT_TAIL = 4000  # characters of test output kept on the result
DEADLINE_EXIT = 97  # exit status of the deadline plugin (pytest itself uses 0-5)
DEADLINE_MARK = "RLCYCLE_DEADLINE"
PYTEST_INI = "[pytest]\n# written by rlcycle's grader: rootdir and confcutdir are hidden_tests/\n"
INI_NAMES = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")

# Imported by pytest at startup (PYTEST_PLUGINS), so the alarm also covers collection, i.e.
# import-time hangs of the agent's modules. The message goes to a copy of the real stderr taken
# before pytest captures fd 2; os._exit because a hung test must not be able to swallow it.
DEADLINE_PLUGIN = f'''"""rlcycle grader: end the test run at RLCYCLE_DEADLINE_S seconds (the code under test hung)."""
import os
import signal
import traceback

_STDERR = os.dup(2)


def _expired(signum, frame):
    where = "".join(traceback.format_stack(frame, limit=4)) if frame else ""
    message = ("\\n{DEADLINE_MARK}: the tests ran past %s s; the code under test hangs or is too "
               "slow. Innermost frames:\\n%s" % (os.environ.get("RLCYCLE_DEADLINE_S"), where))
    os.write(_STDERR, message.encode("utf-8", "replace"))
    os._exit({DEADLINE_EXIT})


_seconds = float(os.environ.get("RLCYCLE_DEADLINE_S") or 0)
if _seconds > 0:
    signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, _seconds)
'''


class GradeStatus(str, Enum):
    """The verdict on one attempt; equal to its string ("pass" == GradeStatus.PASS)."""

    PASS = "pass"  # every hidden test passed
    FAIL = "fail"  # the model's work does not pass (tests failed, did not import, hung, OOM)
    ERROR = "error"  # infrastructure: the sandbox broke or the harness timed out; not scored


@dataclass
class GradeResult:
    """The outcome of running a task's hidden tests once."""

    task_id: str
    status: GradeStatus
    passed: int = 0  # tests that passed (1 for a non-pytest command that exited 0)
    failed: int = 0  # tests that failed
    errors: int = 0  # tests or modules pytest reports as errors (e.g. an ImportError)
    exit_code: int | None = None  # the test command's; None when it never finished
    timed_out: bool = False  # the deadline (fail) or the harness timeout (error) ended it
    reason: str = ""  # one line: why this status
    duration_s: float = 0.0  # grading wall time, copying included
    output: str = ""  # the tail of the test command's stdout + stderr

    @property
    def ok(self) -> bool:
        return self.status is GradeStatus.PASS

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


# --- the workspace ------------------------------------------------------------------------


def prepare_workspace(task: Task, sandbox: Sandbox) -> None:
    """Copy the task's repo/ into the sandbox workspace (the agent's starting point).

    The sandbox should be clean (a fresh one, or one from `SandboxPool.acquire()`).
    Raises SandboxError when the sandbox refuses the files."""
    if task.repo:
        sandbox.write_files(dict(task.repo))


def apply_solution(task: Task, sandbox: Sandbox) -> None:
    """Write the reference solution's files over the workspace (as a perfect agent would)."""
    sandbox.write_files(dict(task.solution))


def hidden_files(task: Task) -> dict[str, str]:
    """{workspace path: text} of everything grading copies in: hidden tests, ini, plugin."""
    files = {f"{HIDDEN_DIR}/{path}": text for path, text in task.hidden_tests.items()}
    if not any(name in task.hidden_tests for name in INI_NAMES):
        files[f"{HIDDEN_DIR}/pytest.ini"] = PYTEST_INI
    files[f"{GRADER_DIR}/rlcycle_deadline.py"] = DEADLINE_PLUGIN
    return files


# --- grading ------------------------------------------------------------------------------


def grade(task: Task, sandbox: Sandbox, timeout: float | None = None) -> GradeResult:
    """Copy the hidden tests in, run `task.test_command`, and judge (see the module table).

    `timeout` (default `task.timeout_s`) is the deadline for the code under test; the harness
    kills the command `grace_s(timeout)` later. Never raises for a sandbox failure: that is a
    GradeResult with status error."""
    limit = float(timeout or task.timeout_s)
    start = time.monotonic()

    def infra(reason: str, r: ExecResult | None = None) -> GradeResult:
        return GradeResult(
            task.id, GradeStatus.ERROR, reason=reason, duration_s=time.monotonic() - start, output=_tail(r) if r else ""
        )

    # Whatever the agent left at the reserved paths goes first (it may have planted tests).
    r = sandbox.exec(
        f"chmod -R u+rwX {HIDDEN_DIR} {GRADER_DIR} 2>/dev/null; rm -rf -- {HIDDEN_DIR} {GRADER_DIR}", timeout=30
    )
    if r.status is Status.INFRA:
        return infra(f"sandbox: {r.error}", r)
    if r.status is not Status.OK:
        return infra(f"could not clear {HIDDEN_DIR}/ before grading ({r.status.value})", r)
    try:
        sandbox.write_files(hidden_files(task))
    except RlcycleError as e:
        return infra(f"sandbox: could not copy the hidden tests in: {e.message}")
    env = {
        "PYTEST_PLUGINS": "rlcycle_deadline",
        "PYTHONPATH": f"{WORKSPACE}/{GRADER_DIR}",
        "RLCYCLE_DEADLINE_S": f"{limit:g}",
    }
    r = sandbox.exec(task.test_command, timeout=limit + grace_s(limit), env=env)
    result = judge(task.id, r)
    result.duration_s = time.monotonic() - start
    return result


def grace_s(timeout: float) -> float:
    """How long past the deadline the harness waits before it kills the test command.

    Generous: the deadline starts only once pytest is imported, which alone takes seconds on
    a loaded machine, and a hang caught by the deadline is a `fail` the harness must not
    pre-empt with its own `error`."""
    return max(5.0, 0.5 * timeout)


def judge(task_id: str, r: ExecResult) -> GradeResult:
    """Turn the test command's ExecResult into a GradeResult (the module table, in code)."""
    out = _tail(r)
    res = GradeResult(task_id, GradeStatus.FAIL, exit_code=r.exit_code, output=out)
    if r.status is Status.INFRA:
        return _set(res, GradeStatus.ERROR, f"sandbox: {r.error}")
    if r.status is Status.TIMEOUT:
        res.timed_out = True
        return _set(res, GradeStatus.ERROR, f"harness timeout: the test command ran {r.duration_s:.1f}s and was killed")
    counts = parse_pytest_counts(r.stdout + "\n" + r.stderr)
    if counts:
        res.passed, res.failed, res.errors = counts
    if r.exit_code == DEADLINE_EXIT and DEADLINE_MARK in r.stderr:
        res.timed_out = True
        return _set(res, GradeStatus.FAIL, "deadline: the code under test hung or was too slow")
    if r.status is Status.OOM:
        return _set(res, GradeStatus.FAIL, "out of memory: the code under test hit the sandbox limit")
    code = r.exit_code
    if code == 0:
        if counts is None:  # not pytest: the exit status is the verdict
            res.passed = 1
            return _set(res, GradeStatus.PASS, "the test command exited 0")
        if res.passed > 0 and res.failed == 0 and res.errors == 0:
            return _set(res, GradeStatus.PASS, f"{res.passed} test(s) passed")
        return _set(res, GradeStatus.FAIL, "no test passed")
    if (code in (3, 4) and counts is None) or code in (126, 127):
        return _set(res, GradeStatus.ERROR, f"the task's test command is broken (exit {code})")
    if counts is None and code == 1:
        res.failed = 1
    reason = {
        1: "tests failed",
        2: "collection error or interrupted (the code does not import?)",
        5: "no tests collected",
    }.get(code, f"the test command exited {code}")
    return _set(res, GradeStatus.FAIL, reason)


_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b")
_SUMMARY = re.compile(r"\b(?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|no tests ran)\b.* in [\d.]+s")


def parse_pytest_counts(text: str) -> tuple[int, int, int] | None:
    """(passed, failed, errors) from pytest's final summary line; None when there is none.

    Reads lines like `2 passed, 1 failed in 0.05s`, `==== 1 error in 0.1s ====` and
    `no tests ran in 0.01s` (-q or not). xpassed counts as passed, xfailed is ignored."""
    for line in reversed(text.splitlines()):
        if not _SUMMARY.search(line):
            continue
        counts = {"passed": 0, "failed": 0, "errors": 0}
        for n, kind in _COUNT.findall(line):
            if kind in ("passed", "xpassed"):
                counts["passed"] += int(n)
            elif kind == "failed":
                counts["failed"] += int(n)
            elif kind.startswith("error"):
                counts["errors"] += int(n)
        return counts["passed"], counts["failed"], counts["errors"]
    return None


def _set(res: GradeResult, status: GradeStatus, reason: str) -> GradeResult:
    res.status = status
    res.reason = reason
    return res


def _tail(r: ExecResult) -> str:
    text = (r.stdout or "") + ("\n" + r.stderr if r.stderr else "")
    return text[-OUTPUT_TAIL:]
