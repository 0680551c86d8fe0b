"""The closed-loop experiment (experiments/closed_loop/run.py): two simulate-sourced cycles run
in-process with their own registry home stay on-policy, and the A/B metrics are the right
numbers on a hand-made trajectories table."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLE

from experiments.closed_loop import pool
from experiments.closed_loop import run as loop
from experiments.closed_loop.report import VERDICT_METRICS, ab_cells, loop_metrics
from rlcycle import stats
from rlcycle.errors import InputError
from rlcycle.report import ab

REPO = Path(__file__).resolve().parent.parent

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


def _config(arm: str | None, seed: int, sets: list[str]):
    return loop.cycle_config(Path("/r/run"), Path("/r/home"), arm, seed, 7, "/t", False, sets)


def test_cycle_config_and_sets():
    """`--set` means what it means to `rlcycle cycle --set`: a dotted key of a stage table, or a
    top-level key, resolved by rlcycle.config over the experiment's defaults."""
    sets = ["train.lr=1e-4", "eval.max_tasks=5", "simulate.runner.run_id=x", "reward_spec=/r.toml"]
    cfg = _config(None, 2, sets)
    assert cfg.source == "simulate" and cfg.tasks == "/t" and cfg.reward_spec == "/r.toml"
    assert cfg.run_dir == "/r/run" and cfg.registry_home == "/r/home"  # the arm's own registry, explicit
    assert cfg.simulate.seed == 2 and cfg.simulate.episodes == 7 and cfg.simulate.runner.run_id == "x"
    assert cfg.train.lr == 1e-4 and cfg.eval.max_tasks == 5
    assert cfg.train.max_steps > 1000  # epochs decide, not a step cap
    assert cfg.train.batch_size == 16 and cfg.eval.gates.latency_noise_ms == 10000.0  # the experiment's own sizes
    # every unknown key at once, exit 2 (InputError), naming where it came from
    with pytest.raises(InputError) as e:
        _config(None, 2, ["bogus=1", "sourse=logs"])
    assert "--set: unknown key 'bogus'" in e.value.message and "did you mean 'source'?" in e.value.message


def test_arms_differ_only_in_their_distill_switch():
    configs = {arm: _config(arm, 5, ["train.lr=1e-4"]) for arm in ("treatment", "control", "naive")}
    t, c, n = (configs[a] for a in ("treatment", "control", "naive"))
    assert not t.distill.permute_rewards and not t.distill.discard_invalid
    assert (c.distill.permute_rewards, c.distill.permute_seed) == (True, 5)  # a fresh shuffle per cycle
    assert n.distill.discard_invalid and not n.distill.permute_rewards
    for cfg in (c, n):
        cfg.distill = t.distill
    assert t == c == n  # everything else identical: traffic seed, sessions, training
    # the same traffic seeds in every arm; the measure run's is fresh and the same too
    assert loop.seeds(1, 2) == [("cycle-1", 1001), ("cycle-2", 1002), ("measure", 1900)]
    assert loop.seeds(1, 2, heldout=True)[-1] == ("measure-heldout", 1901)  # its own fresh sessions
    assert loop.main(["--arms", "treatment,bogus", "--report-only"]) == 2
    assert loop.main(["--arms", "treatment,bogus", "--out", "/nonexistent/x"]) == 2


def test_plan_resolves_every_run_and_writes_nothing(tmp_path, capsys):
    """--plan: each run's name, seed and resolved cycle config (the start need not exist yet:
    edit_experiment.sh plans before it makes one); nothing is written."""
    out = tmp_path / "exp"
    args = ["--plan", "--json", "--cycles", "2", "--seed", "3", "--start", str(tmp_path / "later"), "--out", str(out)]
    assert loop.main([*args, "--tasks", str(REPO / "sample_data" / "tasks"), "--set", "train.lr=1e-4"]) == 0
    plan = json.loads(capsys.readouterr().out)
    runs = [(r["arm"], r["run"], r["seed"]) for r in plan["runs"]]
    assert runs[0] == ("v0", "measure", 3900)  # a chosen start: v0 measured on the measure traffic
    assert runs[1:4] == [("treatment", "cycle-1", 3001), ("treatment", "cycle-2", 3002), ("treatment", "measure", 3900)]
    control = [r["config"] for r in plan["runs"] if r["arm"] == "control"]
    assert [(c["distill"]["permute_rewards"], c["distill"]["permute_seed"]) for c in control[:2]] == [
        (True, 3001),
        (True, 3002),
    ]
    assert not control[2]["distill"]["permute_rewards"]  # the measure run: no switch
    assert all(r["config"]["train"]["lr"] == 1e-4 for r in plan["runs"])
    assert all(r["config"]["registry_home"] == str(out / r["arm"] / "home") for r in plan["runs"])
    assert not out.exists()


def test_pool_refuses_what_is_not_a_finished_seed(tmp_path, capsys):
    assert pool.main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'runs.json'}: no such file" in capsys.readouterr().err
    assert pool.main([str(tmp_path), str(tmp_path)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_user_verdict_is_the_hidden_tests_verdict():
    """tests_passed from the simulated user's follow-up: satisfied texts pass, complaints fail,
    anything else (a clarification answer, no follow-up) says nothing."""
    from experiments.closed_loop.report import with_user_verdict
    from rlcycle.agent import user

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
    "eval.gates.max_latency_ratio=5.0",
]


@pytest.mark.docker
def test_two_cycles_stay_on_policy(cli, tmp_path, docker_client, capsys):
    """Two cycles from a start checkpoint, in this process, against the arm's own registry home:
    each serves what the last deployed; then the start and the last version are measured on the
    same fresh sessions (OUT/v0/measure beside the arm's measure run) and the report's
    differences against v0 are paired by session (the pair_key column)."""
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
            "--heldout",
            str(SAMPLE / "edit_tasks" / "heldout"),
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
    # the verdict: the last measured version against v0, from the A/B cells the report shows;
    # improved = a verdict metric better with 95% confidence and none worse. Four sessions a
    # version decide nothing about learning, so not which way it went is asserted, only that
    # the verdict follows from those cells and names the two versions it compared.
    verdict, last = report["verdict"], report["versions"][-1]
    assert verdict["calls"] == {m: cell["call"] for m, cell in report["ab"][last["id"]].items()}
    calls = [verdict["calls"].get(m) for m in VERDICT_METRICS]
    assert verdict["improved"] == ("better" in calls and "worse" not in calls)
    assert last["label"] in verdict["summary"] and "v0" in verdict["summary"]
    # step 1 of each cycle's train, as its train_metrics.arrow wrote it; none for the measure run
    for c, k in zip(report["cycles"][:2], (1, 2), strict=True):
        row = pl.read_ipc(out / f"cycle-{k}" / "train" / "checkpoint" / "train_metrics.arrow").row(0, named=True)
        assert c["mismatch"]["mismatch_kl"] == row["mismatch_kl"] and row["step"] == 1
        assert c["mismatch"]["seq_ratio_min"] <= c["mismatch"]["seq_ratio_max"]
    assert report["cycles"][2]["mismatch"] is None
    # v0 measured on the measure traffic: the same four sessions as the last version's
    record = json.loads((root / "runs.json").read_text())
    assert [c["name"] for c in record["v0"]["cycles"]] == ["measure"]
    measured = [pl.read_ipc(root / run / "measure" / "collect" / "trajectories.arrow") for run in ("v0", "treatment")]
    keys = [t.get_column("pair_key").unique().sort().to_list() for t in measured]
    sessions = [set(t.get_column("session_id")) for t in measured]
    assert keys[0] == keys[1] and len(keys[0]) == 4 and None not in keys[0]  # the same sessions ...
    assert not sessions[0] & sessions[1]  # ... under other session ids (they name the run)
    cycle1 = pl.read_ipc(out / "cycle-1" / "collect" / "trajectories.arrow").get_column("pair_key")
    assert not set(cycle1) & set(keys[0])  # another traffic seed: other sessions, nothing to pair
    last = "/".join(experiment["last"]["treatment"])
    assert experiment["paired"] == {last.replace("/", " "): 4}
    assert experiment["vs_v0"][last]["tests_pass_rate"]["diff"]["kind"] == "paired"
    assert (root / "report.txt").read_text().startswith("Experiment: arms treatment")
    assert "Serving vs trainer at step 1" in (root / "report.txt").read_text()
    # held-out: v0 and the last version on the same fresh sessions of tasks the arm never saw,
    # kept out of the arm's per-version report (its versions were measured on training tasks)
    held = [
        pl.read_ipc(root / run / "measure-heldout" / "collect" / "trajectories.arrow") for run in ("v0", "treatment")
    ]
    held_keys = [t.get_column("pair_key").unique().sort().to_list() for t in held]
    assert held_keys[0] == held_keys[1] and len(held_keys[0]) == 4 and not set(held_keys[0]) & set(keys[0])
    for arm in ("v0", "treatment"):
        cfg = json.loads((root / arm / "measure-heldout.config.json").read_text())
        assert cfg["tasks"] == str((SAMPLE / "edit_tasks" / "heldout").resolve())
    assert record["v0"]["heldout"]["name"] == record["arms"]["treatment"]["heldout"]["name"] == "measure-heldout"
    assert all(c["name"] != "measure-heldout" for c in record["arms"]["treatment"]["cycles"])
    assert experiment["heldout"]["paired"] == {last.replace("/", " "): 4}
    assert experiment["heldout"]["vs_v0"][last]["tests_pass_rate"]["diff"]["kind"] == "paired"
    assert "=== held-out tasks" in (root / "report.txt").read_text()
    # the arm's registry home holds what it deployed; the process's RLCYCLE_HOME is untouched
    from rlcycle.policy.registry import Registry

    deployed = second["deployed"] or first["deployed"]
    assert Registry(root / "treatment" / "home" / "registry").aliases()["production"] == deployed
    assert not (Path(os.environ["RLCYCLE_HOME"]) / "registry").exists()
    # the HTML: `rlcycle report` of the real run directories, v0's measure run first; its A/B
    # paired by session as the text report's
    last_id = next(v["id"] for v in report["versions"] if v["label"] == experiment["last"]["treatment"][1])
    assert experiment["html"]["command"] == (
        f"rlcycle report {root / 'v0' / 'measure'} {out / 'measure'} -o {root / 'report.html'}"
    )
    page = (root / "report.html").read_text()
    assert "Paired by session" in page and f"matched sessions ({last_id} − {v0}: 4)" in page
    assert not (root / "report").exists()  # no fabricated run directory
    # pool.py over two copies of this seed: each copy's difference is the report's, the pool has
    # the same difference over twice the sessions; no control arm ran, so no comparison with it
    twin = tmp_path / "twin"
    shutil.copytree(root, twin)
    pooled = pool.pool([root, twin])
    for suite, block in (("traffic", experiment), ("heldout", experiment["heldout"])):
        rows = pooled["suites"][suite]["comparisons"]
        assert set(rows) == {"treatment - v0"}
        single = rows["treatment - v0"]["seeds"][str(root)]
        want = block["vs_v0"][last]["tests_pass_rate"]["diff"]["value"]
        assert single["n"] == 4 and single["diff"]["tests_pass_rate"]["value"] == pytest.approx(want)
        assert rows["treatment - v0"]["pooled"]["n"] == 8
        assert rows["treatment - v0"]["pooled"]["diff"]["tests_pass_rate"]["value"] == pytest.approx(want)


@pytest.mark.docker
def test_user_verdict_matches_simulates_pass_count(cli, tmp_path, docker_client):
    """The hidden-test pass rate the experiment reports (the simulated user's verdict) is
    simulate's own graded pass count, session by session."""
    from experiments.closed_loop.report import with_user_verdict

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
