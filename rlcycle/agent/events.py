"""Production events, exactly the `events` schema that `collect` reads: the one writer of
`completion` and `tool_result` events, and an agent session as events (the simulator's log).

The writer (`completion_event`, `tool_result_event`, `event`) is used by both producers: the
simulator's `SessionLog` below and the gateway (`rlcycle.gateway.chat.completion_events`). In:
what one model call was given and produced (`Sample`), what served it (`Served`: checkpoint and
sampling, and for the gateway `Drawn`: its whole sampling record and where the completion
ended) and each producer's own fields (`GatewayCall`; the simulator's `pair_key`, `loss_mask`).
Out: an event dict whose keys come in a fixed order (the logs are JSON written from dicts, so
the order is part of the bytes on disk). Every field that names what produced the event comes
in through the arguments; the writer derives ids (`call_id_of`) and formats (`iso`), never identity.

`SessionLog`: what goes in is what happened in one session (a task attempt): each model sample
with its parsed tool calls and their outcomes, the user's messages, and the simulated user's
late signals. What comes out: event dicts (one JSON object per line of an events log), in
causal order:

    completion   episode_id, sample_id, turn, policy_version, the prompt (prompt_parent,
                 prompt_shared, prompt_added: stored against the session's previous sample,
                 `prompt_fields`), completion_ids,
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rlcycle import prompts


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


# --- the writer: one place builds every completion and tool_result event -----------------------


def call_id_of(sample_id: str, index: int) -> str:
    """The id of the `index`-th tool call of a sample (both producers name calls this way)."""
    return f"{sample_id}-c{index}"


def event(type_: str, event_id: str, ts_ms: float, session_id: str, **fields: Any) -> dict[str, Any]:
    """Any event: the common header (`event_id`, `type`, `ts`, `session_id`), then `fields` in order."""
    return {"event_id": event_id, "type": type_, "ts": iso(ts_ms), "session_id": session_id, **fields}


@dataclass(frozen=True)
class Sample:
    """One model call: where it sits in its session, what it was given and what it produced."""

    session_id: str
    episode_id: str
    sample_id: str
    turn: int  # index of the call in its episode
    ts_ms: float  # when the completion was done (epoch ms)
    prompt_ids: Sequence[int]  # exactly the ids the model was given
    completion_ids: Sequence[int]  # exactly the ids it sampled (kept ones, after any cut)
    logprobs: Sequence[float]  # per completion id, from the server that sampled
    text: str  # the completion as text (the decoded kept ids)
    calls: Sequence[tuple[str | None, str]]  # (name, arguments string) per listed call, invalid ones too
    latency_ms: float


@dataclass(frozen=True)
class Served:
    """What drew a completion: the checkpoint that answered, its temperature and token limit."""

    policy_version: str  # the checkpoint id that answered (never an alias)
    temperature: float
    max_new_tokens: int | None  # the per-call token limit (Dr. GRPO's M in train)


@dataclass(frozen=True)
class Drawn:
    """The gateway's whole record of how a completion was drawn and where it ended.

    `greedy`, `top_p` and `seed` are logged beside `sampling` (collect carries them into
    trajectories; train drops greedy and truncated rows from the importance-corrected update)."""

    greedy: bool
    top_p: float
    seed: int | None
    sampling: Mapping[str, Any]  # every request parameter that shaped the distribution
    finish_reason: str  # the backend's: stop / length
    cut: Mapping[str, Any] | None  # why the ids were cut short (a stop string, one call), or None

    def __post_init__(self) -> None:
        # The event names one distribution: the lifted fields may not contradict the record.
        for key in ("greedy", "top_p", "seed"):
            if key in self.sampling and self.sampling[key] != getattr(self, key):
                raise ValueError(f"Drawn.{key}={getattr(self, key)!r} but sampling[{key!r}]={self.sampling[key]!r}")


@dataclass(frozen=True)
class GatewayCall:
    """What the gateway knows of the request a completion answered."""

    choice_index: int  # which of the request's n choices
    id_rules: Mapping[str, str]  # which rule gave the session and episode ids
    parent_sample_id: str | None  # the earlier answer this request continues
    api: str  # chat.completions / responses
    request_id: str
    served_as: str  # the alias (role) whose checkpoint answered: production / candidate
    n_unlisted_calls: int  # calls the parser found outside the listed tools


@dataclass(frozen=True)
class Parent:
    """The earlier sample of the session a prompt is stored against, and that sample's context
    (its prompt and completion ids): the writer keeps only what the prompt adds to it."""

    sample_id: str
    context: Sequence[int]


def prompt_fields(prompt_ids: Sequence[int], parent: Parent | None = None) -> dict[str, Any]:
    """The prompt of a completion event, as it is recorded (docs/design.md, "Prompts stored once").

    This is the one place the prompt is laid out; both producers reach it through
    `completion_event`. With a parent, the prompt is stored as `prompt_parent` (its sample id),
    `prompt_shared` (how many leading tokens of its context the prompt keeps) and
    `prompt_added` (the rest); without one, or when nothing is shared, it is a root whose
    `prompt_added` is the whole prompt. `prompt_ids` is never written: readers rebuild it
    exactly (rlcycle/prompts.py)."""
    shared, added = prompts.delta(prompt_ids, None if parent is None else parent.context)
    return {
        "prompt_parent": parent.sample_id if parent is not None and shared else None,
        "prompt_shared": shared,
        "prompt_added": added,
    }


def completion_event(
    sample: Sample,
    served: Served,
    drawn: Drawn | None = None,
    call: GatewayCall | None = None,
    *,
    pair_key: str | None = None,
    loss_mask: Sequence[int] | None = None,
    parent: Parent | None = None,
) -> dict[str, Any]:
    """The `completion` event of one sample (docs/design.md, "Events"), keys in this order:

    header, episode_id, sample_id, turn, policy_version, the prompt (`prompt_fields`), the
    completion (ids, logprobs, text, tool_calls, latency_ms), temperature, max_new_tokens; then,
    each only when given: `drawn` (greedy, top_p, seed, sampling, finish_reason, cut), `call`
    (the gateway's request fields), `pair_key`, `loss_mask` (the simulator's extensions)."""
    s = sample
    fields: dict[str, Any] = {
        "episode_id": s.episode_id,
        "sample_id": s.sample_id,
        "turn": s.turn,
        "policy_version": served.policy_version,
        **prompt_fields(s.prompt_ids, parent),
        "completion_ids": list(s.completion_ids),
        "completion_logprobs": list(s.logprobs),
        "completion_text": s.text,
        "tool_calls": [
            {"call_id": call_id_of(s.sample_id, i), "name": name, "arguments": args}
            for i, (name, args) in enumerate(s.calls)
        ],
        "latency_ms": round(float(s.latency_ms), 3),
        "temperature": served.temperature,
        "max_new_tokens": served.max_new_tokens,
    }
    if drawn is not None:
        fields.update(
            greedy=drawn.greedy,
            top_p=drawn.top_p,
            seed=drawn.seed,
            sampling=drawn.sampling,
            finish_reason=drawn.finish_reason,
            cut=drawn.cut,
        )
    if call is not None:
        fields.update(vars(call))  # the dataclass fields, in their declared order
    if pair_key is not None:
        fields["pair_key"] = pair_key
    if loss_mask is not None:
        fields["loss_mask"] = list(loss_mask)
    return event("completion", f"{s.sample_id}-completion", s.ts_ms, s.session_id, **fields)


def tool_result_event(
    session_id: str,
    ts_ms: float,
    sample_id: str,
    call_id: str,
    status: str,
    error: str | None,
    duration_ms: float,
) -> dict[str, Any]:
    """The `tool_result` event of one call: status ok / error / invalid / timeout."""
    return event(
        "tool_result",
        f"{call_id}-result",
        ts_ms,
        session_id,
        sample_id=sample_id,
        call_id=call_id,
        status=status,
        error=error,
        duration_ms=round(float(duration_ms), 3),
    )


# --- the simulator's session log ---------------------------------------------------------------


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
    last: Parent | None = None  # the session's previous sample: the next prompt is stored against it

    @property
    def episode_id(self) -> str:
        return f"{self.session_id}-e{self.episode}"

    def _event(self, type_: str, event_id: str, **fields: Any) -> dict[str, Any]:
        return self._append(event(type_, event_id, self.clock.now_ms, self.session_id, **fields))

    def _append(self, ev: dict[str, Any]) -> dict[str, Any]:
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
        self.clock.advance(latency_ms)
        sample = Sample(
            self.session_id,
            self.episode_id,
            sample_id,
            self.turn,
            self.clock.now_ms,
            prompt_ids,
            completion_ids,
            logprobs,
            text,
            calls,
            latency_ms,
        )
        served = Served(self.policy_version, self.temperature, self.max_new_tokens)
        self._append(completion_event(sample, served, pair_key=self.pair_key, loss_mask=loss_mask, parent=self.last))
        self.last = Parent(sample_id, [*prompt_ids, *completion_ids])
        self.turn += 1
        return sample_id, [call_id_of(sample_id, i) for i in range(len(calls))]

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
        self._append(
            tool_result_event(self.session_id, self.clock.now_ms, sample_id, call_id, status, error, duration_ms)
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
        return self._append(
            event(
                "edit_outcome",
                f"{call_id}-outcome",
                at_ms,
                self.session_id,
                sample_id=sample_id,
                call_id=call_id,
                lines_proposed=int(proposed),
                lines_surviving=int(surviving),
                observed_after_s=round((at_ms - edited_ms) / 1000.0, 3),
            )
        )
