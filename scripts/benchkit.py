"""The shared harness of scripts/bench_*.py: one `--runs`, medians, a ratio to a named baseline.

In: a bench's measurements, one `Table` per comparison: named sides, each with one sample per
run (seconds, tokens/s, ...), one side named as the baseline measured in the same run.
Out: on stdout, either the common printed table (medians, min, max, ratio to the baseline) and
the bench's notes, or, with `--json`, one JSON object:

    {"bench": "bench_eval", "runs": 3, "machine": {"cpus": 2, "load_avg": [...]},
     "tables": [{"title": ..., "metric": "tasks/min", "baseline": "concurrency 1",
                 "higher_is_better": true,
                 "rows": [{"side": ..., "median": ..., "min": ..., "max": ...,
                           "samples": [...], "ratio": ...}]}],
     "notes": [...], "extra": {...}}

`ratio` is always median(side) / median(baseline) of the table's metric; `higher_is_better`
says which way is good. Progress goes to stderr (`progress`), so `--json` output stays one
object. Scripts sit outside the package: this module imports no rlcycle internals.

    import benchkit
    ap = benchkit.parser(__doc__, runs=3)          # adds --runs and --json
    args = ap.parse_args()
    seconds, result = benchkit.timed(fn, x)
    t = benchkit.Table("eval", "tasks/min", baseline="c=1", samples={"c=1": [...], "c=4": [...]})
    benchkit.emit(args, "bench_eval", [t], notes=["..."])
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any


def parser(doc: str | None, runs: int, runs_help: str = "repetitions; medians are reported") -> argparse.ArgumentParser:
    """An ArgumentParser with the options every bench shares: `--runs N` and `--json`."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=positive, default=runs, help=f"{runs_help} (default {runs})")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress stays on stderr)")
    return ap


def positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def progress(*parts: object) -> None:
    """A progress line on stderr (never stdout: that holds the result)."""
    print(*parts, file=sys.stderr, flush=True)


def timed(fn, *args, **kwargs) -> tuple[float, Any]:
    """(wall seconds, fn's result) of one call."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


@dataclass
class Process:
    """One finished subprocess: wall seconds, peak RSS (MB, from wait4), exit code, output."""

    seconds: float
    rss_mb: float
    returncode: int
    stdout: str
    stderr: str


def run_process(cmd: list[str], env: dict[str, str] | None = None, cwd=None) -> Process:
    """Run `cmd` to the end, timing it and reading its peak RSS; stdout/stderr captured."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(), err.read().decode()
    return Process(wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), text, errors)


def summary(samples: list[float]) -> dict[str, float]:
    """Median, min and max of one side's samples."""
    if not samples:
        raise ValueError("no samples")
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


@dataclass
class Table:
    """One comparison: sides measured in the same run, each a list of samples (one per run)."""

    title: str
    metric: str  # what a sample is, with its unit: "tokens/s", "seconds", "p50 ms"
    baseline: str  # the side the ratios are taken against; must be in samples
    samples: dict[str, list[float]] = field(default_factory=dict)
    higher_is_better: bool = True

    def rows(self) -> list[dict]:
        if self.baseline not in self.samples:
            raise KeyError(f"baseline {self.baseline!r} not among the sides {list(self.samples)}")
        base = summary(self.samples[self.baseline])["median"]
        out = []
        for side, xs in self.samples.items():
            s = summary(xs)
            ratio = s["median"] / base if base else float("nan")
            out.append({"side": side, **s, "samples": list(xs), "ratio": ratio})
        return out

    def as_dict(self) -> dict:
        return {
            "title": self.title,
            "metric": self.metric,
            "baseline": self.baseline,
            "higher_is_better": self.higher_is_better,
            "rows": self.rows(),
        }


def result(name: str, runs: int, tables: list[Table], notes=(), extra: dict | None = None) -> dict:
    """The JSON object `--json` prints."""
    return {
        "bench": name,
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "load_avg": list(os.getloadavg())},
        "tables": [t.as_dict() for t in tables],
        "notes": list(notes),
        "extra": extra or {},
    }


def render(res: dict) -> str:
    """The common printed table: one block per Table, then the notes and the machine's load."""
    lines = []
    for t in res["tables"]:
        better = "higher" if t["higher_is_better"] else "lower"
        lines.append(f"{t['title']}  [{t['metric']}, {better} is better; ratio = side / {t['baseline']}]")
        width = max(24, *(len(r["side"]) for r in t["rows"]))
        lines.append(f"  {'side':<{width}} {'median':>11} {'min':>11} {'max':>11} {'ratio':>8}")
        for r in t["rows"]:
            lines.append(
                f"  {r['side']:<{width}} {_num(r['median'])} {_num(r['min'])} {_num(r['max'])} {r['ratio']:>7.2f}x"
            )
    lines += res["notes"]
    m = res["machine"]
    lines.append(f"(median of {res['runs']} run(s); {m['cpus']} CPUs, load average {m['load_avg'][0]:.1f} at the end)")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:>11.4g}" if abs(x) < 1e5 else f"{x:>11,.0f}"


def emit(args: argparse.Namespace, name: str, tables: list[Table], notes=(), extra: dict | None = None) -> dict:
    """Print the result: one JSON object with `--json`, else the table. Returns the object."""
    res = result(name, args.runs, tables, notes, extra)
    print(json.dumps(res) if args.json else render(res), flush=True)
    return res


def skip(args: argparse.Namespace, name: str, reason: str) -> int:
    """A bench that cannot run here (no vLLM, ...): the reason on stderr, with `--json` an object
    saying so on stdout; exit code 0, so `scripts/dev.sh bench` goes on to the next bench."""
    progress(f"{name}: skipped: {reason}")
    if args.json:
        print(json.dumps({"bench": name, "skipped": reason}), flush=True)
    return 0
