"""From eval results to a verdict: metrics per policy, the paired comparison, the gates.

In: an `eval_results` table (one row per task × policy × attempt; see rlcycle/schema.py) and a
`GateConfig`. Out: a `verdict` dict (what `verdict.json` holds) whose `decision` is `accept`,
`refuse` or `no_verdict` (too few tasks ran cleanly to judge).

Rows with status `error` are infrastructure failures: they are counted and left out of every
metric (never scored as the model's failure). A task enters the paired comparison only when
both policies have at least one non-error attempt on it.

The gates (each reported with metric, value, threshold and result):
- `pass_rate`: no significant regression. The upper end of the cluster-bootstrap CI of the
  paired pass-rate difference must be >= −max_pass_rate_drop, and McNemar must not show a
  significant loss. Equal or better candidates pass.
- `invalid_tool_call_rate`, `clarification_rate`: behaviour drift upwards is capped (the two
  reward hacks of docs/design.md: broken calls on hard tasks, clarifying instead of editing).
- `edit_rate`: drift downwards is capped (an agent that stops editing hides its failures).
- `latency`: candidate latency per model call within a ratio of the baseline's (differences
  below `latency_noise_ms` pass: timer noise), and under an absolute budget when one is set.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import polars as pl

from rlcycle import stats
from rlcycle.config import cfg, check_range


@dataclass
class GateConfig:
    level: float = cfg(0.95, help="Confidence level of intervals and the McNemar test (1 - alpha).")
    bootstrap_samples: int = cfg(2000, help="Cluster-bootstrap resamples.")
    seed: int = cfg(0, help="Seed of the bootstrap.")
    max_pass_rate_drop: float = cfg(0.0, help="Refuse when the pass rate is significantly lower by more than this.")
    max_invalid_rate_increase: float = cfg(0.02, help="Largest allowed rise of the invalid tool call rate.")
    max_clarification_rate_increase: float = cfg(0.10, help="Largest allowed rise of the clarification rate.")
    max_edit_rate_decrease: float = cfg(0.10, help="Largest allowed fall of the edit rate.")
    max_latency_ratio: float = cfg(1.10, help="Candidate mean latency / baseline mean latency, at most.")
    latency_budget_ms: float | None = cfg(
        None, help="Absolute cap on the candidate's mean latency per model call (ms)."
    )
    latency_noise_ms: float = cfg(
        20.0, help="Latency differences per model call below this pass the ratio gate (timer noise)."
    )
    min_paired_tasks: int = cfg(5, help="Fewer cleanly paired tasks than this gives no verdict.")
    k: int = cfg(1, help="k for pass@k and pass^k (at most the attempts per task).")

    def validate(self) -> list[str]:
        problems = []
        check_range(problems, self, "level", ge=0.5, lt=1)
        check_range(
            problems,
            self,
            (
                "max_pass_rate_drop",
                "max_invalid_rate_increase",
                "max_clarification_rate_increase",
                "max_edit_rate_decrease",
            ),
            ge=0,
        )
        check_range(problems, self, "max_latency_ratio", gt=0)
        check_range(problems, self, "k", ge=1)
        return problems


def policy_metrics(rows: pl.DataFrame, k: int) -> dict[str, Any]:
    """Metrics of one policy over its non-error rows."""
    ok = rows.filter(pl.col("status") != "error")
    if ok.height == 0:
        return {"tasks": 0, "attempts": 0, "errors": rows.height}
    per_task = ok.group_by("task_id").agg(pl.len().alias("n"), (pl.col("status") == "pass").sum().alias("c"))
    ks = [(n, c) for n, c in per_task.select("n", "c").iter_rows()]
    kk = min(k, min(n for n, _ in ks))
    calls = ok["n_tool_calls"].sum()
    return {
        "tasks": per_task.height,
        "attempts": ok.height,
        "errors": rows.height - ok.height,
        "pass@1": sum(c / n for n, c in ks) / len(ks),
        f"pass@{kk}": sum(stats.pass_at_k(n, c, kk) for n, c in ks) / len(ks),
        f"pass^{kk}": sum(stats.pass_hat_k(n, c, kk) for n, c in ks) / len(ks),
        "mean_reward": float(ok["reward"].mean()),
        "invalid_tool_call_rate": float(ok["n_invalid_tool_calls"].sum() / calls) if calls else 0.0,
        "clarification_rate": float(ok["asked_clarification"].cast(pl.Float64).mean()),
        "edit_rate": float(ok["edited"].cast(pl.Float64).mean()),
        "mean_turns": float(ok["turns"].mean()),
        "mean_tokens": float(ok["tokens"].mean()),
        "mean_latency_ms": float(ok["latency_ms"].mean()),
        # Per model call: an agent that takes more turns to solve a task is not "slower" per se.
        # The median episode's latency per call: robust to the odd stall of a shared machine.
        "latency_per_call_ms": float((ok["latency_ms"] / ok["turns"].clip(lower_bound=1)).median()),
    }


def _paired(results: pl.DataFrame, candidate: str, baseline: str):
    ok = results.filter(pl.col("status") != "error")
    rates: dict[str, dict[str, float]] = defaultdict(dict)
    clusters: dict[str, str] = {}
    outcomes: dict[tuple[str, str, int], bool] = {}
    for task, cluster, policy, attempt, status in ok.select(
        "task_id", "cluster", "policy", "attempt", "status"
    ).iter_rows():
        outcomes[(policy, task, attempt)] = status == "pass"
        clusters[task] = cluster
    per = ok.group_by("task_id", "policy").agg((pl.col("status") == "pass").mean().alias("rate"))
    for task, policy, rate in per.iter_rows():
        rates[task][policy] = rate
    diffs = {t: r[candidate] - r[baseline] for t, r in rates.items() if candidate in r and baseline in r}
    pairs = [
        (outcomes[(candidate, t, a)], outcomes[(baseline, t, a)])
        for (p, t, a) in outcomes
        if p == candidate and t in diffs and (baseline, t, a) in outcomes
    ]
    return diffs, clusters, pairs


def _gate(name: str, metric: str, value: float, threshold: float, ok: bool, detail: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "passed": bool(ok),
        "detail": detail,
    }


def _no_verdict_cause(results: pl.DataFrame, paired: int, need: int) -> tuple[str, str]:
    """Why fewer than `need` tasks paired, and the fix: a suite too small to pair `need` tasks
    even with every episode clean is a config problem, not a sandbox one."""
    suite = results["task_id"].n_unique() if results.height else 0
    errors = int((results["status"] == "error").sum()) if results.height else 0
    if suite < need:
        return (
            f"{paired} paired task(s) < min_paired_tasks={need}: the suite has {suite} task(s)",
            "lower eval.gates.min_paired_tasks (rlcycle eval --set gates.min_paired_tasks=N; "
            "rlcycle cycle --set eval.gates.min_paired_tasks=N) or use a bigger suite (or a larger max_tasks)",
        )
    return (
        f"only {paired} task(s) ran cleanly under both policies (need min_paired_tasks={need}; "
        f"{errors} episode(s) of {suite} task(s) ended in a sandbox error)",
        "check sandbox health (`rlcycle sandbox ls`) and rerun, or raise attempts/retries",
    )


def decide(results: pl.DataFrame, candidate: str, baseline: str, gates: GateConfig) -> dict[str, Any]:
    """The verdict for `candidate` vs `baseline` over an eval_results table."""
    cand = policy_metrics(results.filter(pl.col("policy") == candidate), gates.k)
    base = policy_metrics(results.filter(pl.col("policy") == baseline), gates.k)
    diffs, clusters, pairs = _paired(results, candidate, baseline)
    verdict: dict[str, Any] = {
        "candidate": candidate,
        "baseline": baseline,
        "metrics": {"candidate": cand, "baseline": base},
        "paired_tasks": len(diffs),
        "errors": int((results["status"] == "error").sum()),
        "gates": [],
    }
    if len(diffs) < gates.min_paired_tasks:
        verdict["decision"] = "no_verdict"
        verdict["reason"], verdict["hint"] = _no_verdict_cause(results, len(diffs), gates.min_paired_tasks)
        return verdict
    ci = stats.paired_cluster_bootstrap(diffs, clusters, gates.bootstrap_samples, gates.level, gates.seed)
    mc = stats.mcnemar_exact(pairs)
    verdict["paired"] = {
        "pass_rate_diff": ci.as_dict(),
        "mcnemar": mc.__dict__,
        "clusters": len(set(clusters[t] for t in diffs)),
    }
    alpha = 1 - gates.level
    significant_loss = mc.p_value < alpha and mc.baseline_only > mc.candidate_only
    g = [
        _gate(
            "pass_rate",
            "upper CI of paired pass-rate difference",
            ci.high,
            -gates.max_pass_rate_drop,
            ci.high >= -gates.max_pass_rate_drop and not significant_loss,
            f"diff {ci.estimate:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}], McNemar p={mc.p_value:.3g}",
        ),
        _gate(
            "invalid_tool_call_rate",
            "candidate - baseline",
            cand["invalid_tool_call_rate"] - base["invalid_tool_call_rate"],
            gates.max_invalid_rate_increase,
            cand["invalid_tool_call_rate"] - base["invalid_tool_call_rate"] <= gates.max_invalid_rate_increase,
        ),
        _gate(
            "clarification_rate",
            "candidate - baseline",
            cand["clarification_rate"] - base["clarification_rate"],
            gates.max_clarification_rate_increase,
            cand["clarification_rate"] - base["clarification_rate"] <= gates.max_clarification_rate_increase,
        ),
        _gate(
            "edit_rate",
            "baseline - candidate",
            base["edit_rate"] - cand["edit_rate"],
            gates.max_edit_rate_decrease,
            base["edit_rate"] - cand["edit_rate"] <= gates.max_edit_rate_decrease,
        ),
    ]
    c_lat, b_lat = cand["latency_per_call_ms"], base["latency_per_call_ms"]
    ratio = c_lat / b_lat if b_lat > 0 else 1.0
    g.append(
        _gate(
            "latency",
            "candidate / baseline latency per model call",
            ratio,
            gates.max_latency_ratio,
            ratio <= gates.max_latency_ratio or c_lat - b_lat <= gates.latency_noise_ms,
            f"{c_lat:.1f} ms vs {b_lat:.1f} ms per call",
        )
    )
    if gates.latency_budget_ms is not None:
        g.append(
            _gate(
                "latency_budget",
                "candidate latency per model call (ms)",
                c_lat,
                gates.latency_budget_ms,
                c_lat <= gates.latency_budget_ms,
            )
        )
    verdict["gates"] = g
    verdict["decision"] = "accept" if all(x["passed"] for x in g) else "refuse"
    return verdict
