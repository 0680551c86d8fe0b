"""The episode runner: a policy works on tasks in sandboxes, turn by turn, and is graded.

What goes in: a `Policy` (token ids in, token ids and logprobs out), the tasks, a `SandboxPool`,
a `RunnerConfig`. What comes out: one `EpisodeResult` per (task, attempt): pass/fail/error from
the hidden tests, counters eval reports, and the session's production events (the `events`
schema `collect` reads), so `simulate` and `eval` run exactly the production harness.

    from rlcycle.agent.runner import RunnerConfig, run_episodes
    with SandboxPool(size=4) as pool:
        results = run_episodes(policy, "ckpt-1a2b", tasks, pool, RunnerConfig(), attempts=2)
    [(r.task_id, r.status, r.end_reason) for r in results]

One *session* is one task attempt: the task's instruction starts it and every model call runs
on one sandbox. A session holds one production *episode* per user request: a clarifying
question (`ask_user`) ends an episode, the user's answer starts the next one (docs/design.md:
an episode is one request and every model call until control goes back to the user).

A turn, per session:
  1. sample: the harness Transcript's prompt ids -> `policy.generate` (batched: one call for
     every session waiting for the model, each prompt with its own seed);
  2. record: the sampled ids are appended to the transcript *as generated* (mask 1), the text
     is parsed strictly (`parse_completion`), a `completion` event logs prompt ids, completion
     ids, the sampler's logprobs and every call, invalid ones included;
  3. act: the valid calls run in the sandbox in order (sessions in parallel threads); invalid
     calls are not run and their parser reason goes back to the model; calls after a terminal
     call are not run;
  4. observe: each result becomes a `tool` message (mask 0: tool output is never trained on)
     and a `tool_result` event.

A session ends at `finish`, at a completion without any tool call (the reply goes to the user,
as in production), at `ask_user` once `max_clarifications` questions were answered, at
`max_turns` model calls, or at `max_total_tokens` sampled tokens (also when the prompt fills the
model's context). Then the hidden tests are copied in and run (`rlcycle.tasks.grade`).

Infrastructure is never the model's fault: when the sandbox breaks (executor dead, grading
could not run in the sandbox), the session is discarded and rerun from the start on a fresh
sandbox, up to `retries` times; after that it is reported with status `error` and *no events*
(so a broken container never becomes training data). A grading error that is not the
sandbox's (the task's own test command is broken) is `error` without a retry.

Determinism: the seed of every sample derives from (seed, task id, attempt, sample index),
the scheduling is lock-step (each step waits for every session's tools), so batches are the
same run after run; see docs/simulate.md for what stays nondeterministic (latencies, ts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from rlcycle.agent.events import SessionLog, SimClock, parse_time_ms
from rlcycle.agent.tools_exec import SandboxBroken, ToolOutcome, execute, not_run
from rlcycle.agent.user import SessionOutcome, SimulatedUser, UserConfig
from rlcycle.config import cfg, check_range
from rlcycle.errors import InputError, RlcycleError
from rlcycle.harness import (
    EDIT_TOOLS,
    ChatRenderer,
    ParsedCompletion,
    ToolCall,
    initial_messages,
    parse_completion,
)
from rlcycle.policy.base import Generation, SamplingParams
from rlcycle.tasks.grade import GradeStatus, grade, prepare_workspace
from rlcycle.tasks.suite import Task


@dataclass
class RunnerConfig:
    """How episodes run: sampling, limits, parallelism, retries, the simulated clock."""

    max_turns: int = cfg(8, help="Model calls per session at most (all its episodes together).")
    max_new_tokens: int = cfg(256, help="Tokens one model call may sample at most.")
    max_total_tokens: int = cfg(8192, help="Tokens a session may sample in all; then it ends.")
    max_prompt_tokens: int = cfg(
        0,
        help="A longer prompt ends the session (max_tokens) instead "
        "of reaching the model; 0: the policy's context length "
        "(`policy.max_length`) when it has one.",
    )
    temperature: float = cfg(1.0, help="Sampling temperature (0: greedy).")
    top_p: float = cfg(1.0, help="Nucleus sampling mass (1: off).")
    tool_timeout_s: float = cfg(
        30.0, help="Seconds a tool call may run in the sandbox (run_tests: at least the task's timeout_s)."
    )
    concurrency: int = cfg(
        4, help="Sessions live at once (capped at the pool's size); the model samples for all of them in one batch."
    )
    retries: int = cfg(1, help="Reruns of a session whose sandbox broke before it is an error.")
    max_clarifications: int = cfg(
        1, help="ask_user questions the user answers per session; the next one ends the session."
    )
    start: str = cfg("2026-12-01T00:00:00Z", help="Simulated clock: when the first session starts (RFC 3339).")
    session_gap_s: float = cfg(60.0, help="Simulated seconds between the starts of two sessions.")
    run_id: str | None = cfg(
        None, help="Prefix of session/episode/sample ids; default: a hash of the policy name, seed and start."
    )

    def validate(self) -> list[str]:
        """Every problem at once."""
        problems = []
        check_range(problems, self, ("max_turns", "max_new_tokens", "max_total_tokens", "concurrency"), ge=1)
        check_range(problems, self, ("retries", "max_clarifications", "max_prompt_tokens"), ge=0)
        check_range(problems, self, ("temperature", "session_gap_s"), ge=0)
        check_range(problems, self, "top_p", gt=0, le=1)
        check_range(problems, self, "tool_timeout_s", gt=0)
        try:
            parse_time_ms(self.start)
        except ValueError:
            problems.append(f"start={self.start!r}: not an RFC 3339 time")
        return problems


@dataclass
class EpisodeResult:
    """One task attempt (a session): outcome, counters and its production events."""

    task_id: str
    cluster: str
    policy: str
    attempt: int
    status: str  # pass / fail / error (error: infrastructure, never the model's fault)
    reward: float  # 1.0 pass, 0.0 otherwise (distill does the real shaping)
    turns: int  # model calls
    n_tool_calls: int
    n_invalid_tool_calls: int
    edited: bool  # any write_file/apply_patch that applied
    asked_clarification: bool  # any valid ask_user call
    tokens: int  # completion tokens sampled
    latency_ms: float  # summed generation latency
    end_reason: str  # finish / ask_user / max_turns / max_tokens / no_tool_call / error
    events: list[dict[str, Any]]  # production events (empty for status error)
    error: str | None = None  # what broke (status error)
    grade_reason: str = ""  # the grader's one line (e.g. "2 test(s) passed")
    episodes: int = 1  # production episodes in the session (1 + answered questions)
    tries: int = 1  # sandboxes used (retries after infrastructure failures + 1)
    index: int = 0  # position in the run's job list (results come back in this order)

    def to_row(self) -> dict[str, Any]:
        """Everything but the events (e.g. a line of a results table)."""
        return {k: v for k, v in self.__dict__.items() if k != "events"}


# --- one session ----------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the runner will do with one completion."""

    sample_id: str
    calls: list[tuple[ToolCall, str]]  # listed calls and their call ids
    run_until: int  # calls[:run_until] are run (or reported invalid); the rest are not run
    terminal: str | None  # the terminal call that stops the run (finish / ask_user)
    end_reason: str | None  # the session ends after this completion
    outcomes: list[ToolOutcome] = field(default_factory=list)


class _Session:
    """One task attempt while it runs. Main thread: sampling and bookkeeping; worker thread:
    everything that touches the sandbox (start, tools, grading)."""

    def __init__(self, index: int, task: Task, attempt: int, ctx: _Context):
        self.index, self.task, self.attempt, self.ctx = index, task, attempt, ctx
        self.tries = 0
        self.result: EpisodeResult | None = None
        self.stack: ExitStack | None = None
        self._reset()

    def _reset(self) -> None:
        c = self.ctx
        self.sandbox: Any = None
        self.transcript: Any = None
        self.rng = random.Random(derive_seed(c.seed, self.task.id, self.attempt, "user"))
        start = c.start_ms + self.index * c.config.session_gap_s * 1000.0
        sid = f"{c.run_id}-{self.task.id}-a{self.attempt}"
        self.log = SessionLog(
            sid,
            c.policy_name,
            SimClock(start),
            c.config.temperature,
            max_new_tokens=c.config.max_new_tokens,
            pair_key=f"s{c.seed}-{self.task.id}-a{self.attempt}",
        )
        self.turns = self.n_calls = self.n_invalid = self.tokens = self.clarifications = 0
        self.latency_ms = 0.0
        self.edited = self.asked = False
        self.plan: _Plan | None = None
        self.grade: Any = None
        self.waiting = False  # for the model

    # worker thread ------------------------------------------------------------------------
    def begin(self) -> None:
        """Take a sandbox, copy the repo in, render the first prompt."""
        self.stack = ExitStack()
        try:
            self.sandbox = self.stack.enter_context(self.ctx.pool.acquire())
            prepare_workspace(self.task, self.sandbox)
        except RlcycleError as e:
            raise SandboxBroken(f"could not prepare a sandbox: {e.message}") from None
        first = self.task.instruction
        if self.ctx.simulate_user:  # a simulated user may write less than the task says (agent/user.py)
            brief_rng = random.Random(derive_seed(self.ctx.seed, self.task.id, self.attempt, "first_message"))
            first = self.ctx.user.first_message(self.task, brief_rng)
        self.transcript = self.ctx.renderer.new_transcript(initial_messages(first))
        self.waiting = True

    def act(self) -> None:
        """Run the planned calls; when the session ends, grade it and give the sandbox back."""
        plan = self.plan
        assert plan is not None
        timeout = self.ctx.config.tool_timeout_s
        for i, (call, _) in enumerate(plan.calls):
            if i < plan.run_until:
                plan.outcomes.append(execute(call, self.sandbox, self.task, timeout))
            else:
                plan.outcomes.append(not_run(call, plan.terminal or "a terminal call"))
        if plan.end_reason is not None:
            self.grade = grade(self.task, self.sandbox)
            if self.grade.status is GradeStatus.ERROR and (
                self.sandbox.broken or self.grade.reason.startswith("sandbox:")
            ):
                raise SandboxBroken(f"grading: {self.grade.reason}")
            self.release()

    def release(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            stack.close()

    # main thread --------------------------------------------------------------------------
    def params(self) -> SamplingParams:
        c = self.ctx.config
        budget = min(c.max_new_tokens, c.max_total_tokens - self.tokens)
        seed = derive_seed(self.ctx.seed, self.task.id, self.attempt, self.turns)
        return SamplingParams(max_new_tokens=max(1, budget), temperature=c.temperature, top_p=c.top_p, seed=seed)

    def on_generation(self, prompt: list[int], gen: Generation) -> None:
        """Record a sample, parse it, and plan what happens next."""
        self.waiting = False
        if not gen.token_ids:  # the prompt filled the model's context: nothing was sampled
            self.plan = _Plan("", [], 0, None, "max_tokens")
            return
        turn = self.transcript.add_completion(gen.token_ids, gen.logprobs, gen.finish_reason)
        parsed = parse_completion(turn.text)
        self.turns += 1
        self.tokens += len(gen.token_ids)
        self.latency_ms += gen.latency_ms
        self.n_calls += parsed.n_calls
        self.n_invalid += parsed.n_invalid
        mask = self.transcript.mask[turn.prompt_len : turn.prompt_len + len(gen.token_ids)]
        sample_id, call_ids = self.log.completion(
            prompt,
            gen.token_ids,
            gen.logprobs,
            turn.text,
            [(c.name, c.arguments_json) for c in parsed.calls],
            gen.latency_ms,
            mask,
        )
        self.plan = self._plan(sample_id, parsed, call_ids)

    def _plan(self, sample_id: str, parsed: ParsedCompletion, call_ids: list[str]) -> _Plan:
        calls = list(zip(parsed.calls, call_ids, strict=True))
        stop = next((i for i, c in enumerate(parsed.calls) if c.valid and c.name in ("finish", "ask_user")), None)
        terminal = parsed.calls[stop].name if stop is not None else None
        c = self.ctx.config
        end: str | None = None
        if terminal == "finish":
            end = "finish"
        elif terminal == "ask_user":
            self.asked = True
            if self.clarifications >= c.max_clarifications:
                end = "ask_user"
        elif not parsed.calls:
            end = "no_tool_call"
        if end is None and self.turns >= c.max_turns:
            end = "max_turns"
        if end is None and self.tokens >= c.max_total_tokens:
            end = "max_tokens"
        run_until = len(calls) if stop is None else stop + 1
        return _Plan(sample_id, calls, run_until, terminal, end)

    def observe(self) -> None:
        """Log the tool results and feed them (and a clarification answer) to the transcript."""
        plan = self.plan
        assert plan is not None
        for (call, call_id), out in zip(plan.calls, plan.outcomes, strict=True):
            self.log.tool_result(
                plan.sample_id,
                call_id,
                out.status,
                out.error,
                out.duration_ms,
                out.lines_proposed if call.name in EDIT_TOOLS else None,
            )
            self.edited |= out.status == "ok" and out.edited
        if plan.end_reason is not None:
            return
        # One tool message per call in call order; the terminal call itself gets none.
        messages = [
            {"role": "tool", "content": self.ctx.renderer.clip_tool_output(out.output)}
            for (call, _), out in zip(plan.calls, plan.outcomes, strict=True)
            if not (call.valid and call.name in ("finish", "ask_user"))
        ]
        if plan.terminal == "ask_user":
            self.clarifications += 1
            answer, _ = self.ctx.user.answer(self.task, self.rng)
            messages.append({"role": "user", "content": answer})
            self.log.user_message(answer, self.ctx.user.think_ms(self.rng), next_episode=True)
        self.transcript.add_messages(messages)
        self.waiting = True

    def finish(self) -> EpisodeResult:
        """The result of a graded session, with the user's late signals when simulated."""
        plan = self.plan
        assert plan is not None and self.grade is not None
        status = self.grade.status.value
        if status == "error":  # grading could not judge (e.g. the task's test command is broken)
            return self._result("error", "error", f"grading: {self.grade.reason}")
        if self.ctx.simulate_user:
            self._react(status == "pass", plan.end_reason or "finish")
        return self._result(status, plan.end_reason or "finish", None)

    def _react(self, passed: bool, end_reason: str) -> None:
        user, rng, log = self.ctx.user, self.rng, self.log
        failure = self.grade.output if self.grade is not None else ""
        reaction = user.react(SessionOutcome(passed, self.edited, end_reason, failure), rng)
        end_ms = log.clock.now_ms
        if reaction.followup is not None:
            log.user_message(reaction.followup, user.think_ms(rng), next_episode=False)
        if reaction.feedback is not None:
            log.feedback(reaction.feedback, user.think_ms(rng) / 4)
        for sample_id, call_id, lines, edited_ms in log.edits:
            surviving = user.surviving(lines, passed, rng)
            log.edit_outcome(sample_id, call_id, lines, surviving, end_ms + user.edit_delay_ms(rng), edited_ms)

    def _result(self, status: str, end_reason: str, error: str | None) -> EpisodeResult:
        t = self.task
        return EpisodeResult(
            task_id=t.id,
            cluster=t.cluster,
            policy=self.ctx.policy_name,
            attempt=self.attempt,
            status=status,
            reward=1.0 if status == "pass" else 0.0,
            turns=self.turns,
            n_tool_calls=self.n_calls,
            n_invalid_tool_calls=self.n_invalid,
            edited=self.edited,
            asked_clarification=self.asked,
            tokens=self.tokens,
            latency_ms=self.latency_ms,
            end_reason=end_reason,
            events=[] if status == "error" else self.log.events,
            error=error,
            grade_reason=self.grade.reason if self.grade is not None else "",
            episodes=self.log.episode + 1,
            tries=self.tries + 1,
            index=self.index,
        )

    def broke(self, reason: str) -> None:
        """The sandbox failed: start over on a fresh one, or give up with status error."""
        self.release()  # a broken sandbox is replaced by the pool, never handed out again
        self.tries += 1
        if self.tries > self.ctx.config.retries:
            self.result = self._result("error", "error", f"infrastructure: {reason}")
            self.result.tries = self.tries  # every one of them broke
        else:
            self._reset()


# --- many sessions, lock-step ----------------------------------------------------------------


@dataclass
class _Context:
    """What every session of a run shares."""

    policy: Any
    policy_name: str
    pool: Any
    renderer: ChatRenderer
    config: RunnerConfig
    seed: int
    simulate_user: bool
    user: SimulatedUser
    run_id: str
    start_ms: float


def run_episodes(
    policy: Any,
    policy_name: str,
    tasks: list[Task],
    pool: Any,
    config: RunnerConfig,
    attempts: int = 1,
    seed: int = 0,
    simulate_user: bool = False,
    *,
    n_episodes: int | None = None,
    renderer: ChatRenderer | None = None,
    user_config: UserConfig | None = None,
    on_result: Callable[[EpisodeResult], None] | None = None,
    only: Sequence[int] | None = None,
) -> list[EpisodeResult]:
    """Run every task `attempts` times (attempt-major: all tasks once, then again ...).

    `n_episodes` runs exactly that many sessions cycling over the tasks instead (attempt =
    i // len(tasks)). `renderer` defaults to a ChatRenderer of `policy.tokenizer`.
    `simulate_user` adds the user's follow-up, thumbs and edit outcomes to the events
    (clarifying questions are answered either way). Results come in job order; `on_result`
    sees each one as it is done. A policy that raises stops the run (sandboxes are returned).
    `only` runs just those positions of the job list, a shard of a larger run (the Ray
    executor's): ids, seeds and the simulated clock are the full run's, and the results are
    those positions' in the order given."""
    problems = config.validate() + (user_config.validate() if user_config else [])
    if problems:
        raise InputError("bad runner config: " + "; ".join(problems), hint="see RunnerConfig")
    if not tasks:
        raise InputError("no tasks to run", hint="load a suite with rlcycle.tasks.load_suite")
    if hasattr(policy, "bind_tasks"):
        policy.bind_tasks(tasks)  # scripted policies that look up each task's script
    total = n_episodes if n_episodes is not None else attempts * len(tasks)
    order = list(range(total)) if only is None else list(only)
    if len(set(order)) != len(order) or any(not 0 <= i < total for i in order):
        raise InputError(
            f"job positions {order[:20]}{' ...' if len(order) > 20 else ''}: each must be in "
            f"0..{total - 1}, at most once",
            hint="a shard names distinct positions of the run",
        )
    jobs = [(tasks[i % len(tasks)], i // len(tasks)) for i in order]
    ctx = _Context(
        policy,
        policy_name,
        pool,
        renderer or _renderer(policy),
        config,
        seed,
        simulate_user,
        SimulatedUser(user_config),
        config.run_id or run_id_for(policy_name, seed, config, tasks, simulate_user, user_config),
        parse_time_ms(config.start),
    )
    # More live sessions than sandboxes would block a step on `acquire` while the holders
    # wait for that very step.
    width = max(1, min(config.concurrency, getattr(pool, "size", config.concurrency)))
    results: list[EpisodeResult | None] = [None] * len(jobs)
    slot: dict[int, int] = {}  # job position -> place in `results`
    live: list[_Session] = []
    next_job = 0
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="rlcycle-episode") as workers:
        try:
            while next_job < len(jobs) or live:
                while next_job < len(jobs) and len(live) < width:
                    task, attempt = jobs[next_job]
                    live.append(_Session(order[next_job], task, attempt, ctx))
                    slot[order[next_job]] = next_job
                    next_job += 1
                _sandbox_step(live, workers)
                for s in [s for s in live if s.result is not None]:
                    live.remove(s)  # and with it the transcript: memory stays ~ `width` sessions
                    results[slot.pop(s.index)] = s.result
                    if on_result is not None:
                        on_result(s.result)  # type: ignore[arg-type]
                _model_step(ctx, [s for s in live if s.waiting])
        finally:
            for s in live:
                s.release()
    return results  # type: ignore[return-value]


def _sandbox_step(live: list[_Session], workers: ThreadPoolExecutor) -> None:
    """Everything that touches a sandbox, for every live session at once; then bookkeeping."""
    todo: list[tuple[_Session, Any]] = []
    for s in live:
        if s.transcript is None:
            todo.append((s, workers.submit(s.begin)))
        elif s.plan is not None:
            todo.append((s, workers.submit(s.act)))
    wait([f for _, f in todo])  # all of them, even when one failed: nothing runs behind us
    for s, future in todo:
        err = future.exception()
        if isinstance(err, SandboxBroken):
            s.broke(str(err))
        elif err is not None:
            raise err
        elif s.plan is not None:
            s.observe()
            if s.plan.end_reason is not None:
                s.result = s.finish()
            s.plan = None


def _model_step(ctx: _Context, waiting: list[_Session]) -> None:
    """One batched `generate` call for every session waiting for the model."""
    prompts = [s.transcript.prompt_ids() for s in waiting]
    limit = ctx.config.max_prompt_tokens or getattr(ctx.policy, "max_length", None)
    if limit:  # a prompt that leaves no room to sample ends its session (never a server error)
        full = [(s, p) for s, p in zip(waiting, prompts, strict=True) if len(p) >= limit]
        for s, p in full:
            s.on_generation(p, Generation([], [], "length", 0.0))
        waiting = [s for s in waiting if all(s is not f for f, _ in full)]
        prompts = [p for p in prompts if len(p) < limit]
    if not waiting:
        return
    gens = ctx.policy.generate(prompts, [s.params() for s in waiting])
    if len(gens) != len(prompts):
        raise RlcycleError(
            f"the policy returned {len(gens)} generations for {len(prompts)} prompts",
            hint="a Policy returns one Generation per prompt, in order",
        )
    for s, prompt, gen in zip(waiting, prompts, gens, strict=True):
        s.on_generation(prompt, gen)


# --- helpers ----------------------------------------------------------------------------------


def _renderer(policy: Any) -> ChatRenderer:
    tok = getattr(policy, "tokenizer", None)
    if tok is None:
        raise InputError(
            f"policy {getattr(policy, 'name', policy)!r} has no tokenizer to render prompts with",
            hint="pass renderer=ChatRenderer.from_pretrained(DIR) (for a server: the served "
            "model's tokenizer directory, e.g. `rlcycle simulate --tokenizer DIR`)",
        )
    return ChatRenderer(tok)


def run_id_for(
    policy_name: str,
    seed: int,
    config: RunnerConfig,
    tasks: Sequence[Task],
    simulate_user: bool,
    user_config: UserConfig | None,
) -> str:
    """The run id `run_episodes` uses when the config names none."""
    user = dataclasses.asdict(user_config or UserConfig()) if simulate_user else None
    return default_run_id(policy_name, seed, config, tasks, user)


def derive_seed(seed: int, *parts: Any) -> int:
    """A 63-bit seed from a base seed and labels (stable across runs and platforms)."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def default_run_id(
    policy_name: str, seed: int, config: RunnerConfig, tasks: Sequence[Task] = (), extra: Any = None
) -> str:
    """`sim-<8 hex>` from everything that shapes the events: the policy name, the seed, the
    config (but its concurrency), the tasks and `extra` (e.g. the user's config). A rerun of
    the same thing writes the same ids, so collect drops the copies; change anything and the
    ids change, so two different runs never collide."""
    conf = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("concurrency", "run_id")}
    key = json.dumps(
        [policy_name, seed, conf, [(t.id, t.instruction) for t in tasks], extra], sort_keys=True, default=str
    )
    return "sim-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def summarize(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    """Rates over results: pass rate (errors excluded), invalid calls, clarifications, latency."""
    scored = [r for r in results if r.status != "error"]
    calls = sum(r.n_tool_calls for r in scored)
    samples = sum(r.turns for r in scored)
    rate = lambda n, d: n / d if d else math.nan  # noqa: E731
    ends: dict[str, int] = {}
    for r in results:
        ends[r.end_reason] = ends.get(r.end_reason, 0) + 1
    return {
        "episodes": len(results),
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(r.status == "fail" for r in results),
        "errors": len(results) - len(scored),
        "pass_rate": rate(sum(r.status == "pass" for r in scored), len(scored)),
        "invalid_call_rate": rate(sum(r.n_invalid_tool_calls for r in scored), calls),
        "clarification_rate": rate(sum(r.asked_clarification for r in scored), len(scored)),
        "edit_rate": rate(sum(r.edited for r in scored), len(scored)),
        "samples": samples,
        "tool_calls": calls,
        "tokens": sum(r.tokens for r in scored),
        "mean_latency_ms": rate(sum(r.latency_ms for r in scored), samples),
        "end_reasons": dict(sorted(ends.items())),
    }
