"""The gateway when its upstream goes away and comes back (rlcycle/gateway/upstream.py), fast.

The upstream is a second gateway serving the tiny model in-process over vLLM's /v1/completions
(in this process), stopped and started again on the same port; the gateway, its prober, the official `openai` SDK and the
log are all real. What a client gets while it is down (502/503 in OpenAI's error shape, nothing
logged), what /health says, that a restarted upstream serving another checkpoint is refused
with an error naming the fix, and that the gateway serves again by itself once the right one is
back. The same against a real vLLM killed under load: tests/test_vllm_upstream.py.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from rlcycle.gateway import GatewayConfig, start
from rlcycle.policy.registry import Entry, Registry

MSGS = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from rlcycle import model_init

    root = tmp_path_factory.mktemp("gwup")
    m0 = Path(model_init.run(model_init.InitModelConfig(seed=0), root / "m0").path)
    m1 = Path(model_init.run(model_init.InitModelConfig(seed=1), root / "m1").path)
    reg = Registry(root / "registry")
    with reg.locked():
        cid = reg.add(m0)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"root": root, "m0": m0, "m1": m1, "registry": str(reg.root), "cid": cid, "port": port}


def _serve(world, model: Path):
    """A gateway serving `model` in-process on the world's port (listed with it as root, as vLLM
    does), logging nothing."""
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    policy = HFPolicy.from_pretrained(model, HFPolicyConfig(device="cpu", dtype="float32", num_threads=1))
    return start(GatewayConfig(port=world["port"], logging=False), policy=policy, checkpoint=model)


def _ask(url: str, stream: bool = False) -> tuple[str, object]:
    """One chat request with its own request id: (request id, the response or the APIStatusError)."""
    rid = uuid.uuid4().hex
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        r = client.chat.completions.with_raw_response.create(
            model="production",
            messages=MSGS,
            max_tokens=4,
            seed=1,
            stream=stream,
            extra_headers={"X-Request-Id": rid},
        )
        if stream:
            list(r.parse())
        return rid, r
    except openai.APIStatusError as e:
        return rid, e


def _openai_error(e: object, status: int, code: str) -> str:
    assert isinstance(e, openai.APIStatusError), e
    body = e.response.json()
    assert e.status_code == status and set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code and err["type"] == "server_error" and err["message"], err
    return err["message"]


def _logged(running) -> dict[str, int]:
    """request id -> completion events logged for it."""
    from tests.test_gateway import read_events

    running.gateway.log.flush()
    counts: dict[str, int] = {}
    for ev in read_events(running.gateway.config.log_dir):
        if ev["type"] == "completion":
            counts[ev["request_id"]] = counts.get(ev["request_id"], 0) + 1
    return counts


def _until(predicate, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _gateway(world, tmp_path, upstream: str):
    """The gateway in front of `upstream`, probing every 0.2 s, flushing its log every 0.05 s."""
    config = GatewayConfig(
        registry=world["registry"],
        log_dir=str(tmp_path / "logs"),
        port=0,
        upstream=upstream,
        flush_interval_s=0.05,
        upstream_probe_s=0.2,
    )
    return start(config)


def test_down_refused_then_back_by_itself_with_identity_rechecked(world, tmp_path):
    server = _serve(world, world["m0"])
    running = _gateway(world, tmp_path, server.url)
    url, ok, failed = running.url, [], []
    try:
        rid, r = _ask(url)
        assert r.http_response.status_code == 200 and r.headers["x-checkpoint-id"] == world["cid"]
        ok.append(rid)
        assert httpx.get(url + "/health").text == "ok"

        # the upstream goes away: the first request fails in flight (502) or is refused (503)
        server.close()
        for stream in (False, True, False):
            rid, e = _ask(url, stream)
            assert isinstance(e, openai.APIStatusError) and e.status_code in (502, 503), e
            _openai_error(e, e.status_code, "upstream_error" if e.status_code == 502 else "upstream_unavailable")
            failed.append(rid)
        health = _until(lambda: (h := httpx.get(url + "/health")).status_code == 503 and h.json(), "/health 503")
        up = health["upstream"]
        assert health["status"] == "degraded" and up["url"] == server.url and up["ok"] is False
        assert up["reachable"] is False and up["error"] and up["since"] and up["outages"] == 1
        # while down: refused at once, with Retry-After, streamed or not
        for stream in (False, True):
            rid, e = _ask(url, stream)
            msg = _openai_error(e, 503, "upstream_unavailable")
            assert "down since" in msg and e.response.headers["retry-after"].isdigit()
            failed.append(rid)

        # back on the same port, but serving another checkpoint: refused, naming the fix
        other = _serve(world, world["m1"])
        try:
            health = _until(
                lambda: (h := httpx.get(url + "/health").json())["upstream"]["reachable"] and h, "reachable again"
            )
            [engine] = health["upstream"]["engines"]
            assert engine["served"] is False and health["upstream"]["ok"] is False
            assert "does not serve checkpoint " + world["cid"] in engine["error"]
            assert "rlcycle deploy-vllm" in engine["error"]
            rid, e = _ask(url)
            msg = _openai_error(e, 503, "adapter_not_loaded")
            assert world["cid"] in msg and "rlcycle deploy-vllm" in msg
            failed.append(rid)
        finally:
            other.close()

        # the right one back: served again by itself, logged as the checkpoint
        server = _serve(world, world["m0"])
        _until(lambda: httpx.get(url + "/health").text == "ok", "/health ok again")
        for stream in (False, True):
            rid, r = _ask(url, stream)
            assert r.http_response.status_code == 200 and r.headers["x-checkpoint-id"] == world["cid"]
            ok.append(rid)
        stats = httpx.get(url + "/v1/rlcycle/stats").json()["upstream"]
        assert stats["ok"] and stats["outages"] == 2 and stats["last_outage_s"] > 0  # m0 gone, then m1
    finally:
        running.close()
        server.close()
    logged = _logged(running)
    assert {rid: logged.get(rid, 0) for rid in ok} == dict.fromkeys(ok, 1)
    assert {rid: logged.get(rid, 0) for rid in failed} == dict.fromkeys(failed, 0)


def test_starts_before_its_upstream_and_serves_once_it_answers(world, tmp_path):
    """A gateway started while vLLM is still loading (nothing listens yet) does not refuse to
    start: /health says the upstream is down, requests get 503 (nothing logged), and once the
    upstream answers with the right checkpoint the gateway serves by itself."""
    running = _gateway(world, tmp_path, f"http://127.0.0.1:{world['port']}")
    url, server = running.url, None
    try:
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.json()["upstream"]["reachable"] is False
        rid, e = _ask(url)
        assert "down since" in _openai_error(e, 503, "upstream_unavailable")
        server = _serve(world, world["m0"])
        _until(lambda: httpx.get(url + "/health").text == "ok", "/health ok once the upstream answers")
        rid2, r = _ask(url)
        assert r.http_response.status_code == 200 and r.headers["x-checkpoint-id"] == world["cid"]
    finally:
        running.close()
        if server is not None:
            server.close()
    logged = _logged(running)
    assert (logged.get(rid, 0), logged.get(rid2, 0)) == (0, 1)


def test_starts_while_its_adapter_is_not_loaded_and_serves_once_it_is(world, tmp_path):
    """Started against an upstream that does not serve the alias's checkpoint yet (a restarted
    vLLM before the deploy hook reloads the adapter): 503 `adapter_not_loaded` naming the fix,
    then served by itself once the right checkpoint is listed."""
    other = _serve(world, world["m1"])
    running = _gateway(world, tmp_path, other.url)
    url, server = running.url, None
    try:
        [engine] = httpx.get(url + "/health").json()["upstream"]["engines"]
        assert engine["served"] is False and "does not serve checkpoint " + world["cid"] in engine["error"]
        _, e = _ask(url)
        assert "rlcycle deploy-vllm" in _openai_error(e, 503, "adapter_not_loaded")
        other.close()
        server = _serve(world, world["m0"])
        _until(lambda: httpx.get(url + "/health").text == "ok", "/health ok once the checkpoint is served")
        _, r = _ask(url)
        assert r.http_response.status_code == 200 and r.headers["x-checkpoint-id"] == world["cid"]
    finally:
        running.close()
        other.close()
        if server is not None:
            server.close()
