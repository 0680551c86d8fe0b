"""`rlcycle cycle`: the whole loop in one run directory (rlcycle/cycle.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from rlcycle.cli import config_help
from rlcycle.cli import options as opt
from rlcycle.cli.eval_cmd import no_verdict
from rlcycle.errors import EXIT_GATE_REFUSED, RlcycleError


def register(app: typer.Typer) -> None:
    @app.command(
        "cycle",
        help=(
            "Chain simulate (or collect from logs), distill, train, eval and deploy in one run directory. "
            "Stages whose inputs and config are unchanged are skipped; a crashed cycle resumes at its first "
            "unfinished stage; one cycle runs at a time. Exit 3 when the eval gate refused "
            "(nothing deployed).\n\n"
            "Every stage table defaults to that stage's production defaults. `--config demo` is the "
            "packaged demo (rlcycle/configs/demo.toml: small sizes, and the tiny default model as "
            "production when the registry is empty); without it an empty registry is an error (exit 2).\n\n"
            "Examples:\n\n"
            "  rlcycle cycle --config demo\n\n"
            "  rlcycle cycle --config cycle.toml --run-dir runs/$(date +%F-%H) --json\n\n"
            "  rlcycle cycle --config cycle.toml --plan\n\n"
            "  rlcycle cycle --run-dir runs/c1 --from train --force"
        ),
    )
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
        from rlcycle import cycle as stage
        from rlcycle.stage import RunLayout

        cfg = stage.load_config(config, set_, {"run_dir": run_dir, "source": source, "events": events or None})
        if cfg.registry_home is None:  # the CLI's default home (rlcycle/cli/options.py)
            cfg = dataclasses.replace(cfg, registry_home=str(opt.home()))
        if plan:
            opt.emit_json(dataclasses.asdict(cfg))
            return
        result = stage.Cycle(
            cfg, force=force, dry_run=dry_run, from_stage=from_stage, until_stage=until_stage, quiet=quiet
        ).run()
        if as_json:
            opt.emit_json(result.as_dict())
        else:
            typer.echo(stage.format_summary(result))
        verdict = RunLayout(cfg.run_dir).file("verdict")
        if result.exit_code == EXIT_GATE_REFUSED:
            raise RlcycleError(
                "the eval gate refused the candidate; nothing was deployed",
                hint=f"see {verdict}",
                exit_code=EXIT_GATE_REFUSED,
            )
        if result.exit_code:  # the gate stage gave no verdict: say why, from the verdict itself
            raise no_verdict(_read_verdict(verdict), "the cycle stopped: eval gave no verdict", verdict)


def _read_verdict(path: Path) -> dict:
    """verdict.json, or {} when it is not there or not JSON (the error then says so generically)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
