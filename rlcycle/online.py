"""Online metrics per policy version, with 95% intervals, sessions as the clusters.

In:  a trajectories table (`pyarrow.Table` or polars frame; rlcycle/schema.py TRAJECTORIES, one
     row per model sample; only the columns below are read, and absent optional ones are fine),
     a follow-up classifier (a callable: texts -> scores in [-1, 1], null for null; e.g.
     `functools.partial(rlcycle.distill.followup.score_texts, hook=None)`), the clarify and
     edit tool names.
Out: `OnlineMetrics`: per version (ordered by first sample), each metric of METRICS as a
     `rlcycle.stats.Estimate`, the counts behind them, the newest complaints.
     `paired_differences` gives version b minus version a per metric on matched sessions (on
     independent traffic, rlcycle/report/ab.py takes `rlcycle.stats.difference` of two
     versions' estimates). The report, the closed-loop experiment (experiments/closed_loop/)
     and the distill monitors all compute their per-version rates here, so they agree.

Two steps, so that distill (which has the episode facts already) shares the second:
  `episode_facts(traj, ...)`  one row per (version, episode): the sums and flags of EPISODE_FACTS
  `summarize(facts)`          per version and session the sums, then the estimators of stats.py

Paired comparisons: when two versions served the same sessions (simulate writes a `pair_key`
per sample that names the session independently of the policy: rlcycle/agent/events.py),
`episode_facts(traj, ..., session_column=PAIR_COLUMN)` keys the facts by that pair key and
`paired_differences` joins two versions' facts on it.

The metrics (y / x, summed per session; sessions are the clusters, since one confused session
emits several broken calls and several complaints):
  tests_pass_rate       episodes whose last `tests_passed` is true / episodes with one (only
                        when the trajectories carry the optional `tests_passed` column)
  edit_persistence      lines surviving / lines proposed, over edits whose outcome arrived
  dissatisfied_rate     episodes whose follow-up the classifier scores < 0 / episodes with a
                        follow-up that did not ask a clarifying question (the follow-up is then
                        an answer, not a verdict); needs a classifier
  invalid_per_sample    invalid tool calls / model calls
  clarification_rate    episodes with a clarifying call (status ok, or no result logged) / episodes
  edit_rate             episodes with an ok edit call / episodes
  tokens_per_call       completion tokens / model calls
  latency_ms            latency / model calls that were timed
  feedback              explicit feedback / model calls that carry it
Ratios get the delta-method interval, shares of episodes the clustered Wilson interval
(rlcycle/stats.py says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from rlcycle import stats
from rlcycle.stats import Estimate

C = pl.col
NO_VERSION = "(none)"
CLARIFY_TOOLS = ("ask_user",)
EDIT_TOOLS = ("write_file", "apply_patch")
TESTS_COLUMN = "tests_passed"
PAIR_COLUMN = "pair_key"  # optional: the same session across policy versions (rlcycle/agent/events.py)
Classifier = Callable[[pl.Series], pl.Series]


@dataclass(frozen=True)
class Metric:
    title: str
    how: str
    unit: str  # rate, count, tokens, ms, value
    noun: str  # what the denominator counts
    direction: int  # +1 higher is better, -1 lower is better, 0 neither
    y: str  # EPISODE_FACTS columns summed per session
    x: str
    proportion: bool = False


INF = math.inf
METRICS = {
    "tests_pass_rate": Metric(
        "Hidden tests passed",
        "episodes passing / episodes tested",
        "rate",
        "episodes tested",
        +1,
        "tests_ok",
        "tested",
        True,
    ),
    "edit_persistence": Metric(
        "Edit persistence", "lines surviving / lines proposed", "rate", "lines proposed", +1, "surviving", "proposed"
    ),
    "dissatisfied_rate": Metric(
        "Dissatisfied follow-ups",
        "dissatisfied / episodes with a follow-up",
        "rate",
        "follow-ups",
        -1,
        "dissatisfied",
        "answered",
        True,
    ),
    "invalid_per_sample": Metric(
        "Invalid tool calls per model call",
        "invalid calls / model calls",
        "count",
        "model calls",
        -1,
        "invalid",
        "samples",
    ),
    "clarification_rate": Metric(
        "Clarifying questions", "episodes that asked / episodes", "rate", "episodes", 0, "asked", "one", True
    ),
    "edit_rate": Metric(
        "Episodes with an edit", "episodes with an ok edit / episodes", "rate", "episodes", 0, "edited", "one", True
    ),
    "tokens_per_call": Metric(
        "Completion tokens per model call", "tokens / model calls", "tokens", "model calls", 0, "tokens", "samples"
    ),
    "latency_ms": Metric(
        "Latency per model call (ms)", "mean latency per model call", "ms", "calls timed", -1, "latency", "timed"
    ),
    "feedback": Metric(
        "Explicit feedback",
        "mean feedback value where given",
        "value",
        "calls with feedback",
        +1,
        "feedback_sum",
        "feedback_n",
    ),
}
BOUNDS = {"rate": (0.0, 1.0), "count": (0.0, INF), "tokens": (0.0, INF), "ms": (0.0, INF), "value": (-INF, INF)}
# One row per (version, episode); `score` is the follow-up's classifier score (null: none).
EPISODE_FACTS = (
    "version",
    "session",
    "episode",
    "order",
    "start",
    "samples",
    "timed",
    "latency",
    "invalid",
    "tokens",
    "proposed",
    "surviving",
    "asked",
    "edited",
    "followup",
    "score",
    "feedback_sum",
    "feedback_n",
    "tests_passed",
)
COLUMNS = (
    "sample_id",
    "episode_id",
    "session_id",
    "policy_version",
    "ts",
    "turn",
    "tool_calls",
    "n_invalid_tool_calls",
    "edit_lines_proposed",
    "edit_lines_surviving",
    "followup_text",
    "feedback",
    "latency_ms",
    "completion_ids",
    TESTS_COLUMN,
    PAIR_COLUMN,
)
REQUIRED = ["policy_version"]  # the rest of COLUMNS may be absent (typed nulls)
OPTIONAL = tuple(c for c in COLUMNS if c not in REQUIRED)


@dataclass
class OnlineMetrics:
    """Per policy version (in `versions` order): metric -> Estimate, counts, complaints."""

    versions: list[str]
    metrics: dict[str, dict[str, Estimate]] = field(default_factory=dict)  # version -> metric -> estimate
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # version -> sessions, episodes, ...
    complaints: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # version -> newest (episode, text)
    absent: list[str] = field(default_factory=list)  # metrics the input cannot measure (no column, no classifier)
    notes: list[str] = field(default_factory=list)


def online_metrics(
    traj: pa.Table | pl.DataFrame,
    classify: Classifier | None = None,
    clarify_tools: Sequence[str] = CLARIFY_TOOLS,
    edit_tools: Sequence[str] = EDIT_TOOLS,
    level: float = stats.LEVEL,
    n_complaints: int = 5,
) -> OnlineMetrics:
    """The metrics of METRICS per policy version of `traj` (see the module docstring)."""
    facts = episode_facts(traj, classify, clarify_tools, edit_tools)
    absent = [] if classify is not None else ["dissatisfied_rate"]
    return summarize(facts, level, n_complaints, absent)


def paired_differences(a: pl.DataFrame, b: pl.DataFrame, level: float = stats.LEVEL) -> tuple[dict[str, Estimate], int]:
    """b − a per metric when two versions served the *same* sessions: `a` and `b` are
    EPISODE_FACTS frames of one version each whose `session` values name the same session on
    both sides: `episode_facts(..., session_column=PAIR_COLUMN)`. Sessions that only one side
    served are left out. Returns the differences (rlcycle.stats.paired_difference, kind
    "paired") and the number of matched sessions."""
    sa, sb = (_sessions(f).drop("version") for f in (a, b))
    j = sa.join(sb, on="session", how="inner", suffix="_b")
    out = {
        name: stats.paired_difference(
            j.get_column(m.y).to_numpy(),
            j.get_column(m.x).to_numpy(),
            j.get_column(m.y + "_b").to_numpy(),
            j.get_column(m.x + "_b").to_numpy(),
            level,
            kind="paired",
        )
        for name, m in METRICS.items()
    }
    return out, j.height


# --- step 1: episode facts ------------------------------------------------------------------


_TYPES = {
    "sample_id": pl.String,
    "episode_id": pl.String,
    "session_id": pl.String,
    "policy_version": pl.String,
    "ts": pl.Datetime("ms", "UTC"),
    "turn": pl.Int32,
    "tool_calls": pl.List(pl.Struct({"name": pl.String, "status": pl.String})),
    "n_invalid_tool_calls": pl.Int64,
    "edit_lines_proposed": pl.Int64,
    "edit_lines_surviving": pl.Int64,
    "followup_text": pl.String,
    "feedback": pl.Float64,
    "latency_ms": pl.Float64,
    "completion_ids": pl.List(pl.Int32),
    TESTS_COLUMN: pl.Boolean,
    PAIR_COLUMN: pl.String,
}


def _frame(traj: pa.Table | pl.DataFrame) -> pl.DataFrame:
    """The COLUMNS of `traj`, absent ones as typed nulls (a hand-made table may lack `ts`)."""
    names = traj.column_names if isinstance(traj, pa.Table) else traj.columns
    keep = [c for c in COLUMNS if c in names]
    f = pl.from_arrow(traj.select(keep)) if isinstance(traj, pa.Table) else traj.select(keep)
    assert isinstance(f, pl.DataFrame)
    return f.with_columns(pl.lit(None, _TYPES[c]).alias(c) for c in COLUMNS if c not in names)


def episode_facts(
    traj: pa.Table | pl.DataFrame,
    classify: Classifier | None = None,
    clarify_tools: Sequence[str] = CLARIFY_TOOLS,
    edit_tools: Sequence[str] = EDIT_TOOLS,
    session_column: str = "session_id",
) -> pl.DataFrame:
    """One row per (version, episode) with the columns of EPISODE_FACTS, in first-seen order.
    `session` is `session_column`'s value: the session id, or PAIR_COLUMN for a paired
    comparison (a row without one falls back to its session id, which pairs with nothing)."""
    if session_column not in ("session_id", PAIR_COLUMN):
        raise ValueError(f"session_column={session_column!r}: session_id or {PAIR_COLUMN}")
    f = _frame(traj)
    call = pl.element().struct
    ok = call.field("status").eq("ok")
    # A clarifying question counts when it went out (status ok, or its result never logged).
    asked = C("tool_calls").list.eval(
        call.field("name").is_in(list(clarify_tools)) & (ok | call.field("status").is_null())
    )
    edited = C("tool_calls").list.eval(call.field("name").is_in(list(edit_tools)) & ok)
    recount = (
        C("tool_calls").list.eval(call.field("status").eq("invalid")).list.sum()
    )  # where collect's count is missing
    proposed, surviving = C("edit_lines_proposed"), C("edit_lines_surviving")
    row = pl.int_range(pl.len())
    episode = pl.coalesce(C("episode_id"), C("sample_id"), pl.format("#{}", row))  # a lone sample is an episode
    g = (
        f.with_columns(
            version=C("policy_version").fill_null(NO_VERSION),
            episode=episode,
            order=row,
            session_=pl.coalesce(C(session_column), C("session_id"), episode),
            asked_=asked.list.any().fill_null(False),
            edited_=edited.list.any().fill_null(False),
            invalid_=C("n_invalid_tool_calls").cast(pl.Int64).fill_null(recount).fill_null(0),
            tests_=C(TESTS_COLUMN).cast(pl.Boolean),
        )
        .group_by("version", "episode", maintain_order=True)
        .agg(
            session=C("session_").first(),
            order=C("order").min(),
            start=C("ts").min(),
            samples=pl.len().cast(pl.Float64),
            timed=C("latency_ms").count().cast(pl.Float64),
            latency=C("latency_ms").fill_null(0).sum().cast(pl.Float64),
            invalid=C("invalid_").sum().cast(pl.Float64),
            tokens=C("completion_ids").list.len().fill_null(0).sum().cast(pl.Float64),
            # an edit counts once its outcome arrived (both numbers present)
            proposed=proposed.filter(surviving.is_not_null()).sum().cast(pl.Float64),
            surviving=surviving.filter(proposed.is_not_null()).sum().cast(pl.Float64),
            asked=C("asked_").any(),
            edited=C("edited_").any(),
            followup=C("followup_text").drop_nulls().first(),
            feedback_sum=C("feedback").fill_null(0).sum().cast(pl.Float64),
            feedback_n=C("feedback").count().cast(pl.Float64),
            tests_passed=C("tests_").sort_by(C("turn").fill_null(0)).drop_nulls().last(),  # the last verdict
        )
    )
    names = traj.column_names if isinstance(traj, pa.Table) else traj.columns
    score = (
        classify(g.get_column("followup"))
        if classify is not None
        else pl.repeat(None, g.height, dtype=pl.Float64, eager=True)
    )
    facts = g.with_columns(score=pl.Series("score", score, dtype=pl.Float64))
    if "completion_ids" not in names:
        facts = facts.with_columns(tokens=pl.lit(None, pl.Float64))
    if TESTS_COLUMN not in names:
        facts = facts.with_columns(tests_passed=pl.lit(None, pl.Boolean))
    return facts.select(EPISODE_FACTS)


# --- step 2: per version, per session, the estimators --------------------------------------


def version_order(facts: pl.DataFrame) -> list[str]:
    """Versions by first sample time (nulls last), then first appearance; NO_VERSION last."""
    first = facts.group_by("version").agg(C("start").min(), C("order").min()).sort("start", "order", nulls_last=True)
    names = first.get_column("version").to_list()
    return [n for n in names if n != NO_VERSION] + ([NO_VERSION] if NO_VERSION in names else [])


def _sessions(facts: pl.DataFrame) -> pl.DataFrame:
    """Per (version, session) the sums every metric's y and x name."""
    answered = C("followup").is_not_null() & ~C("asked")
    flags = facts.with_columns(
        answered=answered.cast(pl.Float64),
        dissatisfied=(answered & (C("score") < 0).fill_null(False)).cast(pl.Float64),
        asked=C("asked").cast(pl.Float64),
        edited=C("edited").cast(pl.Float64),
        one=pl.lit(1.0),
        tested=C("tests_passed").is_not_null().cast(pl.Float64),
        tests_ok=C("tests_passed").fill_null(False).cast(pl.Float64),
        outcome=(C("proposed") > 0).cast(pl.Float64),
    )
    sums = {m.y for m in METRICS.values()} | {m.x for m in METRICS.values()} | {"outcome"}
    return flags.group_by("version", "session").agg(*(C(c).fill_null(0).sum() for c in sorted(sums)))


def summarize(
    facts: pl.DataFrame, level: float = stats.LEVEL, n_complaints: int = 5, absent: Sequence[str] = ()
) -> OnlineMetrics:
    """OnlineMetrics from an EPISODE_FACTS frame (see the module docstring)."""
    absent = list(absent)
    if facts.get_column("tokens").null_count() == facts.height and facts.height:
        absent.append("tokens_per_call")
    if facts.get_column("tests_passed").null_count() == facts.height:
        absent.append("tests_pass_rate")
    out = OnlineMetrics(version_order(facts), absent=[m for m in METRICS if m in absent])
    if "tests_pass_rate" in absent:
        out.notes.append(f"no {TESTS_COLUMN!r} column: the hidden-test pass rate is not measured")
    by_session = _sessions(facts).partition_by("version", as_dict=True)
    said = facts.filter(C("followup").is_not_null() & ~C("asked") & (C("score") < 0)).partition_by(
        "version", as_dict=True
    )
    episodes = dict(facts.group_by("version").len().iter_rows())
    for v in out.versions:
        s = by_session[(v,)]
        out.metrics[v] = {name: _estimate(m, s, level) for name, m in METRICS.items() if name not in out.absent}
        out.counts[v] = {
            "sessions": s.height,
            "episodes": episodes[v],
            "samples": int(s.get_column("samples").sum()),
            "followups": int(s.get_column("answered").sum()),
            "asked": int(s.get_column("asked").sum()),
            "edits_with_outcome": int(s.get_column("outcome").sum()),
        }
        newest = (
            said.get((v,), facts.clear()).sort("start", "order", descending=True, nulls_last=True).head(n_complaints)
        )
        out.complaints[v] = list(newest.select("episode", "followup").iter_rows())
    return out


def _estimate(m: Metric, sessions: pl.DataFrame, level: float) -> Estimate:
    y, x = sessions.get_column(m.y).to_numpy(), sessions.get_column(m.x).to_numpy()
    if m.proportion:
        return stats.cluster_proportion(y, x, level)
    return stats.ratio_estimate(y, x, level, BOUNDS[m.unit])
