"""scripts/bench_sessions.py and its generator, scripts/session_events.py, at a tiny size.

In: sessions of 2 and 4 turns (small turns: 40-token first prompt, 20 generated + 80 of tool
output), generated, collected, distilled and trained through the real CLI by the bench. Out:
the generator's sessions extend token for token and are seeded; the bench's `--json` object has
its documented shape; the events (whole prompts, as logs written before issue 36 item 1) store
ids per unique token that grow with turns, trajectories and examples store every token once
(prompts stored once), train still scores whole prompts row by row; train's counts agree with the
replayed plan, and the growth table has an exponent per cost. Nothing about speed is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import session_events  # noqa: E402

SMALL = session_events.Shape(prompt0=40, generated=20, tool_output=80)


def _completions(out: Path) -> list[dict]:
    lines = [json.loads(x) for f in sorted(out.glob("events-*.jsonl")) for x in f.read_text().splitlines()]
    return [e for e in lines if e["type"] == "completion"]


def test_each_prompt_extends_the_last_prompt_completion_and_tool_output(tmp_path):
    summary = session_events.generate(tmp_path / "a", 2, 5, vocab=512, policy_version="v0", seed=3, shape=SMALL)
    comps = _completions(tmp_path / "a")
    assert summary["events"] == 2 * (2 * 5 + 1)  # completion + tool_result a turn, feedback a session
    for sid in {e["session_id"] for e in comps}:
        turns = sorted((e for e in comps if e["session_id"] == sid), key=lambda e: e["turn"])
        assert [e["turn"] for e in turns] == list(range(5))
        for a, b in zip(turns, turns[1:], strict=False):
            history = a["prompt_ids"] + a["completion_ids"]
            assert b["prompt_ids"][: len(history)] == history
            assert len(b["prompt_ids"]) == len(history) + SMALL.tool_output
        last = turns[-1]
        assert len(last["prompt_ids"]) + len(last["completion_ids"]) == SMALL.unique_tokens(5)
        assert all(len(e["completion_logprobs"]) == len(e["completion_ids"]) == SMALL.generated for e in turns)
        assert all(16 <= i < 512 for e in turns for i in e["prompt_ids"])
    logged = sum(len(e["prompt_ids"]) + len(e["completion_ids"]) for e in comps)
    assert logged == summary["logged_ids"] == 2 * SMALL.logged_ids(5)
    # Seeded: the same arguments give the same bytes.
    session_events.generate(tmp_path / "b", 2, 5, vocab=512, policy_version="v0", seed=3, shape=SMALL)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in files)


def test_the_delta_layout_rebuilds_the_same_prompts(tmp_path):
    from rlcycle import prompts

    session_events.generate(tmp_path / "full", 2, 4, vocab=512, policy_version="v0", seed=3, shape=SMALL)
    session_events.generate(tmp_path / "delta", 2, 4, vocab=512, policy_version="v0", seed=3, shape=SMALL, delta=True)
    full, delta = _completions(tmp_path / "full"), _completions(tmp_path / "delta")
    assert all("prompt_ids" not in e for e in delta)
    assert [e["prompt_ids"] for e in prompts.events_with_full_prompts(delta)] == [e["prompt_ids"] for e in full]
    assert sum(len(e["prompt_added"]) + len(e["completion_ids"]) for e in delta) == 2 * SMALL.unique_tokens(4)


def test_the_bench_reports_the_curve_of_both_layouts(tmp_path):
    cmd = [sys.executable, str(SCRIPTS / "bench_sessions.py"), "--turns", "2,4", "--sessions", "2"]
    cmd += ["--train-steps", "1", "--runs", "1", "--json", "--keep", str(tmp_path)]
    cmd += ["--prompt0", "40", "--generated", "20", "--tool-output", "80"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # one object on stdout; progress went to stderr
    assert res["bench"] == "bench_sessions" and res["runs"] == 1
    assert res["extra"]["config"]["layouts"] == ["before", "delta"]
    sizes = res["extra"]["sizes"]
    assert [(s["layout"], s["turns"]) for s in sizes] == [("before", 2), ("delta", 2), ("before", 4), ("delta", 4)]
    for s in sizes:
        assert s["samples"] == 2 * s["turns"]  # collect kept every call
        assert s["unique_tokens"] == 2 * SMALL.unique_tokens(s["turns"])
        assert set(s["stages"]) == {"events", "trajectories", "examples"}
        for stage in s["stages"].values():
            assert stage["ids"] > 0 and stage["bytes"] > 0
            assert stage["ids_per_unique"] == stage["ids"] / s["unique_tokens"]
        assert len(s["collect"]["seconds"]) == len(s["collect"]["rss_mb"]) == 1
        t = s["train"]
        assert t["plan_matches"], t
        assert t["rows_in"] == t["rows_used"] == t["rows_trained"] == 2 * s["turns"] and t["dropped"] == {}
        assert t["unique_trained"] == s["unique_tokens"]  # every row trained: the whole data
        assert len(t["s_per_step"]) == 1
        if s["layout"] == "before":  # whole prompts at every stage, every row scored on its own
            for stage in s["stages"].values():
                assert stage["ids"] == 2 * SMALL.logged_ids(s["turns"])
            assert t["seq_tokens"] == s["stages"]["events"]["ids"]
        else:  # every token stored once, and run forward once (each session one segment)
            for stage in s["stages"].values():
                assert stage["ids"] == s["unique_tokens"]
            assert t["forward_tokens"] == s["unique_tokens"]
    by = {(s["layout"], s["turns"]): s for s in sizes}
    assert by["before", 4]["stages"]["events"]["ids_per_unique"] > by["before", 2]["stages"]["events"]["ids_per_unique"]
    assert by["before", 4]["train"]["forward_per_unique"] > by["before", 2]["train"]["forward_per_unique"]
    assert by["delta", 4]["train"]["forward_per_unique"] == by["delta", 2]["train"]["forward_per_unique"] == 1.0
    grow = {(g["layout"], g["cost"]): g for g in res["extra"]["growth"]}
    assert grow["before", "events_ids"]["exponent"] > grow["before", "unique"]["exponent"]  # super-linear
    assert abs(grow["delta", "events_ids"]["exponent"] - grow["delta", "unique"]["exponent"]) < 1e-9  # linear
    assert {t["title"] for t in res["tables"]} >= {"collect: wall seconds", "train: seconds per optimizer step"}
    assert all(r["ratio"] == 1.0 for t in res["tables"] for r in t["rows"] if r["side"] == "before, 2 turns")
