"""The reward spec hears the simulated user: every complaint it writes scores as dissatisfied,
every praise as satisfied, and every annoyed answer to a needless question as "the task was
clear" — scored by the sample spec's own params, as distill scores them."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from rlcycle.agent.user import (
    ANNOYED,
    DISSATISFIED_FAILED,
    DISSATISFIED_NOTHING,
    SATISFIED,
    SessionOutcome,
    SimulatedUser,
)
from rlcycle.distill import followup
from rlcycle.distill.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "sample_data" / "rewards.toml"


@pytest.fixture(scope="module")
def params():
    return load_spec(SPEC).params_of("dissatisfied_followup")


def scores(texts, params) -> list[float]:
    return followup.score_texts(
        pl.Series(list(texts)), None, params["phrases"], params["satisfied_phrases"], params["negations"]
    ).to_list()


def test_every_complaint_scores_dissatisfied_and_every_praise_satisfied(params):
    complaints = DISSATISFIED_FAILED + DISSATISFIED_NOTHING + ANNOYED
    got = dict(zip(complaints, scores(complaints, params), strict=True))
    assert all(s < 0 for s in got.values()), {t: s for t, s in got.items() if s >= 0}
    praise = dict(zip(SATISFIED, scores(SATISFIED, params), strict=True))
    assert all(s > 0 for s in praise.values()), {t: s for t, s in praise.items() if s <= 0}


def test_annoyed_answers_say_the_task_was_clear():
    clear = load_spec(SPEC).params_of("clarification")["clear_phrases"]
    hits = pl.DataFrame({"t": list(ANNOYED)}).select(followup.matches_any(pl.col("t"), clear)).to_series()
    assert hits.all(), [t for t, h in zip(ANNOYED, hits, strict=True) if not h]


def test_what_the_user_writes_follows_what_the_agent_did(params):
    """The reaction depends on the outcome: a pass is praised, a failed edit and no edit at
    all are complained about, whatever the seed; and the score follows."""
    user, seen = SimulatedUser(), {}
    for seed in range(40):
        for outcome in (
            SessionOutcome(True, True, "finish"),
            SessionOutcome(False, True, "finish"),
            SessionOutcome(False, False, "finish"),
        ):
            r = user.react(outcome, random.Random(seed))
            seen.setdefault((outcome.passed, outcome.edited), set()).add(r.followup)
    assert seen[(True, True)] <= set(SATISFIED)
    assert seen[(False, True)] <= set(DISSATISFIED_FAILED)
    assert seen[(False, False)] <= set(DISSATISFIED_NOTHING)
    assert all(s > 0 for s in scores(seen[(True, True)], params))
    assert all(s < 0 for s in scores(seen[(False, True)] | seen[(False, False)], params))
