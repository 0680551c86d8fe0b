"""Benchmark: seconds per stage of the same cycles sampled by a real vLLM vs rlcycle's in-process
engine, float32 and bfloat16 (issue 23 item 6, issue 25 item 6).

    .venv/bin/python scripts/bench_cycle_engines.py                       # the tiny model, 1 cycle
    .venv/bin/python scripts/bench_cycle_engines.py --model /work/smol/base --cycles 2

Both engines run `rlcycle cycle --config vllm` (rlcycle/configs/vllm.toml: 16 simulated sessions,
a 2-step LoRA train, eval, deploy) on the same model, seeds and tasks, one engine after the
other, `--cycles` cycles each in a row (cycle k samples what cycle k-1 deployed), each engine in
a fresh RLCYCLE_HOME whose registry holds `--model` as production:
- vllm: `rlcycle serve --policy production` (dtype auto: float32 on a CPU without
  native bf16), the config's `serving_url` set to it; simulate and eval sample through it and
  the deploy hook hot-loads each new adapter into it. The server's start is reported apart.
- in-process: the same config with `serving_url` and the deploy hook unset: simulate and eval
  load the checkpoint in-process (float32 on a CPU, the default), deploy moves the registry;
- in-process-bf16: the same with `simulate.policy.dtype` and `eval.policy.dtype` bfloat16.
Prints each engine's per-stage seconds per cycle and each engine's ratio to in-process (float32)
per stage (the sum over cycles). `--engines` picks and orders them. Needs Docker (sandboxes) and .venv-vllm (`bash scripts/dev.sh vllm`); without a
vLLM it says so and exits 0 (`dev.sh bench` runs every bench). Speeds move with the machine's
load: compare the two engines of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("simulate", "collect", "distill", "train", "eval", "deploy")


def rlcycle(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcycle", *args], env=env, text=True, **kw)


def run_cycles(engine: str, model: Path, root: Path, cycles: int, extra: list[str]) -> dict:
    """`cycles` cycles with one engine: {"start_s": vLLM's start or 0, "cycles": [stage -> s]}."""
    env = {**os.environ, "RLCYCLE_HOME": str(root / engine / "home")}
    rlcycle(["registry", "add", str(model), "--alias", "production"], env, check=True, capture_output=True)
    server, start_s, sets = None, 0.0, list(extra)
    try:
        if engine == "vllm":
            t = time.perf_counter()
            server = subprocess.Popen(
                [sys.executable, "-m", "rlcycle", "serve", "--policy", "production"]
                + ["--port", "0", "--set", f"log={root / 'vllm.log'}"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            url = (server.stdout.readline() if server.stdout else "").strip()
            if not url.startswith("http"):
                raise SystemExit(f"bench_cycle_engines: vLLM did not start (see {root / 'vllm.log'})")
            start_s = time.perf_counter() - t
            sets += ["--set", f"serving_url={url}"]
        else:
            sets += ["--set", "serving_url=none", "--set", "deploy.hook=none"]
        if engine == "in-process-bf16":
            sets += ["--set", "simulate.policy.dtype=bfloat16", "--set", "eval.policy.dtype=bfloat16"]
        out = []
        for k in range(cycles):
            run_dir = root / engine / f"c{k + 1}"
            r = rlcycle(
                ["cycle", "--config", "vllm", "--run-dir", str(run_dir), "--json", *sets], env, capture_output=True
            )
            if r.returncode != 0:
                sys.stderr.write(r.stderr[-3000:])
                raise SystemExit(f"bench_cycle_engines: {engine} cycle {k + 1} exited {r.returncode}")
            result = json.loads(r.stdout)
            seconds = {s["name"]: s["seconds"] for s in result["stages"]}
            statuses = {s["name"]: s["status"] for s in result["stages"]}
            out.append({"seconds": seconds, "status": statuses})
            print(f"bench_cycle_engines: {engine} cycle {k + 1}: {json.dumps(seconds)} {statuses}", file=sys.stderr)
        return {"start_s": start_s, "cycles": out}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="Model directory (default: the tiny init-model in a temp dir).")
    p.add_argument("--cycles", type=int, default=1)
    p.add_argument(
        "--set", dest="extra", action="append", default=[], help="Extra cycle --set KEY=VALUE (both engines)."
    )
    p.add_argument("--keep", type=Path, help="Run here and keep the run directories (default: a temp dir).")
    p.add_argument("--engines", default="vllm,in-process,in-process-bf16", help="Comma-separated, run in this order.")
    args = p.parse_args()

    from rlcycle.errors import RlcycleError
    from rlcycle.policy import vllm_serve

    try:
        vllm_serve.find_python(vllm_serve.VllmServeConfig())
    except RlcycleError as e:
        print(f"bench_cycle_engines: skipped: {e.message} ({e.hint})", file=sys.stderr)
        return 0
    extra = [x for kv in args.extra for x in ("--set", kv)]
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model = args.model
        if model is None:
            from rlcycle import model_init

            model = Path(model_init.run(model_init.InitModelConfig(seed=0), root / "model").path)
        engines = args.engines.split(",")
        unknown = set(engines) - {"vllm", "in-process", "in-process-bf16"}
        if unknown or "in-process" not in engines:
            p.error(f"--engines: vllm, in-process (needed: the baseline), in-process-bf16; not {sorted(unknown)}")
        runs = {e: run_cycles(e, model.resolve(), root, args.cycles, extra) for e in engines}
    print(f"seconds per stage, {args.cycles} cycle(s) of `rlcycle cycle --config vllm` on {model}:")
    if "vllm" in runs:
        print(f"  vLLM start (once): {runs['vllm']['start_s']:.1f} s")
    others = [e for e in runs if e != "in-process"]
    header = "  " + f"{'stage':<10}" + "".join(f"{e + ' c' + str(k + 1):>20}" for e in runs for k in range(args.cycles))
    print(header + "".join(f"{e + '/fp32':>21}" for e in others))
    for stage in (*STAGES, "total"):
        cells, sums = [], {}
        for e, r in runs.items():
            for c in r["cycles"]:
                v = sum(c["seconds"].values()) if stage == "total" else c["seconds"].get(stage)
                cells.append("—" if v is None else f"{v:.1f}")
                sums[e] = sums.get(e, 0.0) + (v or 0.0)
        base = sums.get("in-process") or float("nan")
        ratios = "".join(f"{sums[e] / base:>20.2f}x" for e in others)
        print("  " + f"{stage:<10}" + "".join(f"{c:>20}" for c in cells) + ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
