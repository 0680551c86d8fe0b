"""The follow-up classifier: is the user's next message dissatisfied, satisfied, or neither?

A transparent built-in rule set (phrases plus negation) that anyone can read, test and extend
from the reward spec, and a dotted-path hook for a real classifier.

Scores: -1 dissatisfied, +1 satisfied, 0 neither (a new request, a question, an answer).
The built-in rule, on the lower-cased text (curly apostrophes straightened):

    dissatisfied  a dissatisfied phrase ("still fails", "revert", ...) that no negation word
                  stands right before (within two words, spaces only between: "no need to
                  revert" is not a complaint),
                  or a satisfied phrase that a negation does stand before ("not fixed",
                  "never works")
    satisfied     otherwise, a satisfied phrase ("thanks", "fixed it", ...) not negated
    neither       otherwise

Phrases match whole words (`\\b` on both ends). Every complaint text of the simulated user
(`rlcycle.agent.user`) scores -1 and every praise text +1 (tests/test_user_followups.py). Dissatisfaction wins over thanks: "thanks, but
it still fails" is dissatisfied. The phrase lists below are the defaults of the
`dissatisfied_followup` signal's `phrases`, `satisfied_phrases` and `negations` params.

The hook: `classifier = "mypkg.sentiment:score"` names a function that takes a list of texts
(each distinct non-null follow-up once) and returns one score per text in [-1, 1] (floats are
fine: a model's P(satisfied) - P(dissatisfied)). Its scores replace the built-in ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import polars as pl

from rlcycle.errors import InputError, RlcycleError

DISSATISFIED = [
    "that's wrong",
    "that is wrong",
    "this is wrong",
    "still wrong",
    "still fails",
    "still failing",
    "still broken",
    "still getting",
    "still seeing",
    "still crashes",
    "doesn't work",
    "does not work",
    "didn't work",
    "did not work",
    "not working",
    "didn't fix",
    "did not fix",
    "not fixed",
    "isn't fixed",
    "not what i asked",
    "not what i wanted",
    "revert",
    "undo that",
    "undo it",
    "roll back",
    "you broke",
    "made it worse",
    # Nothing was done: the simulated user's complaints (rlcycle.agent.user), real users' too.
    "didn't change anything",
    "did not change anything",
    "nothing changed",
    "no code was touched",
    "actually make the change",
    "just make the change",
    "just do it",
    "don't ask me",
]
SATISFIED = [
    "thanks",
    "thank you",
    "ty",
    "works",
    "fixed it",
    "that fixed",
    "is fixed",
    "now fixed",
    "perfect",
    "great",
    "lgtm",
    "looks good",
    "merging",
    "nice",
]
NEGATIONS = ["not", "no longer", "never", "nothing", "hardly", "no need to", "cannot", "*n't"]
# Answers to a clarifying question that say the task was clear already (clarification signal).
CLEAR_TASK = [
    "as i said",
    "like i said",
    "i already said",
    "already told you",
    "as stated",
    "as mentioned",
    "just do it",
    "it's in the",
    "read the",
    "obviously",
    "you decide",
    "your call",
    "up to you",
    "whatever you think",
    "doesn't matter",
    "don't care",
]


def _phrase(p: str) -> str:
    """A regex for one phrase: literal text, whole words at its word-character ends."""
    body = re.escape(p.lower())
    if p.startswith("*"):  # a suffix: "*n't" matches doesn't, didn't, isn't ...
        return r"\w+" + re.escape(p[1:].lower()) + r"\b"
    head = r"\b" if p[:1].isalnum() else ""
    tail = r"\b" if p[-1:].isalnum() else ""
    return head + body + tail


def any_of(phrases: Sequence[str]) -> str:
    """One alternation regex matching any of `phrases` (longest first, so longer ones win)."""
    ordered = sorted({p for p in phrases if p}, key=lambda p: (-len(p), p))
    return "(?:" + "|".join(_phrase(p) for p in ordered) + ")" if ordered else r"(?:$^)"


def _negated(negations: Sequence[str], phrases: Sequence[str]) -> str:
    # A negation, then at most two other words, then the phrase: "not really fixed". Only
    # spaces in between: punctuation ends the negation's reach ("no longer fails, thanks").
    return any_of(negations) + r"(?:\s+\w+){0,2}?\s+" + any_of(phrases)


def normalise(text: pl.Expr) -> pl.Expr:
    return text.str.to_lowercase().str.replace_all("\u2019", "'", literal=True)


def builtin_scores(
    text: pl.Expr,
    phrases: Sequence[str] = DISSATISFIED,
    satisfied: Sequence[str] = SATISFIED,
    negations: Sequence[str] = NEGATIONS,
) -> pl.Expr:
    """-1 / 0 / +1 per text (null stays null), by the rule in the module docstring."""
    t = normalise(text)
    # Counting matches (not just testing for one) lets "don't revert, undo it" stay
    # dissatisfied: two complaints, only one of them negated.
    complaints = t.str.count_matches(any_of(phrases))
    negated_complaints = t.str.count_matches(_negated(negations, phrases))
    thanks = t.str.count_matches(any_of(satisfied))
    negated_thanks = t.str.count_matches(_negated(negations, satisfied))
    dissatisfied = (complaints > negated_complaints) | (negated_thanks > 0)
    return (
        pl.when(text.is_null())
        .then(None)
        .when(dissatisfied)
        .then(pl.lit(-1.0))
        .when(thanks > negated_thanks)
        .then(pl.lit(1.0))
        .otherwise(pl.lit(0.0))
    )


def matches_any(text: pl.Expr, phrases: Sequence[str]) -> pl.Expr:
    """True where the (normalised) text contains one of `phrases` as whole words."""
    return normalise(text).str.contains(any_of(phrases))


def score_texts(
    texts: pl.Series,
    hook: Callable[[list[str]], Sequence[float]] | None,
    phrases: Sequence[str] = DISSATISFIED,
    satisfied: Sequence[str] = SATISFIED,
    negations: Sequence[str] = NEGATIONS,
) -> pl.Series:
    """Scores for `texts` (one per element, null for null), each distinct text scored once."""
    distinct = texts.drop_nulls().unique(maintain_order=True)
    if hook is None:
        scores = (
            pl.DataFrame({"t": distinct}).select(builtin_scores(pl.col("t"), phrases, satisfied, negations)).to_series()
        )
    else:
        scores = pl.Series(_call_hook(hook, distinct.to_list()), dtype=pl.Float64)
    return texts.replace_strict(distinct, scores, default=None, return_dtype=pl.Float64)


def _call_hook(hook: Callable, texts: list[str]) -> list[float | None]:
    name = getattr(hook, "__qualname__", repr(hook))
    try:
        out = list(hook(texts))
    except Exception as e:  # the hook is user code: name it in the error
        raise RlcycleError(
            f"follow-up classifier {name} failed: {type(e).__name__}: {e}",
            hint="run it on a few texts by hand, or drop `classifier` to use the built-in rules",
        ) from e
    if len(out) != len(texts):
        raise InputError(f"follow-up classifier {name} returned {len(out)} scores for {len(texts)} texts")
    bad = [s for s in out if s is not None and not (isinstance(s, (int, float)) and -1 <= s <= 1)]
    if bad or any(isinstance(s, float) and math.isnan(s) for s in out):
        raise InputError(
            f"follow-up classifier {name} returned scores outside [-1, 1], e.g. {bad[:3]}",
            hint="return -1 (dissatisfied) ... +1 (satisfied) per text",
        )
    return [None if s is None else float(s) for s in out]
