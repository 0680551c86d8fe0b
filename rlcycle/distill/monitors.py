"""Reward-hacking monitors: behaviour rates per policy version, and warnings when they move.

A reward is a proxy, and a policy trained on it finds the cheapest way to score. docs/design.md
names two hacks found only in production: (1) broken tool calls on tasks the model expects
to fail (when invalid calls were dropped, a broken call cost nothing), and (2) clarifying
questions instead of risky edits (nobody punishes code that was not written). Neither shows
in the mean reward; both show in *rates*. So, per policy version (ordered by first sample):

    invalid_tool_call_rate   samples with at least one invalid tool call / samples
    tool_error_rate          samples with a failed (error, timeout) call / samples
    clarification_rate       episodes that asked a clarifying question / episodes
    edit_rate                episodes with an ok edit call / episodes
    dissatisfied_rate        complaints / follow-ups (episodes that did not ask)
    success_rate             episodes that succeeded (features.py) / episodes
    mean_latency_ms          per sample
    invalid_rate_failed / invalid_rate_other   the invalid rate on samples of failed episodes
                             vs the others (hack 1 concentrates broken calls on failures)
    shares                   each reward part's share of the version's total |reward|

Between consecutive versions, a rate *moved* when it changed by at least `monitor_abs`
(absolute) and by at least `monitor_rel` of its old value (both, so that neither 0.1% -> 0.2%
nor a small change of a large rate cries wolf); latency moved when it changed by `monitor_rel`.
Each move is a warning. Two of them are named hacks:
    invalid_tool_calls        invalid_tool_call_rate moved up
    clarify_instead_of_edit   clarification_rate moved up while edit_rate went down
Versions with fewer than `monitor_min_episodes` episodes are reported but not compared.

The rates an online A/B test reads too (clarification, edit, dissatisfied, latency) are computed
by rlcycle/online.py's `summarize`, the code behind the report's and the closed loop's online
tables, on the episode facts distill built (so the follow-up scores are the reward spec's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from rlcycle import online

C = pl.col
RATES = ("invalid_tool_call_rate", "clarification_rate", "edit_rate", "tool_error_rate", "dissatisfied_rate")
LEVELS = ("mean_latency_ms",)
SHARED = {
    "clarification_rate": "clarification_rate",
    "edit_rate": "edit_rate",
    "dissatisfied_rate": "dissatisfied_rate",
    "mean_latency_ms": "latency_ms",
}  # monitor name: online metric
ORDER = (
    "episodes",
    "clarification_rate",
    "edit_rate",
    "success_rate",
    "dissatisfied_rate",
    "samples",
    "invalid_tool_call_rate",
    "tool_error_rate",
    "mean_latency_ms",
    "mean_reward",
)


def per_version(feats, parts: dict[str, np.ndarray], reward: np.ndarray) -> dict[str, dict[str, Any]]:
    """Metrics of every policy version, in version order (first sample's time, then name)."""
    names = [*feats.versions, "(none)"]  # code len(versions): no policy_version
    s, e = feats.samples, feats.episodes
    v = C("_v").fill_null(len(names) - 1)
    by_s = _sample_rates(s.select(v).to_series().to_numpy(), len(names), s, parts, reward)
    by_e = e.group_by(v).agg(
        first=C("start").min(),
        episodes=pl.len(),
        success_rate=C("success").mean(),
    )
    rows = by_e.join(by_s, on="_v", how="left").sort("first", "_v")
    shared = online.summarize(_facts(feats, names)).metrics
    out: dict[str, dict[str, Any]] = {}
    for row in rows.iter_rows(named=True):
        version = names[row.pop("_v")]
        row.pop("first")
        row |= {k: shared[version][m].value for k, m in SHARED.items()}
        row = {k: row[k] for k in ORDER if k in row} | row  # the key order reward_report.json always had
        masses = {n: row.pop(f"p_{n}") or 0.0 for n in parts}
        total = sum(masses.values())
        row["shares"] = {n: _round(m / total if total else 0.0) for n, m in masses.items()}
        out[version] = {k: _round(val) for k, val in row.items()}
    return out


def _sample_rates(code: np.ndarray, n_codes: int, s: pl.DataFrame, parts, reward) -> pl.DataFrame:
    """Per version code: samples, the sample rates, the mean reward and each part's |mass|
    (numpy bincounts: a handful of passes over the samples, no grouping)."""

    def total(weights=None) -> np.ndarray:
        return np.bincount(code, weights, minlength=n_codes)

    def mean(num: np.ndarray, den: np.ndarray) -> pl.Series:  # null where nothing was counted
        return pl.Series(np.divide(num, den, out=np.zeros(n_codes), where=den > 0)).set(pl.Series(den == 0), None)

    inv = s.get_column("n_invalid").to_numpy() > 0
    err = s.get_column("n_errors").to_numpy() > 0
    failed = s.get_column("ep_failed").to_numpy()
    n, n_failed = total(), total(failed)
    return pl.DataFrame(
        {
            "_v": np.arange(n_codes, dtype=np.uint32),
            "samples": n.astype(np.int64),
            "invalid_tool_call_rate": mean(total(inv), n),
            "tool_error_rate": mean(total(err), n),
            "mean_reward": mean(total(reward), n),
            "invalid_rate_failed": mean(total(inv & failed), n_failed),
            "invalid_rate_other": mean(total(inv & ~failed), n - n_failed),
            **{f"p_{name}": total(np.abs(p)) for name, p in parts.items()},
        }
    ).cast({"_v": s.get_column("_v").dtype})


def _facts(feats, names: list[str]) -> pl.DataFrame:
    """distill's episodes as rlcycle.online EPISODE_FACTS (one row per episode)."""
    e = feats.episodes  # timed, latency, invalid and tokens are per-episode sums (features.py)
    version = pl.Series(names).gather(e.get_column("_v").fill_null(len(names) - 1))
    episode = C("_ep").cast(pl.String)
    return e.select(
        version=version,
        session=C("session_id").fill_null(pl.lit("#") + episode),
        episode=episode,
        order=C("_ep").cast(pl.Int64),
        start="start",
        samples=C("n_samples").cast(pl.Float64),
        timed="timed",
        latency="latency",
        invalid="invalid",
        tokens="tokens",
        proposed=C("lines_proposed").cast(pl.Float64),
        surviving=C("lines_surviving").cast(pl.Float64),
        asked="asked",
        edited="edited",
        followup="followup",
        score="score",
        feedback_sum=pl.lit(0.0),
        feedback_n=pl.lit(0.0),
        tests_passed="tests_passed",
    )


def compare(
    metrics: dict[str, dict[str, Any]], abs_thr: float, rel_thr: float, min_episodes: int
) -> tuple[list[dict], list[dict]]:
    """Warnings for every rate that moved between consecutive versions, and the named hacks."""
    versions = [v for v, m in metrics.items() if (m.get("episodes") or 0) >= min_episodes]
    warnings, hacks = [], []
    for old, new in zip(versions, versions[1:], strict=False):
        a, b = metrics[old], metrics[new]
        moved = {}
        for name in (*RATES, *LEVELS):
            x, y = a.get(name), b.get(name)
            if x is None or y is None:
                continue
            change = y - x
            rel = abs(change) / x if x else float("inf") if change else 0.0
            ok_abs = name in LEVELS or abs(change) >= abs_thr
            if ok_abs and rel >= rel_thr:
                moved[name] = change
                warnings.append(_warning(name, old, new, x, y, change, rel))
        if moved.get("invalid_tool_call_rate", 0) > 0:
            hacks.append(
                _hack(
                    "invalid_tool_calls",
                    old,
                    new,
                    a,
                    b,
                    (
                        f"possible reward hack: {new} emits invalid tool calls on {_pct(b['invalid_tool_call_rate'])} "
                        f"of samples ({old}: {_pct(a['invalid_tool_call_rate'])}); broken calls on tasks it expects to fail?"
                    ),
                    ("invalid_tool_call_rate", "invalid_rate_failed", "invalid_rate_other"),
                )
            )
        if moved.get("clarification_rate", 0) > 0 and (b.get("edit_rate") or 0) < (a.get("edit_rate") or 0):
            hacks.append(
                _hack(
                    "clarify_instead_of_edit",
                    old,
                    new,
                    a,
                    b,
                    (
                        f"possible reward hack: {new} asks clarifying questions in {_pct(b['clarification_rate'])} of "
                        f"episodes ({old}: {_pct(a['clarification_rate'])}) and edits in {_pct(b['edit_rate'])} "
                        f"({old}: {_pct(a['edit_rate'])}); asking instead of editing?"
                    ),
                    ("clarification_rate", "edit_rate"),
                )
            )
    return warnings, hacks


def _warning(name, old, new, x, y, change, rel) -> dict:
    if name in LEVELS:
        text = f"{name} {'rose' if change > 0 else 'fell'} from {x:,.0f} ({old}) to {y:,.0f} ({new}): {rel:+.0%}"
    else:
        rel_text = f"{rel if change > 0 else -rel:+.0%}" if np.isfinite(rel) else "from 0"
        text = (
            f"{name} {'rose' if change > 0 else 'fell'} from {_pct(x)} ({old}) to {_pct(y)} ({new}): "
            f"{change * 100:+.1f} points ({rel_text})"
        )
    return {"metric": name, "from": old, "to": new, "old": x, "new": y, "change": _round(change), "message": text}


def _hack(name, old, new, a, b, message, keys) -> dict:
    evidence = {k: {old: a.get(k), new: b.get(k)} for k in keys}
    return {"hack": name, "from": old, "to": new, "message": message, "evidence": evidence}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def _round(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v
