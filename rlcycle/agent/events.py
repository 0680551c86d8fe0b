"""An agent session as production events: exactly the `events` schema that `collect` reads.

What goes in: what happened in one session (a task attempt): each model sample with its parsed
tool calls and their outcomes, the user's messages, and the simulated user's late signals.
What comes out: event dicts (one JSON object per line of an events log), in causal order:

    completion   episode_id, sample_id, turn, policy_version, prompt_ids, completion_ids,
                 completion_logprobs, completion_text, tool_calls, latency_ms, temperature,
                 max_new_tokens, pair_key, loss_mask (optional extensions, see below)
    tool_result  sample_id, call_id, status (ok/error/invalid/timeout), error, duration_ms
    user_message episode_id (the episode it follows), text
    edit_outcome sample_id, call_id, lines_proposed, lines_surviving, observed_after_s
    feedback     episode_id, value, kind

Every event also has `event_id`, `type`, `ts` (RFC 3339, UTC, milliseconds) and `session_id`.

Ids are derived, never random, so the same run writes the same ids (docs/design.md: duplicates are
dropped by `event_id`, so a rerun cannot double-count):

    session_id  {run_id}-{task_id}-a{attempt}
    episode_id  {session_id}-e{k}        k-th user request of the session (a clarification
                                         answer starts a new episode, as in production)
    sample_id   {episode_id}-t{turn}     turn = index of the model call in its episode
    call_id     {sample_id}-c{i}         i = index of the call in the completion
    event_id    {sample_id}-completion, {call_id}-result, {call_id}-outcome,
                {episode_id}-user, {episode_id}-feedback

`pair_key` names the session independently of the policy: `s{seed}-{task_id}-a{attempt}` (the
traffic seed, the task, the attempt). Two runs with the same seed and tasks serve sessions with
the same pair keys to whatever policy they run: the same task, simulated user and sampling
seeds, so a comparison of two versions can pair them session by session (rlcycle.online
`paired_differences`) without parsing ids; the session id differs, since it names the run.

`max_new_tokens` is the runner's per-call token limit (its config's `max_new_tokens`): train's
Dr. GRPO divides by it (docs/train.md). `loss_mask` is the harness Transcript's mask over `completion_ids`. Every completion id was
sampled, so it is all ones; it is written so a reader can check that tool output never reaches
the loss (tool outputs live only in later `prompt_ids`, masked 0 by construction). collect
ignores fields it does not know.

Time comes from a simulated clock (`SimClock`), advanced by measured generation latencies and
tool durations and by simulated user delays: see docs/simulate.md for what is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds of an RFC 3339 time ('Z' or an offset; naive means UTC)."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(round(dt.timestamp() * 1000))


def iso(ms: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-12-01T00:00:00.000Z."""
    dt = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


@dataclass
class SimClock:
    """Simulated wall time of one session, in epoch ms; only ever moves forward."""

    now_ms: float

    def advance(self, ms: float) -> float:
        self.now_ms += max(0.0, ms)
        return self.now_ms


@dataclass
class SessionLog:
    """Builds the events of one session as it runs (ids, turns, episodes, clock)."""

    session_id: str
    policy_version: str
    clock: SimClock
    temperature: float
    max_new_tokens: int | None = None  # the sampler's per-call limit (Dr. GRPO's M in train)
    pair_key: str | None = None  # the same session across runs and policy versions (see the docstring)
    events: list[dict[str, Any]] = field(default_factory=list)
    episode: int = 0  # index of the current episode (user request) in the session
    turn: int = 0  # index of the next sample in the current episode
    edits: list[tuple[str, str, int, float]] = field(default_factory=list)  # sample, call, lines, ts

    @property
    def episode_id(self) -> str:
        return f"{self.session_id}-e{self.episode}"

    def _event(self, type_: str, event_id: str, **fields: Any) -> dict[str, Any]:
        ev = {
            "event_id": event_id,
            "type": type_,
            "ts": iso(self.clock.now_ms),
            "session_id": self.session_id,
            **fields,
        }
        self.events.append(ev)
        return ev

    def completion(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        logprobs: list[float],
        text: str,
        calls: list[tuple[str | None, str]],
        latency_ms: float,
        loss_mask: list[int],
    ) -> tuple[str, list[str]]:
        """Log one sample (the clock advances by its latency first); returns its sample id
        and the call ids of `calls` ([(name, arguments string)], invalid ones included)."""
        sample_id = f"{self.episode_id}-t{self.turn}"
        call_ids = [f"{sample_id}-c{i}" for i in range(len(calls))]
        self.clock.advance(latency_ms)
        self._event(
            "completion",
            f"{sample_id}-completion",
            episode_id=self.episode_id,
            sample_id=sample_id,
            turn=self.turn,
            policy_version=self.policy_version,
            prompt_ids=list(prompt_ids),
            completion_ids=list(completion_ids),
            completion_logprobs=list(logprobs),
            completion_text=text,
            tool_calls=[
                {"call_id": cid, "name": name, "arguments": args}
                for cid, (name, args) in zip(call_ids, calls, strict=True)
            ],
            latency_ms=round(float(latency_ms), 3),
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            **({"pair_key": self.pair_key} if self.pair_key is not None else {}),
            loss_mask=list(loss_mask),
        )
        self.turn += 1
        return sample_id, call_ids

    def tool_result(
        self,
        sample_id: str,
        call_id: str,
        status: str,
        error: str | None,
        duration_ms: float,
        edit_lines: int | None = None,
    ) -> None:
        """Log one tool result (the clock advances by its duration); remember ok edits."""
        self.clock.advance(duration_ms)
        self._event(
            "tool_result",
            f"{call_id}-result",
            sample_id=sample_id,
            call_id=call_id,
            status=status,
            error=error,
            duration_ms=round(float(duration_ms), 3),
        )
        if status == "ok" and edit_lines is not None:
            self.edits.append((sample_id, call_id, edit_lines, self.clock.now_ms))

    def user_message(self, text: str, delay_ms: float, next_episode: bool) -> None:
        """The user's message after the current episode (`delay_ms` of thinking later);
        `next_episode`: it starts a new episode of this session (a clarification answer)."""
        self.clock.advance(delay_ms)
        self._event("user_message", f"{self.episode_id}-user", episode_id=self.episode_id, text=text)
        if next_episode:
            self.episode += 1
            self.turn = 0

    def feedback(self, value: float, delay_ms: float, kind: str = "thumbs") -> None:
        """A rating of the current (last) episode."""
        self.clock.advance(delay_ms)
        self._event(
            "feedback", f"{self.episode_id}-feedback", episode_id=self.episode_id, value=float(value), kind=kind
        )

    def edit_outcome(
        self, sample_id: str, call_id: str, proposed: int, surviving: int, at_ms: float, edited_ms: float
    ) -> dict[str, Any]:
        """A late edit outcome at `at_ms` (the clock is not moved: it arrives hours later)."""
        ev = {
            "event_id": f"{call_id}-outcome",
            "type": "edit_outcome",
            "ts": iso(at_ms),
            "session_id": self.session_id,
            "sample_id": sample_id,
            "call_id": call_id,
            "lines_proposed": int(proposed),
            "lines_surviving": int(surviving),
            "observed_after_s": round((at_ms - edited_ms) / 1000.0, 3),
        }
        self.events.append(ev)
        return ev
