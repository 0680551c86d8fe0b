"""simulate: a policy works on a task suite in sandboxes while a simulated user reacts; out come
production events, the same schema as real logs, ready for `rlcycle collect`.

In:  a policy (a checkpoint directory, a registry alias, an http(s) URL of an OpenAI-compatible
     server, `scripted:reference` or `scripted:nothing`, or a Policy object), a task suite
     directory (or loaded `Task`s), a number of episodes.
Out: an events log (JSON lines, written atomically; `-` streams to stdout) and a
     `SimulateResult` with the rates a deploy decision watches: pass rate, invalid tool call
     rate, clarification rate, edit rate, mean latency.

    rlcycle simulate --policy runs/demo/policy --tasks sample_data/tasks --episodes 40 \\
        -o runs/demo/events/sim.jsonl
    rlcycle collect runs/demo/events/sim.jsonl -o runs/demo/trajectories.arrow

Episode i runs task i mod T (T tasks), attempt i div T, through the episode runner
(`rlcycle.agent.runner`: the production harness, batched generation, sandboxes, hidden-test
grading) with the simulated user of `rlcycle.agent.user`: clarifying questions are answered
(or annoy the user when the task was clear), a follow-up message says whether the user is
satisfied, thumbs ratings come now and then, and each edit's `edit_outcome` arrives hours after
the session: all its lines survive when the hidden tests pass, none or a few otherwise.

Determinism: the same config, policy and suite give the same ids, token ids (for a policy that
is itself deterministic given its seed, like the in-process backend on one device), tool
results and user reactions. Latencies are measured, and the simulated clock (`start`) advances
by them, so `latency_ms`, `duration_ms` and `ts` differ from run to run (docs/simulate.md).
Sessions whose sandbox broke beyond `retries` are counted as errors and write no events.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rlcycle import io as rio
from rlcycle.agent.runner import (
    EpisodeResult,
    RunnerConfig,
    run_id_for,
    summarize,
)
from rlcycle.agent.user import UserConfig
from rlcycle.config import cfg, check_range, ensure_valid
from rlcycle.console import Progress
from rlcycle.errors import InputError
from rlcycle.faults import crash_point
from rlcycle.policy.open import PolicyConfig, open_policy
from rlcycle.rollout import RolloutConfig, open_executor
from rlcycle.stage import Outcome, RunLayout, StageContext, content_key


@dataclass
class SimulateConfig:
    """Options of `rlcycle simulate`: how episodes run (`runner`: sampling, limits, retries, the
    simulated clock), the simulated user (`user`), where they run (`rollout`: local or ray,
    docs/scale.md), plus these."""

    episodes: int | None = cfg(None, help="Sessions to run, cycling over the tasks (default: one per task).")
    seed: int = cfg(0, help="Seed of sampling and of the simulated user.")
    sandboxes: int = cfg(
        4, help="Sandboxes in the pool (sessions run concurrently over them); with executor=ray: in each worker's pool."
    )
    policy: PolicyConfig = cfg(
        PolicyConfig(), help="How the policy reference is opened: tokenizer, server, prefix cache, dtype."
    )
    runner: RunnerConfig = cfg(RunnerConfig(), help="How episodes run (the episode runner's keys).")
    user: UserConfig = cfg(UserConfig(), help="How the simulated user behaves.")
    rollout: RolloutConfig = cfg(RolloutConfig(), help="Where episodes run: local or ray (docs/scale.md).")

    def validate(self) -> list[str]:
        """This level's problems (`config.validate_all` adds the nested tables')."""
        problems: list[str] = []
        check_range(problems, self, "episodes", ge=1, optional=True)
        check_range(problems, self, "sandboxes", ge=1)
        return problems


@dataclass
class SimulateResult:
    """What a simulate run did: counts, rates, where the events went, how fast."""

    output: str
    policy: str
    run_id: str
    episodes: int
    passed: int
    failed: int
    errors: int
    pass_rate: float
    invalid_call_rate: float
    clarification_rate: float
    edit_rate: float
    samples: int
    tool_calls: int
    tokens: int
    mean_latency_ms: float
    events: int
    seconds: float
    end_reasons: dict[str, int]

    @property
    def episodes_per_min(self) -> float:
        return 60.0 * self.episodes / self.seconds if self.seconds > 0 else math.nan

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN rates, e.g. no tool calls at all, become null)."""
        d = dataclasses.asdict(self)
        d["episodes_per_min"] = self.episodes_per_min
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def run(
    config: SimulateConfig,
    policy: Any,
    tasks: Any,
    out: str | Path,
    quiet: bool = False,
    registry: str | Path | None = None,
) -> SimulateResult:
    """Simulate `config.episodes` sessions of `policy` on `tasks`, writing events to `out`.

    `policy`: a Policy object or a reference string (see the module docstring); `tasks`: a
    suite directory or a list of Tasks; `out`: a .jsonl path or `-` (stdout); `registry`: the
    registry directory a policy alias resolves in."""
    ensure_valid(config)
    started = time.monotonic()
    task_list = _load_tasks(tasks)
    opened = open_policy(policy, config.policy, registry, where=config.rollout.executor)
    spec, name, key = opened.spec, opened.name, opened.run_key
    progress = Progress("simulate", quiet=quiet)
    runner = dataclasses.replace(config.runner)  # a copy: the run id set below is this run's only
    n = config.episodes or len(task_list)
    if key is not None and not runner.run_id:  # a server or a dtype: ids derive from what runs, not the ref
        runner.run_id = run_id_for(key, config.seed, runner, task_list, True, config.user)
    try:
        with _event_sink(out) as sink, open_executor(config.rollout, min(config.sandboxes, n)) as ex:
            writer = _OrderedWriter(sink)

            def done(r: EpisodeResult) -> None:
                writer.add(r)
                progress.update(episodes=f"{writer.done}/{n}", passed=writer.passed, events=writer.events)

            results = ex.run(
                spec,
                name,
                task_list,
                runner,
                seed=config.seed,
                simulate_user=True,
                n_episodes=n,
                user_config=config.user,
                on_result=done,
            )
    finally:
        if spec.policy is not None and spec.policy is not policy:  # we opened it: free it
            opened.close()
    stats = summarize(results)
    return SimulateResult(
        output=str(out),
        policy=name,
        run_id=runner.run_id or run_id_for(name, config.seed, runner, task_list, True, config.user),
        events=writer.events,
        seconds=time.monotonic() - started,
        **{k: stats[k] for k in _STAT_KEYS},
    )


_STAT_KEYS = (
    "episodes",
    "passed",
    "failed",
    "errors",
    "pass_rate",
    "invalid_call_rate",
    "clarification_rate",
    "edit_rate",
    "samples",
    "tool_calls",
    "tokens",
    "mean_latency_ms",
    "end_reasons",
)


class _OrderedWriter:
    """Writes each session's events in job order as sessions finish (out of order), keeping
    only the sessions that wait for an earlier one in memory; drops events once written."""

    def __init__(self, sink: IO[str]):
        self.sink = sink
        self.pending: dict[int, EpisodeResult] = {}
        self.next = 0
        self.done = self.passed = self.events = 0

    def add(self, r: EpisodeResult) -> None:
        self.done += 1
        self.passed += r.status == "pass"
        self.pending[r.index] = r
        while self.next in self.pending:
            ready = self.pending.pop(self.next)
            for ev in ready.events:
                self.sink.write(json.dumps(ev, ensure_ascii=False, separators=(",", ":")) + "\n")
            self.events += len(ready.events)
            ready.events = []  # written: free the token lists
            self.next += 1
            crash_point("simulate:session-written")  # fault injection: a kill -9 mid-log


@contextmanager
def _event_sink(out: str | Path) -> Iterator[IO[str]]:
    """A text stream for the events: stdout for `-`, else a temp file renamed at the end."""
    if str(out) == rio.STDIO:
        yield sys.stdout
        sys.stdout.flush()
        return
    path = Path(out)
    if path.is_dir():
        raise InputError(f"-o {out} is a directory", hint="give a file path, e.g. -o runs/sim/events.jsonl")
    with rio.atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a log like any other file, not mkstemp's 0600


def _load_tasks(tasks: Any) -> list:
    from rlcycle.tasks.suite import load_suite

    task_list = load_suite(tasks) if isinstance(tasks, (str, Path)) else list(tasks)
    if not task_list:
        raise InputError(f"no tasks in {tasks}", hint="`rlcycle tasks ls DIR` lists a suite")
    return task_list


def format_summary(r: SimulateResult) -> str:
    """The human-readable lines `rlcycle simulate` prints on stderr after a run."""
    ends = ", ".join(f"{k} {v}" for k, v in r.end_reasons.items())
    latency = "n/a" if math.isnan(r.mean_latency_ms) else f"{r.mean_latency_ms:,.1f} ms"
    return "\n".join(
        [
            f"simulate: {r.episodes:,} episodes of {r.policy} in {r.seconds:.1f}s "
            f"({r.episodes_per_min:,.1f}/min) -> {r.output}",
            f"  pass rate          {_pct(r.pass_rate)}  ({r.passed} pass, {r.failed} fail, {r.errors} error)",
            f"  invalid call rate  {_pct(r.invalid_call_rate)}  of {r.tool_calls:,} tool calls",
            f"  clarification rate {_pct(r.clarification_rate)}",
            f"  edit rate          {_pct(r.edit_rate)}",
            f"  mean latency       {latency} per model call ({r.samples:,} calls, {r.tokens:,} tokens)",
            f"  ended by           {ends}",
            f"  events             {r.events:,} (run id {r.run_id})",
        ]
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


# --- the stage object (rlcycle/stage.py): what `rlcycle simulate` and the cycle both run -------


@dataclass(frozen=True)
class SimulateArgs:
    """What one simulate reads and writes: `run`'s arguments past the config."""

    policy: Any  # a Policy, or a reference: checkpoint dir, registry alias, URL, scripted:...
    tasks: Any  # a suite directory or a list of Tasks
    out: str | Path  # events .jsonl, or `-`
    registry: str | Path | None = None  # the registry directory a policy alias resolves in
    quiet: bool = False


class SimulateStage:
    """simulate as a stage: a policy (in a cycle, the pinned base) on a task suite -> events."""

    name = "simulate"
    config_class = SimulateConfig
    cacheable, gate, publishes = True, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {"policy": ctx.base_id, "tasks": content_key([ctx.tasks])}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"events": layout.file("events")}

    def args(self, ctx: StageContext) -> SimulateArgs:
        out = ctx.layout.file("events")
        return SimulateArgs(str(ctx.base_path), ctx.tasks, out, registry=ctx.registry, quiet=ctx.quiet)

    def run(self, config: SimulateConfig, args: SimulateArgs) -> SimulateResult:
        return run(config, args.policy, args.tasks, args.out, quiet=args.quiet, registry=args.registry)

    def record(self, result: SimulateResult) -> Outcome:
        return Outcome({"episodes": result.episodes, "output": result.output}, format_summary(result))


STAGE = SimulateStage()
