"""The HTTP backend against the gateway's vLLM-compatible /v1/completions on loopback (no mocks).

The gateway serves the tiny model in-process (`gateway.start(config, policy=...)`), real uvicorn;
the same client against a real vLLM is tests/test_vllm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlcycle.errors import InputError, RlcycleError
from rlcycle.gateway import GatewayConfig, start
from rlcycle.policy.base import SamplingParams
from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
from rlcycle.policy.http import HTTPPolicy, HTTPPolicyConfig, parse_choice, request_body

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["def add(a, b):", "Fix the failing test", "import os\nprint(os.listdir())", "x = 1\n"]


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoTokenizer

    from rlcycle.model_init import InitModelConfig, build_model

    tok = AutoTokenizer.from_pretrained(str(REPO / "sample_data" / "tokenizer"))
    return HFPolicy(build_model(InitModelConfig(seed=0), tok), tok, HFPolicyConfig(num_threads=1), name="tiny")


@pytest.fixture(scope="module")
def prompts(policy):
    return [policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


@contextmanager
def _gateway(policy, **kw):
    """The gateway serving `policy` as `tiny`, logging nothing (completions are never logged)."""
    running = start(GatewayConfig(alias="tiny", port=0, logging=False, batch_wait_ms=20, **kw), policy=policy)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def server(policy):
    with _gateway(policy) as srv:
        yield srv


def post(url, body, headers=None):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=11),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.8, seed=12),
        SamplingParams(max_new_tokens=8, temperature=0.0),
    ],
)
def test_http_and_in_process_give_the_same_samples(policy, prompts, server, params):
    client = HTTPPolicy(server.url + "/v1")
    try:
        remote = client.generate(prompts, params)
    finally:
        client.close()
    local = policy.generate(prompts, params)
    for r, g in zip(remote, local, strict=True):
        assert r.token_ids == g.token_ids and r.finish_reason == g.finish_reason
        assert r.logprobs == pytest.approx(g.logprobs, abs=1e-4)
        assert r.latency_ms > 0
    assert client.name == "tiny"


def test_stop_token_is_included_and_reported(policy, prompts, server):
    [g] = policy.generate([prompts[0]], SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(99999,)))
    stop = g.token_ids[2]
    client = HTTPPolicy(server.url, HTTPPolicyConfig(model="tiny"))
    [r] = client.generate([prompts[0]], SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(stop,)))
    client.close()
    assert r.token_ids[-1] == stop and r.finish_reason == "stop"
    assert r.token_ids == g.token_ids[: g.token_ids.index(stop) + 1]


def test_wire_format_is_vllm_compatible(prompts, server):
    body = request_body("tiny", prompts[0], SamplingParams(max_new_tokens=5, seed=1))
    status, resp = post(server.url, body)
    assert status == 200 and resp["object"] == "text_completion"
    choice = resp["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    assert resp["usage"]["completion_tokens"] == len(choice["token_ids"])
    # vLLM without return_token_ids: ids come from the "token_id:N" strings alone
    ids = choice.pop("token_ids")
    assert parse_choice(resp).token_ids == [int(t[9:]) for t in choice["logprobs"]["tokens"]]
    # a batch of prompts in one request: prompt i gets seed + i, like the client
    status, multi = post(server.url, {**body, "prompt": [prompts[0], prompts[1]]})
    assert status == 200 and len(multi["choices"]) == 2
    assert multi["choices"][0]["token_ids"] == ids


def test_top_logprobs_are_the_tempered_k_most_likely_as_vllm(policy, prompts, server):
    """`logprobs: k` > 1: the k most likely tokens at each generated position under
    log_softmax(logits / T), most likely first, plus the sampled token; k > 20 is refused."""
    import torch

    body = {
        **request_body("tiny", prompts[1], SamplingParams(max_new_tokens=3, temperature=0.5, seed=2)),
        "logprobs": 5,
    }
    status, resp = post(server.url, body)
    assert status == 200, resp
    choice = resp["choices"][0]
    tops = choice["logprobs"]["top_logprobs"]
    assert len(tops) == len(choice["token_ids"]) == 3
    ids = torch.tensor([prompts[1] + choice["token_ids"]])
    with torch.inference_mode():
        logits = policy.model(input_ids=ids).logits[0].float()
    for i, (top, sampled) in enumerate(zip(tops, choice["token_ids"], strict=True)):
        want = torch.log_softmax(logits[len(prompts[1]) - 1 + i] / 0.5, -1)
        vals, idx = want.topk(5)
        assert sorted(top, key=top.get, reverse=True)[:5] == [f"token_id:{t}" for t in idx.tolist()]
        assert [top[f"token_id:{t}"] for t in idx.tolist()] == pytest.approx(vals.tolist(), abs=1e-4)
        assert f"token_id:{sampled}" in top and len(top) in (5, 6)
    status, err = post(server.url, {**body, "logprobs": 21})
    assert status == 400 and "at most 20" in err["error"]["message"]


def test_the_logprobs_check_tells_processed_from_raw_without_echo(policy, server, monkeypatch):
    """served.logprobs_processed compares the top-20 spread at T = 0.25 with T = 1: 4x from a
    server in processed mode (the gateway, as vLLM with processed_logprobs), 1x from one that reports raw logprobs (vLLM
    without --logprobs-mode processed_logprobs, imitated here), which HTTPPolicy refuses before
    its first T != 1 sample. Never a prompt-logprobs (echo) request."""
    from rlcycle.errors import InputError
    from rlcycle.policy import served

    sent = []
    client = HTTPPolicy(server.url)
    real_call = client._call
    monkeypatch.setattr(client, "_call", lambda m, path, body, *a: sent.append(body) or real_call(m, path, body, *a))
    try:
        assert served.logprobs_processed(client, client.model) is True
        assert sent and not any((b or {}).get("echo") for b in sent)
        raw_top = HFPolicy.top_logprobs
        monkeypatch.setattr(HFPolicy, "top_logprobs", lambda self, p, c, t, k: raw_top(self, p, c, 1.0, k))
        assert served.logprobs_processed(client, client.model) is False
        with pytest.raises(InputError, match="raw model's logprobs") as e:
            client.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2, temperature=0.7, seed=1))
        assert "--logprobs-mode processed_logprobs" in e.value.hint
    finally:
        client.close()


def test_models_endpoint_and_health(server):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
        data = json.loads(r.read())
    assert data["data"][0]["id"] == "tiny" and data["data"][0]["max_model_len"] > 0
    status, err = post(server.url, {"model": "nope", "prompt": [5, 6]})  # vLLM's answer to a name it lacks
    assert (
        status == 404 and err["error"]["type"] == "NotFoundError" and "`nope` does not exist" in err["error"]["message"]
    )
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.read() == b"ok"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"top_k": 5}, "top_k"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"stop": ["\n"]}, "stop"),
        ({"n": 2}, "n must be 1"),
        ({"stream": True}, "stream"),
        ({"echo": True}, "echo"),
        ({"logprobs": -1}, "logprobs"),
        ({"max_tokens": 10**6}, "cap"),
        ({"prompt": "not ids"}, None),  # text prompts are tokenised: accepted
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, 99999]}, "outside"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_requests_that_would_change_the_distribution_are_refused(server, extra, message):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "logprobs": 1, **extra}
    status, resp = post(server.url, body)
    if message is None:
        assert status == 200
    else:
        assert status == 400 and message in resp["error"]["message"]


def test_client_reports_refusals_and_dead_servers(server):
    client = HTTPPolicy(server.url, HTTPPolicyConfig(model="tiny", retries=0))
    with pytest.raises(InputError, match="outside"):
        client.generate([[1, 99999]], SamplingParams(max_new_tokens=2))
    client.close()
    dead = HTTPPolicy("http://127.0.0.1:9", HTTPPolicyConfig(model="x", retries=0, timeout_s=5))
    with pytest.raises(RlcycleError) as e:
        dead.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert "rlcycle serve" in e.value.hint
    dead.close()


def test_api_key_is_enforced(policy):
    with _gateway(policy, api_key="s3cret") as srv:  # the gateway's one auth path
        bad = HTTPPolicy(srv.url, HTTPPolicyConfig(model="tiny", retries=0))
        with pytest.raises(InputError, match="401"):
            bad.generate([[1, 2]], SamplingParams(max_new_tokens=2))
        good = HTTPPolicy(srv.url, HTTPPolicyConfig(model="tiny", api_key="s3cret"))
        assert len(good.generate([[1, 2]], SamplingParams(max_new_tokens=2, seed=0))[0].token_ids) >= 1
        bad.close()
        good.close()


def test_gateway_command_serves_completions_end_to_end(tmp_path, prompts, policy):
    """`rlcycle gateway --alias DIR --port 0 --json` in a subprocess (the command that serves a model
    in-process), queried over /v1/completions: the samples of the same seed-0 weights in-process.
    (`rlcycle serve`'s command line starts the session's real vLLM: conftest.py's `vllm`.)"""
    from rlcycle.model_init import init_model

    init_model(tmp_path / "m", seed=0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcycle", "gateway", "--alias", str(tmp_path / "m"), "--port", "0", "--json"]
        + ["--log-dir", str(tmp_path / "logs"), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RLCYCLE_HOME": str(tmp_path / "home")},
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert info["url"].startswith("http://127.0.0.1:")
        client = HTTPPolicy(info["url"])
        params = SamplingParams(max_new_tokens=6, seed=4)
        remote = client.generate(prompts[:2], params)
        client.close()
        assert client.policy_version == info["checkpoint_id"]  # named by its root, never the URL
        local = policy.generate(prompts[:2], params)  # same seed-0 weights, built in-process
        assert [g.token_ids for g in remote] == [g.token_ids for g in local]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_port_in_use_is_a_clear_error(policy, server):
    port = int(server.url.rsplit(":", 1)[1])
    with pytest.raises(RlcycleError, match="cannot listen") as e:
        start(GatewayConfig(port=port, logging=False), policy=policy)
    assert "--port" in e.value.hint
