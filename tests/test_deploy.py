"""Registry and deploy: verdict rules, aliases, hooks, rollback, and crashes at any moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from rlcycle import schema
from rlcycle.cli.options import registry_dir
from rlcycle.policy.registry import Registry, checkpoint_id


def make_ckpt(path, seed: int):
    """A real (tiny, random) transformers checkpoint."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture
def ckpts(tmp_path):
    return [make_ckpt(tmp_path / f"ckpt{i}", i) for i in range(3)]


def verdict(tmp_path, decision="accept", name="v.json", **extra):
    p = tmp_path / name
    p.write_text(
        json.dumps({"decision": decision, "gates": [{"name": "pass_rate", "passed": decision == "accept"}], **extra})
    )
    return p


def test_refuses_without_a_passing_verdict(cli, ckpts, tmp_path):
    r = cli(["deploy", ckpts[0]])
    assert r.exit_code == 3 and "without a verdict" in r.error
    r = cli(["deploy", ckpts[0], "--verdict", verdict(tmp_path, "refuse")])
    assert r.exit_code == 3 and "failed gates: pass_rate" in r.error
    r = cli(["deploy", ckpts[0], "--verdict", tmp_path / "missing.json"])
    assert r.exit_code == 2
    assert Registry(registry_dir()).aliases() == {}


def test_promote_twice_then_rollback(cli, ckpts, tmp_path):
    ids = [checkpoint_id(c) for c in ckpts]
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    r = cli(["deploy", ckpts[1], "--verdict", v, "--json"])
    assert json.loads(r.stdout)["previous_id"] == ids[0]
    reg = Registry(registry_dir())
    assert reg.aliases() == {"production": ids[1], "previous": ids[0]}
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(reg.resolve("production"))  # loads as it is
    assert cli(["rollback"]).exit_code == 0
    assert Registry(registry_dir()).aliases() == {"production": ids[0], "previous": ids[1]}
    hist = Registry(registry_dir()).history()
    assert hist.column("action").to_pylist() == ["promote", "promote", "rollback"]
    assert schema.validate(hist, schema.DEPLOYMENTS) == []
    ls = json.loads(cli(["registry", "ls", "--json"]).stdout)
    assert len(ls["checkpoints"]) == 2 and ls["aliases"]["production"] == ids[0]


def test_force_is_recorded_and_canary_keeps_production(cli, ckpts, tmp_path):
    assert cli(["deploy", ckpts[0], "--force"]).exit_code == 0
    assert Registry(registry_dir()).history().column("note").to_pylist() == ["forced without a passing verdict"]
    ids = [checkpoint_id(c) for c in ckpts]
    assert cli(["deploy", ckpts[1], "--verdict", verdict(tmp_path), "--canary", "0.1"]).exit_code == 0
    state = Registry(registry_dir()).state()
    assert state["aliases"]["production"] == ids[0] and state["aliases"]["candidate"] == ids[1]
    assert state["canary"] == {"id": ids[1], "fraction": 0.1, "alias": "production"}


def test_verdict_for_another_checkpoint_is_refused(cli, ckpts, tmp_path):
    r = cli(["deploy", ckpts[0], "--verdict", verdict(tmp_path, candidate_id="sha256:other")])
    assert r.exit_code == 2 and "is for checkpoint sha256:other" in r.error


def test_failing_command_hook_moves_the_alias_back(cli, ckpts, tmp_path):
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    before = Registry(registry_dir()).aliases()
    marker = tmp_path / "hook_ran"
    r = cli(["deploy", ckpts[1], "--verdict", v, "--hook", f"echo $RLCYCLE_CHECKPOINT_ID > {marker}; exit 7"])
    assert r.exit_code == 1 and "serving hook failed (exit 7" in r.error
    assert marker.read_text().strip() == checkpoint_id(ckpts[1])
    assert Registry(registry_dir()).aliases() == before
    assert Registry(registry_dir()).history().column("action").to_pylist() == ["promote", "promote", "revert"]


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
        assert r.exit_code == 1 and Registry(registry_dir()).aliases()["production"] == checkpoint_id(ckpts[0])
    finally:
        server.shutdown()


def _temps(root):
    """Dot-entries under checkpoints/ (a writer's temp dirs), looked at without opening the registry."""
    return sorted(p.name for p in (root / "checkpoints").iterdir() if p.name.startswith("."))


def _registry_is_valid(root):
    reg = Registry(root)  # opening it repairs what a killed writer left
    state = reg.state()
    for cid in state["aliases"].values():
        assert (reg.ckpts / cid / "config.json").exists()
    assert reg.history().num_rows == state["seq"]
    assert _temps(root) == []  # no temp dir (or file) left behind
    for d in reg.ckpts.iterdir():  # every stored checkpoint is complete: its content is its id
        assert checkpoint_id(d) == d.name


def _deploy(env, v, ckpt, crash_at=None, *extra):
    env = dict(env, RLCYCLE_CRASH_AT=crash_at) if crash_at else env
    cmd = [sys.executable, "-m", "rlcycle", "deploy", "--verdict", str(v), *extra, str(ckpt)]
    return subprocess.run(cmd, env=env, capture_output=True).returncode


# crash point -> which checkpoint is production after the kill (of deploying ckpts[1] over ckpts[0])
DEPLOY_CRASHES = {
    "copying": 0,
    "copied": 0,
    "before-state": 0,
    "after-state": 1,
    "before-state:promote": 0,
    "after-state:promote": 1,
}


@pytest.mark.parametrize("crash_at", sorted(DEPLOY_CRASHES))
def test_killed_mid_deploy_leaves_a_valid_registry(ckpts, tmp_path, crash_at, rlcycle_home):
    v, root = verdict(tmp_path), rlcycle_home / "registry"
    env = dict(os.environ, RLCYCLE_HOME=str(rlcycle_home))
    assert _deploy(env, v, ckpts[0]) == 0
    assert _deploy(env, v, ckpts[1], crash_at) == -signal.SIGKILL  # the crash point was reached
    if crash_at in ("copying", "copied"):
        assert len(_temps(root)) == 1  # the killed copy is still there, until the next open
    _registry_is_valid(root)
    ids = [checkpoint_id(c) for c in ckpts]
    assert Registry(registry_dir()).aliases()["production"] == ids[DEPLOY_CRASHES[crash_at]]
    # and the registry keeps working: the same deploy now completes
    assert _deploy(env, v, ckpts[1]) == 0
    _registry_is_valid(root)
    assert Registry(registry_dir()).aliases() == {"production": ids[1], "previous": ids[0]}


def test_killed_mid_copy_into_an_empty_registry(ckpts, tmp_path, rlcycle_home):
    v, root = verdict(tmp_path), rlcycle_home / "registry"
    env = dict(os.environ, RLCYCLE_HOME=str(rlcycle_home))
    assert _deploy(env, v, ckpts[0], "copying") == -signal.SIGKILL
    (temp,) = _temps(root)
    copied = sorted(os.listdir(root / "checkpoints" / temp))
    assert len(copied) == 1 and len(os.listdir(ckpts[0])) > 1  # killed after its first file
    _registry_is_valid(root)
    assert Registry(registry_dir()).aliases() == {} and Registry(registry_dir()).checkpoints() == []


@pytest.mark.parametrize("crash_at, rolled_back", [("before-state:rollback", False), ("after-state:rollback", True)])
def test_killed_mid_rollback_leaves_a_valid_registry(ckpts, tmp_path, rlcycle_home, crash_at, rolled_back):
    v, root = verdict(tmp_path), rlcycle_home / "registry"
    env = dict(os.environ, RLCYCLE_HOME=str(rlcycle_home))
    assert _deploy(env, v, ckpts[0]) == 0 and _deploy(env, v, ckpts[1]) == 0
    r = subprocess.run([sys.executable, "-m", "rlcycle", "rollback"], env=dict(env, RLCYCLE_CRASH_AT=crash_at))
    assert r.returncode == -signal.SIGKILL
    _registry_is_valid(root)
    ids = [checkpoint_id(c) for c in ckpts]
    assert Registry(registry_dir()).aliases()["production"] == (ids[0] if rolled_back else ids[1])


def test_opening_waits_for_a_live_writer_and_keeps_its_copy(ckpts, rlcycle_home):
    """The stale-temp sweep runs under the registry lock, so a copy in progress is never swept."""
    root = rlcycle_home / "registry"
    reg = Registry(root)
    in_copy, finish = threading.Event(), threading.Event()
    final = reg.ckpts / "ckpt-being-added"

    def writer():
        with reg.locked():
            tmp = reg.ckpts / ".ckpt-being-added.live.tmp"
            tmp.mkdir()
            (tmp / "config.json").write_text("{}")
            in_copy.set()
            finish.wait(30)
            os.replace(tmp, final)

    w = threading.Thread(target=writer)
    w.start()
    assert in_copy.wait(30)
    opened = []
    opener = threading.Thread(target=lambda: opened.append(Registry(root)))
    opener.start()
    opener.join(timeout=1)
    assert opener.is_alive() and not opened  # blocked on the lock, not sweeping
    assert _temps(root) == [".ckpt-being-added.live.tmp"]
    finish.set()
    w.join(30)
    opener.join(30)
    assert opened and (final / "config.json").read_text() == "{}" and _temps(root) == []


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
    before = Registry(registry_dir()).state()
    assert cli(["deploy", ckpts[2], "--verdict", v, "--hook", "exit 1"]).exit_code == 1
    after = Registry(registry_dir()).state()
    assert after["aliases"] == before["aliases"] and after["canary"] == before["canary"]


def test_rollback_calls_the_serving_hook_and_a_failing_one_undoes_it(cli, ckpts, tmp_path):
    ids = [checkpoint_id(c) for c in ckpts]
    v = verdict(tmp_path)
    assert cli(["deploy", ckpts[0], "--verdict", v]).exit_code == 0
    assert cli(["deploy", ckpts[1], "--verdict", v]).exit_code == 0
    marker = tmp_path / "hook_ran"
    # a failing hook: the serving side still has ids[1], so the registry must say so
    r = cli(["rollback", "--hook", f"echo $RLCYCLE_CHECKPOINT_ID $RLCYCLE_DEPLOY_ACTION > {marker}; exit 5"])
    assert r.exit_code == 1 and "serving hook failed (exit 5" in r.error and "rollback was undone" in r.error
    assert marker.read_text().split() == [ids[0], "rollback"]
    assert Registry(registry_dir()).aliases() == {"production": ids[1], "previous": ids[0]}
    r = cli(["rollback", "--json", "--hook", f"echo $RLCYCLE_CHECKPOINT_ID $RLCYCLE_CHECKPOINT_DIR > {marker}"])
    assert r.exit_code == 0, r.output
    got_id, got_dir = marker.read_text().split()
    assert got_id == ids[0] and checkpoint_id(Path(got_dir)) == ids[0]
    assert json.loads(r.stdout)["hook"] and Registry(registry_dir()).aliases() == {
        "production": ids[0],
        "previous": ids[1],
    }
    hist = Registry(registry_dir()).history().column("action").to_pylist()
    assert hist == ["promote", "promote", "rollback", "revert", "rollback"]


def test_deploy_help_names_the_env_var_the_gateway_reads(cli):
    """One name for the gateway's API key: deploy's help example and the gateway's --api-key."""
    import typer.main

    from rlcycle.cli import app

    gateway = typer.main.get_command(app).commands["gateway"]
    [api_key] = [p for p in gateway.params if p.name == "api_key"]
    assert api_key.envvar == "RLCYCLE_GATEWAY_API_KEY"
    r = cli(["deploy", "--help"])
    text = " ".join(r.stdout.split())  # help is wrapped at 80 columns
    assert r.exit_code == 0 and "--hook-api-key-env RLCYCLE_GATEWAY_API_KEY" in text
    assert "RLCYCLE_GATEWAY_KEY" not in text


def test_deploy_reloads_a_real_gateway_with_the_key_from_its_env_var(cli, tmp_path, monkeypatch, rlcycle_home):
    """deploy --hook-api-key-env RLCYCLE_GATEWAY_API_KEY against a gateway keyed with that same
    variable: the reload is authorised and the gateway serves the new checkpoint."""
    from rlcycle import model_init
    from rlcycle.gateway import GatewayConfig, start

    models = [model_init.run(model_init.InitModelConfig(seed=s), tmp_path / f"m{s}").path for s in (0, 1)]
    v = verdict(tmp_path)
    assert cli(["deploy", models[0], "--verdict", v]).exit_code == 0
    monkeypatch.setenv("RLCYCLE_GATEWAY_API_KEY", "s3cret")
    running = start(
        GatewayConfig(
            registry=str(rlcycle_home / "registry"),
            log_dir=str(tmp_path / "logs"),
            port=0,
            api_key=os.environ["RLCYCLE_GATEWAY_API_KEY"],
            watch_interval_s=0,
        )
    )
    try:
        hook = ["--hook", running.url + "/v1/rlcycle/reload", "--hook-api-key-env", "RLCYCLE_GATEWAY_API_KEY"]
        assert running.gateway.models.describe()["checkpoint_id"] == checkpoint_id(models[0])
        monkeypatch.setenv("RLCYCLE_GATEWAY_API_KEY", "wrong")
        r = cli(["deploy", models[1], "--verdict", v, *hook])
        assert r.exit_code == 1 and "401" in r.error  # the gateway refused the key: alias moved back
        monkeypatch.setenv("RLCYCLE_GATEWAY_API_KEY", "s3cret")
        r = cli(["deploy", models[1], "--verdict", v, *hook])
        assert r.exit_code == 0, r.error
        assert running.gateway.models.describe()["checkpoint_id"] == checkpoint_id(models[1])
    finally:
        running.close()


def test_the_cycle_retries_a_deploy_whose_hook_failed_but_not_an_old_one(ckpts, tmp_path):
    """The cycle's deploy (skip_promoted) skips a checkpoint promoted before as `superseded`, but
    a promote its serving hook reverted never served: rerunning that run directory deploys it."""
    from rlcycle.deploy.stage import STAGE, DeployArgs, DeployConfig
    from rlcycle.errors import RlcycleError

    reg = Registry(tmp_path / "reg")
    v = verdict(tmp_path)
    first = DeployArgs(ckpts[0], v, reg, skip_promoted=True)
    assert STAGE.run(DeployConfig(), first).action == "promote"
    second = DeployArgs(ckpts[1], v, reg, skip_promoted=True)
    with pytest.raises(RlcycleError, match="serving hook failed"):
        STAGE.run(DeployConfig(hook="exit 7"), second)
    assert reg.aliases()["production"] == checkpoint_id(ckpts[0])
    # the rerun of the failed cycle's deploy tries again (the hook works now) ...
    assert STAGE.run(DeployConfig(hook="true"), second).action == "promote"
    assert reg.aliases()["production"] == checkpoint_id(ckpts[1])
    # ... while an old run directory's checkpoint, promoted and served before, stays superseded
    assert STAGE.run(DeployConfig(), first).action == "superseded"
    assert reg.aliases()["production"] == checkpoint_id(ckpts[1])
