"""`rlcycle train`: examples + a base checkpoint to an updated checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from rlcycle import console

HELP = (
    "Off-policy-corrected policy-gradient update of a causal LM on the logged token ids "
    "(never re-tokenised).\n\n"
    "Loss variants (--objective): ppo, grpo, dr_grpo, cispo; importance ratios against the "
    "logged behaviour logprobs, token normalisation over the whole global batch. Writes OUT/ "
    "(HF checkpoint + tokenizer + rlcycle.json) and OUT/train_metrics.arrow. A killed run "
    "resumes from OUT.state when rerun.\n\n"
    "Examples:\n\n"
    "  rlcycle train examples.arrow --base checkpoints/base -o runs/1/checkpoint\n\n"
    "  rlcycle train examples.arrow --base ckpt -o out --config sample_data/train.toml "
    "--set objective=cispo --set lr=2e-6\n\n"
    "  rlcycle train examples.arrow --base ckpt -o out --processes 2\n\n"
    "  accelerate launch --config_file fsdp.yaml -m rlcycle.train.launch train examples.arrow --base ckpt -o out"
)


def register(app: typer.Typer) -> None:
    @app.command("train", help=HELP)
    def train(
        examples: list[str] = typer.Argument(..., help="examples.arrow file(s) from distill (Arrow or Parquet)."),
        base: str = typer.Option(..., "--base", help="Base checkpoint directory (HF format, with its tokenizer)."),
        out: str = typer.Option(..., "-o", "--out", help="Checkpoint directory to write."),
        config: Path = typer.Option(None, "--config", help="TOML config ([train] table or top level)."),
        set_: list[str] = typer.Option(None, "--set", help="Override a config key: --set lr=2e-6 (repeatable)."),
        objective: str = typer.Option(None, "--objective", help="ppo, grpo, dr_grpo or cispo."),
        lr: float = typer.Option(None, "--lr", help="Peak learning rate."),
        epochs: int = typer.Option(None, "--epochs", help="Passes over the examples."),
        batch_size: int = typer.Option(None, "--batch-size", help="Rows per optimizer step (global)."),
        max_steps: int = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
        seed: int = typer.Option(None, "--seed", help="Seed of the data order and every RNG."),
        processes: int = typer.Option(1, "--processes", help="Processes on this machine (re-runs under torchrun)."),
        metrics: str = typer.Option(None, "--metrics", help="Write train_metrics.arrow here instead of OUT/."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it exists."),
        no_resume: bool = typer.Option(False, "--no-resume", help="Ignore and remove saved state (OUT.state)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or summary on stderr."),
    ) -> None:
        from rlcycle.train import launch

        if processes > 1 and not launch.in_launched_process():
            args = _relaunch_args(locals())
            raise typer.Exit(launch.spawn(processes, args))

        from rlcycle.config import resolve
        from rlcycle.errors import RlcycleError
        from rlcycle.train import stage
        from rlcycle.train.config import TrainConfig

        _quiet_transformers()
        flags = {"objective": objective, "lr": lr, "epochs": epochs, "batch_size": batch_size,
                 "max_steps": max_steps, "seed": seed, "resume": False if no_resume else None}  # fmt: skip
        cfg = resolve(TrainConfig, config, set_, flags, section="train")
        result = stage.run(cfg, examples, base, out, metrics_path=metrics, overwrite=overwrite, quiet=quiet)
        if os.environ.get("RANK", "0") != "0":
            return
        if result.stopped:
            raise RlcycleError(
                f"train stopped after step {result.steps} of {result.steps_total} (stop_after={cfg.stop_after}); "
                "no checkpoint was written",
                hint="rerun the same command without stop_after to resume from the saved state",
            )
        if as_json:
            console.print_json(result.as_dict())
        if not quiet:
            console.info(format_summary(result))


def _relaunch_args(p: dict) -> list[str]:
    """The `train ...` arguments for the child processes (everything but --processes)."""
    args = ["train", *p["examples"], "--base", p["base"], "-o", p["out"]]
    for opt, key in (("--config", "config"), ("--objective", "objective"), ("--lr", "lr"),
                     ("--epochs", "epochs"), ("--batch-size", "batch_size"), ("--max-steps", "max_steps"),
                     ("--seed", "seed"), ("--metrics", "metrics")):  # fmt: skip
        if p[key] is not None:
            args += [opt, str(p[key])]
    for item in p["set_"] or []:
        args += ["--set", item]
    for flag, key in (("--overwrite", "overwrite"), ("--no-resume", "no_resume"), ("--json", "as_json"),
                      ("--quiet", "quiet")):  # fmt: skip
        if p[key]:
            args.append(flag)
    return args


def _quiet_transformers() -> None:
    """transformers' per-file progress bars are noise in a training log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def format_summary(r) -> str:
    s = r.summary
    lines = [
        f"train: {r.steps} steps ({len(r.skipped_steps)} skipped) on {r.world_size} process(es) in {r.seconds:.1f}s"
        + (f", resumed from step {r.resumed_from}" if r.resumed_from else ""),
        f"  rows           {r.rows_used:,} used of {r.rows_in:,}",
    ]
    for reason, n in sorted(r.dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {n:>8,}  dropped: {reason}")
    lines += [
        f"  tokens         {s.get('tokens', 0):,} ({s.get('loss_tokens', 0):,} trained on), "
        f"{_g(s.get('tokens_per_s_mean'))} tokens/s, padding {_g(s.get('padding_fraction_mean'))}",
        f"  loss           first {_g(s.get('loss_first'))}, last {_g(s.get('loss_last'))}",
        f"  off-policy     ratio {_g(s.get('ratio_mean_mean'))}, mismatch KL {_g(s.get('mismatch_kl_mean'))}, "
        f"ESS {_g(s.get('ess_mean'))}, clip {_g(s.get('clip_frac_mean'))}, IS-capped {_g(s.get('is_frac_mean'))}",
        f"  checkpoint     {r.output} (id {_short(r.checkpoint_id)}, parent {_short(r.parent_id)})",
        f"  metrics        {r.metrics_path}",
    ]
    return "\n".join(lines)


def _short(cid: str | None) -> str:
    """sha256:0123456789ab... -> sha256:0123456789ab (12 hex digits)."""
    if not cid:
        return "-"
    head, sep, tail = cid.rpartition(":") if ":" in cid else ("", "", cid)
    return f"{head}{sep}{tail[:12]}"


def _g(x) -> str:
    return "-" if x is None else f"{x:.4g}"
