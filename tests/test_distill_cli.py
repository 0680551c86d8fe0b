"""distill through the real CLI: exact advantages, exclusions, hack monitors, determinism,
bad specs and input, pipes, and the sample production log end to end."""

# ruff: noqa: F811  (dcli is a pytest fixture imported from distill_data)
from __future__ import annotations

import json
import random

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from distill_data import T0, by_sample, call, dcli, distill, episode, read, write  # noqa: F401
from events_factory import many

from rlcycle import schema
from rlcycle.schema import TRAJECTORIES

FEEDBACK = "[signals.explicit_feedback]\nweight = 1.0\ncap = 1.0\n"


def feedback_rows() -> list[dict]:
    """Four episodes on one prompt (a GRPO group) and two on prompts of their own (-> batch)."""
    rows = []
    for i, fb in enumerate([1.0, 0.5, 0.0, -0.5]):
        rows += episode(
            f"G{i}",
            [{"feedback": fb, "feedback_scope": "sample"}],
            prompt=[5, 5, 5],
            session_id=f"g{i}",
            start=T0 + i * 1000,
        )
    for i, fb in enumerate([1.0, -1.0]):
        rows += episode(
            f"B{i}",
            [{"feedback": fb, "feedback_scope": "sample"}],
            prompt=[6 + i],
            session_id=f"b{i}",
            start=T0 + 9000 + i * 1000,
        )
    return rows


@pytest.mark.parametrize(
    "norm, expected",
    [
        # group G: rewards 1, .5, 0, -.5, mean .25; group "batch": B rewards 1, -1, mean 0.
        # loo: n/(n-1) * (r - mean): 4/3 * (.75, .25, -.25, -.75); batch 2/1 * (1, -1).
        ("loo", [1.0, 1 / 3, -1 / 3, -1.0, 2.0, -2.0]),
        # mean_std: (r - mean) / (std + 1e-4), std with ddof 1: G sqrt(1.25 / 3) = 0.645497,
        # batch sqrt(2) = 1.414214.
        (
            "mean_std",
            [0.75 / 0.645597, 0.25 / 0.645597, -0.25 / 0.645597, -0.75 / 0.645597, 1 / 1.414314, -1 / 1.414314],
        ),
        # dr_grpo: r - mean.
        ("dr_grpo", [0.75, 0.25, -0.25, -0.75, 1.0, -1.0]),
    ],
)
def test_exact_advantages(dcli, tmp_path, norm, expected):
    df, rep = distill(dcli, tmp_path, feedback_rows(), FEEDBACK, "--normalization", norm)
    assert df["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    keys = df["group_key"].to_list()
    assert keys[0].startswith("prompt:") and len(set(keys[:4])) == 1 and keys[4:] == ["batch", "batch"]
    assert rep["normalization"] == norm and rep["groups"]["by_source"] == {"batch": 1, "prompt": 1}
    meta = pa.ipc.open_file(str(tmp_path / "out" / "examples.arrow")).schema.metadata
    assert meta[b"rlcycle.normalization"] == norm.encode() and meta[b"rlcycle.schema"] == b"examples"
    assert df["weight"].to_list() == [1.0] * 6 and df["excluded"].null_count() == 6


def test_flat_groups_and_other_exclusions(dcli, tmp_path):
    bad = {"tool_calls": [call("x", "invalid")]}
    rows = (
        episode("Z0", 1, prompt=[4, 4], session_id="a")
        + episode("Z1", 1, prompt=[4, 4], session_id="b")
        + episode("I0", [bad], prompt=[3, 3], session_id="c")
        + episode("I1", [bad], prompt=[3, 3], session_id="d")
        + episode("M0", [bad], prompt=[2, 2], session_id="e")
        + episode("M1", 1, prompt=[2, 2], session_id="f")
        + episode("E0", [{"completion_ids": [], "behavior_logprobs": []}], prompt=[2, 2], session_id="g")
    )
    df, rep = distill(dcli, tmp_path, rows, "[signals.invalid_tool_call]\nweight = -1.0\n")
    excluded = by_sample(df, "excluded")
    # Z: rewards 0, 0: flat, excluded. I: -1, -1: flat too, but invalid calls are never
    # excluded. M: -1, 0: teaches. E0: no completion tokens, in no baseline.
    assert excluded == {
        "Z0-t0": "flat_group",
        "Z1-t0": "flat_group",
        "I0-t0": None,
        "I1-t0": None,
        "M0-t0": None,
        "M1-t0": None,
        "E0-t0": "no_completion",
    }
    assert by_sample(df, "weight") == {k: (0.0 if v else 1.0) for k, v in excluded.items()}
    assert by_sample(df, "advantage")["I0-t0"] == 0.0 and by_sample(df, "advantage")["E0-t0"] is None
    assert by_sample(df, "advantage")["M0-t0"] == -1.0  # loo, n = 2: 2 * (-1 - (-0.5))
    assert rep["excluded"] == {"flat_group": 2, "no_completion": 1}
    assert rep["groups"]["flat"] == 2 and rep["groups"]["flat_samples"] == 4
    assert df.height == len(rows)  # nothing dropped
    # without exclusion, and with prompt groups only (the lone episode has no group then)
    df2, rep2 = distill(
        dcli,
        tmp_path,
        rows + episode("L", 1, prompt=[1], session_id="h"),
        "[signals.invalid_tool_call]\nweight = -1.0\n",
        "--set",
        "exclude_flat_groups=false",
        "--set",
        "group_keys=prompt",
    )
    assert rep2["excluded"] == {"no_completion": 1, "no_group": 1}
    assert by_sample(df2, "excluded")["L-t0"] == "no_group" and by_sample(df2, "group_key")["L-t0"] is None


def test_permute_rewards_shuffles_rewards_and_parts_together(dcli, tmp_path):
    """The control arm's shuffle: the same (reward, parts) tuples, assigned to other samples,
    never to a sample without a completion; deterministic for a seed."""
    spec = FEEDBACK + "[signals.invalid_tool_call]\nweight = -1.0\n"
    rows = feedback_rows() + episode("E0", [{"completion_ids": [], "behavior_logprobs": []}], session_id="e")
    rows[1]["tool_calls"], rows[1]["n_invalid_tool_calls"] = [call("x", "invalid")], 1
    base, _ = distill(dcli, tmp_path / "a", rows, spec)
    runs = {
        seed: distill(
            dcli, tmp_path / f"p{seed}", rows, spec, "--set", "permute_rewards=true", "--set", f"permute_seed={seed}"
        )
        for seed in (0, 1)
    }
    cols = ["reward", "part_explicit_feedback", "part_invalid_tool_call"]

    def tuples(df):  # (reward, parts) per sample with a completion
        return [tuple(r) for r in df.filter(pl.col("completion_ids").list.len() > 0).select(cols).iter_rows()]

    for seed, (df, rep) in runs.items():
        assert sorted(tuples(df)) == sorted(tuples(base))  # same multiset of (reward, parts)
        assert tuples(df) != tuples(base)  # ... a different assignment
        assert by_sample(df, "reward")["E0-t0"] == by_sample(base, "reward")["E0-t0"]  # never moved
        assert by_sample(df, "excluded")["E0-t0"] == "no_completion"
        assert any("permute_rewards" in n for n in rep["notes"]) and rep["config"]["permute_seed"] == seed
        r = df.get_column("reward").to_numpy()
        parts = df.select(cols[1:]).to_numpy().sum(axis=1)
        assert r == pytest.approx(parts)  # reward is still the sum of its parts, row by row
    assert tuples(runs[0][0]) != tuples(runs[1][0])  # the seed picks the shuffle
    again, _ = distill(dcli, tmp_path / "p0b", rows, spec, "--set", "permute_rewards=true")
    assert tuples(again) == tuples(runs[0][0])  # and the same seed the same one


def test_discard_invalid_excludes_instead_of_penalising(dcli, tmp_path):
    """The naive arm: a sample with an invalid call is dropped (weight 0, in no baseline)."""
    bad = {"tool_calls": [call("x", "invalid")], "feedback": -1.0, "feedback_scope": "sample"}
    good = {"feedback": 1.0, "feedback_scope": "sample"}
    rows = (
        episode("A", [bad], prompt=[3], session_id="a")
        + episode("B", [good], prompt=[3], session_id="b")
        + episode("C", [{"feedback": 0.0, "feedback_scope": "sample"}], prompt=[3], session_id="c")
    )
    spec = FEEDBACK + "[signals.invalid_tool_call]\nweight = -1.0\n"
    penalised, _ = distill(dcli, tmp_path / "a", rows, spec)
    naive, rep = distill(dcli, tmp_path / "b", rows, spec, "--set", "discard_invalid=true")
    assert by_sample(penalised, "excluded") == {"A-t0": None, "B-t0": None, "C-t0": None}
    assert by_sample(penalised, "advantage")["A-t0"] < 0  # a negative example
    assert by_sample(naive, "excluded") == {"A-t0": "discarded_invalid", "B-t0": None, "C-t0": None}
    assert by_sample(naive, "weight") == {"A-t0": 0.0, "B-t0": 1.0, "C-t0": 1.0}
    # B and C alone form the baseline: loo, n = 2: 2 * (1 - 0.5), 2 * (0 - 0.5)
    assert by_sample(naive, "advantage") == {"A-t0": None, "B-t0": 1.0, "C-t0": -1.0}
    assert rep["excluded"] == {"discarded_invalid": 1}


def versions(invalid: tuple[int, int], asks: tuple[int, int], edits: tuple[int, int], n: int = 40) -> list[dict]:
    """Two policy versions, n one-turn episodes each: how many emit an invalid call, ask, edit."""
    rows = []
    for v, version in enumerate(("policy-old", "policy-new")):
        for i in range(n):
            calls = [call("apply_patch")] if i < edits[v] else []
            calls += [call("run_shell", "invalid")] if i >= n - invalid[v] else []
            calls += [call("ask_user")] if edits[v] <= i < edits[v] + asks[v] else []
            rows += episode(
                f"{version}-{i}",
                [{"tool_calls": calls}],
                policy_version=version,
                session_id=f"{version}-{i}",
                start=T0 + v * 3_600_000 + i * 1000,
                prompt=[v, i],
            )
    return rows


def test_both_reward_hacks_trip_warnings(dcli, tmp_path):
    # hack 1: invalid calls 1/40 -> 12/40; hack 2: questions 2/40 -> 16/40, edits 32/40 -> 18/40
    rows = versions(invalid=(1, 12), asks=(2, 16), edits=(32, 18))
    src = write(tmp_path / "t.arrow", rows)
    out = tmp_path / "ex.arrow"
    r = dcli(["distill", src, "-o", out, "--json"])
    assert r.exit_code == 0, r.output + r.error
    report = json.loads(r.stdout)
    assert [h["hack"] for h in report["hacks"]] == ["invalid_tool_calls", "clarify_instead_of_edit"]
    assert all((h["from"], h["to"]) == ("policy-old", "policy-new") for h in report["hacks"])
    moved = {w["metric"] for w in report["warnings"]}
    assert {"invalid_tool_call_rate", "clarification_rate", "edit_rate"} <= moved
    new = report["per_policy_version"]["policy-new"]
    assert (new["invalid_tool_call_rate"], new["clarification_rate"], new["edit_rate"]) == (0.3, 0.4, 0.45)
    assert report["version_order"] == ["policy-old", "policy-new"]  # by first sample
    assert "possible reward hack" in r.stderr and "asking instead of editing" in r.stderr
    assert json.loads((tmp_path / "reward_report.json").read_text())["hacks"] == report["hacks"]
    # the invalid calls are penalised on their samples, none excluded for it
    df = read(out)
    bad = df.filter(pl.col("n_invalid_tool_calls") > 0)
    assert bad.height == 13 and bad["excluded"].null_count() == 13 and (bad["part_invalid_tool_call"] == -1).all()


def test_steady_versions_raise_no_warning(dcli, tmp_path):
    src = write(tmp_path / "t.arrow", versions(invalid=(2, 2), asks=(2, 2), edits=(30, 30)))
    r = dcli(["distill", src, "-o", tmp_path / "ex.arrow", "--json", "--quiet"])
    report = json.loads(r.stdout)
    assert report["warnings"] == [] and report["hacks"] == [] and "warning" not in r.stderr


def test_deterministic_and_independent_of_row_order(dcli, tmp_path):
    rows = versions(invalid=(1, 3), asks=(2, 4), edits=(20, 25), n=12) + feedback_rows()
    for r in rows[::3]:
        r["followup_text"] = "no, revert that"
    src = write(tmp_path / "t.arrow", rows)
    outs = []
    for name in ("a", "b"):
        r = dcli(["distill", src, "-o", tmp_path / name / "ex.arrow", "--quiet"])
        assert r.exit_code == 0, r.error
        outs.append((tmp_path / name / "ex.arrow").read_bytes())
    assert outs[0] == outs[1]
    # Shuffled rows (episodes no longer contiguous): the same numbers for every sample.
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    src2 = write(tmp_path / "s.arrow", shuffled)
    assert dcli(["distill", src2, "-o", tmp_path / "c" / "ex.arrow", "--quiet"]).exit_code == 0
    a, b = read(tmp_path / "a" / "ex.arrow"), read(tmp_path / "c" / "ex.arrow")
    for col in ("reward", "advantage", "group_key", "excluded"):
        assert by_sample(a, col) == by_sample(b, col), col


def test_bad_spec_lists_every_problem(dcli, tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text(
        "[signals.latncy]\nweight = -1.0\n"
        "[signals.explicit_feedback]\ncap = -0.2\n"
        '[signals.invalid_tool_call]\nwieght = -1.0\ntransform = "cube"\n'
        '[signals.mine]\nfn = "no_such_module:f"\n'
        "[signalz]\n"
    )
    src = write(tmp_path / "t.arrow", episode("E", 1))
    r = dcli(["distill", src, "-o", tmp_path / "ex.arrow", "--spec", spec])
    assert r.exit_code == 2
    for needle in (
        "6 problem(s)",
        "[signals.latncy] unknown signal (did you mean 'latency'?)",
        "cap=-0.2",
        "unknown key 'wieght' (did you mean 'weight'?)",
        "transform='cube'",
        "no_such_module",
        "unknown top-level key 'signalz' (did you mean 'signals'?)",
    ):
        assert needle in r.error, (needle, r.error)
    assert not (tmp_path / "ex.arrow").exists()


def test_bad_config_and_input(dcli, tmp_path):
    src = write(tmp_path / "t.arrow", episode("E", 1))
    r = dcli(
        [
            "distill",
            src,
            "-o",
            tmp_path / "ex.arrow",
            "--set",
            "normalization=zscore",
            "--set",
            "credit=some",
            "--set",
            "group_keyz=batch",
        ]
    )
    assert r.exit_code == 2
    assert "unknown key 'group_keyz' (did you mean 'group_keys'?)" in r.error
    r = dcli(["distill", src, "-o", tmp_path / "ex.arrow", "--set", "normalization=zscore", "--set", "credit=some"])
    assert r.exit_code == 2 and "2 problem(s)" in r.error and "normalization='zscore'" in r.error
    # a file that is not trajectories: every missing column listed
    thin = tmp_path / "thin.arrow"
    pa.ipc.new_file(str(thin), pa.schema([("sample_id", pa.string())])).close()
    r = dcli(["distill", thin, "-o", tmp_path / "ex.arrow"])
    assert r.exit_code == 2 and "missing column 'episode_id'" in r.error and "missing column 'tool_calls'" in r.error
    # an examples file is not raw trajectories
    assert dcli(["distill", src, "-o", tmp_path / "ex.arrow", "-q"]).exit_code == 0
    r = dcli(["distill", tmp_path / "ex.arrow", "-o", tmp_path / "ex2.arrow"])
    assert r.exit_code == 2 and "'examples' file" in r.error


def test_pipe_from_collect_and_stream_out(dcli, tmp_path, monkeypatch):
    lines = "".join(json.dumps(e) + "\n" for e in many(6)).encode()
    r = dcli(
        ["collect", "-", "-o", "-", "--as-of", "2026-12-02T00:00:00Z", "--quiet", "--quarantine", tmp_path / "q.jsonl"],
        input=lines,
    )
    assert r.exit_code == 0, r.error
    n = pa.ipc.open_stream(r.stdout_bytes).read_all().num_rows
    r2 = dcli(["distill", "-", "-o", tmp_path / "ex.arrow", "--quiet"], input=r.stdout_bytes)
    assert r2.exit_code == 0, r2.output + r2.error
    assert pa.ipc.open_file(str(tmp_path / "ex.arrow")).read_all().num_rows == n
    # -o -: an Arrow stream on stdout, the report where --report says (default: cwd)
    monkeypatch.chdir(tmp_path)
    r3 = dcli(["distill", "-", "-o", "-", "--quiet"], input=r.stdout_bytes)
    assert r3.exit_code == 0, r3.error
    table = pa.ipc.open_stream(r3.stdout_bytes).read_all()
    assert table.num_rows == n and schema.validate(table, schema.EXAMPLES) == []
    assert json.loads((tmp_path / "reward_report.json").read_text())["rows"] == n


def test_outputs_read_back_by_polars_and_duckdb(dcli, tmp_path):
    df, rep = distill(dcli, tmp_path, feedback_rows(), FEEDBACK)
    path = tmp_path / "out" / "examples.arrow"
    table = pa.ipc.open_file(str(path)).read_all()
    assert schema.validate(table, schema.EXAMPLES) == []
    # every trajectory column is kept, extension columns too
    assert set(TRAJECTORIES.schema.names) <= set(table.column_names)
    con = duckdb.connect()
    con.register("ex", table)
    got = con.execute("select sum(reward), count(*), count(excluded) from ex").fetchone()
    assert got[0] == pytest.approx(df["reward"].sum()) and got[1:] == (6, 0)
    assert rep["rows"] == 6 and rep["included"] == 6
    assert json.loads((tmp_path / "out" / "examples.arrow.config.json").read_text())["normalization"] == "loo"


def test_sample_production_log_end_to_end(dcli, tmp_path):
    from conftest import SAMPLE

    traj = tmp_path / "traj.arrow"
    r = dcli(["collect", SAMPLE / "events", "-o", traj, "--as-of", "2026-12-02T00:00:00Z", "--quiet"])
    assert r.exit_code == 0, r.error
    out = tmp_path / "ex.arrow"
    r = dcli(["distill", traj, "-o", out, "--spec", SAMPLE / "rewards.toml", "--json"])
    assert r.exit_code == 0, r.output + r.error
    report = json.loads(r.stdout)
    n = pa.ipc.open_file(str(traj)).read_all().num_rows
    assert report["rows"] == n and pa.ipc.open_file(str(out)).read_all().num_rows == n
    # the newer policy asks more and edits less: the second hack of docs/design.md is flagged
    assert [h["hack"] for h in report["hacks"]] == ["clarify_instead_of_edit"]
    older, newer = (report["per_policy_version"][v] for v in report["version_order"])
    assert older["invalid_tool_call_rate"] > newer["invalid_tool_call_rate"]
    assert older["invalid_rate_failed"] > older["invalid_rate_other"]  # broken calls on failures
    assert report["signals"]["dissatisfied_followup"]["share"] <= 0.5 + 1e-6  # its cap


def test_help_has_examples(dcli):
    r = dcli(["distill", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.stdout and "--spec" in r.stdout


def test_spec_distill_table_and_precedence(dcli, tmp_path):
    spec = '[distill]\nnormalization = "dr_grpo"\n\n' + FEEDBACK
    _, rep = distill(dcli, tmp_path, feedback_rows(), spec)
    assert rep["normalization"] == "dr_grpo"  # the spec's [distill] table
    _, rep = distill(dcli, tmp_path, feedback_rows(), spec, "--set", "normalization=mean_std")
    assert rep["normalization"] == "mean_std"  # --set over the file
    _, rep = distill(dcli, tmp_path, feedback_rows(), spec, "--set", "normalization=mean_std", "--normalization", "loo")
    assert rep["normalization"] == "loo"  # a flag over --set


def test_no_spec_means_every_builtin(dcli, tmp_path):
    src = write(tmp_path / "t.arrow", feedback_rows())
    r = dcli(["distill", src, "-o", tmp_path / "ex.arrow", "--quiet"])
    assert r.exit_code == 0, r.error
    from rlcycle.distill.signals import BUILTINS

    names = [f.name for f in pa.ipc.open_file(str(tmp_path / "ex.arrow")).schema.field("reward_parts").type]
    assert names == list(BUILTINS)
