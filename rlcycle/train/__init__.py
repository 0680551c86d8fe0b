"""The train stage: an off-policy-corrected policy-gradient update on logged token ids.

`rlcycle.train.stage.run(config, examples, base, out)` is the library entry point; the modules,
in the order the data flows: config (TrainConfig), data (examples -> micro-batches), loss (the
objectives and their math), loop (Accelerate steps, resume), checkpoint (HF save + rlcycle.json),
launch (N processes via torchrun). Importing this package does not import torch, which is why
`TrainStage` (the stage object `rlcycle train` and `rlcycle cycle` both run, rlcycle/stage.py)
lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlcycle.stage import Outcome, RunLayout, StageContext, content_key
from rlcycle.train.config import TrainConfig

if TYPE_CHECKING:
    from rlcycle.train.stage import TrainResult

__all__ = ["STAGE", "TrainArgs", "TrainConfig", "TrainStage"]


@dataclass(frozen=True)
class TrainArgs:
    """What one train reads and writes: `run`'s arguments past the config."""

    examples: list[str]  # examples.arrow file(s) from distill
    base: str | Path  # the base: a checkpoint directory, registry alias or checkpoint id
    out: str | Path  # the checkpoint directory to write (its saved state: OUT.state)
    metrics: str | None = None  # default: OUT/train_metrics.arrow
    overwrite: bool = False  # replace OUT if it exists
    quiet: bool = False
    registry: str | Path | None = None  # the registry an alias or id in `base` resolves in


class TrainStage:
    """train as a stage: distill's examples on the base -> a checkpoint (resumable: a rerun
    continues its own optimizer state). torch is imported only when it really runs."""

    name = "train"
    config_class = TrainConfig
    cacheable, gate, publishes = True, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {"examples": content_key([ctx.layout.file("examples")], pending_ok=True), "base": ctx.base_id}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"checkpoint": layout.file("checkpoint")}

    def args(self, ctx: StageContext) -> TrainArgs:
        examples, out = ctx.layout.file("examples"), ctx.layout.file("checkpoint")
        return TrainArgs([str(examples)], ctx.base_path, out, overwrite=True, quiet=ctx.quiet)

    def run(self, config: TrainConfig, args: TrainArgs) -> TrainResult:
        from rlcycle.train.stage import run

        return run(
            config,
            args.examples,
            args.base,
            args.out,
            metrics_path=args.metrics,
            overwrite=args.overwrite,
            quiet=args.quiet,
            registry=args.registry,
        )

    def record(self, result: TrainResult) -> Outcome:
        from rlcycle.train.stage import format_summary

        return Outcome({"checkpoint_id": result.checkpoint_id, "steps": result.steps}, format_summary(result))


STAGE = TrainStage()
