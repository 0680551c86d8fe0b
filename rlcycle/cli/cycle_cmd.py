"""`rlcycle cycle`: the whole loop in one run directory (rlcycle/cycle.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt
from rlcycle.cli.eval_cmd import no_verdict
from rlcycle.errors import EXIT_GATE_REFUSED, RlcycleError


def cycle(
    _help_config: bool = config_help.option("cycle"),
    config: Path = opt.config(
        help="Cycle config: a TOML file ([cycle] table or top level), or a packaged one by name (demo, cron)."
    ),
    run_dir: str = typer.Option(None, "--run-dir", help="Run directory (default runs/cycle)."),
    source: str = typer.Option(None, "--source", help="logs or simulate."),
    events: list[str] = typer.Option(None, "--events", help="Event logs for source=logs (repeatable)."),
    set_: list[str] = opt.sets(help="Override a key: --set source=simulate, --set train.max_steps=50."),
    from_stage: str = typer.Option(None, "--from", help="First stage to run (earlier ones are skipped)."),
    until_stage: str = typer.Option(None, "--until", help="Last stage to run."),
    force: bool = typer.Option(False, "--force", help="Rerun the selected stages even when cached."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would run; run and write nothing."),
    plan: bool = typer.Option(
        False, "--plan", help="Print the resolved config (every stage table) as JSON; read nothing else."
    ),
    as_json: bool = opt.json_flag("Print one JSON summary object."),
    quiet: bool = opt.quiet("No progress on stderr."),
) -> None:
    """Chain simulate (or collect from logs), distill, train, eval and deploy in one run directory. Stages whose inputs
    and config are unchanged are skipped; a crashed cycle resumes at its first unfinished stage; one cycle runs at a
    time. Exit 3 when the eval gate refused (nothing deployed).

    Every stage table defaults to that stage's production defaults. `--config demo` is the packaged demo
    (rlcycle/configs/demo.toml: small sizes, and the tiny default model as production when the registry is empty);
    without it an empty registry is an error (exit 2).

    Examples:

      rlcycle cycle --config demo

      rlcycle cycle --config cycle.toml --run-dir runs/$(date +%F-%H) --json

      rlcycle cycle --config cycle.toml --plan

      rlcycle cycle --run-dir runs/c1 --from train --force
    """
    from rlcycle import cycle as stage

    cfg = stage.load_config(config, set_, {"run_dir": run_dir, "source": source, "events": events or None})
    if cfg.registry_home is None:  # the CLI's default home (rlcycle/cli/options.py)
        cfg = dataclasses.replace(cfg, registry_home=str(opt.home()))
    if plan:
        opt.emit_json(dataclasses.asdict(cfg))
        return
    result = stage.Cycle(
        cfg, force=force, dry_run=dry_run, from_stage=from_stage, until_stage=until_stage, quiet=quiet
    ).run()
    # The summary is the result here (stdout); each stage's manifest in the run directory holds its config.
    output.finish(result, as_json=as_json, text=stage.format_summary(result), error=_stopped(cfg, result))


def _stopped(cfg, result) -> RlcycleError | None:
    """Exit 3 when the eval gate refused, 1 when eval gave no verdict (why, from the verdict
    itself); None when the cycle finished."""
    from rlcycle.stage import RunLayout

    verdict = RunLayout(cfg.run_dir).file("verdict")
    if result.exit_code == EXIT_GATE_REFUSED:
        return RlcycleError(
            "the eval gate refused the candidate; nothing was deployed",
            hint=f"see {verdict}",
            exit_code=EXIT_GATE_REFUSED,
        )
    if result.exit_code:
        return no_verdict(_read_verdict(verdict), "the cycle stopped: eval gave no verdict", verdict)
    return None


def _read_verdict(path: Path) -> dict:
    """verdict.json, or {} when it is not there or not JSON (the error then says so generically)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
