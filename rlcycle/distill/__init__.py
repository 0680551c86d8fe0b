"""distill: trajectories + a reward spec -> rewarded, advantage-normalised training examples.

    from rlcycle.distill import DistillConfig, load_spec, run
    result = run(DistillConfig(), "trajectories.arrow", "examples.arrow", load_spec("rewards.toml"))

The stage reads top to bottom in stage.py; docs/distill.md documents every signal and key.
"""

from rlcycle.distill.spec import RewardSpec, SignalSpec, default_spec, load_spec, parse_spec
from rlcycle.distill.stage import DistillConfig, DistillResult, format_summary, run

__all__ = [
    "DistillConfig",
    "DistillResult",
    "RewardSpec",
    "SignalSpec",
    "default_spec",
    "format_summary",
    "load_spec",
    "parse_spec",
    "run",
]
