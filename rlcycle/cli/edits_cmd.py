"""`rlcycle edits`: a git working tree and the gateway's log to `edit_outcome` events."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def edits(
    logs: list[str] = typer.Argument(..., help="The gateway's event logs: files, directories or globs."),
    repo: str = typer.Option(..., "--repo", help="The git working tree the agents edit."),
    out: str = opt.out("Directory for the edit_outcome events (one edit_outcomes-<time>.jsonl per run with any)."),
    state: str = typer.Option(
        None, "--state", help="State file of earlier runs (default: <git dir>/rlcycle/edits-state.json)."
    ),
    target: str = typer.Option(None, "--target", help="What is observed: worktree (default) or a branch, e.g. main."),
    _help_config: bool = config_help.option("edits"),
    config: Path = opt.config("edits"),
    set_: list[str] = opt.sets("observe_after_s=3600"),
    as_json: bool = opt.json_flag(),
    quiet: bool = opt.quiet(),
) -> None:
    """Record what coding agents changed in a git working tree, per logged tool call, and hours later emit
    `edit_outcome` events (lines proposed, lines surviving) that collect joins onto those calls.

    Run it every minute beside the agents and the gateway: each run snapshots the working tree (a temporary index;
    the user's index, HEAD and files are never touched), records the episodes that finished since, and observes the
    proposals that are `observe_after_s` old. Only line counts and line hashes leave the repository. See
    docs/edits.md.

    Examples:

      rlcycle edits --repo ~/src/project /var/log/rlcycle-gateway -o /var/log/rlcycle-edits

      * * * * *  rlcycle edits --repo ~/src/project gw-logs/ -o edit-events/ --quiet

      rlcycle edits --repo . gw-logs/ -o edit-events/ --target main --set observe_after_s=86400 --json
    """
    from rlcycle.config import resolve
    from rlcycle.edits import stage

    cfg = resolve(stage.EditsConfig, config, set_, {"target": target}, section="edits")
    result = stage.STAGE.run(cfg, stage.EditsArgs(repo, logs, out, state=state, quiet=quiet))
    output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg, summary=stage.format_summary(result))
