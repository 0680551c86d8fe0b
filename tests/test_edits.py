"""`rlcycle edits` on a real git repository and a gateway-shaped log (no agent client: see
tests/test_edits_clients.py for mini-swe-agent through the real gateway).

Each test drives the shipped CLI as cron would: a run before the agent works (the before
snapshot), the agent's calls (files written, calls logged), a run after (the episode is
recorded), the user's own work, then a run that observes. `settle_s=0` so the episode counts as
finished at once, `observe_after_s` large or 0 to say whether the observation is due.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import polars as pl
import pytest

from tests.edits_world import GatewayLog, commit_all, git, make_repo, read_outcomes, write

NOW = ["--set", "settle_s=0", "--set", "observe_after_s=0"]
LATER = ["--set", "settle_s=0", "--set", "observe_after_s=3600"]

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
UTIL = "import os\nROOT = os.getcwd()\nNAME = 'util'\n"
FMT = "x=[1,2,3]\nif x:\n  print( x )\n"


@pytest.fixture
def world(tmp_path):
    return {"repo": make_repo(tmp_path), "log": GatewayLog(tmp_path / "gw"), "out": tmp_path / "edit-events"}


def edits(cli, world, *extra, ok=True):
    r = cli(["edits", "--repo", world["repo"], world["log"].dir, "-o", world["out"], "--json", *extra])
    if ok:
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)
    return r


def agent_episode(cli, world):
    """One episode of three edit calls, while the user adds a line of their own to calc.py."""
    repo, log = world["repo"], world["log"]
    edits(cli, world, *LATER)  # the before snapshot
    s0 = log.call("sess-a-e0", [("write_file", write(repo, "calc.py", CALC))])
    s1 = log.call(
        "sess-a-e0", [("write_file", write(repo, "util.py", UTIL)), ("write_file", write(repo, "fmt.py", FMT))]
    )
    with (repo / "calc.py").open("a") as f:  # the user, meanwhile: not the agent's line
        f.write("USER_ONLY = 1\n")
    log.call("sess-a-e0", [])  # the final answer
    rec = edits(cli, world, *LATER)
    assert rec["episodes_recorded"] == 1 and rec["proposals_recorded"] == 3, rec
    assert rec["lines_proposed"] == 4 + 3 + 3 and rec["lines_unattributed"] == 1, rec
    assert rec["outcomes_emitted"] == 0 and rec["proposals_waiting"] == 3 and rec["output"] is None
    return s0, s1


def test_survival_rules_reindent_move_revert_delete(cli, world, tmp_path):
    repo = world["repo"]
    s0, s1 = agent_episode(cli, world)
    # The user keeps add(), deletes sub() (a rewrite), reformats fmt.py, moves ROOT to a new
    # file and deletes util.py, then commits.
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return b - a + 0\n")
    (repo / "fmt.py").write_text("x = [1, 2, 3]\nif x:\n    print(x)\n")
    (repo / "paths.py").write_text("import os\n\nROOT   =   os.getcwd()\n")
    (repo / "util.py").unlink()
    commit_all(repo, "user's work")
    out = edits(cli, world, *NOW)
    assert out["outcomes_emitted"] == 3 and out["proposals_waiting"] == 0, out
    got = read_outcomes(world["out"])
    assert {k: (v["lines_proposed"], v["lines_surviving"]) for k, v in got.items()} == {
        f"{s0}-c0": (4, 3),  # def add, return a + b, def sub kept; return a - b rewritten
        f"{s1}-c0": (3, 2),  # util.py deleted; import os and ROOT moved to paths.py
        f"{s1}-c1": (3, 3),  # reformatted: the same lines without whitespace
    }
    assert all(e["event_id"] == f"{k}-outcome" and e["observed_after_s"] >= 0 for k, e in got.items())
    assert all(e["session_id"] == "sess-a" and e["sample_id"] in (s0, s1) for e in got.values())

    # collect joins them onto the samples that made the calls; distill rewards them
    traj, ex = tmp_path / "t.arrow", tmp_path / "ex.arrow"
    r = cli(["collect", world["log"].dir, world["out"], "-o", traj, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["orphans"] == {}
    t = pl.read_ipc(traj).sort("turn")
    assert t["edit_lines_proposed"].to_list() == [4, 6, None]
    assert t["edit_lines_surviving"].to_list() == [3, 5, None]
    r = cli(["distill", traj, "-o", ex, "--set", "exclude_flat_groups=false"])
    assert r.exit_code == 0, r.output
    parts = pl.read_ipc(ex).sort("turn")["reward_parts"].struct.field("edit_persistence").to_list()
    assert parts[:2] == pytest.approx([3 / 4 - 0.5, 5 / 6 - 0.5])


def test_outcomes_arrive_once_and_a_lost_state_re_emits_the_same_ids(cli, world, tmp_path):
    repo = world["repo"]
    agent_episode(cli, world)
    state = repo / ".git" / "rlcycle" / "edits-state.json"
    saved = tmp_path / "state-before-observing.json"
    shutil.copyfile(state, saved)
    (repo / "util.py").unlink()
    first = edits(cli, world, *NOW)
    assert first["outcomes_emitted"] == 3
    again = edits(cli, world, *NOW)  # cron runs again: nothing new
    assert again["outcomes_emitted"] == 0 and again["output"] is None
    # a crash after the events were written but before the state was: the rerun writes the
    # same event ids, which collect drops as duplicates
    shutil.copyfile(saved, state)
    third = edits(cli, world, *NOW)
    assert third["outcomes_emitted"] == 3 and third["output"] != first["output"]
    ids = [json.loads(x)["event_id"] for x in open(first["output"])]
    assert ids == [json.loads(x)["event_id"] for x in open(third["output"])]
    r = cli(["collect", world["log"].dir, world["out"], "-o", tmp_path / "t.arrow", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["duplicates"] == 3, r.output
    t = pl.read_ipc(tmp_path / "t.arrow").sort("turn")
    assert t["edit_lines_surviving"].to_list() == [4, 3, None]  # util.py gone: 0 of its 3 lines


def test_the_users_index_head_and_files_are_untouched(cli, world):
    repo = world["repo"]
    (repo / "staged.py").write_text("a = 1\n")
    git(repo, "add", "staged.py")
    (repo / "staged.py").write_text("a = 2\n")  # staged one version, another in the tree
    before = (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD"), git(repo, "diff", "--cached"))
    agent_episode(cli, world)
    edits(cli, world, *NOW)
    assert (repo / "staged.py").read_text() == "a = 2\n"
    after = (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD"), git(repo, "diff", "--cached"))
    assert before[1:] == after[1:]
    assert " M staged.py" not in before[0] and "AM staged.py" in after[0]


def test_not_a_repository_is_a_usage_error(cli, world, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    world["log"].call("sess-x-e0", [])
    r = edits(cli, {**world, "repo": plain}, ok=False)
    assert r.exit_code == 2 and "not a git working tree" in r.stderr and str(plain) in r.stderr, r.output
    r = edits(cli, {**world, "repo": tmp_path / "nowhere"}, ok=False)
    assert r.exit_code == 2 and "no such directory" in r.stderr
    r = edits(cli, world, "--target", "no-such-branch", ok=False)
    assert r.exit_code == 2 and "no-such-branch" in r.stderr


def test_rewritten_history_waits_then_is_a_counted_skip(cli, world):
    repo = world["repo"]
    agent_episode(cli, world)
    commit_all(repo, "agent's work")
    # a force pull: HEAD now on a history that does not contain the one the agent worked on
    git(repo, "checkout", "-q", "--orphan", "rewritten")
    commit_all(repo, "rewritten root")
    waiting = edits(cli, world, *NOW)
    assert waiting["outcomes_emitted"] == 0 and waiting["proposals_waiting"] == 3, waiting
    skipped = edits(cli, world, *NOW, "--set", "give_up_s=0")
    assert skipped["outcomes_emitted"] == 0 and skipped["proposals_skipped"] == {"history_rewritten": 3}
    assert read_outcomes(world["out"]) == {}


def test_a_branch_target_counts_what_the_branch_holds(cli, world, tmp_path):
    """--target main: lines on a branch never merged into main are not kept. The default
    worktree target, with main checked out, counts the same (main descends from the HEAD the
    agent worked on); a branch with commits of its own abandoned is rewritten history."""
    repo, log = world["repo"], world["log"]
    git(repo, "checkout", "-q", "-b", "feature")
    edits(cli, world, *LATER)
    kept = log.call("sess-b-e0", [("write_file", write(repo, "a.py", "A = 1\n"))])
    lost = log.call("sess-b-e0", [("write_file", write(repo, "b.py", "B = 2\n"))])
    edits(cli, world, *LATER)
    commit_all(repo, "feature")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "feature", "--", "a.py")  # only a.py reaches main
    commit_all(repo, "take a.py")
    state = repo / ".git" / "rlcycle" / "edits-state.json"
    shutil.copyfile(state, tmp_path / "state.json")
    # the worktree target (a copy of the state, its own output), main checked out
    on_main = edits(cli, {**world, "out": tmp_path / "worktree-out"}, *NOW, "--state", tmp_path / "state.json")
    assert (on_main["outcomes_emitted"], on_main["lines_surviving"]) == (2, 1), on_main
    git(repo, "checkout", "-q", "feature")
    out = edits(cli, world, *NOW, "--target", "main")
    assert out["outcomes_emitted"] == 2
    got = read_outcomes(world["out"])
    assert got[f"{kept}-c0"]["lines_surviving"] == 1 and got[f"{lost}-c0"]["lines_surviving"] == 0


def test_binary_files_and_a_huge_diff_are_counted_skips(cli, world):
    repo, log = world["repo"], world["log"]
    edits(cli, world, *LATER)
    (repo / "logo.png").write_bytes(b"\x89PNG\0\0\x01binary")
    log.call("sess-c-e0", [("write_file", write(repo, "ok.py", "OK = 1\n")), ("save_image", {"path": "logo.png"})])
    rec = edits(cli, world, *LATER)
    assert rec["binary_files"] == 1 and rec["proposals_recorded"] == 1 and rec["lines_proposed"] == 1, rec

    big = "".join(f"line_{i} = {i}\n" for i in range(5000))
    log.call("sess-c-e1", [("write_file", write(repo, "big.py", big))])
    rec = edits(cli, world, *LATER, "--set", "max_diff_bytes=4096")
    assert rec["episodes_skipped"] == {"diff over max_diff_bytes (4,096)": 1} and rec["proposals_recorded"] == 0
    # the skip is final: a later run does not count it again
    assert edits(cli, world, *LATER)["episodes_skipped"] == {}


def test_episodes_before_the_first_snapshot_or_still_open_are_not_guessed(cli, world):
    repo, log = world["repo"], world["log"]
    log.call("sess-d-e0", [("write_file", write(repo, "early.py", "E = 1\n"))])
    first = edits(cli, world, *LATER)  # the first run: no tree from before that episode
    assert first["episodes_skipped"] == {"no snapshot before the episode": 1}
    log.call("sess-d-e1", [("write_file", write(repo, "late.py", "L = 1\n"))])
    still = edits(cli, world, "--set", "settle_s=3600")
    assert still["episodes_open"] == 1 and still["proposals_recorded"] == 0


def test_report_shows_edit_persistence_per_policy_version_from_edits_events(cli, world, tmp_path):
    """Two versions serve two sessions each; the user keeps more of v-a's lines than v-b's."""
    from rlcycle.online import online_metrics

    repo, log = world["repo"], world["log"]
    edits(cli, world, *LATER)
    for session, version, path, content in (
        ("sess-a1", "v-a", "a1.py", "A = 1\nA2 = 2\n"),
        ("sess-a2", "v-a", "a2.py", "C = 1\nC2 = 2\n"),
        ("sess-b1", "v-b", "b1.py", "B = 1\nB2 = 2\nB3 = 3\n"),
        ("sess-b2", "v-b", "b2.py", "D = 1\n"),
    ):
        log.call(f"{session}-e0", [("write_file", write(repo, path, content))], version=version)
    edits(cli, world, *LATER)
    (repo / "a2.py").write_text("C = 1\n")
    (repo / "b1.py").write_text("B = 1\n")
    (repo / "b2.py").unlink()
    edits(cli, world, *NOW)
    run = tmp_path / "run"
    r = cli(["collect", log.dir, world["out"], "-o", run / "collect" / "trajectories.arrow"])
    assert r.exit_code == 0, r.output
    m = online_metrics(pl.read_ipc(run / "collect" / "trajectories.arrow")).metrics
    a, b = m["v-a"]["edit_persistence"], m["v-b"]["edit_persistence"]
    assert (a.num, a.den, a.units) == (3, 4, 2) and (b.num, b.den, b.units) == (1, 4, 2)
    assert a.value == pytest.approx(0.75) and b.value == pytest.approx(0.25)
    assert a.low is not None and a.low <= a.value <= a.high and b.low is not None and b.low <= b.value <= b.high
    r = cli(["report", run, "--json"])
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    assert "Edit persistence" in page and "v-a" in page and "v-b" in page


def test_git_missing_objects_do_not_crash_a_run(cli, world):
    """A snapshot git pruned (gc after weeks): the episode is a counted skip, not an error."""
    repo, log = world["repo"], world["log"]
    edits(cli, world, *LATER)
    state = repo / ".git" / "rlcycle" / "edits-state.json"
    doc = json.loads(state.read_text())
    doc["snapshots"][-1]["tree"] = "0" * 40
    state.write_text(json.dumps(doc))
    log.call("sess-e-e0", [("write_file", write(repo, "x.py", "X = 1\n"))])
    rec = edits(cli, world, *LATER)
    assert rec["episodes_skipped"] == {"snapshot pruned from the object store": 1}, rec
    assert subprocess.run(["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True).returncode == 0


def test_the_state_forgets_what_cannot_matter_and_outcomes_still_arrive_once(cli, world):
    """keep_snapshots_s=0: every run prunes as far as it can. An open episode holds the horizon
    (and its before-snapshot) back; a forgotten episode still in the log is ignored, never
    recorded or emitted again; a pending proposal is kept whatever its age."""
    repo, log = world["repo"], world["log"]
    state = repo / ".git" / "rlcycle" / "edits-state.json"
    forget = ["--set", "keep_snapshots_s=0"]
    edits(cli, world, *LATER)  # the before snapshot
    sample = log.call("sess-p-e0", [("write_file", write(repo, "p.py", "P = 1\nQ = 2\n"))])
    still = edits(cli, world, *forget, "--set", "settle_s=3600")  # open: nothing of it forgotten
    assert still["episodes_open"] == 1 and len(json.loads(state.read_text())["snapshots"]) == 2, still
    rec = edits(cli, world, *LATER, *forget)
    assert rec["episodes_recorded"] == 1 and rec["lines_proposed"] == 2, rec
    doc = json.loads(state.read_text())  # the episode is forgotten; its pending proposal is not
    assert doc["episodes"] == {} and [e["status"] for e in doc["edits"]] == ["pending"], doc
    assert doc["horizon_ms"] > 0 and len(doc["snapshots"]) == 1 and rec["pruned"]["episodes"] == 1
    (repo / "p.py").write_text("P = 1\n")
    obs = edits(cli, world, *NOW, *forget)
    assert obs["outcomes_emitted"] == 1 and obs["lines_surviving"] == 1, obs
    assert obs["episodes_before_horizon"] == 1 and obs["episodes_recorded"] == 0
    for _ in range(2):  # the emitted proposal is forgotten next run; nothing comes back
        again = edits(cli, world, *NOW, *forget)
        assert again["outcomes_emitted"] == 0 and again["episodes_recorded"] == 0 and again["output"] is None
        assert again["episodes_before_horizon"] == 1
    doc = json.loads(state.read_text())
    assert (doc["episodes"], doc["edits"], len(doc["snapshots"])) == ({}, [], 1), doc
    assert list(read_outcomes(world["out"])) == [f"{sample}-c0"]


def test_a_foreign_or_broken_state_file_and_an_overlapping_run_are_clear_errors(cli, world, tmp_path):
    from rlcycle import io as rio

    edits(cli, world, *LATER)
    state = world["repo"] / ".git" / "rlcycle" / "edits-state.json"
    other = make_repo(tmp_path / "other")
    r = edits(cli, {**world, "repo": other}, "--state", state, ok=False)  # another repository's state
    assert r.exit_code == 2 and "belongs to the repository" in r.stderr and "--state" in r.stderr, r.output
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": 1, "repo": ')
    r = edits(cli, world, "--state", broken, ok=False)
    assert r.exit_code == 2 and "unreadable" in r.stderr, r.output
    with rio.FileLock(state.with_name(state.name + ".lock"), wait=False, holder="another run"):
        r = edits(cli, world, ok=False)  # cron's next tick while a slow run still holds the state
    assert r.exit_code == 1 and "locked by another run" in r.stderr, r.output
    assert edits(cli, world, *LATER)["episodes_seen"] == 0  # the state is intact afterwards


def test_an_observation_over_the_byte_bound_is_a_final_counted_skip(cli, world):
    repo = world["repo"]
    agent_episode(cli, world)
    (repo / "data.py").write_text("".join(f"row_{i} = {i}\n" for i in range(500)))  # the user's big file
    out = edits(cli, world, *NOW, "--set", "max_diff_bytes=1024")
    assert out["proposals_skipped"] == {"observation over max_diff_bytes (1,024)": 3}, out
    assert out["outcomes_emitted"] == 0 and read_outcomes(world["out"]) == {}
    again = edits(cli, world, *NOW)  # decided: a larger bound later does not observe it after all
    assert again["outcomes_emitted"] == 0 and again["proposals_skipped"] == {}
