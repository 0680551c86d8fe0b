"""The tail every stage command shares: save the resolved config, print the result, exit.

In: a stage's result and what the command wants said about it. Out: OUT.config.json beside the
output, the `--json` object (or a text result) on stdout, the summary on stderr, and an exit
code through an `RlcycleError` (rlcycle.errors), in that order, alike in every command.

    result = stage.STAGE.run(cfg, stage.CollectArgs(events, out, quiet=quiet))
    output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg,
                  summary=stage.format_summary(result))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rlcycle import console
from rlcycle.cli import options as opt
from rlcycle.errors import RlcycleError


def finish(
    result: Any,
    *,
    as_json: bool,
    data: Any = None,
    text: str | None = None,
    summary: str | None = None,
    quiet: bool = False,
    out: str | Path | None = None,
    config: Any = None,
    error: RlcycleError | None = None,
) -> None:
    """End a command that ran a stage.

    1. `config` (the resolved config dataclass) is saved as OUT.config.json, unless OUT is `-`
       (stdout carries the data; there is nowhere beside it).
    2. With `--json`: `data` (default `result.as_dict()`) as one JSON object on stdout, or one
       line on stderr when OUT is `-` (opt.emit_json). Without: `text` on stdout, if given
       (deploy, cycle: the summary *is* the result).
    3. `summary` on stderr unless `quiet`.
    4. `error` raised last (the gate refused: exit 3), after the result was printed.
    """
    if config is not None and out is not None and str(out) != "-":
        from rlcycle.config import save_resolved

        save_resolved(config, f"{out}.config.json")
    if as_json:
        opt.emit_json(result.as_dict() if data is None else data, out)
    elif text is not None:
        typer.echo(text)
    if summary is not None and not quiet:
        console.info(summary)
    if error is not None:
        raise error
