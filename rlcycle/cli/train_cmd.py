"""`rlcycle train`: examples + a base checkpoint to an updated checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from rlcycle.cli import config_help, output
from rlcycle.cli import options as opt


def train(
    examples: list[str] = typer.Argument(..., help="examples.arrow file(s) from distill (Arrow or Parquet)."),
    base: str = typer.Option(
        ...,
        "--base",
        help="Base checkpoint: a directory (HF format, with its tokenizer), a registry alias or a checkpoint id.",
    ),
    out: str = opt.out("Checkpoint directory to write."),
    _help_config: bool = config_help.option("train"),
    config: Path = opt.config("train"),
    set_: list[str] = opt.sets("lr=2e-6"),
    max_steps: int = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
    seed: int = typer.Option(None, "--seed", help="Seed of the data order and every RNG."),
    processes: int = typer.Option(1, "--processes", help="Processes on this machine (re-runs under torchrun)."),
    metrics: str = typer.Option(None, "--metrics", help="Write train_metrics.arrow here instead of OUT/."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it exists."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Ignore and remove saved state (OUT.state)."),
    as_json: bool = opt.json_flag(),
    quiet: bool = opt.quiet(),
) -> None:
    """Off-policy-corrected policy-gradient update of a causal LM on the logged token ids (never re-tokenised).

    Loss variants (--set objective=…): ppo, grpo, dr_grpo, cispo; importance ratios against the logged behaviour logprobs,
    token normalisation over the whole global batch. Writes OUT/ (HF checkpoint + tokenizer + rlcycle.json) and
    OUT/train_metrics.arrow. A killed run resumes from OUT.state when rerun. How it trains is the config's
    (`--set lr=2e-6`, objective, epochs, batch_size; `--help-config` lists every key).

    Examples:

      rlcycle train examples.arrow --base checkpoints/base -o runs/1/checkpoint

      rlcycle train examples.arrow --base ckpt -o out --config sample_data/train.toml --set objective=cispo
    --set lr=2e-6

      rlcycle train examples.arrow --base ckpt -o out --processes 2

      accelerate launch --config_file fsdp.yaml -m rlcycle train examples.arrow --base ckpt -o out
    """
    from rlcycle.train import launch

    if processes > 1 and not launch.in_launched_process():
        args = _relaunch_args(locals())
        raise typer.Exit(launch.spawn(processes, args))

    from rlcycle.config import resolve
    from rlcycle.errors import RlcycleError
    from rlcycle.train import STAGE, TrainArgs, TrainConfig
    from rlcycle.train.stage import format_summary

    _quiet_transformers()
    flags = {
        "max_steps": max_steps,
        "seed": seed,
        "resume": False if no_resume else None,
    }
    cfg = resolve(TrainConfig, config, set_, flags, section="train")
    args = TrainArgs(
        examples, base, out, metrics=metrics, overwrite=overwrite, quiet=quiet, registry=opt.registry_dir()
    )
    result = STAGE.run(cfg, args)
    if os.environ.get("RANK", "0") != "0":
        return
    if result.stopped:
        raise RlcycleError(
            f"train stopped after step {result.steps} of {result.steps_total} (stop_after={cfg.stop_after}); "
            "no checkpoint was written",
            hint="rerun the same command without stop_after to resume from the saved state",
        )
    # OUT is a checkpoint directory that saves its own config (rlcycle.json), so none is passed.
    output.finish(result, as_json=as_json, quiet=quiet, summary=format_summary(result))


def _relaunch_args(p: dict) -> list[str]:
    """The `train ...` arguments for the child processes (everything but --processes)."""
    args = ["train", *p["examples"], "--base", p["base"], "-o", p["out"]]
    for name, key in (
        ("--config", "config"),
        ("--max-steps", "max_steps"),
        ("--seed", "seed"),
        ("--metrics", "metrics"),
    ):
        if p[key] is not None:
            args += [name, str(p[key])]
    for item in p["set_"] or []:
        args += ["--set", item]
    for flag, key in (
        ("--overwrite", "overwrite"),
        ("--no-resume", "no_resume"),
        ("--json", "as_json"),
        ("--quiet", "quiet"),
    ):
        if p[key]:
            args.append(flag)
    return args


def _quiet_transformers() -> None:
    """transformers' per-file progress bars are noise in a training log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
