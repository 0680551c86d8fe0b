"""Registry and deploy: verdict rules, aliases, hooks, rollback, and crashes at any moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pyarrow as pa
import pytest

from rlcycle import schema
from rlcycle.registry import Registry, checkpoint_id


def make_ckpt(path, seed: int):
    """A real (tiny, random) transformers checkpoint."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture
def ckpts(tmp_path):
    return [make_ckpt(tmp_path / f"ckpt{i}", i) for i in range(3)]


def verdict(tmp_path, decision="accept", name="v.json", **extra):
    p = tmp_path / name
    p.write_text(json.dumps({"decision": decision, "gates": [{"name": "pass_rate", "passed": decision == "accept"}], **extra}))
    return p


def test_refuses_without_a_passing_verdict(cli, ckpts, tmp_path):
    r = cli(["deploy", ckpts[0]])
    assert r.exit_code == 3 and "without a verdict" in r.error
    r = cli(["deploy", ckpts[0], "--verdict", verdict(tmp_path, "refuse")])
    assert r.exit_code == 3 and "failed gates: pass_rate" in r.error
    r = cli(["deploy", ckpts[0], "--verdict", tmp_path / "missing.json"])
    assert r.exit_code == 2
    assert Registry().aliases() == {}


def test_promote_twice_then_rollback(cli, ckpts, tmp_path):
    ids = [checkpoint_id(c) for c in ckpts]
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    r = cli(["deploy", ckpts[1], "--verdict", v, "--json"])
    assert json.loads(r.stdout)["previous_id"] == ids[0]
    reg = Registry()
    assert reg.aliases() == {"production": ids[1], "previous": ids[0]}
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(reg.resolve("production"))  # loads as it is
    assert cli(["rollback"]).exit_code == 0
    assert Registry().aliases() == {"production": ids[0], "previous": ids[1]}
    hist = Registry().history()
    assert hist.column("action").to_pylist() == ["promote", "promote", "rollback"]
    assert schema.validate(hist, schema.DEPLOYMENTS) == []
    ls = json.loads(cli(["registry", "ls", "--json"]).stdout)
    assert len(ls["checkpoints"]) == 2 and ls["aliases"]["production"] == ids[0]


def test_force_is_recorded_and_canary_keeps_production(cli, ckpts, tmp_path):
    assert cli(["deploy", ckpts[0], "--force"]).exit_code == 0
    assert Registry().history().column("note").to_pylist() == ["forced without a passing verdict"]
    ids = [checkpoint_id(c) for c in ckpts]
    assert cli(["deploy", ckpts[1], "--verdict", verdict(tmp_path), "--canary", "0.1"]).exit_code == 0
    state = Registry().state()
    assert state["aliases"]["production"] == ids[0] and state["aliases"]["candidate"] == ids[1]
    assert state["canary"] == {"id": ids[1], "fraction": 0.1, "alias": "production"}


def test_verdict_for_another_checkpoint_is_refused(cli, ckpts, tmp_path):
    r = cli(["deploy", ckpts[0], "--verdict", verdict(tmp_path, candidate_id="sha256-other")])
    assert r.exit_code == 2 and "is for checkpoint sha256-other" in r.error


def test_failing_command_hook_moves_the_alias_back(cli, ckpts, tmp_path):
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    before = Registry().aliases()
    marker = tmp_path / "hook_ran"
    r = cli(["deploy", ckpts[1], "--verdict", v, "--hook", f"echo $RLCYCLE_CHECKPOINT_ID > {marker}; exit 7"])
    assert r.exit_code == 1 and "serving hook failed (exit 7" in r.error
    assert marker.read_text().strip() == checkpoint_id(ckpts[1])
    assert Registry().aliases() == before
    assert Registry().history().column("action").to_pylist() == ["promote", "promote", "revert"]


def test_http_hook_receives_the_checkpoint(cli, ckpts, tmp_path):
    got = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200 if len(got) == 1 else 500)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/load"
    try:
        v = verdict(tmp_path)
        assert cli(["deploy", ckpts[0], "--verdict", v, "--hook", url]).exit_code == 0
        assert got[0]["checkpoint_id"] == checkpoint_id(ckpts[0]) and os.path.isdir(got[0]["checkpoint_dir"])
        r = cli(["deploy", ckpts[1], "--verdict", v, "--hook", url])  # the server now answers 500
        assert r.exit_code == 1 and Registry().aliases()["production"] == checkpoint_id(ckpts[0])
    finally:
        server.shutdown()


def _registry_is_valid(root):
    reg = Registry(root)
    state = reg.state()
    for cid in state["aliases"].values():
        assert (reg.ckpts / cid / "config.json").exists()
    assert reg.history().num_rows == state["seq"]
    assert not [p for p in reg.ckpts.iterdir() if p.name.startswith(".") and p.is_file()]


@pytest.mark.parametrize("crash_at", ["copied", "before-state", "after-state"])
def test_killed_mid_deploy_leaves_a_valid_registry(ckpts, tmp_path, crash_at, rlcycle_home):
    v = verdict(tmp_path)
    env = dict(os.environ, RLCYCLE_HOME=str(rlcycle_home))
    cmd = [sys.executable, "-m", "rlcycle", "deploy", "--verdict", str(v)]
    assert subprocess.run([*cmd, str(ckpts[0])], env=env).returncode == 0
    r = subprocess.run([*cmd, str(ckpts[1])], env=dict(env, RLCYCLE_CRASH_AT=crash_at))
    assert r.returncode == -signal.SIGKILL
    _registry_is_valid(rlcycle_home / "registry")
    expected = checkpoint_id(ckpts[1]) if crash_at == "after-state" else checkpoint_id(ckpts[0])
    assert Registry().aliases()["production"] == expected
    # and the registry keeps working: the same deploy now completes
    assert subprocess.run([*cmd, str(ckpts[1])], env=env).returncode == 0
    _registry_is_valid(rlcycle_home / "registry")


def test_sigkill_at_random_moments(ckpts, tmp_path, rlcycle_home):
    v = verdict(tmp_path)
    env = dict(os.environ, RLCYCLE_HOME=str(rlcycle_home))
    for i, delay in enumerate([0.3, 0.6, 0.9, 1.2, 1.5, 1.8]):
        proc = subprocess.Popen([sys.executable, "-m", "rlcycle", "deploy", "--verdict", str(v), str(ckpts[i % 3])], env=env)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        _registry_is_valid(rlcycle_home / "registry")


def test_history_is_an_arrow_file_other_readers_open(cli, ckpts, tmp_path, rlcycle_home):
    assert cli(["deploy", ckpts[0], "--verdict", verdict(tmp_path)]).exit_code == 0
    import duckdb

    table = pa.ipc.open_file(str(rlcycle_home / "registry" / "deployments.arrow")).read_all()
    con = duckdb.connect()
    con.register("h", table)
    assert con.execute("select action, alias from h").fetchall() == [("promote", "production")]


def test_a_failed_hook_restores_the_previous_canary_too(cli, ckpts, tmp_path):
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    assert cli(["deploy", ckpts[1], "--verdict", v, "--canary", "0.2"]).exit_code == 0
    before = Registry().state()
    assert cli(["deploy", ckpts[2], "--verdict", v, "--hook", "exit 1"]).exit_code == 1
    after = Registry().state()
    assert after["aliases"] == before["aliases"] and after["canary"] == before["canary"]
