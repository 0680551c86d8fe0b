"""Eval statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from rlcycle import stats


def test_pass_at_k_matches_the_definition():
    # n=5 attempts, c=2 passed, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert stats.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert stats.pass_at_k(5, 0, 1) == 0.0
    assert stats.pass_at_k(5, 5, 3) == 1.0
    assert stats.pass_at_k(4, 3, 2) == 1.0  # only one failure: any 2 draws include a pass
    assert stats.pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    with pytest.raises(ValueError):
        stats.pass_at_k(1, 1, 2)


def test_pass_hat_k():
    # c=3 of n=4, k=2: C(3,2)/C(4,2) = 3/6
    assert stats.pass_hat_k(4, 3, 2) == pytest.approx(0.5)
    assert stats.pass_hat_k(4, 1, 2) == 0.0


def test_mcnemar_exact_small_table():
    # b=6, c=1: p = 2 * P(X<=1 | n=7) = 2 * (1 + 7)/128 = 0.125
    pairs = [(True, False)] * 6 + [(False, True)] + [(True, True)] * 10
    m = stats.mcnemar_exact(pairs)
    assert (m.candidate_only, m.baseline_only) == (6, 1)
    assert m.p_value == pytest.approx(0.125)
    assert stats.mcnemar_exact([(True, True)]).p_value == 1.0


def test_cluster_bootstrap_is_seeded_and_resamples_clusters():
    diffs = {f"a{i}": 1.0 for i in range(5)} | {f"b{i}": -1.0 for i in range(5)}
    clusters = {t: t[0] for t in diffs}
    ci = stats.paired_cluster_bootstrap(diffs, clusters, n_boot=500, seed=3)
    assert ci.estimate == 0.0
    # only two clusters: every draw is (a,a), (a,b), (b,a) or (b,b): means in {-1, 0, 1}
    assert ci.low == -1.0 and ci.high == 1.0
    assert ci == stats.paired_cluster_bootstrap(diffs, clusters, n_boot=500, seed=3)
    # treating each task as its own cluster gives a narrower interval: clustering matters
    own = stats.paired_cluster_bootstrap(diffs, {t: t for t in diffs}, n_boot=500, seed=3)
    assert own.high - own.low < ci.high - ci.low


def test_bootstrap_detects_a_consistent_improvement():
    diffs = {f"t{i}": 0.5 + (i % 3) * 0.1 for i in range(30)}
    ci = stats.paired_cluster_bootstrap(diffs, {t: f"c{i % 6}" for i, t in enumerate(diffs)}, seed=0)
    assert ci.low > 0


def test_mean_interval():
    ci = stats.mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 1.959964 * math.sqrt((5 / 3) / 4)
    assert ci.estimate == 2.5 and ci.low == pytest.approx(2.5 - half, abs=1e-4)


def _results(cand_pass, base_pass, clarify=0.0, n_tasks=20, attempts=2):
    """A synthetic eval_results table: per-task pass probabilities as deterministic patterns."""
    import polars as pl

    rows = []
    for t in range(n_tasks):
        for policy, p, clar in (("cand", cand_pass, clarify), ("base", base_pass, 0.0)):
            for a in range(attempts):
                passed = ((t * attempts + a) % 10) < p * 10
                rows.append(
                    {
                        "task_id": f"t{t}",
                        "cluster": f"c{t % 5}",
                        "policy": policy,
                        "attempt": a,
                        "status": "pass" if passed else "fail",
                        "reward": float(passed),
                        "turns": 3,
                        "n_tool_calls": 4,
                        "n_invalid_tool_calls": 0,
                        "edited": True,
                        "asked_clarification": ((t + a) % 10) < clar * 10,
                        "tokens": 100,
                        "latency_ms": 50.0,
                    }
                )
    return pl.DataFrame(rows)


def test_verdict_accepts_better_refuses_worse_and_clarify_everywhere():
    from rlcycle.evaluation.verdict import GateConfig, decide

    g = GateConfig()
    assert decide(_results(0.8, 0.4), "cand", "base", g)["decision"] == "accept"
    worse = decide(_results(0.2, 0.8), "cand", "base", g)
    assert worse["decision"] == "refuse"
    assert [x["name"] for x in worse["gates"] if not x["passed"]] == ["pass_rate"]
    clar = decide(_results(0.5, 0.5, clarify=0.8), "cand", "base", g)
    assert clar["decision"] == "refuse"
    assert [x["name"] for x in clar["gates"] if not x["passed"]] == ["clarification_rate"]


def test_errors_are_left_out_and_too_few_tasks_give_no_verdict():
    import polars as pl

    from rlcycle.evaluation.verdict import GateConfig, decide

    df = _results(0.5, 0.5, n_tasks=6)
    df = df.with_columns(
        pl.when(pl.col("task_id").is_in(["t0", "t1", "t2"])).then(pl.lit("error")).otherwise("status").alias("status")
    )
    v = decide(df, "cand", "base", GateConfig())
    assert v["decision"] == "no_verdict" and v["errors"] == 3 * 2 * 2
    assert v["metrics"]["candidate"]["tasks"] == 3
    # Six tasks, three of them lost to sandbox errors: the cause is the sandboxes, not the suite.
    assert "sandbox error" in v["reason"] and "sandbox health" in v["hint"]


def test_a_suite_smaller_than_min_paired_tasks_names_the_suite_not_the_sandboxes():
    from rlcycle.evaluation.verdict import GateConfig, decide

    v = decide(_results(0.5, 0.5, n_tasks=3), "cand", "base", GateConfig(min_paired_tasks=5))
    assert v["decision"] == "no_verdict" and v["errors"] == 0
    assert v["reason"] == "3 paired task(s) < min_paired_tasks=5: the suite has 3 task(s)"
    assert "min_paired_tasks" in v["hint"] and "bigger suite" in v["hint"] and "sandbox" not in v["hint"]
    # Exactly enough tasks: a verdict.
    assert decide(_results(0.5, 0.5, n_tasks=3), "cand", "base", GateConfig(min_paired_tasks=3))["decision"] in (
        "accept",
        "refuse",
    )
