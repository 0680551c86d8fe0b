"""collect: production event logs (JSON lines, Arrow, Parquet, OTel) -> trajectories.arrow.

    from rlcycle.collect import CollectConfig, run
    result = run(CollectConfig(), ["sample_data/events"], "trajectories.arrow")

Modules, top to bottom: stage.py (the two passes: partition, then join) over sources.py (find
inputs, dispatch by format), one reader per format (jsonl.py, arrow.py, otel.py), events.py (the
event model and its rules), join.py (events -> one row per sample) and redact.py (secrets).
docs/collect.md documents every option.
"""

from rlcycle.collect.stage import (
    CollectConfig,
    CollectResult,
    default_quarantine_path,
    parse_time,
    run,
)

__all__ = ["CollectConfig", "CollectResult", "default_quarantine_path", "parse_time", "run"]
