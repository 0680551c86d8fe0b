"""`rlcycle edits` end to end with a real client: mini-swe-agent 2.4.6 (pinned, its own venv, as in
tests/test_gateway_clients.py) edits a real git repository through the real gateway, a scripted
user commits on top, then `edits` -> `collect` -> `distill` -> the online metrics of `report`.

Two policy versions: two gateways, each serving its own checkpoint (`production` of a registry
of its own) over a scripted upstream, log into two directories, as a team running a second
version beside the first would. The model is the stand-in of test_gateway_clients.py (the tiny
random checkpoint cannot write tool calls): a fixed completion per task and step. The client,
the gateways, the harness parser, the log, git, edits, collect, distill and the metrics are real.
Not covered here: the gateway's own canary split (`--canary`) of one gateway over two
checkpoints, which needs an upstream serving both (tests/test_vllm_upstream.py does that on vLLM).
"""

from __future__ import annotations

import json
import textwrap

import polars as pl
import pytest

from rlcycle.policy.registry import Entry, Registry
from tests.edits_world import commit_all
from tests.test_gateway import _scripted_upstream, _start, world  # noqa: F401  (fixture)
from tests.test_gateway_clients import CALL, Scripted, _drive, _repo, _venv

pytestmark = pytest.mark.slow


def bash(command: str) -> str:
    return CALL.format(name="bash", args=json.dumps({"command": command}))


SUBMIT = "Done.\n" + bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
FMT = "x=[1,2,3]\nif x:\n  print( x )\n"
UTIL = "import os\nROOT = os.getcwd()\nNAME = 'util'\n"
SCRIPTS = {
    "EDITS-A-TASK": [
        "Write calc.py.\n" + bash(f"cat > calc.py <<'EOF'\n{CALC}EOF"),
        "Write fmt.py.\n" + bash(f"cat > fmt.py <<'EOF'\n{FMT}EOF"),
        SUBMIT,
    ],
    "EDITS-B-TASK": ["Write util.py.\n" + bash(f"cat > util.py <<'EOF'\n{UTIL}EOF"), SUBMIT],
}
MINI = """
import os, sys, yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

cfg = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
model_cfg = {**cfg["model"], "model_name": "openai/production"}
model_cfg["model_kwargs"] = {
    **(model_cfg.get("model_kwargs") or {}),
    "api_base": os.environ["BASE"],
    "api_key": "unused",
    "max_tokens": 256,
}
agent = DefaultAgent(
    LitellmModel(**model_cfg), LocalEnvironment(cwd=os.getcwd()), **{**cfg["agent"], "step_limit": 6}
)
result = agent.run(os.environ["TASK"] + ": write the files")
print("EXIT", result.get("exit_status"))
"""
ENV = {"MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_CONFIGURED": "true"}


def _second_version(world, root):  # noqa: F811
    """A second checkpoint, `production` of a registry of its own."""
    from rlcycle import model_init

    model = model_init.run(model_init.InitModelConfig(seed=1), root / "m1").path
    reg = Registry(root / "registry-b")
    with reg.locked():
        cid = reg.add(model)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    return {**world, "model": model, "registry": str(reg.root), "cid": cid}


def test_mini_swe_agent_edits_persistence_end_to_end(cli, world, tmp_path):  # noqa: F811
    py = _venv("mini-swe-agent")
    world_b = _second_version(world, tmp_path)
    repo = _repo(tmp_path)
    out, logs = tmp_path / "edit-events", [tmp_path / "logs-a", tmp_path / "logs-b"]
    servers = [_scripted_upstream(w, Scripted(str(world["model"]), SCRIPTS)) for w in (world, world_b)]
    gateways = [_start(w, d, upstream=s.url) for w, d, s in zip((world, world_b), logs, servers, strict=True)]

    def edits(*sets: str) -> dict:
        r = cli(["edits", "--repo", repo, *logs, "-o", out, "--json", "--set", "settle_s=0", *sets])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    try:
        edits("--set", "observe_after_s=3600")  # cron's tick before the agents start
        recorded = []
        for gw, task in zip(gateways, ("EDITS-A-TASK", "EDITS-B-TASK"), strict=True):
            said = _drive(py, textwrap.dedent(MINI), repo, {**ENV, "BASE": gw.url + "/v1", "TASK": task})
            assert "EXIT Submitted" in said, said
            gw.gateway.log.flush()
            recorded.append(edits("--set", "observe_after_s=3600"))  # cron's next tick
        assert (repo / "calc.py").read_text() == CALC and (repo / "util.py").read_text() == UTIL
        assert [r["episodes_recorded"] for r in recorded] == [1, 1], recorded
        assert [r["lines_proposed"] for r in recorded] == [4 + 3, 3], recorded
        assert [r["proposals_recorded"] for r in recorded] == [2, 1], recorded
        assert sum(r["lines_unattributed"] for r in recorded) == 0, recorded
    finally:
        for g in gateways + servers:
            g.close()

    # the user: keeps add() and rewrites sub(), reformats fmt.py, moves ROOT into a new file
    # and deletes util.py; commits
    (repo / "calc.py").write_text(CALC.replace("return a - b", "return -(b - a)"))
    (repo / "fmt.py").write_text("x = [1, 2, 3]\nif x:\n    print(x)\n")
    (repo / "paths.py").write_text("ROOT = os.getcwd()\n")
    (repo / "util.py").unlink()
    commit_all(repo, "user's work")
    obs = edits("--set", "observe_after_s=0")
    assert obs["outcomes_emitted"] == 3 and obs["lines_surviving"] == 3 + 3 + 1, obs

    traj, ex = tmp_path / "run" / "collect" / "trajectories.arrow", tmp_path / "ex.arrow"
    r = cli(["collect", *logs, out, "-o", traj, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["orphans"] == {}, r.output
    t = pl.read_ipc(traj).sort("policy_version", "turn")
    by_version = {world["cid"]: [(4, 3), (3, 3), (None, None)], world_b["cid"]: [(3, 1), (None, None)]}
    for version, expected in by_version.items():
        rows = t.filter(pl.col("policy_version") == version)
        assert list(zip(rows["edit_lines_proposed"], rows["edit_lines_surviving"], strict=True)) == expected
    r = cli(["distill", traj, "-o", ex, "--set", "exclude_flat_groups=false"])
    assert r.exit_code == 0, r.output
    e = pl.read_ipc(ex).filter(pl.col("edit_lines_proposed").is_not_null())
    reward = e["reward_parts"].struct.field("edit_persistence")
    kept = (e["edit_lines_surviving"] / e["edit_lines_proposed"] - 0.5).to_list()
    assert reward.to_list() == pytest.approx(kept) and sorted(kept) == pytest.approx([1 / 3 - 0.5, 0.25, 0.5])

    from rlcycle.online import online_metrics

    m = online_metrics(pl.read_ipc(traj)).metrics
    assert m[world["cid"]]["edit_persistence"].value == pytest.approx(6 / 7)
    assert m[world_b["cid"]]["edit_persistence"].value == pytest.approx(1 / 3)
    r = cli(["report", tmp_path / "run", "--json"])
    assert r.exit_code == 0, r.output
    assert "Edit persistence" in (tmp_path / "run" / "report.html").read_text()
