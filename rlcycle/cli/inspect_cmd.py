"""`rlcycle inspect FILE`: schema, row count and head of an artifact."""

from __future__ import annotations

import typer

from rlcycle.cli import options as opt


def inspect(
    path: str = typer.Argument(..., help="An .arrow or .parquet file, or - for an Arrow stream on stdin."),
    head: int = typer.Option(5, "--head", "-n", help="How many rows to print."),
    as_json: bool = opt.json_flag("Print one JSON summary object instead."),
    full_prompts: bool = typer.Option(
        False,
        "--full-prompts",
        help="Rebuild every row's whole `prompt_ids` from the delta columns (docs/design.md, "
        "'Prompts stored once'): in the head rows, and in the file written with -o.",
    ),
    output: str | None = typer.Option(
        None, "--output", "-o", help="With --full-prompts: write the table with whole prompts here (.arrow/.parquet/-)."
    ),
) -> None:
    """Show an artifact's format, contract, schema, row count and first rows (JSON lines).

    Examples:

      rlcycle inspect runs/demo/trajectories.arrow

      rlcycle inspect runs/demo/trajectories.arrow --json

      rlcycle collect sample_data/events -o - | rlcycle inspect -

      rlcycle inspect runs/demo/trajectories.arrow --full-prompts -o /tmp/whole.parquet
    """
    from rlcycle import inspect as stage

    if output is not None and not full_prompts:
        from rlcycle.errors import InputError

        raise InputError("-o/--output writes the table with whole prompts", hint="add --full-prompts")
    result = stage.run(path, head=head, full_prompts=full_prompts, output=output)
    if as_json:
        summary = result.summary()
        summary["head"] = result.head
        opt.emit_json(summary)
        return
    typer.echo(stage.format_summary(result))
