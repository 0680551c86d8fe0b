"""The train stage: an off-policy-corrected policy-gradient update on logged token ids.

`rlcycle.train.stage.run(config, examples, base, out)` is the library entry point; the modules,
in the order the data flows: config (TrainConfig), data (examples -> micro-batches), loss (the
objectives and their math), loop (Accelerate steps, resume), checkpoint (HF save + rlcycle.json),
launch (N processes via torchrun). Importing this package does not import torch.
"""

from rlcycle.train.config import TrainConfig

__all__ = ["TrainConfig"]
