"""Prompts stored once (issue 36 items 1 and 4): the writer's delta layout, collect's checks and
conversion, exact reconstruction at every stage, retries, and the storage budget.

Events are written by the one writer (`rlcycle.agent.events.completion_event`) and read back
by the shipped CLI (collect, distill, inspect); every rebuilt prompt is compared with the ids
that were "served".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from conftest import run_cli
from events_factory import T0, iso
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcycle import io as rio
from rlcycle import prompts
from rlcycle.agent import events as E
from rlcycle.gateway.contexts import Contexts


def completion(session, sample_id, turn, ts_ms, prompt, comp, parent=None, layout="delta", request_id=None, ep=None):
    sample = E.Sample(
        session, ep or f"{session}-e0", sample_id, turn, ts_ms, prompt, comp, [-0.5] * len(comp), "x", [], 5.0
    )
    ev = E.completion_event(sample, E.Served("policy-a", 1.0, 64), parent=parent)
    if layout == "full":
        for k in prompts.DELTA_COLUMNS:
            ev.pop(k)
        ev["prompt_ids"] = list(prompt)
    if request_id is not None:
        ev["request_id"] = request_id
    return ev


def session_events(session: str, turns: list[tuple[list[int], list[int]]], layout="delta", t0=T0, episodes=1):
    """Completion events of one session ((prompt, completion) per turn), each stored against
    the previous sample as the simulator and the gateway do; a follow-up closes each episode."""
    out, last = [], None
    per_ep = max(1, len(turns) // episodes)
    for t, (prompt, comp) in enumerate(turns):
        k = min(t // per_ep, episodes - 1)
        sid = f"{session}-t{t:03d}"
        out.append(completion(session, sid, t, t0 + t * 1000, prompt, comp, last, layout, ep=f"{session}-e{k}"))
        last = E.Parent(sid, [*prompt, *comp])
    for k in range(episodes):
        out.append(
            E.event(
                "user_message",
                f"{session}-e{k}-user",
                t0 + (k + 1) * per_ep * 1000 - 1,
                session,
                episode_id=f"{session}-e{k}",
                text="thanks",
            )
        )
    return out


def write(path, evs):
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))
    return path


def collect(tmp, name, evs, *args):
    src = write(tmp / f"{name}.jsonl", evs)
    out = tmp / f"{name}.arrow"
    r = run_cli(["collect", str(src), "-o", str(out), "--json", "--quiet", *args])
    assert r.exit_code == 0, r.output + r.error
    return rio.read_table(out), json.loads(r.stdout)


@st.composite
def sessions(draw):
    """Random sessions whose prompts extend the previous context, keep only part of it
    (a template that drops history, a compaction), or share nothing."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = []
    for s in range(draw(st.integers(1, 3))):
        turns, ctx = [], []
        for _ in range(draw(st.integers(1, 7))):
            kind = rng.integers(0, 4)
            keep = len(ctx) if kind < 2 else (int(rng.integers(0, len(ctx) + 1)) if kind == 2 else 0)
            prompt = ctx[:keep] + rng.integers(0, 6, int(rng.integers(0 if keep else 1, 5))).tolist()
            comp = rng.integers(0, 6, int(rng.integers(1, 4))).tolist()
            turns.append((prompt, comp))
            ctx = prompt + comp
        out.append((f"s{s}", turns))
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions())
def test_every_rebuilt_prompt_is_the_served_one_and_old_logs_give_identical_trajectories(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("p")
    want = {f"{name}-t{t:03d}": p for name, turns in data for t, (p, _) in enumerate(turns)}
    new = [e for name, turns in data for e in session_events(name, turns)]
    old = [e for name, turns in data for e in session_events(name, turns, layout="full")]
    # The log itself: no completion event carries a whole prompt, and each rebuilds exactly.
    assert all("prompt_ids" not in e for e in new if e["type"] == "completion")
    rebuilt = {
        e["sample_id"]: e["prompt_ids"] for e in prompts.events_with_full_prompts(new) if e["type"] == "completion"
    }
    assert rebuilt == want
    t_new, r_new = collect(tmp, "new", new)
    t_old, r_old = collect(tmp, "old", old)
    whole = prompts.with_full_prompts(t_new)
    assert dict(zip(whole["sample_id"].to_pylist(), whole["prompt_ids"].to_pylist(), strict=True)) == want
    assert t_new.column("prompt_ids").null_count == t_new.num_rows  # the delta layout, nothing repeated
    # A log written the old way gives the very same trajectories, column for column.
    assert t_old.equals(t_new)
    assert r_new["segments"] == r_old["segments"] and r_new["prompt_tokens_full"] == sum(len(p) for p in want.values())
    # distill passes the layout through; its examples rebuild to the same prompts.
    r = run_cli(["distill", str(tmp / "new.arrow"), "-o", str(tmp / "ex.arrow")])
    assert r.exit_code == 0, r.output + r.error
    ex = prompts.with_full_prompts(tmp / "ex.arrow")
    assert dict(zip(ex["sample_id"].to_pylist(), ex["prompt_ids"].to_pylist(), strict=True)) == want


def test_bad_references_are_quarantined_with_everything_built_on_them(tmp_path):
    a = session_events("a", [([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 2, 3, 4, 5, 6], [7])])
    b = session_events("b", [([9], [8]), ([9, 8, 7], [6])])
    later = completion(
        "a", "a-late", 9, T0 + 500, [1, 2, 3, 4, 5, 6, 7, 8], [1], E.Parent("a-t002", [1, 2, 3, 4, 5, 6, 7])
    )
    bad = [
        {**a[1], "prompt_parent": "nope"},  # a-t001: names no sample -> a-t002 is built on it
        later,  # a-late is stored against a-t002, which was logged after it
        {**b[1], "prompt_shared": 99},  # outside b-t000's context (2 tokens)
        {**completion("c", "c-t0", 0, T0, [9, 8], [1], E.Parent("b-t000", [9, 8]))},  # another session's sample
        {**completion("d", "d-t0", 0, T0, [4, 4], [1], E.Parent("d-t1", [4, 4])), "prompt_parent": "d-t1"},
        completion("d", "d-t1", 1, T0 + 1000, [4, 4, 1], [1], E.Parent("d-t0", [4, 4, 1])),  # built on the later one
    ]
    evs = [a[0], *bad[:1], a[2], bad[1], b[0], bad[2], bad[3], bad[4], bad[5], *a[3:], *b[2:]]
    table, res = collect(tmp_path, "bad", evs)
    assert sorted(table["sample_id"].to_pylist()) == ["a-t000", "b-t000"]
    assert res["quarantined"] == 7
    reasons = res["quarantine_reasons"]
    assert reasons["prompt_parent: names no sample of this input"] == 1
    assert reasons["prompt_parent: built on a quarantined sample"] == 2  # a-t002, d-t1
    assert reasons["prompt_shared: outside the parent's context"] == 1
    assert reasons["prompt_parent: names a sample of another session"] == 1
    assert reasons["prompt_parent: names a later sample"] == 2  # d-t0, and a-late (logged before a-t002)
    lines = [json.loads(x) for x in (tmp_path / "bad.arrow.quarantine.jsonl").read_text().splitlines()]
    # Each is named by the file and line it was read from (and its sample in the reason).
    where = {(Path(x["file"]).name, x["line"], x["reason"].split("completion ")[1].split()[0]) for x in lines}
    assert where >= {("bad.jsonl", 2, "'a-t001'"), ("bad.jsonl", 3, "'a-t002'"), ("bad.jsonl", 8, "'d-t0'")}
    # --strict stops at the first one, exit 2, naming it.
    r = run_cli(["collect", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "s.arrow"), "--strict"])
    assert r.exit_code == 2 and "prompt_" in r.error and not (tmp_path / "s.arrow").exists()


def test_a_retry_is_detected_counted_and_left_out_of_training(tmp_path):
    p = [1, 2, 3]
    a = completion("s", "s-t0", 0, T0, p, [4, 5], request_id="r1")
    b = completion("s", "s-t1", 1, T0 + 30_000, p, [6, 7], E.Parent("s-t0", [*p, 4, 5]), request_id="r2")
    c = completion("s", "s-t2", 2, T0 + 31_000, [*p, 6, 7, 8], [9], E.Parent("s-t1", [*p, 6, 7]), request_id="r3")
    # n = 2 choices of one request share their request id: never a retry.
    n1 = completion("n", "n-t0", 0, T0, p, [4], request_id="q")
    n2 = completion("n", "n-t0-1", 0, T0 + 1, p, [5], E.Parent("n-t0", [*p, 4]), request_id="q")
    evs = [a, b, c, n1, n2, E.event("user_message", "u", T0 + 40_000, "s", episode_id="s-e0", text="ok")]
    table, res = collect(tmp_path, "retry", evs)
    retried = dict(zip(table["sample_id"].to_pylist(), table["retried"].to_pylist(), strict=True))
    assert retried == {"s-t0": True, "s-t1": False, "s-t2": False, "n-t0": False, "n-t0-1": False}
    assert res["retried"] == 1
    r = run_cli(["distill", str(tmp_path / "retry.arrow"), "-o", str(tmp_path / "ex.arrow"), "--json"])
    assert r.exit_code == 0, r.output + r.error
    ex = rio.read_table(tmp_path / "ex.arrow")
    why = dict(zip(ex["sample_id"].to_pylist(), ex["excluded"].to_pylist(), strict=True))
    assert why["s-t0"] == "retried" and why["s-t2"] != "retried"
    # b is stored against a, which stays in the file: its prompt still rebuilds exactly.
    whole = prompts.with_full_prompts(ex)
    assert whole["prompt_ids"].to_pylist()[ex["sample_id"].to_pylist().index("s-t2")] == [*p, 6, 7, 8]


def test_a_time_window_that_cuts_a_session_rebuilds_the_rows_it_keeps(tmp_path):
    rng = np.random.default_rng(1)
    turns, ctx = [], []
    for _ in range(6):
        prompt = ctx + rng.integers(0, 50, 4).tolist()
        comp = rng.integers(0, 50, 2).tolist()
        turns.append((prompt, comp))
        ctx = prompt + comp
    evs = session_events("w", turns, episodes=2)
    table, _ = collect(tmp_path, "win", evs, "--since", iso(T0 + 3000))
    whole = prompts.with_full_prompts(table)
    assert whole["sample_id"].to_pylist() == ["w-t003", "w-t004", "w-t005"]
    assert whole["prompt_ids"].to_pylist() == [p for p, _ in turns[3:]]
    assert table["prompt_parent"].to_pylist()[0] is None  # its parent was left out: a root


def test_a_100_turn_session_stores_its_unique_tokens_at_every_stage(tmp_path, capsys):
    """The budget: token ids stored <= 1.5x the session's unique tokens in the log,
    trajectories and examples (the full layout stores ~turns/2 x); bytes on disk beside it."""
    rng = np.random.default_rng(0)
    turns, ctx = [], rng.integers(0, 1000, 200).tolist()  # a system prompt
    for _ in range(100):
        prompt = ctx + rng.integers(0, 1000, 40).tolist()  # tool output / user message
        comp = rng.integers(0, 1000, 10).tolist()
        turns.append((prompt, comp))
        ctx = prompt + comp
    unique = len(ctx)
    evs = session_events("long", turns)
    log = write(tmp_path / "log.jsonl", evs)
    in_log = sum(len(e.get("prompt_added") or []) + len(e["completion_ids"]) for e in evs if e["type"] == "completion")
    table, res = collect(tmp_path, "long", evs)
    r = run_cli(["distill", str(tmp_path / "long.arrow"), "-o", str(tmp_path / "ex.arrow")])
    assert r.exit_code == 0, r.output + r.error
    ex = rio.read_table(tmp_path / "ex.arrow")
    full_log = write(tmp_path / "full.jsonl", session_events("long", turns, layout="full"))
    ratios = {
        "log": in_log / unique,
        "trajectories": prompts.stored_tokens(table) / unique,
        "examples": prompts.stored_tokens(ex) / unique,
        "full layout": (res["prompt_tokens_full"] + sum(len(c) for _, c in turns)) / unique,
    }
    with capsys.disabled():
        print(
            f"\n100 turns, {unique:,} unique tokens: ids stored per unique token "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            + f"; log {log.stat().st_size / 1e3:.0f} kB (full layout {full_log.stat().st_size / 1e3:.0f} kB), "
            f"trajectories {(tmp_path / 'long.arrow').stat().st_size / 1e3:.0f} kB"
        )
    assert ratios["log"] <= 1.5 and ratios["trajectories"] <= 1.5 and ratios["examples"] <= 1.5
    assert ratios["full layout"] > 20  # what the old layout would have stored
    assert res["segments"] == 1 and res["sessions_out"] == 1


def test_inspect_full_prompts_writes_whole_prompts_for_analysts(tmp_path):
    turns = [([1, 2], [3]), ([1, 2, 3, 4], [5]), ([7], [8])]
    collect(tmp_path, "t", session_events("i", turns))
    r = run_cli(["inspect", str(tmp_path / "t.arrow"), "--full-prompts", "-o", str(tmp_path / "w.parquet"), "--json"])
    assert r.exit_code == 0, r.output + r.error
    assert [row["prompt_ids"] for row in json.loads(r.output)["head"]] == [p for p, _ in turns]
    import duckdb

    got = duckdb.sql(f"select prompt_ids from '{tmp_path / 'w.parquet'}' order by sample_id").fetchall()
    assert [list(x[0]) for x in got] == [p for p, _ in turns]
    r = run_cli(["inspect", str(tmp_path / "t.arrow"), "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == 2 and "--full-prompts" in r.error


def test_the_gateway_stores_against_the_sample_continued_bounded_by_tokens_and_days():
    c = Contexts(max_tokens=10)
    c.record("s", "a", [1, 2], [3], day=5)
    c.record("s", "b", [1, 2], [4], day=5)
    assert c.parent("s", "a", day=5).sample_id == "a"  # the choice the client continued
    assert c.parent("s", None, day=5).sample_id == "b"  # else the session's latest
    assert c.parent("s", "a", day=6) is None  # a new UTC day starts from a root
    assert c.parent("other", "a", day=5) is None  # another session's sample is never a parent
    c.record("t", "c", [9] * 6, [1], day=5)  # 13 ids > 10: the least recently used go
    assert c.tokens <= 10 and c.parent("s", "a", day=5).sample_id == "b"  # "a" went: the latest left
    assert c.parent("t", None, day=5).context.tolist() == [9] * 6 + [1]
    c.record("t", "huge", [1] * 20, [], day=5)  # larger than the bound: never kept
    assert c.parent("t", "huge", day=5).sample_id == "c"
