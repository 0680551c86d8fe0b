"""Several seeds of one design, pooled: each comparison of the experiment over all their sessions.

    python experiments/closed_loop/pool.py runs/smol_s2 runs/smol_s3 runs/smol_s4
    python experiments/closed_loop/pool.py runs/smol_s2 runs/smol_s3 --json

In:  finished run.py outputs (OUT/runs.json, and OUT/v0, OUT/treatment, OUT/control with their
     measure runs), one per seed, all of the same design.
Out: per suite (the training traffic: `measure`; the held-out tasks: `measure-heldout`) and
     comparison (treatment − v0, treatment − control, control − v0), each seed's paired
     difference and the pooled one, per metric, with 95% CIs; on stdout (`--json`: one object).

How: a seed's measure runs of v0, treatment's and control's last versions serve the same
sessions (the `pair_key`s, compare.py), so each comparison is a set of per-session pairs. The
pool concatenates the pairs of every seed (session keys prefixed by the seed's directory, so no
session of one seed pairs with another's) and computes the same paired difference
(rlcycle.online.paired_differences) over all of them.

What the pooled interval does and does not cover: it treats the sessions as the random units
and each seed's trained versions as given (a fixed-effect pool). It answers "over these seeds'
versions, is the difference real", not "would a new seed's training land there": with a handful
of seeds, how much training runs differ is read from the per-seed rows printed beside it, not
from an interval. It is a summary made after the runs, not the per-seed criterion of
docs/closed_loop.md section 6.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the checkout root (two folders up) on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import polars as pl  # noqa: E402
import typer  # noqa: E402

from experiments.closed_loop.compare import (  # noqa: E402
    HELDOUT,
    MEASURE,
    V0,
    Measured,
    _heldout_view,
    matched_sessions,
    measured_run,
    paired_cells,
)
from experiments.closed_loop.report import _scoring  # noqa: E402
from rlcycle import online  # noqa: E402
from rlcycle.errors import InputError  # noqa: E402
from rlcycle.stats import Estimate  # noqa: E402

C = pl.col
SUITES = {"traffic": MEASURE, "heldout": HELDOUT}
COMPARISONS = (("treatment", V0), ("treatment", "control"), ("control", V0))  # (b, a): b − a
RECORD = "runs.json"
NAMES = [*online.METRICS, "dissatisfied_truth"]  # every paired metric, the simulated user's labels too


def seed_facts(out: Path) -> dict[str, dict[str, Measured]]:
    """{suite: {version: measured run}} of one seed: v0 and the last version of each of the arms
    treatment and control that it ran."""
    path = out / RECORD
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="pass the --out directory of a finished run.py experiment")
    record = json.loads(path.read_text())
    arms = [a for a in ("treatment", "control") if a in record.get("arms", {})]
    if not record.get("v0") or not arms:
        raise InputError(
            f"{path}: no {'v0 measure run' if arms else 'arm treatment or control'} to compare",
            hint="pooling needs run.py's v0 measure run (--start) and the arms' measure runs",
        )
    scoring = _scoring(out / arms[0], record["arms"][arms[0]])
    suites: dict[str, dict[str, Measured]] = {}
    runs = {V0: record["v0"], **{a: record["arms"][a] for a in arms}}
    for suite, name in SUITES.items():
        view = (lambda r: r) if name == MEASURE else _heldout_view
        measured = {v: measured_run(out / v, view(r), scoring, name) for v, r in runs.items()}
        if any(m is None for m in measured.values()):
            if suite == "traffic":
                raise InputError(f"{out}: a version has no `{name}` run", hint="the seed did not finish")
            continue  # an experiment without --heldout
        suites[suite] = measured
    return suites


def _keyed(m: Measured, prefix: str) -> Measured:
    """The measured run with each session key of its facts and user labels prefixed by its seed."""
    key = pl.concat_str(pl.lit(f"{prefix}|"), C("session").cast(pl.String)).alias("session")
    return m[0], m[1].with_columns(key), m[2].with_columns(key)


def difference(pairs: list[tuple[Measured, Measured, str]]) -> tuple[dict[str, Estimate], int]:
    """b − a per metric over the matched sessions of every (a, b, seed) given: compare.py's
    paired cells on the seeds' sessions concatenated."""
    a = [_keyed(x, seed) for x, _, seed in pairs]
    b = [_keyed(y, seed) for _, y, seed in pairs]
    pa_, pb = ((None, pl.concat([m[1] for m in ms]), pl.concat([m[2] for m in ms])) for ms in (a, b))
    cells = paired_cells(pa_, pb, NAMES, {})
    return {k: c.diff for k, c in cells.items()}, matched_sessions(pa_, pb)


def pool(outs: list[Path]) -> dict[str, Any]:
    """Each seed's and the pooled paired differences (module docstring); a comparison appears
    when every seed ran both of its versions."""
    resolved = [o.resolve() for o in outs]
    if len(set(resolved)) < len(resolved):
        raise InputError(f"a seed directory is given twice: {' '.join(map(str, outs))}", hint="one per seed")
    seeds = {str(o): seed_facts(o) for o in outs}
    result: dict[str, Any] = {"seeds": list(seeds), "suites": {}}
    for suite in SUITES:
        have = {s: f[suite] for s, f in seeds.items() if suite in f}
        if not have:
            continue
        rows = {}
        for b, a in COMPARISONS:
            if not all(a in m and b in m for m in have.values()):
                continue
            per_seed = {s: difference([(m[a], m[b], s)]) for s, m in have.items()}
            pooled = difference([(m[a], m[b], s) for s, m in have.items()])
            rows[f"{b} - {a}"] = {
                "seeds": {s: {"n": n, "diff": _cells(d)} for s, (d, n) in per_seed.items()},
                "pooled": {"n": pooled[1], "diff": _cells(pooled[0])},
            }
        result["suites"][suite] = {"seeds": list(have), "comparisons": rows}
    return result


def _cells(d: dict[str, Estimate]) -> dict[str, dict[str, Any]]:
    return {k: {"value": e.value, "low": e.low, "high": e.high, "units": e.units} for k, e in d.items()}


def render(result: dict[str, Any], metric: str = "tests_pass_rate") -> str:
    label = online.METRICS[metric].title if metric in online.METRICS else metric
    lines = [
        f"{label}: paired differences in points (95% CI; sessions are the units); seeds {', '.join(result['seeds'])}"
    ]
    for suite, block in result["suites"].items():
        lines.append(f"\n{suite} ({len(block['seeds'])} seeds)")
        for comp, row in block["comparisons"].items():
            cells = [f"{Path(s).name} {_pts(c['diff'][metric])} (n {c['n']})" for s, c in row["seeds"].items()]
            lines.append(f"  {comp:22s} pooled {_pts(row['pooled']['diff'][metric])} (n {row['pooled']['n']})")
            lines.append(f"  {'':22s} " + "; ".join(cells))
    lines.append(
        "\nThe pooled interval holds each seed's trained versions fixed: it says whether these"
        " seeds' differences are real, not where a new seed would land (read the per-seed rows)."
    )
    return "\n".join(lines)


def _pts(c: dict[str, Any]) -> str:
    if c["value"] is None:
        return "-"
    if c["low"] is None:
        return f"{100 * c['value']:+.1f}"
    return f"{100 * c['value']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@app.command(
    help="Seeds of one design pooled: each comparison over all their sessions (docs/closed_loop.md).",
    context_settings={"help_option_names": ["-h", "--help"]},
)
def pooled(
    outs: list[Path] = typer.Argument(..., help="run.py --out directories, one per seed, of one design."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    metric: str = typer.Option("tests_pass_rate", "--metric", help="The metric the text shows (the JSON has all)."),
) -> None:
    result = pool(outs)
    typer.echo(json.dumps(result, indent=2) if as_json else render(result, metric))


def main(argv: list[str] | None = None) -> int:
    """The program's exit code with the CLI's conventions (rlcycle.cli.run_app): `Error:`/`Hint:`
    on stderr, exit 2 for bad input."""
    from rlcycle.cli import run_app

    return run_app(app, argv, "experiments/closed_loop/pool.py")


if __name__ == "__main__":
    sys.exit(main())
