"""Hand-made trajectory rows for the distill tests (the `trajectories` contract, tiny).

`episode(...)` builds the samples of one episode the way collect writes them: turns in order,
the follow-up and episode feedback copied onto every sample, `is_final_turn` on the last one.
`write(path, rows)` conforms them to the contract and writes an Arrow file. Also home to the
custom signal and follow-up classifier that the tests load by dotted path.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from rlcycle import io as rio
from rlcycle.schema import TOOL_CALL, TRAJECTORIES, conform

T0 = 1_796_033_700_000  # 2026-11-30T10:15:00Z in epoch ms


def call(name: str, status: str | None = "ok") -> dict:
    return {"call_id": f"c-{name}-{status}", "name": name, "arguments": "{}", "status": status}


def sample(sid: str, ep: str, turn: int, **kw) -> dict:
    """One sample; keyword arguments override the defaults below (trajectory column names)."""
    row = {
        "sample_id": sid,
        "episode_id": ep,
        "session_id": "s1",
        "turn": turn,
        "policy_version": "pa",
        "ts": T0 + turn * 1000,
        "prompt_ids": [1, 2, 3],
        "completion_ids": [7, 8],
        "behavior_logprobs": [-0.5, -0.25],
        "tool_calls": [],
        "n_invalid_tool_calls": 0,
        "n_tool_errors": 0,
        "edit_lines_proposed": None,
        "edit_lines_surviving": None,
        "edit_outcomes_missing": 0,
        "followup_text": None,
        "feedback": None,
        "feedback_scope": None,
        "feedback_kind": None,
        "latency_ms": 1000.0,
        "is_final_turn": False,
        "temperature": 1.0,
        "n_turns": 1,
    }
    row.update(kw)
    row["n_invalid_tool_calls"] = kw.get(
        "n_invalid_tool_calls", sum(c["status"] == "invalid" for c in row["tool_calls"])
    )
    return row


def episode(
    ep: str,
    turns: list[dict] | int = 1,
    start: int = T0,
    followup: str | None = None,
    feedback: float | None = None,
    prompt: list[int] | None = None,
    **shared,
) -> list[dict]:
    """The samples of one episode: `turns` is a count or one dict of overrides per turn."""
    per_turn = [{} for _ in range(turns)] if isinstance(turns, int) else turns
    rows = []
    for t, extra in enumerate(per_turn):
        kw = {**shared, **extra}
        if t == 0 and prompt is not None:
            kw.setdefault("prompt_ids", prompt)
        if feedback is not None and "feedback" not in extra:
            kw.update(feedback=feedback, feedback_scope="episode", feedback_kind="thumbs")
        rows.append(
            sample(
                f"{ep}-t{t}",
                ep,
                t,
                ts=start + t * 1000,
                followup_text=followup,
                is_final_turn=t == len(per_turn) - 1,
                n_turns=len(per_turn),
                **kw,
            )
        )
    return rows


def table(rows: list[dict], extra: dict[str, pa.DataType] | None = None) -> pa.Table:
    """Rows as a `trajectories` table (plus `extra` columns, e.g. tests_passed)."""
    fields = [pa.field(f.name, f.type) for f in TRAJECTORIES.schema]
    fields += [pa.field(n, t) for n, t in (extra or {}).items()]
    cols = {f.name: [r.get(f.name) for r in rows] for f in fields}
    cols["ts"] = [pa.scalar(v, pa.timestamp("ms", tz="UTC")) for v in cols["ts"]]
    arrays = [pa.array(cols[f.name], f.type if f.name != "tool_calls" else pa.list_(TOOL_CALL)) for f in fields]
    return conform(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), TRAJECTORIES)


def write(path: Path, rows: list[dict], extra: dict[str, pa.DataType] | None = None) -> Path:
    rio.write_table(table(rows, extra), path)
    return path


def read(path: Path) -> pl.DataFrame:
    """An examples file with its reward parts unnested as part_<signal> columns."""
    df = pl.read_ipc(path)
    parts = df.get_column("reward_parts").struct.unnest()
    return df.with_columns(parts.rename({c: f"part_{c}" for c in parts.columns}))


def by_sample(df: pl.DataFrame, column: str) -> dict[str, float]:
    return dict(zip(df.get_column("sample_id").to_list(), df.get_column(column).to_list(), strict=True))


# --- running the CLI ---------------------------------------------------------------------------


@pytest.fixture
def dcli(cli):
    """The real CLI (the shared `cli` fixture); kept under this name for the distill tests."""
    return cli


def distill(dcli, tmp_path: Path, rows: list[dict], spec: str, *args, extra=None):
    """Write rows and a spec, run distill; return (examples with part_* columns, report)."""
    src = write(tmp_path / "traj.arrow", rows, extra)
    spec_path = tmp_path / "rewards.toml"
    spec_path.write_text(spec)
    out = tmp_path / "out" / "examples.arrow"
    r = dcli(["distill", src, "-o", out, "--spec", spec_path, "--quiet", *args])
    assert r.exit_code == 0, r.output + r.error
    return read(out), json.loads((out.parent / "reward_report.json").read_text())


# --- loaded by dotted path in the tests ------------------------------------------------------


def turn_bonus(frame: pl.DataFrame, scale: float = 1.0) -> pl.Series:
    """A custom signal: `scale` per turn index (turn 0 earns nothing)."""
    return frame.get_column("turn").cast(pl.Float64) * scale


def shouty_classifier(texts: list[str]) -> list[float]:
    """A follow-up 'classifier': all caps is a complaint, anything else satisfied."""
    return [-1.0 if t.isupper() else 1.0 for t in texts]
