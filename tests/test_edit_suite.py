"""The edit suite (sample_data/edit_tasks): generated deterministically by
scripts/gen_edit_tasks.py, every task a one-file repo whose reference is one `replace_in_file`,
the reference passes and doing nothing fails in real sandboxes, and the simulated user's
edit outcomes reach collect for the new tool (docs/tasks.md, "The edit suite")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlcycle.harness.demos import reference_transcript
from rlcycle.tasks import load_suite, reference_calls

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "sample_data" / "edit_tasks"
GEN = REPO / "scripts" / "gen_edit_tasks.py"


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def generate(out: Path, seed: int) -> None:
    subprocess.run([sys.executable, str(GEN), "--seed", str(seed), "--out", str(out)], check=True, capture_output=True)


def test_the_committed_suite_is_what_the_script_writes_and_seeds_matter(tmp_path):
    generate(tmp_path / "a", 0)
    assert tree(tmp_path / "a") == tree(SUITE)  # regenerate with --seed 0 after changing the script
    generate(tmp_path / "b", 1)
    assert tree(tmp_path / "b") != tree(SUITE)


def test_families_splits_difficulty_and_one_replace_per_task():
    tasks = load_suite(SUITE)
    assert len(tasks) == 72 and len({t.instruction for t in tasks}) == 72
    assert Counter(t.cluster for t in tasks) == {
        f"edit-{f}": 12 for f in ("string", "default", "rename", "compare", "range", "return")
    }
    held = {t.id for t in load_suite(SUITE / "heldout")}
    assert len(held) == 24 and len(load_suite(SUITE / "train")) == 48
    assert {t.difficulty for t in tasks} == {1, 2, 3}
    for t in tasks:
        assert set(t.repo) == set(t.solution) == {"app.py"} and t.repo["app.py"].count("\n") <= 12
        calls = reference_calls(t)
        assert [c.name for c in calls] == ["read_file", "replace_in_file", "run_tests", "finish"], t.id
        edit = calls[1].arguments
        text = t.repo["app.py"]
        assert text.count(edit["old"]) == 1 and "\n" not in edit["old"], t.id  # one line
        assert text.replace(edit["old"], edit["new"], 1) == t.solution["app.py"], t.id


def test_a_demo_is_short_enough_for_a_small_model():
    from rlcycle.harness import ChatRenderer

    renderer = ChatRenderer.from_pretrained(REPO / "sample_data" / "tokenizer")
    sizes = [len(reference_transcript(t, renderer).ids) for t in load_suite(SUITE)]
    assert max(sizes) < 1400  # of the tiny model's 4,096 positions


@pytest.mark.docker
def test_reference_passes_and_doing_nothing_fails_in_sandboxes(cli, tmp_path, docker_client):
    """One task of each family through the real CLI (`tasks check --grade` proved all 72 when
    they were generated; docs/tasks.md)."""
    sub = tmp_path / "suite"
    seen = set()
    for d in sorted((SUITE / "heldout").iterdir()):
        family = d.name.rsplit("-", 1)[0]
        if family not in seen:
            seen.add(family)
            shutil.copytree(d, sub / d.name)
    r = cli(["tasks", "check", sub, "--grade"])
    assert r.exit_code == 0, r.output
    out = {}
    for policy in ("scripted:reference", "scripted:nothing"):
        events = tmp_path / f"{policy.split(':')[1]}.jsonl"
        r = cli(["simulate", "-p", policy, "-t", sub, "--sandboxes", 2, "--json", "-q", "-o", events])
        assert r.exit_code == 0, r.output
        out[policy] = json.loads(r.stdout)
    assert (out["scripted:reference"]["passed"], out["scripted:reference"]["edit_rate"]) == (6, 1.0)
    assert (out["scripted:nothing"]["passed"], out["scripted:nothing"]["edit_rate"]) == (0, 0.0)
    # collect joins the user's edit outcomes to the replace_in_file calls (an edit tool).
    traj = tmp_path / "traj.arrow"
    r = cli(["collect", tmp_path / "reference.jsonl", "-o", traj, "--as-of", "2026-12-02T12:00:00Z", "-q"])
    assert r.exit_code == 0, r.output
    import polars as pl

    t = pl.read_ipc(traj).filter(pl.col("edit_lines_proposed").is_not_null())
    assert t.height == 6 and (t["edit_lines_surviving"] == t["edit_lines_proposed"]).all()
