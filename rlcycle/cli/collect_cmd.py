"""`rlcycle collect`: production event logs to trajectories.arrow."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def collect(
    events: list[str] = typer.Argument(..., help="Event logs: files, directories, globs, or - for stdin."),
    out: str = opt.out("trajectories.arrow (.parquet by extension; - for an Arrow stream on stdout)."),
    policy_version: list[str] = typer.Option(
        None, "--policy-version", help="Keep only this policy version (repeatable)."
    ),
    since: str = typer.Option(None, "--since", help="Keep episodes starting at or after this RFC 3339 time."),
    until: str = typer.Option(None, "--until", help="Keep episodes starting before this RFC 3339 time."),
    maturity: float = typer.Option(
        None, "--maturity", help="Seconds an episode with edit outcomes still due is held back (default 21600)."
    ),
    as_of: str = typer.Option(None, "--as-of", help="'Now' for the maturity rule (RFC 3339; default: the clock)."),
    strict: bool = typer.Option(
        None, "--strict", help="Fail (exit 2) on the first bad record instead of quarantining it."
    ),
    quarantine: str = typer.Option(None, "--quarantine", help="Where bad records go (default: OUT.quarantine.jsonl)."),
    no_redact: bool = typer.Option(False, "--no-redact", help="Do not redact secrets (for logs already scrubbed)."),
    executor: str = opt.executor(
        "local (default: join here) or ray (one Ray task per partition, same output; docs/collect.md)."
    ),
    ray_address: str = opt.ray_address(),
    _help_config: bool = config_help.option("collect"),
    config: Path = opt.config("collect"),
    set_: list[str] = opt.sets("maturity_s=3600"),
    as_json: bool = opt.json_flag(),
    quiet: bool = opt.quiet(),
) -> None:
    """Read production event logs into trajectories (one row per model sample, with its tool results, edit outcomes,
    follow-up and feedback joined).

    Reads files, directories, globs and - (stdin) as JSON lines (.gz too), Arrow, Parquet or OpenTelemetry GenAI
    spans (OTLP/JSON). Bad records go to OUT.quarantine.jsonl (or fail with --strict, exit 2).

    Examples:

      rlcycle collect sample_data/events -o runs/demo/trajectories.arrow

      rlcycle collect 'logs/2026-11-30T*.jsonl' --policy-version policy-b -o traj.arrow --json

      cat events.jsonl | rlcycle collect - -o - | rlcycle inspect -

      rlcycle collect /shared/logs -o /shared/runs/c1/trajectories.arrow --executor ray --ray-address auto
    """
    from rlcycle.collect import stage
    from rlcycle.config import resolve

    flags = {
        "policy_versions": policy_version or None,
        "since": since,
        "until": until,
        "maturity_s": maturity,
        "as_of": as_of,
        "strict": strict,
        "redact": False if no_redact else None,
        "executor": executor,
        "ray_address": ray_address,
    }
    cfg = resolve(stage.CollectConfig, config, set_, flags, section="collect")
    result = stage.STAGE.run(cfg, stage.CollectArgs(events, out, quarantine=quarantine, quiet=quiet))
    output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg, summary=stage.format_summary(result))
