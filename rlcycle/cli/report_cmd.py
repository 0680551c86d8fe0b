"""`rlcycle report RUN_DIR`: one self-contained HTML page about a cycle's run directory."""

from __future__ import annotations

import sys

import typer

from rlcycle import console
from rlcycle.cli import options as opt
from rlcycle.errors import InputError


def report(
    run_dir: str = typer.Argument(..., help="A run directory written by `rlcycle cycle --run-dir`."),
    more: list[str] = typer.Argument(None, help="More run directories for the online section."),
    output: str = typer.Option(
        None, "--output", "-o", help="Where to write the HTML (default RUN_DIR/report.html); - for stdout."
    ),
    as_json: bool = opt.json_flag('Print {"report": path, "sections": [...]}.'),
) -> None:
    """Write one self-contained HTML report of a cycle's run directory: stage timings and the decision, reward parts and
    hack monitors per policy version, online metrics with 95% confidence intervals, the eval comparison with every
    gate, and training curves. Stages that did not run get a 'not available' section. Prints the path.

    Examples:

      rlcycle report runs/cycle

      rlcycle report runs/2026-12-02-10 -o latest.html --json

      rlcycle report runs/cycle -o - | gzip > report.html.gz

    More run directories after the first add their trajectories to the online section (each of their policy versions
    against the first run's; paired by session where they served the same sessions); the other sections are the first
    run's:

      rlcycle report runs/exp/v0/measure runs/exp/treatment/measure -o runs/exp/report.html
    """
    from rlcycle import report as stage

    if output == "-":  # the page itself is the result
        if as_json:
            raise InputError("--json and -o - both want stdout", hint="pass -o FILE with --json")
        sys.stdout.write(stage.render(run_dir, more or ())[0])
        return
    result = stage.run(run_dir, output, more or ())
    if as_json:
        opt.emit_json(result.as_dict())
        return
    missing = [s for s in result.sections if not s["available"]]
    for s in missing:
        console.info(f"report: {s['title']}: not available ({s['why']})")
    typer.echo(result.report)
