"""`replace_in_file`, the short edit production agents have: the parser takes it, the executor
replaces the one occurrence or refuses with a clear error and changes nothing, the demos say
what the executor says. The unit tests run the executor against an in-memory workspace (a
stand-in for the Docker sandbox: the tool only reads and writes files); the last test runs it
through a real sandbox."""

from __future__ import annotations

import json

import pytest

from rlcycle.agent.tools_exec import execute
from rlcycle.harness import EDIT_TOOLS, parse_completion
from rlcycle.harness.demos import synthetic_output
from rlcycle.harness.tools import REPLACED, get_tool
from rlcycle.tasks import Task

CODE = "def is_adult(age):\n    return age > 18\n\n\ndef is_child(age):\n    return age < 18\n"
TASK = Task(
    id="t",
    instruction="x",
    cluster="c",
    difficulty=1,
    repo={"people.py": CODE},
    hidden_tests={"test_x.py": ""},
    solution={"people.py": CODE.replace("> 18", ">= 18")},
)


class Workspace:
    """In-memory files with the Sandbox methods the tool uses (read_files, write_files)."""

    broken = False

    def __init__(self, files: dict[str, str]):
        self.files = {k: v.encode() for k, v in files.items()}

    def read_files(self, paths, max_bytes=1 << 20):
        return {p: self.files.get(p) for p in paths}

    def write_files(self, files):
        self.files.update({k: v.encode() if isinstance(v, str) else v for k, v in files.items()})


def call(**arguments):
    [c] = parse_completion(
        "<tool_call>" + json.dumps({"name": "replace_in_file", "arguments": arguments}) + "</tool_call>"
    ).calls
    return c


def test_the_tool_is_an_edit_with_three_required_string_arguments():
    spec = get_tool("replace_in_file")
    assert spec is not None and spec.required == ("path", "old", "new") and not spec.terminal
    assert "replace_in_file" in EDIT_TOOLS
    assert call(path="a.py", old="x", new="y").valid
    bad = call(path="a.py", old="x")
    assert not bad.valid and bad.code == "missing_argument"
    assert call(path="a.py", old="x", new=1).code == "wrong_type"
    assert call(path="a.py", old="x", new="y", count=2).code == "extra_argument"


def test_one_occurrence_is_replaced_and_counted_as_an_edit():
    ws = Workspace({"people.py": CODE})
    out = execute(call(path="people.py", old="    return age > 18", new="    return age >= 18"), ws, TASK)
    assert (out.status, out.output, out.error) == ("ok", "Replaced the text in people.py.", None)
    assert out.lines_proposed == 1 and out.edited
    assert ws.files["people.py"].decode() == TASK.solution["people.py"]
    assert (
        synthetic_output(TASK, "replace_in_file", {"path": "people.py"})
        == out.output
        == REPLACED.format(path="people.py")
    )


@pytest.mark.parametrize(
    "args, error",
    [
        (dict(path="people.py", old="return age >= 21", new="x"), "the old text does not occur in people.py"),
        (
            dict(path="people.py", old="18", new="21"),
            "the old text occurs 2 times in people.py; include neighbouring lines",
        ),
        (dict(path="people.py", old="", new="x"), "`old` is empty"),
        (dict(path="people.py", old="age", new="age"), "`old` and `new` are the same"),
        (dict(path="nope.py", old="a", new="b"), "nope.py: no such file"),
        (dict(path="../etc/passwd", old="a", new="b"), "not inside the workspace"),
    ],
)
def test_a_replacement_that_cannot_be_made_is_an_error_and_changes_nothing(args, error):
    ws = Workspace({"people.py": CODE})
    out = execute(call(**args), ws, TASK)
    assert out.status == "error" and error in out.error and out.output.startswith("Error: ")
    assert not out.edited and ws.files["people.py"].decode() == CODE


def test_a_missing_text_shows_the_closest_line():
    out = execute(call(path="people.py", old="return age >= 18", new="x"), Workspace({"people.py": CODE}), TASK)
    assert out.output.endswith("The closest line is:\n    return age > 18")


def test_replace_in_file_through_a_real_sandbox(docker_client):
    from rlcycle.sandbox import SandboxPool

    with SandboxPool(size=1) as pool, pool.acquire() as sb:
        sb.write_files({"pkg/people.py": CODE})
        ok = execute(call(path="pkg/people.py", old="age > 18", new="age >= 18"), sb, TASK)
        twice = execute(call(path="pkg/people.py", old="18", new="21"), sb, TASK)
        assert (ok.status, ok.lines_proposed, twice.status) == ("ok", 1, "error")
        assert sb.read_files(["pkg/people.py"])["pkg/people.py"].decode() == CODE.replace("> 18", ">= 18")
        r = sb.exec(
            ["python3", "-c", "import sys; sys.path.insert(0, 'pkg'); import people; print(people.is_adult(18))"],
            timeout=30,
        )
        assert r.stdout.strip() == "True"
