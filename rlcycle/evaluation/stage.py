"""eval: a candidate checkpoint vs the production baseline on a task suite, in sandboxes.

In:  a candidate (checkpoint dir, registry alias, URL or `scripted:*`), a baseline (the same;
     default the registry's `production`), a task suite directory.
Out: `eval_results.arrow` (one row per task × policy × attempt, the `eval_results` contract),
     `verdict.json` beside it (metrics, paired comparison with CIs, every gate), and an
     `EvalResult` whose `decision` is accept / refuse / no_verdict. The CLI exits 3 on refuse.

    rlcycle eval --candidate runs/c1/checkpoint --baseline production \\
                 --tasks sample_data/tasks -o runs/c1/eval/eval_results.arrow

Both policies run every task `attempts` times through the shared harness (rlcycle.agent)
over one sandbox pool; generation is batched across the live episodes of a policy. Hidden
tests are graded after the agent finishes. An episode whose sandbox broke is retried on a
fresh sandbox and, if it still breaks, recorded as `error`: excluded from every metric, never
a `fail` (docs/design.md: never score an infrastructure failure as a model failure).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlcycle import io as rio
from rlcycle.agent.runner import RunnerConfig
from rlcycle.config import cfg, check_range, ensure_valid
from rlcycle.errors import InputError
from rlcycle.evaluation.verdict import GateConfig, decide
from rlcycle.policy.open import PolicyConfig, open_policy
from rlcycle.rollout import RolloutConfig, open_executor
from rlcycle.schema import EVAL_RESULTS, conform
from rlcycle.stage import Outcome, RunLayout, StageContext, checkpoint_key, content_key


@dataclass
class EvalConfig:
    """Options of `rlcycle eval`: the gates (`gates`), how the two policies are opened (`policy`),
    how episodes run (`runner`, the same table as simulate's), where they run (`rollout`: local or
    ray, docs/scale.md), plus these."""

    attempts: int = cfg(2, help="Attempts per task and policy (k for pass@k is at most this).")
    seed: int = cfg(0, help="Seed of sampling (each episode's seed derives from it).")
    sandboxes: int = cfg(
        4,
        help="Sandboxes in the pool; one episode runs on each at a time (eval's runner.concurrency); "
        "with executor=ray: per worker.",
    )
    max_tasks: int | None = cfg(
        None, help="Evaluate at most this many tasks, taken round-robin over clusters (none = all)."
    )
    gates: GateConfig = cfg(GateConfig(), help="The gates a candidate must pass, and the statistics behind them.")
    # Prefix cache on here, off in simulate: reused keys/values equal a fresh prefill up to float
    # rounding, so logprobs move by ~1e-6 but the sampled ids, and so every eval row, stay the
    # same (tests/test_rollout.py checks both, greedy and seeded); simulate's events carry logprobs.
    # `server` set: both checkpoints run on it, as production does (the candidate's adapter is
    # loaded for the run and unloaded after: vLLM's runtime LoRA API), with the baseline's tokenizer.
    policy: PolicyConfig = cfg(
        PolicyConfig(prefix_cache_tokens=16384),
        help="How both policies are opened: tokenizer, server, prefix cache, dtype.",
    )
    runner: RunnerConfig = cfg(
        RunnerConfig(),
        help="How episodes run, for both policies (the episode runner's keys; concurrency is `sandboxes`).",
    )
    rollout: RolloutConfig = cfg(RolloutConfig(), help="Where episodes run: local or ray (docs/scale.md).")

    def validate(self) -> list[str]:
        """This level's problems (`config.validate_all` adds the nested tables')."""
        problems: list[str] = []
        check_range(problems, self, ("attempts", "sandboxes"), ge=1)
        if self.gates.k > self.attempts:
            problems.append(f"gates.k={self.gates.k}: pass@k needs k <= attempts ({self.attempts})")
        if self.runner.concurrency != RunnerConfig().concurrency and self.runner.concurrency != self.sandboxes:
            problems.append(
                f"runner.concurrency={self.runner.concurrency}: eval runs one episode per sandbox; set sandboxes"
            )
        return problems

    def episode_runner(self) -> RunnerConfig:
        """The runner config episodes run with: `runner`, one session per sandbox."""
        return dataclasses.replace(self.runner, concurrency=self.sandboxes)


@dataclass
class EvalResult:
    results_path: str
    verdict_path: str
    verdict: dict[str, Any]
    seconds: float

    @property
    def decision(self) -> str:
        return self.verdict["decision"]


def _rows(episodes) -> pa.Table:
    fields = [f.name for f in EVAL_RESULTS.schema]
    rows = [{name: getattr(e, name) for name in fields} for e in episodes]
    return conform(pa.Table.from_pylist(rows, schema=EVAL_RESULTS.schema), EVAL_RESULTS)


def run(
    config: EvalConfig,
    candidate: str,
    baseline: str,
    tasks_dir: str | Path,
    out: str | Path,
    registry: str | Path | None = None,
) -> EvalResult:
    """Evaluate `candidate` against `baseline` on the suite `tasks_dir`: `out` (the episodes) and
    `verdict.json` beside it. `registry`: the registry directory aliases resolve in."""
    ensure_valid(config)
    started = time.monotonic()
    out = Path(out)
    if out.suffix not in (".arrow", ".parquet"):
        raise InputError(
            f"-o {out}: expected an .arrow or .parquet path for the eval results",
            hint="e.g. -o runs/c1/eval/eval_results.arrow",
        )
    tasks = pick_tasks(_load_suite(tasks_dir), config.max_tasks)
    if not tasks:
        raise InputError(f"{tasks_dir}: no tasks", hint="`rlcycle tasks ls DIR` lists a suite")
    runner = config.episode_runner()
    with _candidate_loaded(config, candidate, registry):
        return _evaluate(config, runner, tasks, candidate, baseline, tasks_dir, out, registry, started)


@contextmanager
def _candidate_loaded(config: EvalConfig, candidate: str, registry: str | Path | None) -> Iterator[None]:
    """`policy.server` set: the candidate's LoRA adapter loaded on the server for the run (and
    unloaded after, if loaded here; rlcycle/policy/served.py), so both checkpoints are then
    opened on it by their served identity. Why served and not in-process: the gate then compares
    the two on the engine production runs, with its numerics and its latency (docs/vllm.md)."""
    if config.policy.server is None:
        yield
        return
    from rlcycle.policy.http import HTTPPolicy
    from rlcycle.policy.open import open_checkpoint
    from rlcycle.policy.served import AdapterLoaded

    cand = open_checkpoint(candidate, registry, what="candidate")
    assert cand.path is not None
    with AdapterLoaded(HTTPPolicy(config.policy.server), cand.path):
        yield


def _evaluate(
    config: EvalConfig,
    runner: RunnerConfig,
    tasks: list,
    candidate: str,
    baseline: str,
    tasks_dir: str | Path,
    out: Path,
    registry: str | Path | None,
    started: float,
) -> EvalResult:
    """Both policies over the tasks (warm-up, ABBA order), the verdict, the files."""
    where = config.rollout.executor
    cand = open_policy(candidate, config.policy, registry, where=where)
    try:
        base = open_policy(baseline, config.policy, registry, where=where)
    except BaseException:
        cand.close()
        raise
    cand_name, base_name = f"candidate:{cand.name}", f"baseline:{base.name}"
    episodes = []
    try:
        with open_executor(config.rollout, config.sandboxes) as ex:
            # The first episodes of a process pay one-off costs (allocator growth, kernel caches
            # at new prompt sizes, cold sandboxes): one discarded warm-up round per policy (per
            # worker on Ray), on the real path, so the latency gate compares the models rather
            # than the run order.
            for p in (cand, base):
                if not p.name.startswith("scripted:"):
                    ex.warm_up(p.spec, tasks, runner, seed=config.seed)
            # ABBA order (candidate, baseline on one half of the tasks; baseline, candidate on
            # the other): a machine that gets slower or faster during the run biases neither.
            halves = (tasks[0::2], tasks[1::2])
            plan = [
                (cand, cand_name, halves[0]),
                (base, base_name, halves[0]),
                (base, base_name, halves[1]),
                (cand, cand_name, halves[1]),
            ]
            for p, name, part in plan:
                if part:
                    episodes += ex.run(p.spec, name, part, runner, attempts=config.attempts, seed=config.seed)
    finally:
        cand.close()
        base.close()
    table = _rows(episodes)
    verdict = decide_from_table(table, cand_name, base_name, config.gates)
    verdict.update(
        {
            "candidate_ref": candidate,
            "candidate_id": cand.checkpoint_id,
            "baseline_ref": baseline,
            "baseline_id": base.checkpoint_id,
            "tasks_dir": str(tasks_dir),
            "config": dataclasses.asdict(config),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    verdict_path = out.parent / "verdict.json"
    rio.write_table(table, out)
    rio.atomic_write_text(verdict_path, json.dumps(verdict, indent=2, default=str) + "\n")
    return EvalResult(str(out), str(verdict_path), verdict, time.monotonic() - started)


def _load_suite(tasks_dir: str | Path) -> list:
    from rlcycle.tasks.suite import load_suite

    return load_suite(tasks_dir)


def pick_tasks(tasks: list, limit: int | None) -> list:
    """At most `limit` tasks, round-robin over clusters so each repo stays represented."""
    if limit is None or limit >= len(tasks):
        return tasks
    by_cluster: dict[str, list] = {}
    for t in sorted(tasks, key=lambda t: t.id):
        by_cluster.setdefault(t.cluster, []).append(t)
    picked, i = [], 0
    while len(picked) < limit:
        for group in by_cluster.values():
            if i < len(group) and len(picked) < limit:
                picked.append(group[i])
        i += 1
    return picked


def decide_from_table(table: pa.Table, candidate: str, baseline: str, gates: GateConfig) -> dict[str, Any]:
    import polars as pl

    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return decide(df, candidate, baseline, gates)


def verdict_table(v: dict[str, Any]) -> Any:
    """verdict.json as the table `rlcycle eval` prints on stderr (a rich Table)."""
    from rich.table import Table

    t = Table(title=f"eval: {v['candidate']} vs {v['baseline']} -> {v['decision'].upper()}")
    t.add_column("metric")
    t.add_column("candidate", justify="right")
    t.add_column("baseline", justify="right")
    cand, base = v["metrics"]["candidate"], v["metrics"]["baseline"]
    for key in cand:
        if key in base:
            t.add_row(key, _fmt(cand[key]), _fmt(base[key]))
    if "paired" in v:
        ci = v["paired"]["pass_rate_diff"]
        t.add_row("pass rate diff (95% CI)", f"{ci['estimate']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]", "")
    for g in v["gates"]:
        t.add_row(
            f"gate {g['name']}", f"{_fmt(g['value'])} vs {_fmt(g['threshold'])}", "pass" if g["passed"] else "FAIL"
        )
    return t


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


# --- the stage object (rlcycle/stage.py): what `rlcycle eval` and the cycle both run -----------


@dataclass(frozen=True)
class EvalArgs:
    """What one eval compares and writes: `run`'s arguments past the config."""

    candidate: str  # checkpoint dir, registry alias, URL (URL#MODEL) or scripted:...
    baseline: str  # the same forms
    tasks: str | Path  # the task suite directory
    out: str | Path  # eval_results.arrow (verdict.json goes beside it)
    registry: str | Path | None = None  # the registry directory aliases resolve in


class EvalStage:
    """eval as a stage: a candidate against a baseline on a suite (in a cycle: train's checkpoint
    against the pinned base). A gate: its `decision` decides whether the cycle goes on."""

    name = "eval"
    config_class = EvalConfig
    cacheable, gate, publishes = True, True, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {
            "candidate": checkpoint_key(ctx.layout.file("checkpoint")),
            "baseline": ctx.base_id,
            "tasks": content_key([ctx.tasks]),
        }

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"results": layout.file("eval_results"), "verdict": layout.file("verdict")}

    def args(self, ctx: StageContext) -> EvalArgs:
        ckpt, out = ctx.layout.file("checkpoint"), ctx.layout.file("eval_results")
        return EvalArgs(str(ckpt), str(ctx.base_path), ctx.tasks, out, registry=ctx.registry)

    def run(self, config: EvalConfig, args: EvalArgs) -> EvalResult:
        return run(config, args.candidate, args.baseline, args.tasks, args.out, registry=args.registry)

    def record(self, result: EvalResult) -> Outcome:
        r = result
        failed = [g["name"] for g in r.verdict.get("gates", []) if not g["passed"]]
        record = {
            "decision": r.decision,
            "failed_gates": failed,
            "verdict": r.verdict_path,
            "status": "refused" if r.decision == "refuse" else "ran",
        }
        return Outcome(record, f"eval: {r.decision}" + (f" (failed: {', '.join(failed)})" if failed else ""))


STAGE = EvalStage()
