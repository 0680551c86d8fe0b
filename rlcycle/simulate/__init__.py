"""simulate: a policy on a task suite with a simulated user -> production events (`rlcycle simulate`).

A stage like the others (collect/, distill/, ...): the stage itself is rlcycle/simulate/stage.py
(SimulateConfig, run, SimulateResult, format_summary), re-exported here.

    from rlcycle.simulate import SimulateConfig, run
"""

from rlcycle.simulate.stage import SimulateConfig, SimulateResult, format_summary, run

__all__ = ["SimulateConfig", "SimulateResult", "format_summary", "run"]
