"""Benchmark: `rlcycle gateway` with event logging on vs off (the baseline), in the same run.

    .venv/bin/python scripts/bench_gateway.py                   # 8 clients x 4 requests, 12 runs
    .venv/bin/python scripts/bench_gateway.py --clients 2 --requests 2 --runs 2 --logger-events 500 --json
    .venv/bin/python scripts/bench_gateway.py --clients 16 --max-tokens 32 --size small --threads 2

Two gateways in this process, in-process mode, on the same model (the random one
`rlcycle init-model` makes, `--size tiny` by default) registered as `production` in a temp
registry: one with logging on (the defaults: redaction on, fsync'd batches every
`flush_interval_s`), one with `logging = false`. Each repeat sends the same requests to each
(`--clients` threads, each with its own official `openai` SDK client, `--requests` chat
completions in a row, seeds fixed per request so both sides sample exactly the same tokens; the
script checks they did), alternating which side goes first. A third line, `direct`, sends the
same rendered prompts straight to the shared batcher in front of the same kind of `HFPolicy`:
what the model costs without HTTP, JSON and the chat layer, for scale.

Printed per side (scripts/benchkit.py's tables, `off` the baseline): p50 and p99 latency per
request (client-side, the SDK call), requests/s, and events/s written during the run; medians
(min, max) over `--runs` (a repeat each), ratio = side / off. Then the on/off paired ratios: the
geometric mean of the per-repeat ratios with a 95% CI (the repeats are paired, so drift of a
shared machine cancels). The logging overhead is the paired p50 ratio;
the issue's target is < 5 % of p50: "met" when the CI's top is under 1.05, "NOT met" when its
bottom is over, else "not resolved at this noise". Last, what the event logger sustains on its
own: real completion events from the run appended as fast as one thread can, until all are
written and fsync'd (redaction on, then off). With few requests a repeat, p99 is the slowest.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path

import benchkit

TASK = "Fix the off-by-one error in utils/pagination.py and run the tests"


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of xs."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def setup(root: Path, size: str, seed: int) -> tuple[Path, str]:
    """(model directory, registry directory): the model registered as `production`."""
    from rlcycle import model_init
    from rlcycle.policy.registry import Entry, Registry

    model = Path(model_init.run(model_init.InitModelConfig(seed=seed, size=size), root / "model").path)
    reg = Registry(root / "registry")
    with reg.locked():
        cid = reg.add(model)
        reg.commit({"production": cid}, Entry("promote", "production", cid, None))
    return model, str(reg.root)


def messages(client: int) -> list[dict[str, str]]:
    from rlcycle.harness import initial_messages

    return initial_messages(f"{TASK} (client {client})")


# --- load ------------------------------------------------------------------------------------


def run_clients(args, make_client) -> tuple[list[float], float, int]:
    """(latencies in ms, wall seconds, completion tokens) of one round of every client.

    `make_client(i)` (called before the clock starts) returns `send(k) -> tokens`, which makes
    client i's k-th request; the clients start together and each sends its requests in a row.
    """
    lat: list[float] = []
    tokens = [0]
    errors: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(args.clients + 1)

    def client(i: int) -> None:
        send = make_client(i)
        go.wait()
        for k in range(args.requests):
            t = time.perf_counter()
            try:
                n = send(k)
            except Exception as e:  # reported once every client is done
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                return
            dt = (time.perf_counter() - t) * 1000
            with lock:
                lat.append(dt)
                tokens[0] += n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"bench_gateway: {len(errors)} requests failed, e.g. {errors[0]}")
    return lat, wall, tokens[0]


def load_gateway(url: str, args, seed0: int) -> tuple[list[float], float, int]:
    """One round through the gateway: an `openai` SDK client a thread, one session each."""
    import openai

    def make_client(i: int):
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        msgs = messages(i)

        def send(k: int) -> int:
            r = sdk.chat.completions.create(
                model="production",
                messages=msgs,
                max_tokens=args.max_tokens,
                temperature=1.0,
                seed=seed0 + i * args.requests + k,
                extra_headers={"X-Session-Id": f"bench-{i}"},
            )
            return r.usage.completion_tokens

        return send

    return run_clients(args, make_client)


def load_direct(batcher, prompts: list[list[int]], args, seed0: int) -> tuple[list[float], float, int]:
    """The same requests straight to a batcher over the policy: no HTTP, no chat layer, no log."""
    from rlcycle.policy.base import SamplingParams

    def make_client(i: int):
        def send(k: int) -> int:
            sp = SamplingParams(max_new_tokens=args.max_tokens, temperature=1.0, seed=seed0 + i * args.requests + k)
            return len(batcher.submit((prompts[i], sp)).result().token_ids)

        return send

    return run_clients(args, make_client)


# --- the event logger on its own -------------------------------------------------------------------


def logger_rate(templates: list[dict], n: int, redact_on: bool, root: Path) -> tuple[float, float, float]:
    """(events/s appended until written and fsync'd, writer wall and CPU µs an event), n events."""
    from rlcycle.collect import redact
    from rlcycle.gateway.logwriter import EventLog

    log = EventLog(root, patterns=redact.DEFAULT_PATTERNS if redact_on else None)
    events = []
    for i in range(n):  # copies made before the clock starts: append() takes dicts it owns
        ev = json.loads(json.dumps(templates[i % len(templates)]))
        ev["event_id"], ev["sample_id"] = f"bench-ev-{i}", f"bench-{i}"
        events.append(ev)
    t = time.perf_counter()
    for k in range(0, n, 64):  # in chunks of 64: as fast as one producer thread can
        log.append(*events[k : k + 64])
    log.close()  # flushes: every event is written and fsync'd when it returns
    dt = time.perf_counter() - t
    assert log.stats.written == n, log.stats.as_dict()
    return n / dt, 1e6 * log.stats.write_seconds / n, 1e6 * log.stats.cpu_seconds / n


# --- the report --------------------------------------------------------------------------------


def summarise(rounds: list[tuple[list[float], float, int, int]]) -> dict[str, list[float]]:
    """Per-repeat p50, p99, requests/s and events/s of one side."""
    return {
        "p50": [percentile(lat, 50) for lat, _, _, _ in rounds],
        "p99": [percentile(lat, 99) for lat, _, _, _ in rounds],
        "rps": [len(lat) / wall for lat, wall, _, _ in rounds],
        "eps": [ev / wall for _, wall, _, ev in rounds],
    }


def paired_ratio(on: list[float], off: list[float]) -> tuple[float, float, float]:
    """(geometric mean of on/off over the paired repeats, 95% CI low, high).

    The repeats are paired (each sends the same requests to both sides, back to back), so the
    machine's drift between repeats cancels in the ratio; the CI is the normal one on the log
    ratios (rlcycle.stats.mean_interval), exponentiated.
    """
    from rlcycle.stats import mean_interval

    iv = mean_interval([math.log(a / b) for a, b in zip(on, off, strict=True)])
    return math.exp(iv.estimate), math.exp(iv.low), math.exp(iv.high)


def tables(args, rounds: dict[str, list]) -> list[benchkit.Table]:
    """p50, p99 and requests/s per side, `off` (logging off) the baseline."""
    s = {name: summarise(r) for name, r in rounds.items()}
    sides = [n for n in ("off", "on", "direct") if n in s]
    title = (
        f"gateway: {args.size} model, in-process, {args.clients} clients x {args.requests} "
        f"requests x {args.max_tokens} tokens, max_batch_size {args.max_batch_size}, "
        f"batch_wait_ms {args.batch_wait_ms:g}, threads {args.threads}"
    )
    metrics = (("p50", "p50 latency, ms", False), ("p99", "p99 latency, ms", False), ("rps", "requests/s", True))
    return [
        benchkit.Table(f"{title}: {label}", label, "off", {n: s[n][k] for n in sides}, higher_is_better=hib)
        for k, label, hib in metrics
    ]


def notes(rounds: dict[str, list], stats: dict) -> list[str]:
    """The paired on/off ratios with their CIs, the verdict, and what the log wrote."""
    s = {name: summarise(r) for name, r in rounds.items()}
    med = {name: {k: statistics.median(v) for k, v in s[name].items()} for name in s}
    lines = [f"events written during the on side: {med['on']['eps']:.1f} events/s (median)"]
    for k, label in (("p50", "p50 latency"), ("p99", "p99 latency"), ("rps", "requests/s")):
        g, lo, hi = paired_ratio(s["on"][k], s["off"][k])
        lines.append(
            f"on/off {label:12s} ratio of medians {med['on'][k] / med['off'][k]:.3f}; paired "
            f"{g:.3f} (95% CI {lo:.3f}..{hi:.3f})"
        )
    g, lo, hi = paired_ratio(s["on"]["p50"], s["off"]["p50"])
    verdict = "met" if hi < 1.05 else "NOT met" if lo > 1.05 else "not resolved at this noise"
    scale = f"; gateway (off) / direct p50 {med['off']['p50'] / med['direct']['p50']:.2f}x" if "direct" in med else ""
    lines.append(
        f"logging overhead {100 * (g - 1):+.1f}% of p50 (95% CI {100 * (lo - 1):+.1f}%.."
        f"{100 * (hi - 1):+.1f}%; target < 5%: {verdict}){scale}"
    )
    n = max(1, stats["written"])
    lines.append(
        f"log during the run: {stats['written']} events in {stats['batches']} fsync'd batches, "
        f"{stats['bytes'] / n:.0f} bytes/event; writer {1e6 * stats['write_seconds'] / n:.0f} µs/event "
        f"wall (redact + serialise + write + fsync), {1e6 * stats['cpu_seconds'] / n:.0f} µs/event CPU "
        f"= {100 * stats['cpu_seconds'] / stats['process_cpu_seconds']:.2f}% of the process's CPU "
        "while the on side ran"
    )
    return lines


# --- main --------------------------------------------------------------------------------------


def parse_args():
    ap = benchkit.parser(__doc__, runs=12, runs_help="paired repeats (each side once per repeat, alternating)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent SDK clients (sessions)")
    ap.add_argument("--requests", type=int, default=4, help="requests per client per repeat")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--size", default="tiny", help="init-model size: tiny or small")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--no-direct", action="store_true", help="skip the direct reference line")
    ap.add_argument("--logger-events", type=int, default=20_000, help="events for the logger alone")
    return ap.parse_args()


def measure(args, root: Path) -> tuple[dict[str, list], dict, list[dict]]:
    """(rounds per side, the on side's log stats, the events it wrote)."""
    from rlcycle.gateway import GatewayConfig, start
    from rlcycle.harness.render import ChatRenderer
    from rlcycle.policy.batching import Batcher, generate_batch
    from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

    model, registry = setup(root, args.size, seed=0)
    common = dict(
        registry=registry,
        port=0,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        num_threads=args.threads,
        device=args.device,
        watch_interval_s=0,
    )
    on = start(GatewayConfig(log_dir=str(root / "logs"), **common))
    off = start(GatewayConfig(logging=False, **common))
    pcfg = HFPolicyConfig(device=args.device, max_batch_size=args.max_batch_size, num_threads=args.threads)
    batcher = Batcher(
        generate_batch(HFPolicy.from_pretrained(model, pcfg)),
        args.max_batch_size,
        args.batch_wait_ms,
    )
    renderer = ChatRenderer.from_pretrained(model, tools=())
    prompts = [renderer.render(messages(i), add_generation_prompt=True) for i in range(args.clients)]
    sides = {
        "off": lambda seed: (*load_gateway(off.url, args, seed), 0),
        "on": lambda seed: _with_events(on.gateway.log, lambda: load_gateway(on.url, args, seed), cpu),
        "direct": lambda seed: (*load_direct(batcher, prompts, args, seed), 0),
    }
    if args.no_direct:
        del sides["direct"]
    rounds: dict[str, list] = {name: [] for name in sides}
    cpu = {"process": 0.0}  # CPU of the whole process while the on side ran (clients included)
    try:
        for run in sides.values():  # warm-up: first requests, kernels, caches
            run(10**6)
        for r in range(args.runs):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))  # cancel drift
            for name in order:
                rounds[name].append(sides[name](1000 * r))
            work = {name: rounds[name][-1][2] for name in sides}
            assert len(set(work.values())) == 1, f"the sides sampled different tokens: {work}"
            benchkit.progress(f"bench_gateway: repeat {r + 1} of {args.runs} done")
        on.gateway.log.flush()
        stats = on.gateway.log.stats.as_dict() | {"process_cpu_seconds": cpu["process"]}
    finally:
        on.close()
        off.close()
        batcher.close()
    events = [json.loads(line) for f in sorted((root / "logs").glob("*.jsonl")) for line in f.read_text().splitlines()]
    completions = sum(e["type"] == "completion" for e in events)
    expected = args.clients * args.requests * (args.runs + 1)
    # zero lost, zero duplicated (the other events are tool_results of invalid calls)
    assert completions == expected and len(events) == stats["written"], (
        completions,
        expected,
        stats,
    )
    return rounds, stats, events


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
        rounds, stats, events = measure(args, Path(tmp))
        lines = notes(rounds, stats)
        templates = [e for e in events if e["type"] == "completion"]
        logger = {}
        for redact_on in (True, False):
            rate, us, cpu_us = logger_rate(templates, args.logger_events, redact_on, Path(tmp) / f"log-{redact_on}")
            logger[f"redaction_{'on' if redact_on else 'off'}"] = {"events_s": rate, "us_wall": us, "us_cpu": cpu_us}
            lines.append(
                f"logger alone, redaction {'on ' if redact_on else 'off'}: {rate:,.0f} events/s "
                f"({args.logger_events} events appended until written and fsync'd; writer "
                f"{us:.0f} µs/event wall, {cpu_us:.0f} µs/event CPU)"
            )
    benchkit.emit(args, "bench_gateway", tables(args, rounds), lines, {"log_stats": stats, "logger_alone": logger})


def _with_events(log, run, cpu: dict[str, float]) -> tuple[list[float], float, int, int]:
    """`run()`'s result plus the events written while it ran (flushed at the end); adds the
    process's CPU seconds meanwhile to cpu["process"]."""
    before, c0 = log.stats.written, time.process_time()
    lat, wall, tokens = run()
    log.flush()
    cpu["process"] += time.process_time() - c0
    return lat, wall, tokens, log.stats.written - before


if __name__ == "__main__":
    main()
