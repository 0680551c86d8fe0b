"""The simulated user: answers clarifying questions, reacts to the result, and keeps or reverts edits.

What goes in: the task, what the agent did (`SessionOutcome`: graded status, whether it edited,
how the session ended) and a seeded `random.Random`. What comes out: text and numbers the runner
logs as production events (`user_message`, `feedback`, `edit_outcome`).

The rules (issue #4, item 6), chosen so the signals distill reads mean what they mean in
production:

- a clarifying question (`ask_user`) is answered with the task's `clarification_answer` when the
  task is ambiguous; when it is not, the user answers *annoyed* and repeats that the task says
  everything (asking instead of working must not look like success: docs/design.md, reward hack 2);
- the follow-up after the session is *satisfied* when the hidden tests pass, *dissatisfied*
  when they fail or nothing was edited (the texts are those of the sample production log);
- an edit *persists* when the hidden tests pass with it: its `edit_outcome` reports every
  proposed line surviving; otherwise it is reverted (0 lines survive) or, with
  `partial_survival_rate`, partly kept (a random fraction under one half), hours later;
- with `followup_style = "informative"` a failed session's complaint says what the user saw: the
  call that misbehaves and what it returned or raised, read off the hidden tests' failure, never
  the fix (rlcycle/agent/feedback.py); `canned` (the default) keeps the lines above, the
  no-information baseline of docs/hints.md;
- with probability `underspecified_rate` the session's first message is the task's brief
  ("Decimal numbers don't work.") instead of its full instruction, as real first messages are;
- a thumbs rating comes with probability `feedback_rate`: +1 on pass, -1 otherwise, flipped
  with probability `feedback_noise` (user signals are noisy).

Everything is drawn from the session's own `random.Random`, so a seed gives the same user.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlcycle.agent.feedback import brief_instruction, failure_detail, informative_followup
from rlcycle.config import cfg, check_range
from rlcycle.tasks.suite import Task

SATISFIED = ("thanks, works", "Thanks! That fixed it.", "great, merging this", "works now, ty")
DISSATISFIED_FAILED = (
    "that's wrong, it still fails",
    "no, revert that",
    "still broken, the tests fail",
    "This is not what I asked for.",
)
DISSATISFIED_NOTHING = (
    "you didn't change anything?",
    "Nothing changed. Please actually make the change.",
    "This is not what I asked for: no code was touched.",
)
FOLLOWUP_STYLES = ("canned", "informative")
ANNOYED = (
    "Why are you asking? Everything you need is in the request. Just do it.",
    "I already said what I want. Please just make the change.",
    "Don't ask me, read the code. The task is clear.",
)


@dataclass
class UserConfig:
    """How the simulated user behaves (probabilities, delays)."""

    followup_rate: float = cfg(1.0, help="Probability the user writes a follow-up after a session.")
    feedback_rate: float = cfg(0.3, help="Probability the user gives a thumbs rating.")
    feedback_noise: float = cfg(0.05, help="Probability a thumbs rating is flipped (noisy users).")
    partial_survival_rate: float = cfg(
        0.3, help="Probability that a failed edit is partly kept instead of fully reverted."
    )
    edit_delay_min_h: float = cfg(1.0, help="Earliest edit outcome, hours after the session.")
    edit_delay_max_h: float = cfg(
        5.0, help="Latest edit outcome, hours after the session (keep it under collect's maturity_s)."
    )
    think_min_s: float = cfg(20.0, help="Fewest seconds the user takes to answer or react.")
    think_max_s: float = cfg(180.0, help="Most seconds the user takes to answer or react.")
    followup_style: str = cfg(
        "canned",
        help="canned (fixed complaint lines: no information) or informative (a failed session's complaint "
        "names the misbehaving call and what it returned, from the hidden tests; docs/hints.md).",
    )
    underspecified_rate: float = cfg(
        0.0, help="Probability a session's first message is the task's brief instead of its full instruction."
    )

    def validate(self) -> list[str]:
        problems = []
        if self.followup_style not in FOLLOWUP_STYLES:
            problems.append(f"followup_style={self.followup_style!r}: expected one of {', '.join(FOLLOWUP_STYLES)}")
        check_range(problems, self, "underspecified_rate", ge=0, le=1)
        check_range(
            problems, self, ("followup_rate", "feedback_rate", "feedback_noise", "partial_survival_rate"), ge=0, le=1
        )
        if not 0 <= self.edit_delay_min_h <= self.edit_delay_max_h:
            problems.append("edit_delay_min_h..edit_delay_max_h: need 0 <= min <= max")
        if not 0 <= self.think_min_s <= self.think_max_s:
            problems.append("think_min_s..think_max_s: need 0 <= min <= max")
        return problems


@dataclass
class SessionOutcome:
    """What the user sees at the end of a session."""

    passed: bool  # the hidden tests pass on what the agent left
    edited: bool  # the agent made at least one edit that applied
    end_reason: str  # finish / ask_user / max_turns / max_tokens / no_tool_call
    failure: str = ""  # the hidden tests' output tail (what an informative user reads the symptom from)


@dataclass(frozen=True)
class Reaction:
    """The user's late signals about a session."""

    followup: str | None  # the follow-up message (None: the user stayed silent)
    kind: str  # satisfied / dissatisfied_failed / dissatisfied_nothing / none
    feedback: float | None  # thumbs value (None: no rating)


class SimulatedUser:
    """One simulated user; all randomness from the `rng` given per call."""

    def __init__(self, config: UserConfig | None = None):
        self.config = config or UserConfig()

    def answer(self, task: Task, rng: random.Random) -> tuple[str, bool]:
        """The answer to a clarifying question and whether the question was warranted."""
        if task.ambiguous and task.clarification_answer:
            return task.clarification_answer, True
        return rng.choice(ANNOYED), False

    def first_message(self, task: Task, rng: random.Random) -> str:
        """The message that starts a session: the instruction, or with `underspecified_rate` its
        brief. `rng` is the session's own stream for this draw (never the reactions' stream)."""
        if self.config.underspecified_rate > 0 and rng.random() < self.config.underspecified_rate:
            return brief_instruction(task)
        return task.instruction

    def react(self, outcome: SessionOutcome, rng: random.Random) -> Reaction:
        """The follow-up message and thumbs rating after the session."""
        c = self.config
        if outcome.passed:
            kind, texts = "satisfied", SATISFIED
        elif not outcome.edited:
            kind, texts = "dissatisfied_nothing", DISSATISFIED_NOTHING
        else:
            kind, texts = "dissatisfied_failed", DISSATISFIED_FAILED
        # Draw every number in a fixed order whatever the branch, so one choice never shifts
        # the random stream of the next (the same seed gives the same user across policies).
        text, p_followup, p_feedback, p_flip = rng.choice(texts), rng.random(), rng.random(), rng.random()
        if kind == "dissatisfied_failed" and c.followup_style == "informative":
            detail = failure_detail(outcome.failure)
            if detail:  # no symptom to tell (a collection error, a timeout): the canned line
                text = informative_followup(detail, texts.index(text))
        followup = text if p_followup < c.followup_rate else None
        feedback = None
        if p_feedback < c.feedback_rate:
            feedback = 1.0 if outcome.passed else -1.0
            if p_flip < c.feedback_noise:
                feedback = -feedback
        return Reaction(followup, kind if followup else "none", feedback)

    def surviving(self, proposed: int, passed: bool, rng: random.Random) -> int:
        """How many of an edit's proposed lines are still there when the outcome is observed."""
        p_partial, fraction = rng.random(), rng.random() * 0.5
        if passed:
            return proposed
        if p_partial < self.config.partial_survival_rate:
            return int(proposed * fraction)
        return 0

    def think_ms(self, rng: random.Random) -> float:
        """How long the user takes before a message, in ms (whole seconds)."""
        return 1000.0 * round(rng.uniform(self.config.think_min_s, self.config.think_max_s))

    def edit_delay_ms(self, rng: random.Random) -> float:
        """When, after the session, an edit's fate is observed, in ms (whole seconds)."""
        hours = rng.uniform(self.config.edit_delay_min_h, self.config.edit_delay_max_h)
        return 1000.0 * round(hours * 3600)
