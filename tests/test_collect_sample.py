"""collect on the bundled production log (sample_data/): the demo's first step, end to end."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
from conftest import SAMPLE

from rlcycle import schema


def test_sample_log_collects_cleanly(cli, tmp_path):
    out = tmp_path / "t.arrow"
    r = cli(["collect", SAMPLE / "events", SAMPLE / "otel", "-o", out, "--json", "-q"])
    assert r.exit_code == 0, r.error
    s = json.loads(r.stdout)
    assert s["quarantined"] == 0, s["quarantine_reasons"]
    assert s["episodes_out"] >= 2000 and s["duplicates"] > 0
    assert len(s["per_policy_version"]) >= 2
    assert {"email", "github_token", "openai_key", "url_password"} <= set(s["redactions"])
    df = pl.read_ipc(out)
    assert df.height == s["samples_out"]
    assert schema.validate(pa.ipc.open_file(str(out)).schema, schema.TRAJECTORIES) == []
    # token ids and logprobs line up, every episode has exactly one final turn
    assert (df["completion_ids"].list.len() == df["behavior_logprobs"].list.len()).all()
    assert df.group_by("episode_id").agg(pl.col("is_final_turn").sum())["is_final_turn"].eq(1).all()
    # the log has the signals distill needs
    assert df["n_invalid_tool_calls"].sum() > 0
    assert df["edit_lines_proposed"].is_not_null().sum() > 0
    assert df["followup_text"].is_not_null().sum() > 0 and df["feedback"].is_not_null().sum() > 0
    calls = df.select(pl.col("tool_calls").explode().struct.field("name")).to_series()
    assert "ask_user" in calls.to_list()


def test_sample_log_over_stdin_matches_files(cli, tmp_path):
    files = sorted((SAMPLE / "events").glob("*.jsonl"))[:3]
    ref = tmp_path / "ref.arrow"
    assert cli(["collect", *files, "-o", ref, "-q"]).exit_code == 0
    data = b"".join(f.read_bytes() for f in files)
    r = cli(["collect", "-", "-o", "-", "-q", "--quarantine", tmp_path / "q.jsonl"], input=data)
    assert r.exit_code == 0
    assert pa.ipc.open_stream(r.stdout_bytes).read_all().equals(pa.ipc.open_file(str(ref)).read_all())
