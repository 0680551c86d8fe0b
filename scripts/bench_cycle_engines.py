"""Benchmark: seconds per stage of the same cycles sampled by a real vLLM vs rlcycle's in-process
engine, float32 and bfloat16 (issue 23 item 6, issue 25 item 6).

    .venv/bin/python scripts/bench_cycle_engines.py                       # the tiny model, 1 cycle
    .venv/bin/python scripts/bench_cycle_engines.py --model /work/smol/base --cycles 2
    .venv/bin/python scripts/bench_cycle_engines.py --engines vllm,in-process --runs 1 --json

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
`--runs` repeats the whole comparison (fresh homes and run directories each time). Prints,
through scripts/benchkit.py, one table per stage and one for the total: each engine's seconds
(the sum over its cycles), median over runs, and its ratio to in-process (float32), the
baseline. `--engines` picks and orders them. Needs Docker (sandboxes) and .venv-vllm (`bash scripts/dev.sh vllm`); without a
vLLM it says so and exits 0 (`dev.sh bench` runs every bench). Speeds move with the machine's
load: compare the two engines of one run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchkit

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
            benchkit.progress(f"bench_cycle_engines: {engine} cycle {k + 1}: {json.dumps(seconds)} {statuses}")
        return {"start_s": start_s, "cycles": out}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)


ENGINES = ("vllm", "in-process", "in-process-bf16")


def parse_args():
    p = benchkit.parser(__doc__, runs=1, runs_help="runs of the whole comparison")
    p.add_argument("--model", type=Path, help="Model directory (default: the tiny init-model in a temp dir).")
    p.add_argument("--cycles", type=int, default=1)
    p.add_argument(
        "--set", dest="extra", action="append", default=[], help="Extra cycle --set KEY=VALUE (both engines)."
    )
    p.add_argument("--keep", type=Path, help="Run here and keep the run directories (default: a temp dir).")
    p.add_argument("--engines", default=",".join(ENGINES), help="Comma-separated, run in this order.")
    args = p.parse_args()
    unknown = set(args.engines.split(",")) - set(ENGINES)
    if unknown or "in-process" not in args.engines.split(","):
        p.error(f"--engines: vllm, in-process (needed: the baseline), in-process-bf16; not {sorted(unknown)}")
    return args


def stage_seconds(run: dict, stage: str) -> float:
    """One engine's seconds in `stage` ("total": every stage), summed over its cycles."""
    if stage == "total":
        return sum(sum(c["seconds"].values()) for c in run["cycles"])
    return sum(c["seconds"].get(stage) or 0.0 for c in run["cycles"])


def main() -> int:
    args = parse_args()
    from rlcycle.errors import RlcycleError
    from rlcycle.policy import vllm_serve

    try:
        vllm_serve.find_python(vllm_serve.VllmServeConfig())
    except RlcycleError as e:
        return benchkit.skip(args, "bench_cycle_engines", f"{e.message} ({e.hint})")
    extra = [x for kv in args.extra for x in ("--set", kv)]
    engines = args.engines.split(",")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        top = args.keep or Path(tmp)
        model = args.model
        if model is None:
            from rlcycle import model_init

            model = Path(model_init.run(model_init.InitModelConfig(seed=0), top / "model").path)
        for k in range(args.runs):
            root = top / f"run{k + 1}"
            root.mkdir(parents=True, exist_ok=True)
            runs.append({e: run_cycles(e, model.resolve(), root, args.cycles, extra) for e in engines})
    tables = [
        benchkit.Table(
            f"{stage}: seconds over {args.cycles} cycle(s) of `rlcycle cycle --config vllm` on {model}",
            "seconds",
            baseline="in-process",
            samples={e: [stage_seconds(r[e], stage) for r in runs] for e in engines},
            higher_is_better=False,
        )
        for stage in (*STAGES, "total")
    ]
    notes = []
    if "vllm" in engines:
        notes.append(f"vLLM start (once a run, not in the stages): {[round(r['vllm']['start_s'], 1) for r in runs]} s")
    benchkit.emit(args, "bench_cycle_engines", tables, notes, {"runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
