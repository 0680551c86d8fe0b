"""`rlcycle edits` end to end with a real client and a real canary: mini-swe-agent 2.4.6 (pinned,
its own venv, as in tests/test_gateway_clients.py) edits a real git repository through ONE real
gateway that splits sessions between two policy versions (the registry's `production` and
`candidate`, `canary_fraction` 0.5), a scripted user commits on top, then `edits` -> `collect`
-> `distill` -> `report`, which shows edit persistence per version with its interval.

The upstream serves both versions as vLLM serves a base and a LoRA candidate (`TwoVersions`
below): /v1/models lists production's checkpoint and the candidate's adapter by the deploy
hook's name, and each name is answered by a scripted model of its own (the stand-in of
test_gateway_clients.py: the tiny random checkpoint cannot write tool calls), so the answers
differ per version: which one served a session shows in what the agent wrote. The client, the
gateway and its canary router, the harness parser, the log, git, edits, collect, distill and
report are real.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import polars as pl
import pytest

from rlcycle.gateway.engine import session_bucket
from rlcycle.policy.registry import Entry, Registry
from rlcycle.policy.served import adapter_name
from tests.edits_world import commit_all, git
from tests.test_gateway import _scripted_upstream, _start, world  # noqa: F401  (fixture)
from tests.test_gateway_clients import CALL, Scripted, _drive, _repo, _venv

pytestmark = pytest.mark.slow


def bash(command: str) -> str:
    return CALL.format(name="bash", args=json.dumps({"command": command}))


def writes(path: str, content: str) -> list[str]:
    """The commands of a task: write one file, then submit."""
    return [f"cat > {path} <<'EOF'\n{content}EOF", SUBMIT]


def script(commands: list[str]) -> list[str]:
    return [f"Step {i}.\n" + bash(c) for i, c in enumerate(commands)]


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
FMT = "x=[1,2,3]\nif x:\n  print( x )\n"
UTIL = "import os\nROOT = os.getcwd()\nNAME = 'util'\n"
CONF = "DEBUG = True\nLEVEL = 3\n"
# each version answers its own tasks (another version's task gets "I do not know this task.")
PRODUCTION = {"CALC-TASK": writes("calc.py", CALC), "FMT-TASK": writes("fmt.py", FMT)}
CANDIDATE = {"UTIL-TASK": writes("util.py", UTIL), "CONF-TASK": writes("conf.py", CONF)}
MINI = """
import json, os, yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

cfg = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
for base, task in json.loads(os.environ["RUNS"]):  # one session each, one after the other
    model_cfg = {**cfg["model"], "model_name": "openai/production"}
    model_cfg["model_kwargs"] = {
        **(model_cfg.get("model_kwargs") or {}), "api_base": base, "api_key": "unused", "max_tokens": 256
    }
    agent = DefaultAgent(
        LitellmModel(**model_cfg), LocalEnvironment(cwd=os.getcwd()), **{**cfg["agent"], "step_limit": 6}
    )
    print("EXIT", task, agent.run(task + ": write the file").get("exit_status"))
"""
ENV = {"MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_CONFIGURED": "true"}


class TwoVersions:
    """One upstream serving two checkpoints, as vLLM serves a base and the candidate's LoRA
    adapter: /v1/models lists production's model (its directory as `root`) and the candidate as
    `rlcycle-<12 hex>`; POST /v1/completions goes to the scripted server of the model named."""

    def __init__(self, production: tuple, candidate: tuple):
        self.servers, listed, routes = [], [], {}
        for i, (cid, model_dir, scripts) in enumerate((production, candidate)):
            scripted = Scripted(str(model_dir), {task: script(c) for task, c in scripts.items()})
            server = _scripted_upstream({"model": model_dir}, scripted)
            self.servers.append(server)
            with urllib.request.urlopen(server.url + "/v1/models") as r:
                [card] = json.load(r)["data"]
            name = card["id"] if i == 0 else adapter_name(cid)
            listed.append({**card, "id": name, **({"parent": listed[0]["id"]} if i else {})})
            routes[name] = (server.url, card["id"])

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer(200, json.dumps({"object": "list", "data": listed}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                url, name = routes[body["model"]]
                req = urllib.request.Request(
                    url + self.path, json.dumps({**body, "model": name}).encode(), {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req) as r:
                    self._answer(r.status, r.read())

            def _answer(self, status: int, data: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        for s in self.servers:
            s.close()


def _candidate(world, root):  # noqa: F811
    """A second checkpoint, the registry's `candidate` beside `production`."""
    from rlcycle import model_init

    model = model_init.run(model_init.InitModelConfig(seed=1), root / "m1").path
    reg = Registry(world["registry"])
    with reg.locked():
        cid = reg.add(model)
        reg.commit({"production": world["cid"], "candidate": cid}, Entry("canary", "candidate", cid, None))
    return cid, model


def _sessions(fraction: float) -> tuple[list[str], list[str]]:
    """Two session names the canary keeps on production, two it sends to the candidate."""
    names = (f"sess-{i}" for i in itertools.count())
    prod = list(itertools.islice((s for s in names if session_bucket(s) >= fraction), 2))
    cand = list(itertools.islice((s for s in names if session_bucket(s) < fraction), 2))
    return prod, cand


def test_canary_through_one_gateway_edit_persistence_per_version(cli, world, tmp_path):  # noqa: F811
    from rlcycle.online import online_metrics
    from rlcycle.report.ab import fmt

    py = _venv("mini-swe-agent")
    prod, (cand, cand_dir) = world["cid"], _candidate(world, tmp_path)
    repo, logs, out = _repo(tmp_path), tmp_path / "logs", tmp_path / "edit-events"
    upstream = TwoVersions((prod, world["model"], PRODUCTION), (cand, cand_dir, CANDIDATE))
    gateway = _start(world, logs, upstream=upstream.url, canary_fraction=0.5)
    (s_calc, s_fmt), (s_util, s_conf) = _sessions(0.5)
    tasks = {s_calc: "CALC-TASK", s_fmt: "FMT-TASK", s_util: "UTIL-TASK", s_conf: "CONF-TASK"}
    version_of = {s_calc: prod, s_fmt: prod, s_util: cand, s_conf: cand}

    def edits(*sets: str) -> dict:
        r = cli(["edits", "--repo", repo, logs, "-o", out, "--json", "--set", "settle_s=0", *sets])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    try:
        assert gateway.gateway.models.describe()["candidate_id"] == cand
        edits("--set", "observe_after_s=3600")  # cron's tick before the agents start
        runs = [[f"{gateway.url}/s/{s}/v1", t] for s, t in tasks.items()]
        said = _drive(py, textwrap.dedent(MINI), repo, {**ENV, "RUNS": json.dumps(runs)})
        assert said.count("Submitted") == 4, said  # a session sent to the wrong version would not submit
        gateway.gateway.log.flush()
        # cron's next tick: the four episodes in one interval, each counting only its own lines
        rec = edits("--set", "observe_after_s=3600")
        assert (rec["episodes_recorded"], rec["proposals_recorded"], rec["lines_proposed"]) == (4, 4, 4 + 3 + 3 + 2)
        assert rec["lines_unattributed"] == 3 * rec["lines_proposed"], rec  # the other three episodes' lines
    finally:
        gateway.close()
        upstream.close()

    # identity: every event of a session names the version whose script wrote its files
    comps = [json.loads(x) for f in sorted(logs.rglob("*.jsonl")) for x in f.read_text().splitlines()]
    comps = [e for e in comps if e["type"] == "completion"]
    assert {e["session_id"] for e in comps} == set(tasks)
    for e in comps:
        assert e["policy_version"] == version_of[e["session_id"]], e
        commands = (PRODUCTION if e["policy_version"] == prod else CANDIDATE)[tasks[e["session_id"]]]
        assert [json.loads(c["arguments"])["command"] for c in e["tool_calls"]] == [commands[e["turn"]]], e

    # the user commits everything, reverts the candidate's util.py, rewrites sub(), reformats
    # fmt.py and drops a line of conf.py
    for files, message in ((["calc.py", "fmt.py", "conf.py"], "agents' work"), (["util.py"], "util")):
        git(repo, "add", *files)
        git(repo, "commit", "-qm", message)
    git(repo, "revert", "--no-edit", "HEAD")
    (repo / "calc.py").write_text(CALC.replace("return a - b", "return -(b - a)"))
    (repo / "fmt.py").write_text("x = [1, 2, 3]\nif x:\n    print(x)\n")
    (repo / "conf.py").write_text("DEBUG = True\n")
    commit_all(repo, "user's work")
    obs = edits("--set", "observe_after_s=0")
    assert obs["outcomes_emitted"] == 4 and obs["lines_surviving"] == 3 + 3 + 0 + 1, obs

    run = tmp_path / "run"
    traj, ex = run / "collect" / "trajectories.arrow", tmp_path / "ex.arrow"
    r = cli(["collect", logs, out, "-o", traj, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["orphans"] == {}, r.output
    t = pl.read_ipc(traj).filter(pl.col("edit_lines_proposed").is_not_null())
    kept = {
        (s, v): (p, k)
        for s, v, p, k in t.select(
            "session_id", "policy_version", "edit_lines_proposed", "edit_lines_surviving"
        ).iter_rows()
    }
    assert kept == {(s_calc, prod): (4, 3), (s_fmt, prod): (3, 3), (s_util, cand): (3, 0), (s_conf, cand): (2, 1)}
    r = cli(["distill", traj, "-o", ex, "--set", "exclude_flat_groups=false"])
    assert r.exit_code == 0, r.output
    e = pl.read_ipc(ex).filter(pl.col("edit_lines_proposed").is_not_null())
    reward = e["reward_parts"].struct.field("edit_persistence")
    assert reward.to_list() == pytest.approx((e["edit_lines_surviving"] / e["edit_lines_proposed"] - 0.5).to_list())

    m = online_metrics(pl.read_ipc(traj)).metrics
    a, b = m[prod]["edit_persistence"], m[cand]["edit_persistence"]
    assert (a.num, a.den, a.units, b.num, b.den, b.units) == (6, 7, 2, 1, 5, 2)
    assert a.low < a.value < a.high and b.low < b.value < b.high
    r = cli(["report", run, "--json"])
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    assert "Edit persistence" in page and fmt(a, "rate") in page and fmt(b, "rate") in page
