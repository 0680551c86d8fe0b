"""A REAL vLLM killed under load behind a real `rlcycle gateway --upstream` process, then restarted.

One dedicated server (not conftest's shared `vllm` fixture: this test kills it), started with
`rlcycle serve`'s flags on the tiny model in float32, and started once more on the
same port. production = the base (served by vLLM's base model), candidate = a LoRA checkpoint
trained by train's stage and hot-loaded by the deploy hook, at a canary share of 0.5, so both
ways a restarted vLLM can come back are seen at once: production serves again by itself; the
candidate's adapter, loaded at runtime before, is gone after the restart, and its sessions get
503 `adapter_not_loaded` naming the fix until the hook loads it again.

Load: six clients (the official `openai` SDK, no retries), chat completions and the Responses
API, streamed and not, each request with its own X-Request-Id. vLLM's process group gets SIGKILL
once a dozen answers are in. Every request must then have either completed (and been logged
exactly once) or got 502/503 in OpenAI's error shape (and been logged not at all); /health says
the upstream is down. The seconds from vLLM healthy again to the gateway serving are printed
(`MEASURED ...`, for docs/gateway.md), never asserted. Under CI=1 a vLLM that cannot start fails
the test; elsewhere it skips with the reason (conftest.py's convention).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from optional import require
from train_data import make_rows, write_examples

from rlcycle.gateway.engine import session_bucket
from rlcycle.policy.registry import checkpoint_id
from rlcycle.policy.served import adapter_name
from rlcycle.prompts import events_with_full_prompts

require("peft")
pytestmark = pytest.mark.slow

CLIENTS = 6
PER_CLIENT = 40  # requests a client sends at most
KILL_AFTER = 12  # answers before vLLM is killed
MSGS = [{"role": "user", "content": "Fix the bug in add()."}]


def _unavailable(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run the vLLM tests (`bash scripts/dev.sh test` installs .venv-vllm)")
    pytest.skip(f"{why}; `bash scripts/dev.sh vllm` installs one")


def _sessions(candidate: bool, n: int) -> list[str]:
    """Session ids the canary (0.5) sends to the candidate, or to production."""
    out, i = [], 0
    while len(out) < n:
        s = f"load-{i}"
        if (session_bucket(s) < 0.5) == candidate:
            out.append(s)
        i += 1
    return out


def _hook(url: str, ckpt: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rlcycle", "deploy-vllm", "--url", url, "--checkpoint", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _gateway(url: str, logs: Path, home: Path, err: Path) -> tuple[subprocess.Popen, str]:
    with open(err, "wb") as stderr:  # a file: a full pipe would block the gateway
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcycle", "gateway", "--port", "0", "--json", "--log-dir", str(logs)]
            + ["--upstream", url, "--canary", "0.5", "--set", "flush_interval_s=0.1"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=dict(os.environ, RLCYCLE_HOME=str(home)),
        )
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the gateway did not start: {err.read_text()[-3000:]}")
    return proc, json.loads(line)["url"]


def _kill_group(server) -> None:
    """SIGKILL vLLM's whole process group (API server and engine core) and wait until it is gone."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(server.proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError("vLLM's process group outlived SIGKILL by 60 s")


class Load:
    """CLIENTS threads sending requests until told to stop; every outcome recorded."""

    def __init__(self, url: str):
        self.url, self.outcomes, self.stop = url, [], threading.Event()
        self._lock = threading.Lock()
        sessions = _sessions(True, CLIENTS // 2) + _sessions(False, CLIENTS - CLIENTS // 2)
        self.threads = [threading.Thread(target=self._client, args=(k, s), daemon=True) for k, s in enumerate(sessions)]

    def answered(self) -> int:
        with self._lock:
            return sum(o["status"] == 200 for o in self.outcomes)

    def _client(self, k: int, session: str) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/s/{session}/v1", api_key="unused", max_retries=0, timeout=120)
        for i in range(PER_CLIENT):
            if self.stop.is_set():
                return
            api, stream = ("responses" if k % 3 == 2 else "chat"), (i + k) % 2 == 1
            rid = uuid.uuid4().hex
            out = {"rid": rid, "api": api, "stream": stream, "session": session, "start": time.monotonic()}
            try:
                h = {"X-Request-Id": rid}
                if api == "chat":
                    r = client.chat.completions.with_raw_response.create(
                        model="production", messages=MSGS, max_tokens=32, stream=stream, extra_headers=h
                    )
                else:
                    r = client.responses.with_raw_response.create(
                        model="production", input="Fix the bug.", max_output_tokens=32, stream=stream, extra_headers=h
                    )
                body = r.parse()
                if stream:  # a stream must end with its final event, never cut short
                    last = list(body)[-1]
                    assert (last.choices[0].finish_reason if api == "chat" else last.type) in (
                        "stop",
                        "length",
                        "response.completed",
                        "response.incomplete",
                    ), last
                out.update(status=200, checkpoint=r.headers["x-checkpoint-id"])
            except openai.APIStatusError as e:
                out.update(status=e.status_code, body=e.response.json(), headers=dict(e.response.headers))
            except Exception as e:  # anything else (a cut stream, a connection error) fails the test
                out.update(status=None, error=f"{type(e).__name__}: {e}")
            out["end"] = time.monotonic()
            with self._lock:
                self.outcomes.append(out)


def _completions(logs: Path) -> list[dict]:
    """The log's completion events, each with its whole prompt rebuilt as `prompt_ids`."""
    events = []
    for f in sorted(logs.glob("*.jsonl")):
        events += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return [ev for ev in events_with_full_prompts(events) if ev.get("type") == "completion"]


def _ask(url: str, session: str) -> tuple[int, dict, str]:
    """(status, body or error, request id) of one plain chat request in `session`."""
    rid = uuid.uuid4().hex
    r = httpx.post(
        f"{url}/s/{session}/v1/chat/completions",
        json={"model": "production", "messages": MSGS, "max_tokens": 8, "seed": 3},
        headers={"X-Request-Id": rid},
        timeout=120,
    )
    return r.status_code, r.json(), rid


def _until(fn, what: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def _is_openai_error(o: dict) -> bool:
    err = o.get("body", {}).get("error") if isinstance(o.get("body"), dict) else None
    return (
        isinstance(err, dict)
        and set(o["body"]) == {"error"}
        and {"message", "type", "code"} <= set(err)
        and err["type"] == "server_error"
        and (o["status"], err["code"]) in {(502, "upstream_error"), (503, "upstream_unavailable")}
    )


def test_vllm_killed_under_load_then_restarted(cli, rlcycle_home, tmp_path):
    from rlcycle.errors import RlcycleError
    from rlcycle.model_init import InitModelConfig
    from rlcycle.model_init import run as init_model
    from rlcycle.policy import vllm_serve
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
    from rlcycle.train import stage
    from rlcycle.train.config import LoraConfig, TrainConfig

    config = vllm_serve.VllmServeConfig(
        port=vllm_serve.free_port("127.0.0.1"),
        dtype="float32",
        kv_cache_gb=1,
        max_model_len=2048,
        startup_timeout_s=900,
        log=str(tmp_path / "vllm.log"),
    )
    try:
        vllm_serve.find_python(config)
    except RlcycleError as e:
        _unavailable(f"no vLLM: {e.message}")
    base = Path(init_model(InitModelConfig(seed=0), tmp_path / "base").path)
    rows = make_rows(8, seed=1)
    ex = write_examples(tmp_path / "ex.arrow", base, rows, versions=[checkpoint_id(base)] * 8)
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    cfg = TrainConfig(lr=5e-2, batch_size=8, micro_batch_tokens=64, max_seq_len=64, save_every=0, epochs=3, lora=lora)
    stage.run(cfg, str(ex), base, tmp_path / "v1", quiet=True)
    v1, base_id = tmp_path / "v1", checkpoint_id(base)
    v1_id = checkpoint_id(v1)
    for ckpt, alias in ((base, "production"), (v1, "candidate")):
        assert cli(["registry", "add", str(ckpt), "--alias", alias]).exit_code == 0

    try:
        server = vllm_serve.start(base, config)
    except RlcycleError as e:
        _unavailable(f"vLLM did not start: {e.message[:2000]}")
    gateway = None
    measured: dict[str, float | int] = {}
    try:
        _hook(server.url, v1)
        logs = tmp_path / "logs"
        gateway, url = _gateway(server.url, logs, rlcycle_home, tmp_path / "gateway.err")
        assert httpx.get(url + "/health").text == "ok"

        # --- load, and SIGKILL mid-load -------------------------------------------------
        load = Load(url)
        for t in load.threads:
            t.start()
        _until(lambda: load.answered() >= KILL_AFTER, f"{KILL_AFTER} answers before the kill", 300)
        t_kill = time.monotonic()
        _kill_group(server)
        measured["answered_before_kill"] = load.answered()
        health = _until(
            lambda: (h := httpx.get(url + "/health", timeout=30)).status_code == 503 and h.json(), "/health 503", 60
        )
        measured["kill_to_health_503_s"] = round(time.monotonic() - t_kill, 2)

        # every client keeps sending while vLLM is gone: all refused now
        def after_kill(session: str) -> int:
            return sum(o["start"] > t_kill + 1 for o in load.outcomes if o["session"] == session)

        sessions = {o["session"] for o in load.outcomes}
        _until(
            lambda: all(after_kill(s) >= 2 for s in sessions) or not any(t.is_alive() for t in load.threads),
            "two requests per client after the kill",
            120,
        )
        load.stop.set()
        for t in load.threads:
            t.join(timeout=180)
        up = health["upstream"]
        assert health["status"] == "degraded" and up["url"] == server.url
        assert up["ok"] is False and up["reachable"] is False and up["error"] and up["since"]

        outcomes = load.outcomes
        strays = [o for o in outcomes if o["status"] != 200 and not _is_openai_error(o)]
        assert not strays, strays[:3]
        ok = [o for o in outcomes if o["status"] == 200]
        failed = [o for o in outcomes if o["status"] != 200]
        in_flight = [o for o in outcomes if o["start"] < t_kill < o["end"]]
        assert ok and failed and all(o["start"] < t_kill for o in ok)  # nothing answered without vLLM
        assert {o["checkpoint"] for o in ok} == {base_id, v1_id}  # both sides of the canary served
        retry = [o["headers"].get("retry-after") for o in failed if o["status"] == 503]
        assert retry and all(r and r.isdigit() for r in retry)
        measured |= {
            "requests": len(outcomes),
            "completed": len(ok),
            "failed_502": sum(o["status"] == 502 for o in failed),
            "failed_503": sum(o["status"] == 503 for o in failed),
            "in_flight_at_kill": len(in_flight),
            "in_flight_at_kill_failed": sum(o["status"] != 200 for o in in_flight),
            "streamed_failed": sum(o["stream"] for o in failed),
            "responses_api_failed": sum(o["api"] == "responses" for o in failed),
        }

        # --- vLLM back on the same port, with only the base: production serves by itself ---
        t0 = time.monotonic()
        server = vllm_serve.start(base, config)
        t_back = time.monotonic()
        measured["vllm_restart_s"] = round(t_back - t0, 1)
        prod, cand = _sessions(False, 1)[0], _sessions(True, 1)[0]
        status, body, rid_prod = _until(lambda: (a := _ask(url, prod))[0] == 200 and a, "production served again", 120)
        measured["vllm_healthy_to_gateway_serving_s"] = round(time.monotonic() - t_back, 2)
        assert body["system_fingerprint"] == base_id
        # ... the candidate's adapter is gone with the old process: a clear 503 naming the fix
        status, body, rid_cand_refused = _ask(url, cand)
        err = body["error"]
        assert (status, err["code"], err["type"]) == (503, "adapter_not_loaded", "server_error"), body
        assert adapter_name(v1_id) in err["message"] and "rlcycle deploy-vllm" in err["message"]
        health = httpx.get(url + "/health").json()
        by_role = {e["role"]: e for e in health["upstream"]["engines"]}
        assert health["upstream"]["reachable"] and not health["upstream"]["ok"]
        assert by_role["production"]["served"] and not by_role["candidate"]["served"]

        # --- the fix the message names: the deploy hook loads the adapter; served by itself ---
        _hook(server.url, v1)
        t_loaded = time.monotonic()
        status, body, rid_cand = _until(lambda: (a := _ask(url, cand))[0] == 200 and a, "candidate served", 120)
        measured["adapter_loaded_to_candidate_serving_s"] = round(time.monotonic() - t_loaded, 2)
        assert body["system_fingerprint"] == v1_id
        assert _until(lambda: httpx.get(url + "/health").text == "ok", "/health ok", 30)
        stats = httpx.get(url + "/v1/rlcycle/stats").json()["upstream"]
        t_up = time.monotonic() - stats["for_s"]  # when the gateway marked it back (identity re-checked)
        measured["vllm_healthy_to_gateway_up_s"] = round(t_up - t_back, 2)
        measured["outage_s_seen_by_gateway"] = stats["last_outage_s"]

        # --- the adapter unloaded under a running gateway: the next request says so, logs nothing
        r = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": adapter_name(v1_id)}, timeout=60)
        assert r.status_code == 200, r.text
        status, body, rid_unloaded = _ask(url, cand)
        assert (status, body["error"]["code"]) == (503, "adapter_not_loaded"), body
        assert "rlcycle deploy-vllm" in body["error"]["message"]
    finally:
        if gateway is not None:
            gateway.send_signal(signal.SIGTERM)
            try:
                gateway.wait(timeout=60)
            except subprocess.TimeoutExpired:
                gateway.kill()
        server.stop()
    print("MEASURED", json.dumps(measured))
    print((tmp_path / "gateway.err").read_text()[-4000:])
    assert gateway.returncode == 0

    # --- the log: every answer exactly once, nothing for a failed request ------------------------
    events = _completions(logs)
    per_request: dict[str, int] = {}
    for ev in events:
        per_request[ev["request_id"]] = per_request.get(ev["request_id"], 0) + 1
    answered = [o["rid"] for o in ok] + [rid_prod, rid_cand]
    assert {r: per_request.get(r, 0) for r in answered} == dict.fromkeys(answered, 1)
    refused = [o["rid"] for o in failed] + [rid_cand_refused, rid_unloaded]
    assert not {r for r in refused if r in per_request}
    assert len(events) == len(answered)  # the polls that were refused logged nothing either
    # the candidate's answer after the restart is v1's adapter sampling, not the base's
    [ev] = [e for e in events if e["request_id"] == rid_cand]
    assert ev["policy_version"] == v1_id
    diffs = {}
    for name, path in (("v1", v1), ("base", base)):
        model = HFPolicy.from_pretrained(path, HFPolicyConfig(device="cpu", dtype="float32", num_threads=1))
        want = model.score(ev["prompt_ids"], ev["completion_ids"])
        diffs[name] = max(abs(a - b) for a, b in zip(ev["completion_logprobs"], want, strict=True))
    assert diffs["v1"] < 1e-3 < 1e-2 < diffs["base"], diffs
