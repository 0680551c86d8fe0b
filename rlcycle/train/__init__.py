"""The train stage: an off-policy-corrected policy-gradient update on logged token ids.

`rlcycle.train.stage.run(config, examples, base, out)` is the library entry point; the modules,
in the order the data flows: config (TrainConfig), data (examples -> micro-batches), loss (the
objectives and their math), loop (Accelerate steps, resume), checkpoint (HF save + rlcycle.json),
launch (N processes via torchrun). Importing this package does not import torch, which is why
`TrainStage` (the stage as `rlcycle cycle` runs it, rlcycle/stage.py) lives here.
"""

from pathlib import Path

from rlcycle.stage import Outcome, RunLayout, StageContext, content_key
from rlcycle.train.config import TrainConfig

__all__ = ["STAGE", "TrainConfig", "TrainStage"]


class TrainStage:
    """The cycle's train: distill's examples on the pinned base -> a checkpoint (resumable: a
    rerun continues its own optimizer state). torch is imported only when it really runs."""

    name = "train"
    config_class = TrainConfig
    cacheable, gate, publishes = True, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {"examples": content_key([ctx.layout.file("examples")], pending_ok=True), "base": ctx.base_id}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"checkpoint": layout.file("checkpoint")}

    def run(self, config: TrainConfig, ctx: StageContext) -> Outcome:
        from rlcycle.train.stage import format_summary, run

        examples, out = ctx.layout.file("examples"), ctx.layout.file("checkpoint")
        r = run(config, str(examples), ctx.base_path, out, overwrite=True, quiet=ctx.quiet)
        return Outcome({"checkpoint_id": r.checkpoint_id, "steps": r.steps}, format_summary(r))


STAGE = TrainStage()
