"""The closed loop (rlcycle/closed_loop.py, behind scripts/closed_loop.py): two simulate-sourced
cycles through the real CLI stay on-policy, and the A/B metrics are the right numbers on a
hand-made trajectories table."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from rlcycle import closed_loop as loop
from rlcycle import stats
from rlcycle.closed_loop import REPO
from rlcycle.report import ab, paired
from rlcycle.report.closed_loop import ab_cells, loop_metrics

# --- the metrics, by hand ---------------------------------------------------------------------

CALL = pl.Struct({"call_id": pl.String, "name": pl.String, "arguments": pl.String, "status": pl.String})
SCHEMA = {
    "session_id": pl.String,
    "episode_id": pl.String,
    "policy_version": pl.String,
    "latency_ms": pl.Float64,
    "n_invalid_tool_calls": pl.Int32,
    "edit_lines_proposed": pl.Int32,
    "edit_lines_surviving": pl.Int32,
    "followup_text": pl.String,
    "tool_calls": pl.List(CALL),
    "completion_ids": pl.List(pl.Int32),
}
ASK = [{"call_id": "c0", "name": "ask_user", "arguments": "{}", "status": "ok"}]
READ = [{"call_id": "c0", "name": "read_file", "arguments": "{}", "status": "ok"}]
ROWS = [
    # version A, session s1: one episode, two samples; an edit 10 -> 5 lines; a complaint
    ("s1", "e1", "A", 100.0, 1, 10, 5, "that's wrong, it still fails", READ, [1, 2, 3]),
    ("s1", "e1", "A", 200.0, 0, None, None, "that's wrong, it still fails", [], [4]),
    # s2: an edit that fully survived, a satisfied user
    ("s2", "e2", "A", 300.0, 0, 4, 4, "thanks, works", READ, [5, 6]),
    # s3: a clarifying question (its follow-up is an answer: left out), then an episode with an
    # edit whose outcome has not arrived (left out of persistence) and a complaint
    (
        "s3",
        "e3a",
        "A",
        400.0,
        1,
        None,
        None,
        "I already said what I want. Please just make the change.",
        ASK,
        [7, 8, 9, 10],
    ),
    ("s3", "e3b", "A", 600.0, 0, 2, None, "you didn't change anything?", READ, [11, 12]),
    # version B: one session, no edit, no follow-up
    ("s4", "e4", "B", 50.0, 0, None, None, None, [], [1, 2, 3, 4, 5]),
]


def test_online_metrics_on_a_hand_made_table():
    traj = pl.DataFrame(ROWS, schema=SCHEMA, orient="row")
    m = loop_metrics(traj)
    assert list(m) == ["A", "B"]  # order of first appearance
    a = m["A"]
    # persistence: (5 + 4) / (10 + 4) over sessions s1, s2 (s3's outcome has not arrived);
    # delta-method SE: sqrt(2/1 * ((5 - 10r)^2 + (4 - 4r)^2)) / 14 = 2.857143 / 14
    p = a["edit_persistence"]
    assert (p.num, p.den, p.units) == (9, 14, 2)
    assert p.value == pytest.approx(9 / 14)
    assert p.se == pytest.approx(0.2040816, abs=1e-6)
    assert p.low == pytest.approx(9 / 14 - 1.959964 * 0.2040816, abs=1e-5) and p.high == 1.0  # clipped at 1
    # latency: 1600 ms / 5 calls; session totals 300/2, 300/1, 1000/2 -> SE sqrt(3/2 * 245600) / 5
    lat = a["latency_ms"]
    assert lat.value == pytest.approx(320.0) and lat.se == pytest.approx(121.39192, abs=1e-4)
    assert lat.low == pytest.approx(320 - 1.959964 * 121.39192, abs=1e-3)
    # invalid calls: 2 of 5 model calls
    assert a["invalid_per_sample"].value == pytest.approx(0.4)
    assert a["tokens_per_call"].value == pytest.approx(12 / 5)
    # follow-ups: e1 (complaint), e2 (thanks), e3b (a complaint the built-in phrases recognise
    # since issue #11: "you didn't change anything?"); e3a asked.
    # One follow-up per session: the design effect is 1 and the interval is Wilson's, 1 of 3.
    d = a["dissatisfied_rate"]
    assert (d.num, d.den) == (2, 3) and d.value == pytest.approx(2 / 3)
    assert (d.low, d.high) == (pytest.approx(0.2077, abs=1e-4), pytest.approx(0.9385, abs=1e-4))
    # s3 asked in one of its two episodes: 1 of 4 episodes, three sessions
    assert a["clarification_rate"].value == pytest.approx(1 / 4) and a["clarification_rate"].units == 3
    assert a["dissatisfied_truth"].value == pytest.approx(2 / 3)
    assert a["counts"] == {
        "sessions": 3,
        "episodes": 4,
        "samples": 5,
        "followups": 3,
        "asked": 1,
        "edits_with_outcome": 2,
        "complaints_missed": 0,
    }
    b = m["B"]
    assert b["edit_persistence"].value is None and b["dissatisfied_rate"].value is None
    assert b["latency_ms"].value == 50.0 and b["latency_ms"].low is None  # one session: no interval
    cells = ab_cells(m)["B"]
    assert cells["latency_ms"].diff.value == pytest.approx(-270.0) and cells["latency_ms"].call == "n/a"
    assert cells["edit_persistence"].call == "n/a"


def test_differences_and_calls():
    # Newcombe (1998), example (a): 56/70 vs 48/80 -> +0.2000 [0.0524, 0.3339]
    d = stats.difference(stats.wilson(48, 80), stats.wilson(56, 70))
    assert d.value == pytest.approx(0.2) and (d.low, d.high) == (
        pytest.approx(0.0524, abs=1e-4),
        pytest.approx(0.3339, abs=1e-4),
    )
    assert ab.call(d, -1) == "worse" and ab.call(d, +1) == "better" and ab.call(d, 0) == "changed"
    # ratios: independent arms, SEs combined
    a = stats.ratio_estimate([100.0, 300.0], [1, 1])  # 200, SE sqrt(2 * 2 * 100^2) / 2 = 100
    b = stats.ratio_estimate([150.0, 250.0, 200.0], [1, 1, 1])
    assert a.se == pytest.approx(100.0)
    diff = stats.difference(a, b)
    assert diff.value == pytest.approx(0.0) and diff.se == pytest.approx(math.hypot(100.0, b.se))
    assert ab.call(diff, -1) == "no change detected"


def test_ab_table_rows_keyed_by_arm_and_version():
    """Generic rows: any key, differences against the chosen baseline row only."""
    est = {"p": stats.wilson(48, 80)}
    rows = {("control", "v0"): est, ("treatment", "v0"): {"p": stats.wilson(56, 70)}, ("naive", "v0"): est}
    cells = ab.ab_table(rows, ("control", "v0"), ["p"], {"p": +1})
    assert list(cells) == [("treatment", "v0"), ("naive", "v0")]
    assert cells[("treatment", "v0")]["p"].call == "better"
    assert cells[("naive", "v0")]["p"].diff.value == 0.0 and cells[("naive", "v0")]["p"].call == "no change detected"
    with pytest.raises(KeyError):
        ab.ab_table(rows, ("control", "v9"), ["p"])


def test_paired_difference_is_the_matched_pairs_interval():
    """Same sessions on both sides: for one verdict per session the paired delta method is the
    matched-pairs normal interval mean(d) ± z·sd(d)/sqrt(n); task variance cancels, so it is
    narrower than the independent (Newcombe) interval on the same numbers."""
    a = [1, 1, 0, 0, 0, 0, 1, 0, 0, 0] * 4
    b = [1, 1, 1, 0, 1, 0, 1, 0, 0, 1] * 4
    ones = [1.0] * len(a)
    p = stats.paired_difference(a, ones, b, ones)
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))
    assert p.value == pytest.approx(0.3) and p.kind == "paired" and p.units == 40
    assert p.se == pytest.approx(sd / math.sqrt(len(d)))
    assert p.low == pytest.approx(0.3 - 1.959964 * sd / math.sqrt(40), abs=1e-5)
    indep = stats.difference(stats.wilson(sum(a), 40), stats.wilson(sum(b), 40))
    assert p.high - p.low < indep.high - indep.low
    # a session only one side has a denominator for still counts; none on either side: left out
    r = stats.paired_difference([5, 0, 0], [10, 0, 0], [4, 2, 0], [4, 2, 0])
    assert r.units == 2 and r.value == pytest.approx(1.0 - 0.5)
    with pytest.raises(ValueError):
        stats.paired_difference([1], [1], [1, 0], [1, 1])


def test_paired_online_differences_join_on_the_session():
    """rlcycle.online.paired_differences pairs two versions' facts by session and leaves out
    sessions only one side served."""
    from rlcycle import online

    rows_a = [
        ("s1", "e1", "A", 100.0, 0, 10, 5, None, READ, [1]),
        ("s2", "e2", "A", 100.0, 1, 4, 0, None, READ, [1]),
        ("s9", "e9", "A", 100.0, 0, 4, 4, None, READ, [1]),
    ]
    rows_b = [("s1", "f1", "B", 100.0, 0, 10, 10, None, READ, [1]), ("s2", "f2", "B", 100.0, 0, 4, 4, None, READ, [1])]
    fa, fb = (online.episode_facts(pl.DataFrame(r, schema=SCHEMA, orient="row")) for r in (rows_a, rows_b))
    diffs, matched = online.paired_differences(fa, fb)
    assert matched == 2  # s9 was served by A only
    assert diffs["edit_persistence"].value == pytest.approx(14 / 14 - 5 / 14)
    assert diffs["invalid_per_sample"].value == pytest.approx(0 - 0.5)


def test_cycle_config_and_sets():
    import tomllib

    sets = loop.parse_sets(
        ["train.lr=1e-4", "eval.max_tasks=5", 'simulate.runner.run_id="x"', 'cycle.reward_spec="/r.toml"']
    )
    assert sets == {
        "train.lr": 1e-4,
        "eval.max_tasks": 5,
        "simulate.runner.run_id": "x",
        "cycle.reward_spec": "/r.toml",
    }
    cfg = tomllib.loads(loop.cycle_toml(2, 7, "/t", sets))["cycle"]
    assert cfg["source"] == "simulate" and cfg["tasks"] == "/t" and cfg["reward_spec"] == "/r.toml"
    assert cfg["simulate"]["seed"] == 2 and cfg["simulate"]["episodes"] == 7
    assert cfg["train"]["lr"] == 1e-4 and cfg["eval"]["max_tasks"] == 5
    assert cfg["train"]["max_steps"] > 1000  # epochs decide, not the cycle's 2-step demo cap


def test_arms_differ_only_in_their_distill_switch():
    import tomllib

    def distill(arm: str, seed: int) -> dict:
        return tomllib.loads(loop.cycle_toml(seed, 7, "/t", loop.arm_overrides(arm, seed, {"train.lr": 1e-4})))["cycle"]

    t, c, n = distill("treatment", 5), distill("control", 5), distill("naive", 5)
    assert "distill" not in t
    assert c.pop("distill") == {"permute_rewards": True, "permute_seed": 5}  # a fresh shuffle per cycle
    assert n.pop("distill") == {"discard_invalid": True}
    assert t == c == n  # everything else identical: traffic seed, sessions, training
    # the same traffic seeds in every arm; the measure run's is fresh and the same too
    assert loop.seeds(1, 2) == [("cycle-1", 1001), ("cycle-2", 1002), ("measure", 1900)]
    with pytest.raises(SystemExit):
        loop.main(["--arms", "treatment,bogus", "--report-only"])


def test_user_verdict_is_the_hidden_tests_verdict():
    """tests_passed from the simulated user's follow-up: satisfied texts pass, complaints fail,
    anything else (a clarification answer, no follow-up) says nothing."""
    from rlcycle.agent import user
    from rlcycle.report.closed_loop import with_user_verdict

    texts = [user.SATISFIED[0], user.DISSATISFIED_FAILED[1], user.DISSATISFIED_NOTHING[0], user.ANNOYED[0], None]
    traj = pl.DataFrame({"policy_version": ["A"] * 5, "followup_text": texts})
    assert with_user_verdict(traj).get_column("tests_passed").to_list() == [True, False, False, None, None]
    given = traj.with_columns(tests_passed=pl.Series([False] * 5))
    assert with_user_verdict(given).get_column("tests_passed").to_list() == [False] * 5  # a real column wins


# --- two cycles through the real CLI ------------------------------------------------------------

TINY = [
    "--set",
    "simulate.runner.max_new_tokens=8",
    "--set",
    "simulate.runner.max_turns=1",
    "--set",
    "train.max_steps=1",
    "--set",
    "eval.max_tasks=5",
    "--set",
    "eval.runner.max_new_tokens=8",
    "--set",
    "eval.runner.max_turns=1",
    "--set",
    "eval.max_latency_ratio=5.0",
]


@pytest.mark.docker
def test_two_cycles_stay_on_policy(cli, tmp_path, docker_client, capsys):
    """Two cycles from a start checkpoint: each serves what the last deployed; then the start
    and the last version are measured on the same fresh sessions (OUT/v0/measure beside the
    arm's measure run) and the report's differences against v0 are paired by session."""
    start = tmp_path / "start"
    assert cli(["init-model", "-o", str(start)]).exit_code == 0
    root = tmp_path / "loop"
    code = loop.main(
        [
            "--arms",
            "treatment",
            "--cycles",
            "2",
            "--episodes",
            "4",
            "--measure-episodes",
            "4",
            "--start",
            str(start),
            "--out",
            str(root),
            "--json",
            "-q",
            *TINY,
        ]
    )
    experiment = json.loads(capsys.readouterr().out)
    report = experiment["arms"]["treatment"]
    out = root / "treatment"
    assert code == 0
    first, second = (json.loads((out / f"cycle-{k}.json").read_text()) for k in (1, 2))
    assert first["decision"] == "accept" and first["deployed"]

    def served(run: str) -> set[str]:
        events = (json.loads(line) for line in (out / run / "simulate" / "events.jsonl").open())
        return {e["policy_version"] for e in events if e["type"] == "completion"}

    # cycle 2 sampled from the checkpoint cycle 1 deployed; cycle 1 from the start
    v0 = json.loads((out / "cycle-1" / "run.json").read_text())["base_id"]
    assert served("cycle-1") == {v0} == {json.loads((start / "rlcycle.json").read_text())["id"]}
    assert served("cycle-2") == {first["deployed"]} != {v0}
    assert json.loads((out / "cycle-2" / "run.json").read_text())["base_id"] == first["deployed"]
    # the report: one row per served version, in order, with its sessions
    ids = [v["id"] for v in report["versions"]]
    assert ids[:2] == [v0, first["deployed"]]
    assert [report["metrics"][v]["counts"]["sessions"] for v in ids[:2]] == [4, 4]
    assert [c["decision"] for c in report["cycles"]] == ["accept", second["decision"], None]
    assert report["verdict"]["improved"] in (True, False) and report["verdict"]["summary"]
    # v0 measured on the measure traffic: the same four sessions as the last version's
    record = json.loads((root / "runs.json").read_text())
    assert [c["name"] for c in record["v0"]["cycles"]] == ["measure"]
    keys = [
        pl.read_ipc(root / run / "measure" / "collect" / "trajectories.arrow")
        .pipe(paired.pair_key)
        .get_column("session_id")
        .unique()
        .sort()
        .to_list()
        for run in ("v0", "treatment")
    ]
    assert keys[0] == keys[1] and len(keys[0]) == 4  # the same sessions under other run prefixes
    last = "/".join(experiment["last"]["treatment"])
    assert experiment["paired"] == {last.replace("/", " "): 4}
    assert experiment["vs_v0"][last]["tests_pass_rate"]["diff"]["kind"] == "paired"
    assert (root / "report.txt").read_text().startswith("Experiment: arms treatment")
    # the HTML's online section: the measure runs only, its A/B paired as the text report's
    assert json.loads((root / "report" / "comparisons.json").read_text()) == {"pairs": [["v0", last]], "paired": True}
    html_traj = pl.read_ipc(root / "report" / "collect" / "trajectories.arrow")
    sessions = html_traj.group_by("policy_version").agg(pl.col("session_id").n_unique()).sort("policy_version")
    assert sessions.rows() == [(last, 4), ("v0", 4)]
    page = (root / "report" / "report.html").read_text()
    assert "Paired by session" in page and "matched sessions (" + last + " − v0: 4)" in page


@pytest.mark.docker
def test_user_verdict_matches_simulates_pass_count(cli, tmp_path, docker_client):
    """The hidden-test pass rate the experiment reports (the simulated user's verdict) is
    simulate's own graded pass count, session by session."""
    from rlcycle.report.closed_loop import with_user_verdict

    events, traj = tmp_path / "ev.jsonl", tmp_path / "traj.arrow"
    r = cli(
        [
            "simulate",
            "--policy",
            "scripted:reference",
            "--tasks",
            str(REPO / "sample_data" / "tasks"),
            "--episodes",
            "6",
            "-o",
            str(events),
            "--json",
        ]
    )
    assert r.exit_code == 0, r.error
    sim = json.loads(r.stdout)
    assert cli(["collect", str(events), "-o", str(traj), "-q"]).exit_code == 0
    verdicts = (
        with_user_verdict(pl.read_ipc(traj)).group_by("session_id").agg(pl.col("tests_passed").drop_nulls().last())
    )
    assert verdicts.height == sim["episodes"] - sim["errors"]
    assert int(verdicts.get_column("tests_passed").sum()) == sim["passed"] > 0
