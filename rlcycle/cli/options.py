"""The options every command shares, and the one way to print a `--json` object.

In: a command's config section and wording. Out: typer option declarations for `--config`,
`--set`, `--json`, `--quiet`/`-q`, `-o/--out` and the rollout's `--executor`/`--ray-address`, spelled, defaulted and documented alike in
every command; `emit_json()` prints the `--json` object where docs/design.md ("Conventions") says it goes
(stage commands reach it through `rlcycle.cli.output.finish`, their shared tail);
`home()`/`registry_dir()`: the one place that reads $RLCYCLE_HOME (the CLI's default home; the
libraries below take the home or registry directory as an argument).

    from rlcycle.cli import options as opt

    def collect(..., out: str = opt.out("trajectories.arrow ..."), config: Path = opt.config("collect"),
                set_: list[str] = opt.sets("maturity_s=3600"), as_json: bool = opt.json_flag(),
                quiet: bool = opt.quiet()) -> None:
        ...
        output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg, summary=...)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from rlcycle import console


def home() -> Path:
    """The CLI's rlcycle home: $RLCYCLE_HOME, else ~/.rlcycle (registry/, cycle.lock, models/)."""
    return Path(os.environ.get("RLCYCLE_HOME") or Path.home() / ".rlcycle")


def registry_dir() -> Path:
    """The CLI's default model registry: `home()/registry`."""
    return home() / "registry"


def model_cache() -> Path:
    """Where `init-model --preset` downloads live: $RLCYCLE_MODEL_CACHE, else home()/cache/models."""
    return Path(os.environ.get("RLCYCLE_MODEL_CACHE") or home() / "cache" / "models")


def open_registry() -> Any:
    """The CLI's default model registry, opened (and repaired: rlcycle.policy.registry)."""
    from rlcycle.policy.registry import Registry

    return Registry(registry_dir())


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


def executor(
    help: str = "local (default: this machine's Docker) or ray (Ray actors with a sandbox pool on every node; "
    "docs/scale.md).",
) -> Any:
    """`--executor` (simulate, eval, collect): where the work runs; see `rollout_flags`."""
    return typer.Option(None, "--executor", help=help)


def ray_address() -> Any:
    """`--ray-address` (simulate, eval, collect): the Ray cluster of `--executor ray`."""
    return typer.Option(
        None,
        "--ray-address",
        help="Ray cluster to join with --executor ray (default: RAY_ADDRESS, else a local Ray).",
    )


def rollout_flags(executor: str | None, ray_address: str | None) -> dict[str, Any]:
    """`--executor` and `--ray-address` as the flags layer of a config with a `rollout` table."""
    return {"rollout.executor": executor, "rollout.ray_address": ray_address}


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
