#!/usr/bin/env python3
"""Benchmark the sandbox: tool-call round trip through the executor vs docker exec_run.

Measures, in one run against the same engine (a named baseline, a ratio; README.md, "Development"):

1. round trip of one tool call (`echo hello`, argv form) through the persistent executor,
   and through `container.exec_run` on the *same* container, interleaved in blocks: p50, p99,
   and the p50 ratio; then the executor alone again (no exec_run in between);
2. pool acquire latency (an idle sandbox handed out) and release latency (the reset);
3. throughput of 64 concurrent tool calls over a pool of 4 containers, `--runs` rounds (median).

The table (scripts/benchkit.py) holds one sample per call; its ratio is executor p50 / exec_run
p50 (the baseline). Needs a Docker engine.

    .venv/bin/python scripts/bench_sandbox.py            # a table on stdout
    .venv/bin/python scripts/bench_sandbox.py --json     # one JSON object
    .venv/bin/python scripts/bench_sandbox.py --n-exec 50 --n-baseline 10 --n-acquire 10 --runs 1   # a quick look

Target (issue #3): executor p50 at least 20x faster than exec_run (ratio <= 0.05), and under 5 ms.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import benchkit

from rlcycle.sandbox import Sandbox, SandboxConfig, SandboxPool, ensure_image
from rlcycle.sandbox.engine import docker_client

CMD = ["echo", "hello"]
BLOCKS = 10


def percentiles(samples_s: list[float]) -> dict[str, float]:
    """p50/p99/mean of samples given in seconds, reported in milliseconds."""
    xs = sorted(samples_s)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "mean_ms": statistics.fmean(xs) * 1000, "n": len(xs)}


def timed_calls(fn, n: int) -> list[float]:
    """Seconds of each of `n` calls of fn."""
    return [benchkit.timed(fn)[0] for _ in range(n)]


def bench_round_trip(client, image: str, cfg: SandboxConfig, n_exec: int, n_baseline: int) -> dict:
    """Executor vs exec_run on one hardened container."""
    with Sandbox.start(client, image, cfg) as sb:
        container = client.containers.get(sb.container_id)

        def via_executor():
            r = sb.exec(CMD, timeout=10)
            assert r.ok and r.stdout == "hello\n", r

        def via_exec_run():
            # The fair baseline: the same command, user and container, no executor involved.
            code, out = container.exec_run(CMD, user=cfg.user, workdir="/workspace")
            assert code == 0 and out == b"hello\n", (code, out)

        timed_calls(via_executor, 20)  # warm up both paths
        timed_calls(via_exec_run, 3)
        # Interleave the two in blocks: load from other processes on the machine then hits
        # both alike, and the ratio stays meaningful even when the absolute numbers move.
        ours, theirs = [], []
        for _ in range(BLOCKS):
            ours += timed_calls(via_executor, max(n_exec // BLOCKS, 1))
            theirs += timed_calls(via_exec_run, max(n_baseline // BLOCKS, 1))
        executor, baseline = percentiles(ours), percentiles(theirs)
        # A call right after an exec_run pays for docker's leftovers of it (its p99 shows
        # that); the executor alone, as a pool uses it:
        alone_s = timed_calls(via_executor, n_exec)
        alone = percentiles(alone_s)
    return {
        "executor": executor,
        "executor_alone": alone,
        "exec_run": baseline,
        "speedup_p50": baseline["p50_ms"] / executor["p50_ms"],
        "samples_ms": {
            "exec_run (baseline)": [x * 1000 for x in theirs],
            "executor": [x * 1000 for x in ours],
            "executor, no exec_run between": [x * 1000 for x in alone_s],
        },
    }


def bench_pool(client, image: str, cfg: SandboxConfig, n_acquire: int, rounds: int) -> dict:
    """Acquire/release latency on a warm pool, then 64 concurrent calls over 4 containers."""
    start = time.perf_counter()
    with SandboxPool(size=4, images=[image], config=cfg, clients=[client]) as pool:
        startup_s = time.perf_counter() - start
        acquire, release = [], []
        for _ in range(n_acquire):
            t0 = time.perf_counter()
            cm = pool.acquire()
            cm.__enter__()
            t1 = time.perf_counter()
            cm.__exit__(None, None, None)
            acquire.append(t1 - t0)
            release.append(time.perf_counter() - t1)

        def call(i: int) -> None:
            with pool.acquire(timeout=60) as sb:
                r = sb.exec(["echo", str(i)], timeout=10)
                assert r.ok and r.stdout == f"{i}\n", r

        walls = []
        with ThreadPoolExecutor(64) as ex:
            list(ex.map(call, range(64)))  # warm up
            for _ in range(rounds):
                t = time.perf_counter()
                list(ex.map(call, range(64)))
                walls.append(time.perf_counter() - t)
    wall = statistics.median(walls)
    return {
        "pool_start_4_s": startup_s,
        "acquire": percentiles(acquire),
        "release_reset": percentiles(release),
        "concurrent_64_over_4": {"wall_s_median": wall, "calls_per_s": 64 / wall, "rounds": rounds},
    }


def main(argv: list[str] | None = None) -> int:
    ap = benchkit.parser(__doc__, runs=5, runs_help="rounds of 64 concurrent calls")
    ap.add_argument("--n-exec", type=int, default=1000, help="executor round trips")
    ap.add_argument("--n-baseline", type=int, default=100, help="exec_run round trips (~100 ms each)")
    ap.add_argument("--n-acquire", type=int, default=300, help="pool acquire/release cycles")
    args = ap.parse_args(argv)

    client = docker_client()
    cfg = SandboxConfig()
    image = ensure_image(client, cfg, log=benchkit.progress)
    result = {"image": image, "engine": client.version().get("Version")}
    result["round_trip"] = bench_round_trip(client, image, cfg, args.n_exec, args.n_baseline)
    benchkit.progress("bench_sandbox: round trips done; the pool next")
    result.update(bench_pool(client, image, cfg, args.n_acquire, args.runs))
    samples = result["round_trip"].pop("samples_ms")
    table = benchkit.Table(
        f"tool call `echo hello` round trip, one sample per call (engine {result['engine']}, image {image})",
        "ms per call",
        baseline="exec_run (baseline)",
        samples=samples,
        higher_is_better=False,
    )
    benchkit.emit(args, "bench_sandbox", [table], notes(result), result)
    return 0


def notes(r: dict) -> list[str]:
    """p99s, the pool's latencies and the concurrent throughput, under the table."""
    rt = r["round_trip"]
    fmt = "{:<34} {:>10.3f} {:>10.3f}"
    c = r["concurrent_64_over_4"]
    return [
        "{:<34} {:>10} {:>10}".format("", "p50 ms", "p99 ms"),
        fmt.format("tool call via executor", rt["executor"]["p50_ms"], rt["executor"]["p99_ms"]),
        fmt.format("tool call via exec_run (baseline)", rt["exec_run"]["p50_ms"], rt["exec_run"]["p99_ms"]),
        fmt.format("  executor, no exec_run between", rt["executor_alone"]["p50_ms"], rt["executor_alone"]["p99_ms"]),
        fmt.format("pool acquire (idle sandbox)", r["acquire"]["p50_ms"], r["acquire"]["p99_ms"]),
        fmt.format("pool release (reset)", r["release_reset"]["p50_ms"], r["release_reset"]["p99_ms"]),
        f"executor speedup over exec_run (p50): {rt['speedup_p50']:.1f}x (target >= 20x, executor p50 < 5 ms)",
        f"64 concurrent calls over 4 containers: {c['wall_s_median'] * 1000:.1f} ms, {c['calls_per_s']:.0f} calls/s "
        f"(median of {c['rounds']} rounds)",
        f"pool of 4 started in {r['pool_start_4_s']:.2f} s",
    ]


if __name__ == "__main__":
    sys.exit(main())
