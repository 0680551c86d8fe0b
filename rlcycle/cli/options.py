"""The options every command shares, and the one way to print a `--json` result.

In: a command's config section and wording. Out: typer option declarations for `--config`,
`--set`, `--json`, `--quiet`/`-q` and `-o/--out`, spelled, defaulted and documented alike in
every command; `emit_json()` prints the `--json` object where docs/design.md ("Conventions") says it goes.

    from rlcycle.cli import options as opt

    def collect(..., out: str = opt.out("trajectories.arrow ..."), config: Path = opt.config("collect"),
                set_: list[str] = opt.sets("maturity_s=3600"), as_json: bool = opt.json_flag(),
                quiet: bool = opt.quiet()) -> None:
        ...
        opt.emit_json(result.as_dict(), out)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from rlcycle import console


def config(section: str = "", *, help: str | None = None) -> Any:
    """`--config FILE.toml`: the config-file layer (defaults < file < --set < flags)."""
    return typer.Option(None, "--config", help=help or f"TOML config ([{section}] table or top level).")


def sets(example: str = "", *, help: str | None = None) -> Any:
    """`--set key=value` (repeatable): one config key over the file; `example` is a key=value."""
    return typer.Option(None, "--set", help=help or f"Override a config key: --set {example} (repeatable).")


def json_flag(help: str = "Print one JSON summary object on stdout.") -> Any:
    """`--json`: the result as one JSON object (see emit_json)."""
    return typer.Option(False, "--json", help=help)


def quiet(help: str = "No progress or summary on stderr.") -> Any:
    """`--quiet`/`-q`: nothing on stderr but warnings and errors."""
    return typer.Option(False, "--quiet", "-q", help=help)


def out(help: str) -> Any:
    """`-o/--out` (required): where the command writes its artifact; `-` for stdout where allowed."""
    return typer.Option(..., "-o", "--out", help=help)


def emit_json(obj: Any, out: str | Path | None = None) -> None:
    """Print a `--json` result: one JSON object on stdout, or one line on stderr when `out` is
    `-`, because then stdout carries the data itself (an Arrow or JSON-lines stream)."""
    if out is not None and str(out) == "-":
        sys.stderr.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
        sys.stderr.flush()
    else:
        console.print_json(obj)
