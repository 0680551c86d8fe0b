"""Scripted policies for tests, benches and demos; each implements `rlcycle.policy.Policy`.

What goes in: prompts as token ids (rendered by the harness), like any policy. What comes out:
`Generation`s whose `token_ids` are the tokenizer's encoding of a scripted completion text plus
the stop token `<|im_end|>` (real ids the harness decodes and parses like a model's), with

    logprobs      0.0 for every token: a scripted policy is deterministic, so each emitted
                  token has probability 1 under it (log 1 = 0). Training on these samples
                  with importance ratios would be meaningless; they exist to exercise the
                  pipeline, and their policy_version (`scripted:*`) says so.
    finish_reason "stop"
    latency_ms    measured (the time to encode the text, well under a millisecond)

`SamplingParams` are ignored, max_new_tokens included: the reference policy must be able to
write a whole file whatever the runner's per-call limit.

Scripts are stateless: the policy reads the conversation off the prompt, so it works with any
batching, interleaving and retry the runner does. The *step* of a prompt is the number of
assistant messages already in it (`<|im_start|>assistant` occurrences, minus the generation
prompt); the *task* is found by the text of the first user message. Both need a ChatML template
(rlcycle's built-in one, or any `<|im_start|>role` template).

    ReplayPolicy(tok, ["<tool_call>...</tool_call>", ...])    step k -> completions[k]
    ReplayPolicy(tok, {"instruction text": [...], ...})       per task, by its instruction
    ReferencePolicy(tok, tasks)                               step k -> k-th call of the task's
                                                              reference script (rlcycle.tasks.reference)
    DoNothingPolicy(tok)                                      always `finish` at once

When a script runs out, the policy calls `finish`. `make("scripted:reference", tokenizer)` is
what `--policy scripted:reference` resolves to; the reference policy learns the tasks when the
runner calls its `bind_tasks(tasks)` (run_episodes does, for any policy that has one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlcycle import resources
from rlcycle.errors import InputError
from rlcycle.harness.render import ZWSP
from rlcycle.policy.base import FINISH_STOP, Generation, SamplingParams
from rlcycle.tasks.reference import ScriptedCall, reference_calls
from rlcycle.tasks.suite import Task

DEFAULT_TOKENIZER = resources.tokenizer()
ASSISTANT_START = "<|im_start|>assistant"
USER_START = "<|im_start|>user\n"
END = "<|im_end|>"
REFERENCE, NOTHING, REPLAY = "scripted:reference", "scripted:nothing", "scripted:replay"
CLARIFY = "scripted:clarify"  # the reference, but it asks a clarifying question on *every* task
DONE_SUMMARY = "Nothing left to do."


def call_text(call: ScriptedCall, note: str | None = None) -> str:
    """One completion in the harness format: a short note, then the tool call."""
    body = json.dumps(call.to_dict(), ensure_ascii=False)
    return f"{note or f'Next: {call.name}.'}\n<tool_call>{body}</tool_call>"


def finish_text(summary: str = DONE_SUMMARY) -> str:
    return call_text(ScriptedCall("finish", {"summary": summary}), "Done.")


class _Script:
    """Shared plumbing: text -> Generation, and reading the step and task off a prompt."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = load_tokenizer(tokenizer)
        vocab = self.tokenizer.get_added_vocab()
        stop = vocab.get(END, self.tokenizer.eos_token_id)
        if stop is None:
            raise InputError(
                "the tokenizer has neither <|im_end|> nor an EOS token",
                hint=f"use a ChatML tokenizer such as {DEFAULT_TOKENIZER}",
            )
        self.stop_id = int(stop)

    def generation(self, text: str) -> Generation:
        start = time.perf_counter()
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.stop_id]
        ms = (time.perf_counter() - start) * 1000.0
        return Generation(ids, [0.0] * len(ids), FINISH_STOP, ms)

    def read_prompt(self, prompt: list[int]) -> tuple[int, str]:
        """(step, first user message) of a rendered prompt."""
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        step = max(0, text.count(ASSISTANT_START) - 1)
        start = text.find(USER_START)
        if start < 0:
            return step, ""
        start += len(USER_START)
        end = text.find(END, start)
        user = text[start:] if end < 0 else text[start:end]
        return step, user.replace(ZWSP, "")  # undo the harness's neutralisation


class ReplayPolicy:
    """Replays fixed completion texts, by step (and by task instruction when given a mapping)."""

    def __init__(self, tokenizer: Any, completions: Sequence[str] | Mapping[str, Sequence[str]], name: str = REPLAY):
        self._s = _Script(tokenizer)
        self.tokenizer = self._s.tokenizer
        self.name = name
        if isinstance(completions, Mapping):
            self._by_task = {k.replace(ZWSP, ""): list(v) for k, v in completions.items()}
            self._all: list[str] | None = None
        else:
            self._by_task, self._all = {}, list(completions)

    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        out = []
        for p in prompts:
            step, user = self._s.read_prompt(p)
            script = self._all if self._all is not None else self._by_task.get(user, [])
            out.append(self._s.generation(script[step] if step < len(script) else finish_text()))
        return out

    def close(self) -> None:
        pass


class ReferencePolicy:
    """Emits each task's reference solution, one tool call per completion."""

    def __init__(self, tokenizer: Any, tasks: Sequence[Task] = (), name: str = REFERENCE, always_ask: bool = False):
        self._s = _Script(tokenizer)
        self.tokenizer = self._s.tokenizer
        self.name = name
        # always_ask: the clarification reward hack (docs/design.md) as a policy — it solves what the
        # reference solves but first asks a question, even when the task is clear.
        self.always_ask = always_ask
        self._calls: dict[str, list[ScriptedCall]] = {}
        self.bind_tasks(tasks)

    def bind_tasks(self, tasks: Sequence[Task]) -> None:
        """Learn the reference scripts of `tasks` (keyed by instruction)."""
        for task in tasks:
            calls = reference_calls(task)
            if self.always_ask and not any(c.name == "ask_user" for c in calls):
                calls = [
                    ScriptedCall("ask_user", {"question": "Before I change anything: what exactly do you want?"}),
                    *calls,
                ]
            key = task.instruction.replace(ZWSP, "")
            if key in self._calls and self._calls[key] != calls:
                raise InputError(
                    f"task {task.id}: another task has the same instruction, so a scripted "
                    "policy cannot tell them apart",
                    hint="make task instructions unique",
                )
            self._calls[key] = calls

    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        out = []
        for p in prompts:
            step, user = self._s.read_prompt(p)
            calls = self._calls.get(user)
            if calls is None:
                text = finish_text("I do not know this task.")
            elif step < len(calls):
                text = call_text(calls[step])
            else:
                text = finish_text()
            out.append(self._s.generation(text))
        return out

    def close(self) -> None:
        pass


class DoNothingPolicy:
    """Calls `finish` at once, on every task."""

    def __init__(self, tokenizer: Any, name: str = NOTHING):
        self._s = _Script(tokenizer)
        self.tokenizer = self._s.tokenizer
        self.name = name

    def generate(self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        return [self._s.generation(finish_text("I left the code as it is.")) for _ in prompts]

    def close(self) -> None:
        pass


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as given, or loaded from a directory (default: sample_data/tokenizer)."""
    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        return tokenizer
    from transformers import AutoTokenizer

    path = Path(tokenizer) if tokenizer is not None else DEFAULT_TOKENIZER
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise InputError(
            f"cannot load a tokenizer from {path}: {e}", hint="pass --tokenizer DIR (a model or tokenizer directory)"
        ) from None


def make(ref: str, tokenizer: Any = None, tasks: Sequence[Task] = ()) -> Any:
    """The scripted policy `ref` names: scripted:reference or scripted:nothing."""
    if ref == REFERENCE:
        return ReferencePolicy(tokenizer, tasks)
    if ref == NOTHING:
        return DoNothingPolicy(tokenizer)
    if ref == CLARIFY:
        return ReferencePolicy(tokenizer, tasks, name=CLARIFY, always_ask=True)
    raise InputError(f"unknown scripted policy {ref!r}", hint=f"use {REFERENCE}, {NOTHING} or {CLARIFY}")
