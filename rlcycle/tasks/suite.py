"""Task suites: load a directory of task directories into `Task`s, listing every problem at once.

What goes in: a directory. Every directory under it that holds a `task.toml` is one task
(directories may be nested, e.g. `tasks/<cluster>/<task-id>/`; a directory that itself holds a
`task.toml` is a one-task suite). What comes out: `list[Task]`, sorted by id, with every file
of the task read into memory (tasks are tiny; a loaded Task needs no filesystem afterwards).

    from rlcycle.tasks import load_suite
    tasks = load_suite("sample_data/tasks")
    tasks[0].id, tasks[0].instruction, sorted(tasks[0].repo)

A task directory (docs/tasks.md is the full reference):

    task.toml        id, instruction, cluster, tags, difficulty, test_command, timeout_s,
                     ambiguous, clarification_question, clarification_answer, ...
    repo/            the files the agent starts with (copied into the sandbox workspace)
    hidden_tests/    copied into the workspace as `hidden_tests/` only after the agent finished
    solution/        files that, written over repo/, make the hidden tests pass

`load_suite` raises one InputError listing every problem of every task (missing or unknown
keys, wrong types, missing directories, duplicate ids, ...); `scan_suite` returns them instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcycle.config import loads_toml
from rlcycle.errors import InputError

TASK_FILE = "task.toml"
HIDDEN_DIR = "hidden_tests"  # where the hidden tests land in the workspace, at grading only
GRADER_DIR = ".rlcycle"  # grader's own files in the workspace (deadline plugin)
RESERVED_PATHS = (HIDDEN_DIR, GRADER_DIR)  # repo/ and solution/ may not write under these
DEFAULT_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider hidden_tests"
DEFAULT_RUN_TESTS_COMMAND = "python3 -m pytest -q -p no:cacheprovider"
DEFAULT_TIMEOUT_S = 30.0
MAX_TASK_BYTES = 1 << 20  # all files of one task together; tasks are meant to be tiny
SKIPPED_NAMES = {"__pycache__", ".pytest_cache", ".DS_Store"}  # local run leftovers, ignored
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def _f(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class Task:
    """One task of a suite: what the user asks, the starting files, the hidden tests, the answer."""

    id: str = _f(help="unique id; equals the task directory's name ([a-z0-9._-])")
    instruction: str = _f(help="what the user types to the agent")
    cluster: str = _f(help="the group it belongs to, e.g. the repository it comes from")
    difficulty: int = _f(help="1 (one-line fix) to 3 (a feature over several places)")
    tags: list[str] = _f([], help="free labels, e.g. bugfix, feature, edge-case, ambiguous")
    test_command: str = _f(
        DEFAULT_TEST_COMMAND,
        help="shell command run in the workspace root after the hidden tests are copied in",
    )
    timeout_s: float = _f(DEFAULT_TIMEOUT_S, help="seconds the test command may run")
    ambiguous: bool = _f(False, help="the request needs a clarifying question to be done right")
    clarification_question: str | None = _f(
        None, help="the question the reference solution asks (ambiguous tasks; optional)"
    )
    clarification_answer: str | None = _f(
        None, help="what the simulated user answers when asked (required when ambiguous)"
    )
    run_tests_command: str = _f(
        DEFAULT_RUN_TESTS_COMMAND, help="what the agent's run_tests tool runs (visible tests only)"
    )
    source: str | None = _f(None, help="where the task comes from, e.g. HumanEval/0")
    brief: str | None = _f(
        None,
        help="the request as a terse user writes it (the simulated user's underspecified first message; "
        "default: the instruction up to its first ':' or sentence end)",
    )
    repo: dict[str, str] = _f({}, help="starting files: relative path -> text")
    hidden_tests: dict[str, str] = _f({}, help="hidden test files, relative to hidden_tests/")
    solution: dict[str, str] = _f({}, help="reference solution files, written over repo")
    path: str | None = _f(None, help="the task directory it was loaded from")

    def solved_files(self) -> dict[str, str]:
        """The workspace after the reference solution: repo with solution written over it."""
        return {**self.repo, **self.solution}

    def summary(self) -> dict[str, Any]:
        """The task.toml fields (no file contents), e.g. for `rlcycle tasks ls --json`."""
        return {k: getattr(self, k) for k in TOML_KEYS}


# task.toml keys: (python type(s), required). Everything else in Task comes from directories.
TOML_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((str,), True),
    "instruction": ((str,), True),
    "cluster": ((str,), True),
    "difficulty": ((int,), True),
    "tags": ((list,), False),
    "test_command": ((str,), False),
    "timeout_s": ((int, float), False),
    "ambiguous": ((bool,), False),
    "clarification_question": ((str,), False),
    "clarification_answer": ((str,), False),
    "run_tests_command": ((str,), False),
    "source": ((str,), False),
    "brief": ((str,), False),
}
TASK_DIRS = ("repo", "hidden_tests", "solution")


@dataclass
class SuiteScan:
    """What `scan_suite` found: the tasks that loaded cleanly and every problem, as lines."""

    root: str
    tasks: list[Task]
    problems: list[str]


# --- loading ------------------------------------------------------------------------------


def load_suite(root: str | Path) -> list[Task]:
    """Every task under `root`, sorted by id; InputError listing every problem at once."""
    scan = scan_suite(root)
    if scan.problems:
        n_bad = len({p.split(":", 1)[0] for p in scan.problems})
        raise InputError(
            f"{len(scan.problems)} problem(s) in task suite {root} ({n_bad} place(s)):\n  "
            + "\n  ".join(scan.problems),
            hint=f"docs/tasks.md describes the task format; fix the lines above and rerun `rlcycle tasks check {root}`",
        )
    return scan.tasks


def scan_suite(root: str | Path) -> SuiteScan:
    """Load every task under `root`; never raises for a bad task, lists its problems instead."""
    base = Path(root)
    if not base.is_dir():
        return SuiteScan(str(root), [], [f"{root}: not a directory"])
    dirs = find_task_dirs(base)
    if not dirs:
        return SuiteScan(str(root), [], [f"{root}: no {TASK_FILE} found under it"])
    tasks: list[Task] = []
    problems: list[str] = []
    for d in dirs:
        where = d.relative_to(base).as_posix() if d != base else d.name
        task, found = load_task(d)
        problems += [f"{where}: {p}" for p in found]
        if task is not None and not found:
            tasks.append(task)
    seen: dict[str, str] = {}
    for task in tasks:
        if task.id in seen:
            problems.append(f"{task.path}: id {task.id!r} is also the id of {seen[task.id]}")
        seen.setdefault(task.id, str(task.path))
    return SuiteScan(str(root), sorted(tasks, key=lambda t: t.id), problems)


def find_task_dirs(root: Path) -> list[Path]:
    """Directories under `root` (or `root` itself) holding a task.toml; not below a task."""
    if (root / TASK_FILE).is_file():
        return [root]
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        hidden = child.name.startswith(".") or child.name in SKIPPED_NAMES
        if child.is_dir() and not child.is_symlink() and not hidden:
            found += find_task_dirs(child)
    return found


def load_task(d: Path) -> tuple[Task | None, list[str]]:
    """One task directory -> (Task or None, its problems). Checks everything it can at once."""
    problems: list[str] = []
    try:
        data = loads_toml((d / TASK_FILE).read_text(encoding="utf-8"), TASK_FILE)
    except InputError as e:  # TASK_FILE:LINE:COL: not valid TOML (...)
        return None, [e.message]
    except (OSError, UnicodeDecodeError) as e:
        return None, [f"{TASK_FILE}: {e}"]
    problems += _check_keys(data)
    files: dict[str, dict[str, str]] = {}
    for name in TASK_DIRS:
        found, errs = _read_tree(d / name)
        files[name] = found
        problems += [f"{name}/{e}" for e in errs]
    problems += _check_values(data, d, files)
    if problems:
        return None, problems
    values = {k: v for k, v in data.items() if k in TOML_KEYS}
    values["timeout_s"] = float(values.get("timeout_s", DEFAULT_TIMEOUT_S))
    values["tags"] = list(values.get("tags", []))
    task = Task(
        **values, repo=files["repo"], hidden_tests=files["hidden_tests"], solution=files["solution"], path=str(d)
    )
    return task, []


def _check_keys(data: dict[str, Any]) -> list[str]:
    """Unknown keys (with a close match), missing required keys, wrong types."""
    problems = []
    for key in data:
        if key not in TOML_KEYS:
            close = difflib.get_close_matches(key, list(TOML_KEYS), n=1)
            problems.append(f"{TASK_FILE}: unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    for key, (types, required) in TOML_KEYS.items():
        if key not in data:
            if required:
                problems.append(f"{TASK_FILE}: missing key {key!r}")
            continue
        value = data[key]
        if isinstance(value, bool) and bool not in types:
            ok = False  # TOML true is not the integer 1
        else:
            ok = isinstance(value, types)
        if not ok:
            want = " or ".join("array" if t is list else t.__name__ for t in types)
            problems.append(f"{TASK_FILE}: {key} = {value!r}: expected {want}")
        elif key == "tags" and not all(isinstance(t, str) for t in value):
            problems.append(f"{TASK_FILE}: tags = {value!r}: expected an array of strings")
    return problems


def _check_values(data: dict[str, Any], d: Path, files: dict[str, dict[str, str]]) -> list[str]:
    """Checks on values that have the right types, and on the directories' contents."""
    problems = []
    tid = data.get("id")
    if isinstance(tid, str):
        if not ID_RE.match(tid):
            problems.append(f"{TASK_FILE}: id {tid!r}: use lowercase letters, digits, '.', '_', '-'")
        elif tid != d.name:
            problems.append(f"{TASK_FILE}: id {tid!r} differs from the directory name {d.name!r}")
    for key in ("instruction", "cluster", "test_command"):
        if isinstance(data.get(key), str) and not data[key].strip():
            problems.append(f"{TASK_FILE}: {key} is empty")
    diff = data.get("difficulty")
    if isinstance(diff, int) and not isinstance(diff, bool) and diff not in (1, 2, 3):
        problems.append(f"{TASK_FILE}: difficulty = {diff}: expected 1, 2 or 3")
    timeout = data.get("timeout_s")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout <= 0:
        problems.append(f"{TASK_FILE}: timeout_s = {timeout}: must be > 0")
    ambiguous = data.get("ambiguous") is True
    answer = data.get("clarification_answer")
    if ambiguous and not (isinstance(answer, str) and answer.strip()):
        problems.append(f"{TASK_FILE}: ambiguous = true needs a clarification_answer (what the user answers)")
    for key in ("clarification_answer", "clarification_question"):
        if key in data and not ambiguous:
            problems.append(f"{TASK_FILE}: {key} is set but ambiguous is not true")
    for name in TASK_DIRS:
        if not (d / name).is_dir():
            problems.append(f"{name}/: missing directory")
        elif name != "repo" and not files[name]:
            problems.append(f"{name}/: holds no file")
    for name in ("repo", "solution"):
        for path in files[name]:
            if path.split("/", 1)[0] in RESERVED_PATHS:
                problems.append(f"{name}/{path}: {path.split('/', 1)[0]}/ is reserved for the grader")
    size = sum(len(t.encode()) for fs in files.values() for t in fs.values())
    if size > MAX_TASK_BYTES:
        problems.append(f"files total {size:,} bytes: more than {MAX_TASK_BYTES:,} (tasks are tiny)")
    return problems


def _read_tree(top: Path) -> tuple[dict[str, str], list[str]]:
    """{relative posix path: text} for every file under `top` (missing top: empty, no problem)."""
    files: dict[str, str] = {}
    problems: list[str] = []
    if not top.is_dir():
        return files, problems
    for p in sorted(top.rglob("*")):
        rel = p.relative_to(top)
        if any(part in SKIPPED_NAMES for part in rel.parts) or p.suffix == ".pyc":
            continue
        if p.is_symlink():
            problems.append(f"{rel.as_posix()}: a symlink (copy the file instead)")
        elif p.is_file():
            try:
                files[rel.as_posix()] = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                problems.append(f"{rel.as_posix()}: not UTF-8 text")
    return files, problems


# --- writing ------------------------------------------------------------------------------


def task_toml(task: Task) -> str:
    """The task.toml text of `task` (defaults left out, keys in TOML_KEYS order)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Task)}
    lines = []
    for key in TOML_KEYS:
        value = getattr(task, key)
        if key not in ("id", "instruction", "cluster", "difficulty") and value == defaults.get(key):
            continue
        if value is None or (key == "tags" and not value):
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n"
    loads_toml(text, f"{TASK_FILE} of {task.id}")  # what we write must read back
    return text


def write_task(task: Task, parent: str | Path) -> Path:
    """Write `task` as the directory `parent/<task.id>` (task.toml, repo/, hidden_tests/,
    solution/); returns it. The directory must not exist yet."""
    d = Path(parent) / task.id
    d.mkdir(parents=True)
    (d / TASK_FILE).write_text(task_toml(task), encoding="utf-8")
    for name in TASK_DIRS:
        (d / name).mkdir()
        for rel, text in getattr(task, name).items():
            p = d / name / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
    return d


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # A TOML basic string: JSON escapes minus the ones TOML lacks (DEL must be escaped).
    import json

    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
