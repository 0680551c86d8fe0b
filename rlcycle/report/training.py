"""The training section: per-step curves from `train/checkpoint/train_metrics.arrow`.

One row per optimizer step (schema: rlcycle/train/stage.py TRAIN_METRICS_SCHEMA). Skipped steps
(non-finite loss or gradient) keep their row with the flag set; they are listed, and their
values are left out of the curves so that one NaN does not hide the rest.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from rlcycle.report import svg
from rlcycle.report.load import RunDir, Unavailable
from rlcycle.report.page import Raw, Section, charts, dl, join, section, table, tag

CHARTS = (  # (title, columns)
    ("Loss", ("loss", "pg_loss", "kl_loss")),
    ("KL", ("kl_ref", "mismatch_kl")),
    ("Clip fraction", ("clip_frac", "clip_frac_low", "clip_frac_high")),
    ("Gradient norm", ("grad_norm",)),
    ("Importance ratio", ("ratio_mean", "ratio_min", "ratio_max")),
    ("Throughput (tokens/s)", ("tokens_per_s",)),
)
SUMMARY = (
    "loss",
    "pg_loss",
    "kl_ref",
    "mismatch_kl",
    "ess",
    "clip_frac",
    "ratio_mean",
    "grad_norm",
    "lr",
    "tokens",
    "padding_fraction",
    "tokens_per_s",
    "step_seconds",
    "peak_memory_gb",
)
NOTES = {
    "peak_memory_gb": "peak so far: CPU the trainer process's RSS, CUDA the allocator's; the host's "
    "other tenants (a vLLM server) are not in it",
    "kl_ref": "KL to the frozen base (only with kl_coef > 0)",
    "mismatch_kl": "KL(sampler ‖ trainer) over loss tokens; large at step 1 means the examples' logprobs "
    "do not match the base (another checkpoint, tempered logprobs, a template drift)",
}


def build(run: RunDir) -> Section:
    return section("training", "Training curves", (_body, (run,)))


def _body(run: RunDir) -> Raw:
    wanted = sorted({c for _, cols in CHARTS for c in cols} | set(SUMMARY))
    frame = run.table("train_metrics", ["step"], optional=(*wanted, "skipped"))
    if frame.height == 0:
        raise Unavailable("train_metrics.arrow has no rows (no optimizer step ran)")
    frame = frame.sort("step")
    skipped = (
        frame.get_column("skipped").fill_null(False)
        if "skipped" in frame.columns
        else pl.Series([False] * frame.height)
    )
    steps = frame.get_column("step").to_list()
    figures = [_chart(title, cols, frame, steps, skipped) for title, cols in CHARTS]
    notes = [f"{k}: {v}." for k, v in NOTES.items()]
    if skipped.any():
        notes.insert(0, "Dashed vertical lines: skipped steps (non-finite loss or gradient; no update was made).")
    return join(
        [_facts(run, frame, skipped), charts(*figures), _summary(frame, skipped), *(tag("p", n, "note") for n in notes)]
    )


def _facts(run: RunDir, frame: pl.DataFrame, skipped: pl.Series) -> Raw:
    cfg = (run.manifest("train") or {}).get("config") or {}
    bad = frame.filter(skipped).get_column("step").to_list()
    items: list[tuple[str, Any]] = [
        ("steps", f"{frame.height} ({len(bad)} skipped{': ' + ', '.join(map(str, bad[:20])) if bad else ''})"),
    ]
    if cfg:
        items.append(
            (
                "objective",
                f"{cfg.get('objective', '?')}, lr {cfg.get('lr', '?')}, batch size "
                f"{cfg.get('batch_size', '?')}, kl_coef {cfg.get('kl_coef', '?')}",
            )
        )
    if "tokens" in frame.columns:
        items.append(("tokens", f"{int(frame.get_column('tokens').fill_null(0).sum()):,}"))
    return dl(items)


def _values(frame: pl.DataFrame, col: str, skipped: pl.Series) -> list[float | None]:
    if col not in frame.columns:
        return []
    vals = frame.get_column(col).cast(pl.Float64).to_list()
    return [None if s or v is None or not math.isfinite(v) else v for v, s in zip(vals, skipped.to_list(), strict=True)]


def _chart(title: str, cols: tuple[str, ...], frame: pl.DataFrame, steps: list, skipped: pl.Series) -> str:
    series = [svg.Series(c, _values(frame, c, skipped)) for c in cols if c in frame.columns]
    marks = [s for s, bad in zip(steps, skipped.to_list(), strict=True) if bad]
    return svg.line_chart(title, steps, series, marks=marks)


def _summary(frame: pl.DataFrame, skipped: pl.Series) -> Raw:
    rows = []
    for col in SUMMARY:
        vals = [v for v in _values(frame, col, skipped) if v is not None]
        if not vals:
            continue
        rows.append(
            [
                col,
                svg.num(vals[0]),
                svg.num(vals[-1]),
                svg.num(sum(vals) / len(vals)),
                svg.num(min(vals)),
                svg.num(max(vals)),
            ]
        )
    return join(
        [
            tag("h3", "Per-step metrics (steps that were not skipped)"),
            table(["metric", "first", "last", "mean", "min", "max"], rows),
        ]
    )
