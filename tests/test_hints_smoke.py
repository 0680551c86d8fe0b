"""The hinted arm end to end through the shipped CLI, on the packaged production logs and the tiny
default model (docs/hints.md): collect -> distill with hints -> train with the hint term.

The packaged logs' follow-ups include informative complaints ("no, revert that. src/... must
..."), so distill emits hints; train then scores the hinted teacher on the target turns and logs
the hint metrics. A few seconds; the SmolLM2 runs of the experiment are documented, not here."""

from __future__ import annotations

import json
from importlib import resources

import polars as pl


def test_hinted_arm_end_to_end(cli, tmp_path, one_thread):
    events = resources.files("rlcycle") / "data" / "events" / "events.jsonl"
    traj, ex, base = tmp_path / "trajectories.arrow", tmp_path / "examples.arrow", tmp_path / "policy"
    assert cli(["collect", str(events), "-o", traj, "-q"]).exit_code == 0
    r = cli(["distill", traj, "-o", ex, "--set", "hints.enabled=true", "--json", "-q"])
    assert r.exit_code == 0, r.output
    hints = json.loads(r.stdout)["hints"]
    assert hints["enabled"] and hints["accepted"] > 0 and hints["rejected_by_rule"] > 0
    df = pl.read_ipc(ex)
    hinted = df.filter(pl.col("hint").is_not_null())
    assert hinted.height == hints["accepted"]  # one target row per accepted episode
    assert hinted["episode_id"].n_unique() == hinted.height
    assert cli(["init-model", "-o", base, "--size", "tiny"]).exit_code == 0
    r = cli(
        ["train", ex, "--base", base, "-o", tmp_path / "ck", "--json", "--set", "max_policy_lag=-1"]
        + ["--set", "hints.coef=0.5", "--set", "batch_size=256", "--set", "max_steps=1", "--set", "lr=1e-5"]
    )
    assert r.exit_code == 0, r.output
    m = pl.read_ipc(json.loads(r.stdout)["metrics_path"]).row(0, named=True)
    assert m["hint_rows_frac"] > 0 and m["hint_tokens"] > 0
    for key in ("hint_gap_mean", "hint_gap_p99", "hint_clip_frac", "hint_loss", "hint_ngram_overlap"):
        assert m[key] is not None, key
    assert not m["skipped"]
