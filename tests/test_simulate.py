"""`rlcycle simulate` end to end: a tiny random model and the scripted reference in real
sandboxes, the events read back by `rlcycle collect`, the CLI's output and errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from test_runner import make_suite, scrub

from rlcycle.agent.runner import RunnerConfig
from rlcycle.agent.user import UserConfig
from rlcycle.prompts import DELTA_COLUMNS, events_with_full_prompts, with_full_prompts
from rlcycle.simulate import SimulateConfig, run


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    make_suite(root)
    return root


def read_events(path) -> list[dict]:
    """The events as written (completions in the delta layout: no `prompt_ids`)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_full_events(path) -> list[dict]:
    """The events with every completion's whole prompt rebuilt as `prompt_ids`."""
    return events_with_full_prompts(read_events(path))


def test_simulate_has_help(cli):
    r = cli(["simulate", "--help"])
    assert r.exit_code == 0 and "Examples" in r.output and "scripted:reference" in r.output


def test_bad_options_exit_2_before_any_sandbox_starts(cli, suite_dir, tmp_path):
    out = tmp_path / "e.jsonl"
    r = cli(["simulate", "-p", "scripted:reference", "-t", suite_dir, "-o", out, "-n", 0])
    assert r.exit_code == 2 and "episodes=0" in r.error
    r = cli(["simulate", "-p", "scripted:genius", "-t", suite_dir, "-o", out])
    assert r.exit_code == 2 and "scripted:genius" in r.error
    r = cli(["simulate", "-p", "scripted:nothing", "-t", tmp_path / "none", "-o", out])
    assert r.exit_code == 2 and "not a directory" in r.error
    r = cli(["simulate", "-p", "scripted:nothing", "-t", suite_dir, "-o", out, "--set", "user.feedback_rat=1"])
    assert r.exit_code == 2 and "did you mean 'user.feedback_rate'?" in r.error
    # A key of a nested table is suggested by its dotted name; a flag still reaches it.
    r = cli(["simulate", "-p", "scripted:nothing", "-t", suite_dir, "-o", out, "--set", "feedback_rate=1"])
    assert r.exit_code == 2 and "unknown key 'feedback_rate' (did you mean 'user.feedback_rate'?)" in r.error
    r = cli(["simulate", "-p", "scripted:nothing", "-t", suite_dir, "-o", out, "--set", "runner.max_new_tokens=0"])
    assert r.exit_code == 2 and "runner.max_new_tokens=0: must be >= 1" in r.error
    assert not out.exists()


@pytest.mark.docker
def test_reference_via_cli_json_summary_files_and_determinism(cli, suite_dir, tmp_path, docker_client):
    out = tmp_path / "sim" / "events.jsonl"
    args = [
        "simulate",
        "-p",
        "scripted:reference",
        "-t",
        suite_dir,
        "-n",
        4,
        "--sandboxes",
        2,
        "--seed",
        7,
        "--json",
        "-q",
        "-o",
    ]
    r = cli(args + [out])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["episodes"], summary["passed"], summary["pass_rate"]) == (4, 4, 1.0)
    assert summary["clarification_rate"] == 0.5 and summary["invalid_call_rate"] == 0.0
    events = read_events(out)
    assert len(events) == summary["events"] and len({e["event_id"] for e in events}) == len(events)
    # OUT.config.json, as collect and distill save theirs (no hidden file)
    assert not (out.parent / ".events.jsonl.config.json").exists()
    assert json.loads((out.parent / "events.jsonl.config.json").read_text())["seed"] == 7
    # Sessions in job order: task i mod 2, attempt i div 2.
    sessions = list(dict.fromkeys(e["session_id"] for e in events))
    assert [s.split("-", 2)[2] for s in sessions] == ["calc-add-a0", "greet-a0", "calc-add-a1", "greet-a1"]
    # The same run again: the same events, but for what is measured. Prompts after a
    # run_tests call differ too: pytest prints its own duration ("1 passed in 0.03s").
    again = tmp_path / "again.jsonl"
    assert cli(args + [again]).exit_code == 0

    def stable(evs):  # whole prompts compared (turn 0 only); how each is stored against its parent is not
        full = events_with_full_prompts(evs)
        return [
            {k: v for k, v in e.items() if k not in DELTA_COLUMNS and (k != "prompt_ids" or e["turn"] == 0)}
            for e in scrub(full)
        ]

    assert stable(read_events(again)) == stable(events)
    # ... and collect reads the directory (its config sidecar skipped and counted) without a complaint.
    traj = tmp_path / "traj.arrow"
    r = cli(["collect", out.parent, "-o", traj, "--as-of", "2026-12-02T12:00:00Z", "--json", "-q"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    n_samples = sum(e["type"] == "completion" for e in events)
    assert (got["samples_out"], got["quarantined"], got["held_back_samples"]) == (n_samples, 0, 0)
    assert got["files"] == 1 and [s["file"] for s in got["skipped"]] == [str(out) + ".config.json"]


@pytest.mark.docker
def test_tiny_random_model_round_trip_through_collect(cli, suite_dir, tmp_path, docker_client, one_thread):
    import polars as pl

    from rlcycle.model_init import init_model

    model = tmp_path / "tiny"
    init_model(model, seed=0)
    config = SimulateConfig(
        episodes=3,
        sandboxes=2,
        seed=1,
        runner=RunnerConfig(max_turns=2, max_new_tokens=24),
        user=UserConfig(feedback_rate=1.0),
    )
    out = tmp_path / "events.jsonl"
    result = run(config, str(model), suite_dir, out, quiet=True)
    assert result.policy.startswith("sha256:") and result.episodes == 3 and result.errors == 0
    assert result.passed == 0 and result.mean_latency_ms > 0
    events = read_full_events(out)
    completions = [e for e in events if e["type"] == "completion"]
    assert len(completions) == result.samples >= 3
    for e in completions:
        assert e["policy_version"] == result.policy and len(e["completion_ids"]) <= 24
        assert len(e["completion_logprobs"]) == len(e["completion_ids"]) == len(e["loss_mask"])
        assert set(e["loss_mask"]) == {1} and all(lp <= 0 for lp in e["completion_logprobs"])
    # Token-exact prompts: a later prompt extends the earlier prompt + its sampled ids.
    by_session: dict[str, list[dict]] = {}
    for e in completions:
        by_session.setdefault(e["session_id"], []).append(e)
    for samples in by_session.values():
        for a, b in zip(samples, samples[1:], strict=False):
            assert (
                b["prompt_ids"][: len(a["prompt_ids"]) + len(a["completion_ids"])]
                == a["prompt_ids"] + a["completion_ids"]
            )
    # Every session got its follow-up and (feedback_rate 1) a thumbs down.
    assert sum(e["type"] == "feedback" and e["value"] == -1.0 for e in events) == 3
    traj = tmp_path / "traj.arrow"
    r = cli(["collect", out, "-o", traj, "--as-of", "2026-12-02T12:00:00Z", "--json", "-q"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["samples_out"], got["quarantined"]) == (len(completions), 0)
    df = pl.from_arrow(with_full_prompts(traj)).sort("sample_id")
    want = sorted(completions, key=lambda e: e["sample_id"])
    assert df["completion_ids"].to_list() == [e["completion_ids"] for e in want]
    assert df["prompt_ids"].to_list() == [e["prompt_ids"] for e in want]
    lps = df["behavior_logprobs"].to_list()
    assert all(
        abs(x - y) < 1e-5
        for a, e in zip(lps, want, strict=True)
        for x, y in zip(a, e["completion_logprobs"], strict=True)
    )
    assert df["followup_text"].null_count() == 0


@pytest.mark.docker
def test_a_bfloat16_run_is_named_apart_from_the_float32_one(cli, suite_dir, tmp_path, docker_client, one_thread):
    """`dtype` samples a checkpoint in-process in bf16: same checkpoint, seed and tasks as a
    float32 run, but its own run and event ids (its logprobs differ), so collect keeps both;
    policy_version stays the checkpoint. A dtype that does not exist is exit 2."""
    from rlcycle.model_init import init_model

    model = tmp_path / "tiny"
    init_model(model, seed=0)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"{dtype}.jsonl"
        args = [
            "simulate",
            "-p",
            model,
            "-t",
            suite_dir,
            "-o",
            out,
            "-n",
            2,
            "--set",
            "runner.max_turns=1",
            "--set",
            "runner.max_new_tokens=8",
        ]
        r = cli([*args, "--sandboxes", 2, "--set", f"policy.dtype={dtype}", "--json", "-q"])
        assert r.exit_code == 0, r.output
        runs[dtype] = (json.loads(r.stdout), [e for e in read_events(out) if e["type"] == "completion"])
    (f32, e32), (b16, e16) = runs["float32"], runs["bfloat16"]
    assert f32["policy"] == b16["policy"] and {e["policy_version"] for e in e32 + e16} == {f32["policy"]}
    assert f32["run_id"] != b16["run_id"]
    assert not {e["sample_id"] for e in e32} & {e["sample_id"] for e in e16}
    assert [e["completion_logprobs"] for e in e32] != [e["completion_logprobs"] for e in e16]
    r = cli(["simulate", "-p", model, "-t", suite_dir, "-o", tmp_path / "x.jsonl", "--set", "policy.dtype=float8"])
    assert r.exit_code == 2 and "policy.dtype='float8': use auto, float32, bfloat16, float16" in r.error


@pytest.mark.docker
def test_events_stream_to_stdout_into_collect(cli, suite_dir, tmp_path, docker_client):
    r = cli(
        [
            "simulate",
            "-p",
            "scripted:nothing",
            "-t",
            suite_dir,
            "-q",
            "--sandboxes",
            2,
            "--set",
            "user.feedback_rate=0",
            "-o",
            "-",
        ]
    )
    assert r.exit_code == 0
    types = [json.loads(x)["type"] for x in r.stdout.splitlines()]
    assert types == ["completion", "tool_result", "user_message"] * 2  # 2 sessions
    traj = tmp_path / "t.arrow"
    c = cli(["collect", "-", "-o", traj, "--json", "-q", "--as-of", "2026-12-02T00:00:00Z"], input=r.stdout.encode())
    assert c.exit_code == 0 and json.loads(c.stdout)["samples_out"] == 2


@pytest.mark.docker
def test_a_killed_simulate_leaves_no_temp_file_after_the_rerun(suite_dir, tmp_path, docker_client):
    """kill -9 mid-log (the deterministic crash point after a session is written) leaves the
    temp log; the rerun removes it (its writer is dead) and only it: a live writer's temp, a
    dead writer's on another host and another output's temp stay."""
    from rlcycle.sandbox import cleanup

    out = tmp_path / "run" / "simulate" / "events.jsonl"
    cmd = [sys.executable, "-m", "rlcycle", "simulate", "-p", "scripted:reference", "-t", str(suite_dir)]
    cmd += ["-n", "4", "--sandboxes", "1", "--seed", "3", "-q", "-o", str(out)]
    killed = subprocess.Popen(cmd, env=dict(os.environ, RLCYCLE_CRASH_AT="simulate:session-written"))
    try:
        assert killed.wait(timeout=300) == -signal.SIGKILL  # the crash point was reached
        [left] = [p.name for p in out.parent.iterdir()]
        assert left.startswith(".events.jsonl.") and left.endswith(".tmp") and not out.exists()
        host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())  # as temp names carry it
        keep = [
            f".events.jsonl.{host}-{os.getpid()}.abcdefgh.tmp",  # a live writer (this process)
            f".events.jsonl.elsewhere-{killed.pid}.abcdefgh.tmp",  # another host's
            f".other.jsonl.{host}-{killed.pid}.abcdefgh.tmp",  # another output's
        ]
        for name in keep:
            (out.parent / name).write_text("")
        rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == sorted(keep)
        sessions = {e["session_id"] for e in read_events(out)}
        assert len(sessions) == 4
    finally:
        killed.kill()
        mine = f":{killed.pid}"  # the killed run's workspace volumes: nobody else removes them
        for x in cleanup.list_leftovers(docker_client):
            if x.owner.endswith(mine):
                cleanup.remove(docker_client, x.kind, x.name)
