"""`rlcycle inspect FILE`: schema, row count and head of an artifact."""

from __future__ import annotations

import typer

from rlcycle.cli import options as opt


def inspect(
    path: str = typer.Argument(..., help="An .arrow or .parquet file, or - for an Arrow stream on stdin."),
    head: int = typer.Option(5, "--head", "-n", help="How many rows to print."),
    as_json: bool = opt.json_flag("Print one JSON summary object instead."),
) -> None:
    """Show an artifact's format, contract, schema, row count and first rows (JSON lines).

    Examples:

      rlcycle inspect runs/demo/trajectories.arrow

      rlcycle inspect runs/demo/trajectories.arrow --json

      rlcycle collect sample_data/events -o - | rlcycle inspect -
    """
    from rlcycle import inspect as stage

    result = stage.run(path, head=head)
    if as_json:
        summary = result.summary()
        summary["head"] = result.head
        opt.emit_json(summary)
        return
    typer.echo(stage.format_summary(result))
