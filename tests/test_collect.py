"""collect through the real CLI on tiny hand-made events: joins, filters, maturity, outputs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from events_factory import T0, episode, iso, many, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcycle import schema
from rlcycle.prompts import with_full_prompts

AS_OF = "2026-12-02T00:00:00Z"


def collect(cli, *args):
    return cli(["collect", *args, "--as-of", AS_OF, "--quiet"])


def test_joins_every_signal(cli, tmp_path):
    src = write_jsonl(tmp_path / "ev.jsonl", episode("ep1", turns=2, feedback=-0.5, invalid=True))
    out = tmp_path / "t.arrow"
    r = collect(cli, src, "-o", out, "--json")
    assert r.exit_code == 0, r.output + r.error
    summary = json.loads(r.stdout)
    assert summary["samples_out"] == 2 and summary["episodes_out"] == 1
    df = pl.read_ipc(out).sort("turn")
    first, last = df.row(0, named=True), df.row(1, named=True)
    assert first["edit_lines_proposed"] == 4 and first["edit_lines_surviving"] == 3
    assert first["n_invalid_tool_calls"] == 1 and last["n_invalid_tool_calls"] == 1
    assert [c["status"] for c in first["tool_calls"]] == ["ok", "invalid"]
    assert first["followup_text"] == "thanks, works"
    assert first["feedback"] == -0.5 and first["feedback_scope"] == "episode"
    assert (first["is_final_turn"], last["is_final_turn"]) == (False, True)
    assert first["behavior_logprobs"] == [-0.5, -0.25, -1.0]
    assert last["prompt_ids"] is None and last["prompt_parent"] == first["sample_id"]  # stored once
    whole = pl.from_arrow(with_full_prompts(out)).sort("turn")
    assert whole["prompt_ids"].to_list() == [[1, 2, 3], [1, 2, 3, 10, 11, 12, 7]]
    assert schema.validate(pa.ipc.open_file(str(out)).schema, schema.TRAJECTORIES) == []


def test_tool_calls_keep_the_completions_order_then_results_it_did_not_list_by_time(cli, tmp_path):
    """A sample's calls in the order its completion listed them (whatever order the results
    came in), then results for call ids it never listed, oldest first; every sample of the
    episode keeps its own calls."""
    events = episode("ep1", turns=2, invalid=True)  # turn 0: write_file, run_shell; turn 1: run_shell, finish
    by_id = {e["event_id"]: e for e in events}
    for sid, offsets in (("ep1-s0", (900, 700)), ("ep1-s1", (100, 50))):
        for k, (call, dt) in enumerate(zip(("late", "early"), offsets, strict=True)):
            events.append(
                {
                    "event_id": f"{sid}-{call}-r",
                    "type": "tool_result",
                    "ts": iso(T0 + (2000 if sid.endswith("s1") else 0) + dt),
                    "session_id": "s1",
                    "sample_id": sid,
                    "call_id": f"{sid}-{call}",
                    "status": ["ok", "error"][k],
                }
            )
    by_id["ep1-s0-c0-r"]["ts"] = iso(T0 + 800)  # the listed calls' results out of order
    random.Random(3).shuffle(events)
    out = tmp_path / "t.arrow"
    assert collect(cli, write_jsonl(tmp_path / "ev.jsonl", events), "-o", out).exit_code == 0
    df = pl.read_ipc(out).sort("turn")
    calls = [[(c["call_id"].split("-", 2)[2], c["status"]) for c in row] for row in df["tool_calls"].to_list()]
    assert calls == [
        [("c0", "ok"), ("bad", "invalid"), ("early", "error"), ("late", "ok")],
        [("bad", "invalid"), ("fin", "ok"), ("early", "error"), ("late", "ok")],
    ]
    assert df["n_tool_errors"].to_list() == [1, 1]


def test_pair_key_is_carried_per_sample_and_null_without_one(cli, tmp_path):
    """A completion's optional `pair_key` (simulate writes one: the same session across
    versions) becomes the sample's `pair_key`; a log without one gives nulls, no error."""
    keyed = episode("ep1", session="s1", turns=2)
    for e in keyed:
        if e["type"] == "completion":
            e["pair_key"] = "s900-task-a0"
    src = write_jsonl(tmp_path / "ev.jsonl", keyed + episode("ep2", session="s2", turns=1))
    out = tmp_path / "t.arrow"
    assert collect(cli, src, "-o", out).exit_code == 0
    df = pl.read_ipc(out).sort("episode_id", "turn")
    assert df.get_column("pair_key").to_list() == ["s900-task-a0", "s900-task-a0", None]
    assert schema.validate(pa.ipc.open_file(str(out)).schema, schema.TRAJECTORIES) == []


def test_outputs_read_back_by_polars_and_duckdb(cli, tmp_path):
    src = write_jsonl(tmp_path / "ev.jsonl", many(6))
    out = tmp_path / "t.arrow"
    assert collect(cli, src, "-o", out).exit_code == 0
    pq_out = tmp_path / "t.parquet"
    assert collect(cli, src, "-o", pq_out).exit_code == 0
    lazy = pl.scan_ipc(out).group_by("policy_version").agg(pl.len()).sort("policy_version").collect()
    con = duckdb.connect()
    duck = con.execute(
        f"select policy_version, count(*) from read_parquet('{pq_out}') group by 1 order by 1"
    ).fetchall()
    arrow_table = pa.ipc.open_file(str(out)).read_all()  # an independent reader of the .arrow
    con.register("traj", arrow_table)
    via_arrow = con.execute("select policy_version, count(*) from traj group by 1 order by 1").fetchall()
    assert [tuple(r) for r in lazy.iter_rows()] == duck == via_arrow
    assert pa.ipc.open_file(str(out)).read_all().num_rows == pq.read_table(pq_out).num_rows == sum(n for _, n in duck)


def test_stdin_in_and_stream_out(cli, tmp_path):
    lines = "".join(json.dumps(e) + "\n" for e in many(4))
    r = cli(
        ["collect", "-", "-o", "-", "--as-of", AS_OF, "--quiet", "--quarantine", tmp_path / "q.jsonl"],
        input=lines.encode(),
    )
    assert r.exit_code == 0, r.error
    table = pa.ipc.open_stream(r.stdout_bytes).read_all()
    assert table.num_rows == sum(1 for e in many(4) if e["type"] == "completion")
    # and the stream pipes into inspect
    r2 = cli(["inspect", "-", "--json"], input=r.stdout_bytes)
    assert json.loads(r2.stdout)["contract"] == "trajectories"


def test_reads_directories_globs_arrow_parquet_and_gzip(cli, tmp_path):
    import gzip

    evs = many(6)
    half = len(evs) // 2
    d = tmp_path / "logs"
    write_jsonl(d / "a.jsonl", evs[:half])
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in evs[half:])
    ref = tmp_path / "ref.arrow"
    assert collect(cli, d, "-o", ref).exit_code == 0
    # the same events as Arrow and Parquet files, read by glob
    (tmp_path / "x").mkdir()
    pl.read_ndjson(d / "a.jsonl").write_ipc(tmp_path / "x" / "a.arrow")
    pl.read_ndjson(gzip.open(d / "b.jsonl.gz")).write_parquet(tmp_path / "x" / "b.parquet")
    out = tmp_path / "t.arrow"
    assert collect(cli, str(tmp_path / "x" / "*"), "-o", out).exit_code == 0
    assert pl.read_ipc(out).drop("ts").equals(pl.read_ipc(ref).drop("ts"))


def test_filters_policy_version_and_time_window(cli, tmp_path):
    src = write_jsonl(tmp_path / "ev.jsonl", many(6))
    out = tmp_path / "t.arrow"
    r = collect(cli, src, "-o", out, "--policy-version", "policy-a", "--json")
    assert set(pl.read_ipc(out)["policy_version"]) == {"policy-a"}
    assert json.loads(r.stdout)["filtered_samples"] > 0
    r = collect(cli, src, "-o", out, "--since", iso(T0 + 200_000), "--until", iso(T0 + 400_000))
    assert sorted(set(pl.read_ipc(out)["episode_id"])) == ["ep2", "ep3"]


def test_maturity_holds_back_episodes_with_outcomes_due(cli, tmp_path):
    evs = episode("late", outcome=False) + episode("done", session="s2", start_ms=T0 + 10)
    src = write_jsonl(tmp_path / "ev.jsonl", evs)
    out = tmp_path / "t.arrow"
    soon = iso(T0 + 60_000)  # one minute after: the edit outcome of "late" may still come
    r = cli(["collect", src, "-o", out, "--as-of", soon, "--json", "--quiet"])
    s = json.loads(r.stdout)
    assert s["held_back_episodes"] == 1 and s["held_back_samples"] == 2
    assert set(pl.read_ipc(out)["episode_id"]) == {"done"}
    # a week later the outcome is not coming: the episode is written, the missing outcome counted
    r = cli(["collect", src, "-o", out, "--as-of", AS_OF, "--json", "--quiet"])
    df = pl.read_ipc(out).filter(pl.col("episode_id") == "late", pl.col("turn") == 0)
    assert df["edit_outcomes_missing"].to_list() == [1] and df["edit_lines_proposed"].to_list() == [None]


def test_dedupes_by_event_id_and_counts(cli, tmp_path):
    evs = episode("ep1")
    src = write_jsonl(tmp_path / "ev.jsonl", evs + evs[:3])
    r = collect(cli, src, "-o", tmp_path / "t.arrow", "--json")
    assert json.loads(r.stdout)["duplicates"] == 3
    assert pl.read_ipc(tmp_path / "t.arrow").height == 2


def test_redacts_secrets_and_counts(cli, tmp_path):
    evs = episode("ep1", followup="my key is sk-abcdefghijklmnopqrstuvwxyz123456, mail a@b.io")
    evs[0]["tool_calls"][0]["arguments"] = json.dumps(
        {"path": "x", "content": "url = 'https://u:hunter2@db.example.com'"}
    )
    src = write_jsonl(
        tmp_path / "ev.jsonl",
        evs,
        ['{"event_id": "bad", "type": "completion", "text": "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB"'],
    )
    r = collect(cli, src, "-o", tmp_path / "t.arrow", "--json")
    s = json.loads(r.stdout)
    assert s["redactions"] == {"email": 1, "github_token": 1, "openai_key": 1, "url_password": 1}
    written = (tmp_path / "t.arrow").read_bytes() + (tmp_path / "t.arrow.quarantine.jsonl").read_bytes()
    for secret in (b"sk-abcdefghij", b"hunter2", b"a@b.io", b"ghp_abcdef"):
        assert secret not in written


def test_otel_spans_become_completions(cli, tmp_path):
    span = {
        "traceId": "t1",
        "spanId": "sp1",
        "name": "chat m",
        "startTimeUnixNano": str(T0 * 1_000_000),
        "endTimeUnixNano": str((T0 + 250) * 1_000_000),
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.conversation.id", "value": {"stringValue": "sess"}},
            {"key": "gen_ai.response.id", "value": {"stringValue": "samp"}},
            {"key": "gen_ai.request.model", "value": {"stringValue": "policy-x"}},
            {"key": "rlcycle.prompt_ids", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"intValue": "2"}]}}},
            {"key": "rlcycle.completion_ids", "value": {"arrayValue": {"values": [{"intValue": "3"}]}}},
            {"key": "rlcycle.completion_logprobs", "value": {"arrayValue": {"values": [{"doubleValue": -0.5}]}}},
        ],
    }
    tool_span = {
        "traceId": "t1",
        "spanId": "sp2",
        "name": "execute_tool",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}}],
    }
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": [span, tool_span]}]}]}
    (tmp_path / "spans.json").write_text(json.dumps(doc, indent=2))
    r = collect(cli, tmp_path / "spans.json", "-o", tmp_path / "t.arrow", "--json")
    assert r.exit_code == 0, r.error
    row = pl.read_ipc(tmp_path / "t.arrow").row(0, named=True)
    assert (row["sample_id"], row["session_id"], row["policy_version"], row["turn"]) == ("samp", "sess", "policy-x", 0)
    assert row["completion_ids"] == [3] and row["latency_ms"] == 250.0
    assert json.loads(r.stdout)["quarantined"] == 1  # the tool span is counted, not dropped


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), split=st.integers(1, 5), parts=st.sampled_from([1, 4]))
def test_shuffled_event_order_gives_identical_trajectories(tmp_path_factory, seed, split, parts):
    from conftest import run_cli

    tmp = tmp_path_factory.mktemp("shuffle")
    evs = many(8)
    evs += [dict(e) for e in evs[:5]]  # duplicates, re-logged later
    ref = tmp / "ref.arrow"
    write_jsonl(tmp / "ref" / "a.jsonl", evs)
    assert run_cli(["collect", tmp / "ref", "-o", ref, "--as-of", AS_OF, "-q"]).exit_code == 0
    shuffled = list(evs)
    random.Random(seed).shuffle(shuffled)
    size = len(shuffled) // split + 1
    for i in range(split):  # spread over several files too
        write_jsonl(tmp / "shuf" / f"{i}.jsonl", shuffled[i * size : (i + 1) * size])
    out = tmp / "out.arrow"
    sets = ["--set", "bucket_bytes=1048576", "--set", f"min_partitions={parts}"]
    r = run_cli(["collect", tmp / "shuf", "-o", out, "--as-of", AS_OF, "-q", *sets])
    assert r.exit_code == 0
    assert pl.read_ipc(out).equals(pl.read_ipc(ref))


def test_resolved_config_saved_and_set_precedence(cli, tmp_path):
    src = write_jsonl(tmp_path / "ev.jsonl", many(2))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[collect]\nmaturity_s = 10.0\nedit_tools = ['write_file']\n")
    out = tmp_path / "t.arrow"
    r = collect(cli, src, "-o", out, "--config", cfg, "--set", "maturity_s=20", "--maturity", "30")
    assert r.exit_code == 0
    saved = json.loads((tmp_path / "t.arrow.config.json").read_text())
    assert saved["maturity_s"] == 30.0 and saved["edit_tools"] == ["write_file"]


def _run_dir_with_sidecars(cli, root):
    """A run directory as rlcycle leaves it: an events log among rlcycle's own files and a stray
    `--json` output, with one bad event line (quarantined) so a quarantine file is there too."""
    evs = many(4)
    write_jsonl(root / "simulate" / "events.jsonl", evs, ['{"event_id": "bad", "type": "telemetry"}'])
    (root / "simulate" / "events.jsonl.config.json").write_text(json.dumps({"seed": 1}, indent=2))
    (root / "simulate" / "manifest.json").write_text(json.dumps({"stage": "simulate"}, indent=2))
    (root / "simulate" / ".events.jsonl.x1y2.tmp").write_text('{"event_id": "half')  # a killed writer's
    (root / "run.json").write_text(json.dumps({"base_id": "sha256:abc"}))
    out = root / "collect" / "trajectories.arrow"
    r = collect(cli, root / "simulate" / "events.jsonl", "-o", out, "--json")
    assert r.exit_code == 0, r.error
    # `--json > DIR/summary.json`, as a terminal shows it (indented) and as a pipe gets it (one line)
    (root / "collect" / "summary.json").write_text(json.dumps(json.loads(r.stdout), indent=2))
    (root / "collect" / "summary.line.json").write_text(json.dumps(json.loads(r.stdout)) + "\n")
    (root / "collect" / "weights.bin").write_bytes(b"\x00\x01binary")
    return evs, r


def test_a_run_dir_collects_its_event_logs_and_skips_and_counts_the_rest(cli, tmp_path):
    run_dir = tmp_path / "run"
    evs, first = _run_dir_with_sidecars(cli, run_dir)
    out = tmp_path / "again.arrow"
    r = collect(cli, run_dir, "-o", out, "--json")
    assert r.exit_code == 0, r.error
    got, ref = json.loads(r.stdout), json.loads(first.stdout)
    assert got["files"] == 1 and got["events_in"] == len(evs) and got["quarantined"] == 1
    assert pl.read_ipc(out).equals(pl.read_ipc(run_dir / "collect" / "trajectories.arrow"))
    assert (got["samples_out"], got["episodes_out"]) == (ref["samples_out"], ref["episodes_out"])
    skipped = {Path(s["file"]).relative_to(run_dir).as_posix(): s["reason"] for s in got["skipped"]}
    assert got["skipped_files"] == len(skipped) == 10
    assert "resolved config" in skipped["simulate/events.jsonl.config.json"]
    assert "resolved config" in skipped["collect/trajectories.arrow.config.json"]
    assert "manifest" in skipped["simulate/manifest.json"] and "run.json" in skipped["run.json"]
    assert "hidden" in skipped["simulate/.events.jsonl.x1y2.tmp"]
    assert "quarantine" in skipped["collect/trajectories.arrow.quarantine.jsonl"]
    assert "not an OTLP/JSON" in skipped["collect/summary.json"]
    assert "none of the event keys" in skipped["collect/summary.line.json"]
    assert "none of the event columns" in skipped["collect/trajectories.arrow"]
    assert "not JSON lines" in skipped["collect/weights.bin"]
    # the human summary says so too
    r = cli(["collect", run_dir, "-o", tmp_path / "h.arrow", "--as-of", AS_OF])
    assert r.exit_code == 0 and "skipped        10 file(s) that are not event logs" in r.stderr


def test_a_named_file_that_is_not_an_event_log_is_an_error(cli, tmp_path):
    run_dir = tmp_path / "run"
    _run_dir_with_sidecars(cli, run_dir)
    cases = {
        "simulate/events.jsonl.config.json": "not an event log (a resolved config",
        "collect/trajectories.arrow.quarantine.jsonl": "not an event log (collect's quarantine file)",
        "simulate/manifest.json": "not an event log (a cycle stage's manifest)",
        "collect/summary.json": "a JSON document that is not an OTLP/JSON trace export",
        "collect/summary.line.json": "not an event log (its first record is a JSON object with none",
        "collect/trajectories.arrow": "not an event log (an Arrow/Parquet table with none of the event columns",
        "collect/weights.bin": "not JSON lines, Arrow, Parquet or OTel JSON",
    }
    for rel, message in cases.items():
        out = tmp_path / "t.arrow"
        r = collect(cli, run_dir / rel, "-o", out)
        assert r.exit_code == 2 and message in r.error and rel in r.error, (rel, r.error)
        assert not out.exists()


def test_a_directory_of_nothing_but_sidecars_is_an_empty_input(cli, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "t.arrow.config.json").write_text("{}")
    r = collect(cli, d, "-o", tmp_path / "t.arrow")
    assert r.exit_code == 2 and "the input is empty (1 file(s) skipped as not event logs)" in r.error


def test_a_killed_collect_leaves_its_working_directory_to_the_next_run(cli, tmp_path):
    """kill -9 with the partitions on disk leaves collect's working directory beside the
    output; the next collect of the same output removes it, and another output's stays."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "t.arrow"
    cmd = [sys.executable, "-m", "rlcycle", "collect", "sample_data/events", "-o", str(out), "-q"]
    root = Path(__file__).parent.parent
    env = dict(os.environ, RLCYCLE_CRASH_AT="collect:partitioned")
    killed = subprocess.run(cmd, env=env, cwd=root, capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    [left] = [p.name for p in tmp_path.iterdir()]
    assert left.startswith(".rlcycle-collect-t.arrow.") and left.endswith(".tmp") and not out.exists()
    other = tmp_path / left.replace("-t.arrow.", "-u.arrow.")  # a dead collect of another output
    other.mkdir()
    r = cli(["collect", root / "sample_data" / "events", "-o", out, "-q"])
    assert r.exit_code == 0, r.error
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.arrow", "t.arrow.config.json", other.name])


def test_executor_ray_without_ray_installed_says_how_to_install_it(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    src = write_jsonl(tmp_path / "ev.jsonl", many(2))
    r = collect(cli, src, "-o", tmp_path / "t.arrow", "--executor", "ray")
    assert r.exit_code == 2 and "--executor ray needs Ray" in r.output and "rlcycle[ray]" in r.output
    assert not (tmp_path / "t.arrow").exists()
    r = collect(cli, src, "-o", tmp_path / "t.arrow", "--executor", "spark")
    assert r.exit_code == 2 and "executor='spark'" in r.output
