"""`rlcycle simulate`: a policy on a task suite in sandboxes with a simulated user -> events."""

from __future__ import annotations

from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def simulate(
    policy: str = typer.Option(
        ...,
        "--policy",
        "-p",
        help="Checkpoint dir, registry alias, http(s) URL, or scripted:reference / scripted:nothing.",
    ),
    tasks: Path = typer.Option(..., "--tasks", "-t", help="Task suite directory."),
    out: str = opt.out("Events log to write (JSON lines), or - for stdout."),
    episodes: int = typer.Option(
        None, "--episodes", "-n", help="Sessions to run, cycling over the tasks (default: one per task)."
    ),
    seed: int = typer.Option(None, "--seed", help="Seed of sampling and of the simulated user (default 0)."),
    sandboxes: int = typer.Option(None, "--sandboxes", help="Sandboxes in the pool (default 4)."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="Tokenizer directory (needed for an http policy)."),
    executor: str = opt.executor(),
    ray_address: str = opt.ray_address(),
    _help_config: bool = config_help.option("simulate"),
    config: Path = opt.config("simulate"),
    set_: list[str] = opt.sets("runner.max_turns=4"),
    as_json: bool = opt.json_flag(),
    quiet: bool = opt.quiet(),
) -> None:
    """Run a policy as the coding agent on a task suite in Docker sandboxes while a simulated user answers questions,
    reacts and keeps or reverts edits. Writes production events (the schema collect reads) as JSON lines.

    --policy takes a checkpoint directory, a registry alias, an http(s) URL of an OpenAI-compatible server (with
    --tokenizer; URL#MODEL asks for a served name, or for the adapter of a registry alias:
    'http://127.0.0.1:8311#production'), or scripted:reference / scripted:nothing. A server's events log the
    checkpoint it serves as policy_version. How sessions run is the config's (`--set runner.max_turns=4`,
    runner.max_new_tokens, runner.temperature, runner.start; `--help-config` lists every key).

    Examples:

      rlcycle simulate --policy runs/demo/policy --tasks sample_data/tasks -n 40 -o sim.jsonl

      rlcycle simulate --policy scripted:reference --tasks sample_data/tasks -o ref.jsonl --json

      rlcycle simulate --policy http://127.0.0.1:8000 --tokenizer runs/demo/policy --tasks sample_data/tasks
    -o - | rlcycle collect - -o traj.arrow

      rlcycle simulate --policy scripted:reference --tasks sample_data/tasks -n 1000 --executor ray
    --ray-address auto -o sim.jsonl
    """
    from rlcycle.config import resolve
    from rlcycle.simulate import stage

    flags = {
        "episodes": episodes,
        "seed": seed,
        "sandboxes": sandboxes,
        "policy.tokenizer": tokenizer,
        **opt.rollout_flags(executor, ray_address),
    }
    cfg = resolve(stage.SimulateConfig, config, set_, flags, section="simulate")
    args = stage.SimulateArgs(policy, tasks, out, registry=opt.registry_dir(), quiet=quiet)
    result = stage.STAGE.run(cfg, args)
    # The config is saved beside the events, as collect and distill do; `collect DIR` skips it.
    output.finish(result, as_json=as_json, quiet=quiet, out=out, config=cfg, summary=stage.format_summary(result))
