"""`rlcycle distill`: trajectories.arrow + a reward spec to examples.arrow and reward_report.json."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def distill(
    trajectories: str = typer.Argument(
        ..., help="trajectories.arrow (or .parquet), or - for an Arrow stream on stdin."
    ),
    out: str = opt.out("examples.arrow (.parquet by extension; - for an Arrow stream on stdout)."),
    spec: Path = typer.Option(
        None, "--spec", help="Reward spec (TOML); default: every built-in signal with its defaults."
    ),
    report: str = typer.Option(
        None, "--report", help="Where reward_report.json goes (default: beside OUT; ./reward_report.json for -o -)."
    ),
    normalization: str = typer.Option(None, "--normalization", help="loo, mean_std or dr_grpo (default: loo)."),
    credit: str = typer.Option(None, "--credit", help="Episode rewards on all turns or the final turn (default: all)."),
    _help_config: bool = config_help.option("distill"),
    config: Path = opt.config(help="TOML config ([distill] table or top level); default: the spec's [distill] table."),
    set_: list[str] = opt.sets("min_group_size=4"),
    as_json: bool = opt.json_flag("Print the report as one JSON object on stdout."),
    quiet: bool = opt.quiet("No summary on stderr (warnings still print)."),
) -> None:
    """Turn trajectories into rewarded, advantage-normalised training examples.

    Each sample gets a reward from the signals of the reward spec (edit persistence, dissatisfied follow-ups,
    feedback, latency, tokens, invalid tool calls, tool errors, clarification shaping, correctness, custom ones),
    then an advantage against its group (same prompt, a column, or the batch). Writes OUT and reward_report.json
    beside it (per-policy-version rates and reward-hacking warnings, also on stderr). Rows are never dropped: rows
    that cannot teach are kept with weight 0 and an `excluded` reason.

    Examples:

      rlcycle distill runs/demo/trajectories.arrow -o runs/demo/examples.arrow --spec sample_data/rewards.toml

      rlcycle collect sample_data/events -o - | rlcycle distill - -o examples.arrow --json

      rlcycle distill traj.arrow -o ex.arrow --set normalization=mean_std --set group_keys=prompt,repo,batch
    """
    from rlcycle.config import resolve
    from rlcycle.distill import stage
    from rlcycle.distill.spec import load_spec

    reward_spec = load_spec(spec)
    # The spec's [distill] table is the config file layer unless --config names another.
    config_file = config if config is not None else (spec if reward_spec.distill else None)
    flags = {"normalization": normalization, "credit": credit}
    cfg = resolve(stage.DistillConfig, config_file, set_, flags, section="distill")
    # Reward-hacking warnings print even with --quiet: they are why the report exists.
    result = stage.STAGE.run(cfg, stage.DistillArgs(trajectories, out, reward_spec, report=report, quiet=False))
    output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg, summary=stage.format_summary(result))
