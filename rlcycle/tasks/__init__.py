"""Task suites: the tasks eval and `simulate` run the agent on, and how they are graded.

    from rlcycle.tasks import load_suite, prepare_workspace, grade, reference_script

    tasks = load_suite("sample_data/tasks")            # every problem of every task at once
    with SandboxPool(size=2) as pool, pool.acquire() as sb:
        prepare_workspace(tasks[0], sb)                 # repo/ -> /workspace
        ...                                             # the agent's tool calls
        result = grade(tasks[0], sb)                    # hidden tests in, run, pass/fail/error

Modules: suite (Task, load/validate/write task directories), grade (GradeResult, grading),
reference (the reference solution as tool calls), check (reference passes, do-nothing fails),
humaneval (importer). docs/tasks.md is the format reference.
"""

from rlcycle.tasks.check import TaskCheck, check_suite, check_task
from rlcycle.tasks.grade import (
    GradeResult,
    GradeStatus,
    apply_solution,
    grade,
    judge,
    parse_pytest_counts,
    prepare_workspace,
)
from rlcycle.tasks.humaneval import import_humaneval, problem_to_task, read_problems
from rlcycle.tasks.reference import (
    ReferenceEpisode,
    ScriptedCall,
    reference_calls,
    reference_script,
)
from rlcycle.tasks.suite import SuiteScan, Task, load_suite, load_task, scan_suite, write_task

__all__ = [
    "GradeResult",
    "GradeStatus",
    "ReferenceEpisode",
    "ScriptedCall",
    "SuiteScan",
    "Task",
    "TaskCheck",
    "apply_solution",
    "check_suite",
    "check_task",
    "grade",
    "import_humaneval",
    "judge",
    "load_suite",
    "load_task",
    "parse_pytest_counts",
    "prepare_workspace",
    "problem_to_task",
    "read_problems",
    "reference_calls",
    "reference_script",
    "scan_suite",
    "write_task",
]
