"""The built-in reward signals: what each one measures, on which sample, with which defaults.

Each signal turns one sample (one model call) into a *raw* value, or null where it says
nothing about that sample (no edit, no follow-up, no tests). The reward spec then shapes it:
`part = weight * clip(transform(raw))`, null counting as 0 (rlcycle/distill/rewards.py).

Scope says where a value belongs:
- `sample`: the sample that did it keeps it, whatever the credit setting (an invalid tool
  call is penalised on the call that emitted it, never spread, never dropped);
- `episode`: an outcome of the whole episode (a follow-up, a clarification, tests). Credit
  assignment decides which samples carry it: `all` (every turn of the episode: each decision
  led to the outcome) or `final` (the last turn only: the one that handed control back).

The expressions read the frames built by rlcycle/distill/features.py. Most read the *sample
frame* (one row per sample, input order):

    proposed, surviving   edit lines of this sample (null: no outcome arrived)
    n_invalid, n_errors   invalid / failed (error, timeout) tool calls of this sample
    latency_ms, n_tokens  the sample's latency and completion length
    feedback, fb_sample   feedback value; whether it was given on this sample itself

Signals marked `on_episodes` read the *episode frame* instead (one row per episode, three
times fewer rows than samples); their values are then copied onto the episode's samples:

    asked                 the episode ended with a clarifying question (ask_user)
    score                 its follow-up's classifier score in [-1, 1] (null: no follow-up)
    answered              the user replied to the episode (for a question: answered it)
    next_success          the next episode of the session succeeded (features.py: success)
    clear                 the task was clear already (answer phrases, or same-prompt peers
                          solved it without asking)
    clar_excess           the share of this policy version's clarifications above the target
                          rate: max(0, (rate - target) / rate)
    tests_passed          the episode's last non-null `tests_passed` (null: column absent)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from rlcycle.distill import followup

C = pl.col


@dataclass(frozen=True)
class Builtin:
    """A built-in signal: its scope, defaults (weight, transform, clip, cap, params), raw value."""

    name: str
    scope: str  # "sample" or "episode"
    help: str
    raw: Callable[[dict[str, Any]], pl.Expr]
    weight: float = 1.0
    clip: tuple[float, float] | None = None
    cap: float = 1.0
    credit: str | None = None  # None: the stage's `credit` setting
    params: dict[str, Any] = field(default_factory=dict)
    # Rows on which an episode signal is nonetheless the sample's own (kept under credit=final).
    own_rows: pl.Expr | None = None
    on_episodes: bool = False  # `raw` reads the episode frame (module docstring)


def _edit_persistence(p: dict) -> pl.Expr:
    # Lines of the sample's edits still in the repository after the maturity window (collect
    # holds an episode back until its outcomes arrive or the window passes), as a share of the
    # lines it proposed. `center` shifts it so that a reverted edit can cost: with 0.5 a fully
    # reverted edit scores -0.5 and a fully kept one +0.5, while not editing scores 0.
    share = C("surviving").cast(pl.Float64) / C("proposed")
    return pl.when(C("proposed") > 0).then(share - p["center"])


def _dissatisfied(p: dict) -> pl.Expr:
    # The dissatisfied part of the follow-up's score: 1 for a complaint, 0 for thanks or a new
    # request, null without a follow-up. After a clarifying question the follow-up is the
    # user's *answer* ("no, inclusive"), not a verdict on work done: skipped by default.
    value = (-C("score")).clip(lower_bound=0.0)
    if p["skip_after_clarification"]:
        return pl.when(~C("asked")).then(value)
    return value


def _feedback(p: dict) -> pl.Expr:
    # Thumbs / accept / reject in -1..1, as collect joined it (sample-level wins over episode).
    return C("feedback").cast(pl.Float64)


def _latency(p: dict) -> pl.Expr:
    # Seconds above the budget; 0 within it (a fast answer earns nothing extra).
    return (C("latency_ms") - p["budget_ms"]).clip(lower_bound=0.0) / 1000.0


def _tokens(p: dict) -> pl.Expr:
    # Completion tokens above the budget, in units of `per` tokens.
    return (C("n_tokens").cast(pl.Float64) - p["budget"]).clip(lower_bound=0.0) / p["per"]


def _invalid(p: dict) -> pl.Expr:
    # Invalid tool calls this sample emitted (bad JSON, unknown tool, missing argument). The
    # first reward hack of docs/design.md came from *dropping* these samples: a broken call on a
    # task the model expected to fail cost nothing. Here the call is a negative example.
    return C("n_invalid").cast(pl.Float64)


def _tool_errors(p: dict) -> pl.Expr:
    return C("n_errors").cast(pl.Float64)


def _clarification(p: dict) -> pl.Expr:
    # Reshaping around clarifying questions (the second hack: asking instead of editing, since
    # nobody punishes code that was not written). On an episode that asked:
    #   + answered_success  if the user answered and the next episode of the session succeeded
    #   + clear_task        (a negative value) if the task was clear already
    #   + over_target       (negative) times the share of the version's clarifications that
    #                       are above `target_rate`: each question pays its part of the excess
    answered_ok = (C("answered") & C("next_success")).cast(pl.Float64)
    value = (
        p["answered_success"] * answered_ok
        + p["clear_task"] * C("clear").cast(pl.Float64)
        + p["over_target"] * C("clar_excess")
    )
    return pl.when(C("asked")).then(value)


def _correctness(p: dict) -> pl.Expr:
    passed = C("tests_passed")
    return pl.when(passed).then(pl.lit(p["passed"])).when(~passed).then(pl.lit(p["failed"]))


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin(
            "edit_persistence",
            "sample",
            "lines surviving / lines proposed, minus center",
            _edit_persistence,
            weight=1.0,
            cap=0.5,
            params={"center": 0.5},
        ),
        Builtin(
            "dissatisfied_followup",
            "episode",
            "1 when the follow-up is a complaint",
            _dissatisfied,
            weight=-1.0,
            cap=0.5,
            params={
                "classifier": "",
                "phrases": list(followup.DISSATISFIED),
                "satisfied_phrases": list(followup.SATISFIED),
                "negations": list(followup.NEGATIONS),
                "skip_after_clarification": True,
            },
            on_episodes=True,
        ),
        Builtin(
            "explicit_feedback",
            "episode",
            "thumbs / accept / reject, -1..1",
            _feedback,
            weight=0.5,
            cap=0.3,
            own_rows=C("fb_sample"),
        ),
        Builtin(
            "latency",
            "sample",
            "seconds above budget_ms",
            _latency,
            weight=-0.05,
            clip=(0.0, 30.0),
            params={"budget_ms": 4000.0},
        ),
        Builtin(
            "tokens",
            "sample",
            "completion tokens above budget, per `per` tokens",
            _tokens,
            weight=-0.5,
            params={"budget": 1024.0, "per": 1000.0},
        ),
        Builtin(
            "invalid_tool_call",
            "sample",
            "invalid tool calls the sample emitted",
            _invalid,
            weight=-1.0,
            clip=(0.0, 3.0),
        ),
        Builtin(
            "tool_errors",
            "sample",
            "tool calls that failed (error, timeout)",
            _tool_errors,
            weight=-0.2,
            clip=(0.0, 3.0),
        ),
        Builtin(
            "clarification",
            "episode",
            "clarifying questions: answered and useful, or not",
            _clarification,
            weight=1.0,
            credit="final",
            params={
                "answered_success": 0.5,
                "clear_task": -1.0,
                "over_target": -1.0,
                "target_rate": 0.05,
                "clear_phrases": list(followup.CLEAR_TASK),
                "clear_if_peers_succeeded": True,
            },
            on_episodes=True,
        ),
        Builtin(
            "correctness",
            "episode",
            "tests passed (+passed) or failed (failed)",
            _correctness,
            weight=1.0,
            params={"column": "tests_passed", "passed": 1.0, "failed": -1.0},
            on_episodes=True,
        ),
    )
}

TRANSFORMS: dict[str, Callable[[pl.Expr], pl.Expr]] = {
    "identity": lambda x: x,
    "sign": lambda x: x.sign(),
    "tanh": lambda x: x.tanh(),
    # Signed log1p / sqrt: compress large magnitudes, keep the sign and 0 -> 0.
    "log1p": lambda x: x.sign() * x.abs().log1p(),
    "sqrt": lambda x: x.sign() * x.abs().sqrt(),
}
