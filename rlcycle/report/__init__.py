"""report: one run directory in, one self-contained HTML file out.

In:  a run directory written by `rlcycle cycle` (run.json and a folder per stage; see
     rlcycle/cycle.py). Any stage may be missing: its section says why instead of failing.
Out: `RUN_DIR/report.html` (or `out`), written atomically: inline CSS and SVG charts, no
     script, nothing fetched, so it opens from a mail attachment or an artifact store; and a
     `ReportResult` naming the sections and whether each could be drawn.

    rlcycle report runs/cycle                       # writes runs/cycle/report.html
    rlcycle report runs/2026-12-02-10 -o /srv/www/latest.html --json
    rlcycle report runs/exp/v0/measure runs/exp/treatment/measure -o runs/exp/report.html

More run directories after the first add their trajectories to the online section, to compare
their policy versions with the first run's (online.py); every other section is the first run's.

Sections, in the order the data flows:
    run        run dir, base checkpoint, candidate, decision, stage timings (manifests)
    reward     reward parts per policy version (mean, share), the hack monitors and warnings
               (distill/reward_report.json, distill/examples.arrow)
    online     edit persistence, dissatisfied follow-ups, invalid tool calls, latency and
               explicit feedback per policy version with 95% CIs (collect/trajectories.arrow)
    eval       candidate vs baseline metrics, paired pass-rate difference, gates, per-cluster
               pass rates (eval/verdict.json, eval/eval_results.arrow)
    training   loss, KL, clip fraction, grad norm, ratio and throughput per step
               (train/checkpoint/train_metrics.arrow)
Every text that comes from the data is HTML-escaped (a follow-up message is user input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import __version__
from rlcycle import io as rio
from rlcycle.report import evaluation, header, online, rewards, training
from rlcycle.report.load import RunDir
from rlcycle.report.page import Section, page

REPORT_NAME = "report.html"
BUILDERS = (header.build, rewards.build, online.build, evaluation.build, training.build)


@dataclass
class ReportResult:
    report: str
    sections: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"report": self.report, "sections": self.sections}


def render(run_dir: str | Path, more: Sequence[str | Path] = ()) -> tuple[str, list[Section]]:
    """The HTML of a run directory's report, and its sections (nothing is written); `more`: run
    directories whose trajectories the online section adds (module docstring)."""
    run = RunDir(run_dir)
    others = [RunDir(p) for p in more]
    sections = [online.build(run, others) if build is online.build else build(run) for build in BUILDERS]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    name = run.path.resolve().name + (f" (+ {len(others)} run{'s' if len(others) > 1 else ''})" if others else "")
    html = page(
        f"rlcycle report: {name}",
        f"rlcycle report — {name}",
        sections,
        f"generated {now} by rlcycle {__version__} from {run.path.resolve()}",
    )
    return html, sections


def run(run_dir: str | Path, out: str | Path | None = None, more: Sequence[str | Path] = ()) -> ReportResult:
    """Render the report of `run_dir` (and `more`) and write it atomically to `out` (default
    RUN_DIR/report.html)."""
    html, sections = render(run_dir, more)
    target = Path(out) if out is not None else Path(run_dir) / REPORT_NAME
    rio.atomic_write_text(target, html)
    return ReportResult(str(target), [s.summary() for s in sections])
