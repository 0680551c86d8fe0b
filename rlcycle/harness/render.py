"""Conversations to token ids, incrementally and token-exactly.

What goes in: a tokenizer (HF) and chat messages `{"role": system|user|assistant|tool,
"content": str}`. What comes out: token ids, and for an episode a `Transcript` that holds the
ids with a parallel loss mask and behaviour logprobs.

The one rule (docs/design.md: train must never re-tokenise what was sampled): the prompt of turn k+1
is *exactly*

    prompt_k + completion_k + ids(closing of the assistant message + tool results + generation prompt)

where `completion_k` are the sampled ids as the policy returned them (never decoded and
re-encoded) and the appended ids come from tokenising only the new text. The mask is 1 on
sampled tokens and 0 everywhere else (system, user, tool output, template glue).

How the new text is found, for any template: render the whole conversation as text before and
after the new messages and take the difference; the template must extend, never rewrite, what
it rendered before (`startswith` is checked; a template that re-renders history, e.g. one that
drops earlier reasoning, raises an RlcycleError naming the fix). The appended text always starts
right after an added token (the sampled stop token, or `<|im_end|>` when the completion was cut
off), and the tokenizer splits on added tokens first, so tokenising the piece alone gives the
same ids as tokenising the whole conversation would there. Hence, for completions whose ids are
what the tokenizer would produce for their text, incremental ids == `render(messages)`
(tested); for any other completion only the sampled span differs, by design.

Template choice: the model's own chat template when it references `tools` (detected from the
Jinja AST), else `prompt.BUILTIN_CHAT_TEMPLATE` (ChatML with a `# Tools` system section and
`tool` messages wrapped in `<tool_response>`). Both receive the same `tools` list. For tools that
are not the harness's own, the built-in template also renders each argument's description and
the `required` list (`tool_details`; see prompt.py): the harness's own prompts stay as they were.

User and tool text is *neutralised*: an added-token string inside it (a file that contains
`<|im_end|>` or `</tool_response>`) gets a zero-width space after its first character, so
text from outside can never forge the conversation's structure. Tool outputs longer than
`max_tool_output_chars` keep their head and tail around an omission marker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcycle.errors import InputError, RlcycleError
from rlcycle.harness.prompt import BUILTIN_CHAT_TEMPLATE
from rlcycle.harness.tools import TOOLS, ToolSpec, openai_tools

ZWSP = "\u200b"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
NEUTRALISED_ROLES = ("user", "tool")


def supports_tools(template: str | None) -> bool:
    """True when a Jinja chat template reads the `tools` variable."""
    if not template:
        return False
    try:
        import jinja2
        from jinja2 import meta

        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except Exception:  # a template jinja2 cannot parse alone (custom tags): fall back to text
        return re.search(r"\btools\b", template) is not None


def _model_template(tokenizer: Any) -> str | None:
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):  # named templates (older transformers): prefer the tool one
        tpl = tpl.get("tool_use") or tpl.get("default")
    return tpl


class ChatRenderer:
    """Renders chat messages for one tokenizer; the factory of `Transcript`s.

    template: "auto" (model's template if it supports tools, else built-in), "builtin",
    "model" (the model's, even without tool support), or a Jinja template string.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: tuple[ToolSpec, ...] = TOOLS,
        template: str = "auto",
        max_tool_output_chars: int = 8_000,
        tool_details: bool | None = None,
    ):
        self.tokenizer = tokenizer
        self.tools = tools
        self.tool_defs = openai_tools(tools)
        # The built-in template's full argument schemas and `required` lists: on for tools that are
        # not the harness's own (None = decide so), so rlcycle's own prompts never change.
        own = [t.openai() for t in TOOLS]
        self.tool_details = any(d not in own for d in self.tool_defs) if tool_details is None else tool_details
        self.max_tool_output_chars = max_tool_output_chars
        model_tpl = _model_template(tokenizer)
        if template == "auto":
            self.uses_model_template = supports_tools(model_tpl)
            self.template = model_tpl if self.uses_model_template else BUILTIN_CHAT_TEMPLATE
        elif template == "builtin":
            self.uses_model_template, self.template = False, BUILTIN_CHAT_TEMPLATE
        elif template == "model":
            if not model_tpl:
                raise InputError("the tokenizer has no chat template", hint="use template='builtin'")
            self.uses_model_template, self.template = True, model_tpl
        else:
            self.uses_model_template, self.template = False, template
        vocab = tokenizer.get_added_vocab()
        self.stop_token_ids: tuple[int, ...] = tuple(
            sorted(
                {vocab[t] for t in STOP_TOKENS if t in vocab}
                | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
            )
        )
        added = sorted((t for t in vocab if len(t) > 1), key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, added))) if added else None

    @classmethod
    def from_pretrained(cls, path: str | Path, **kw: Any) -> ChatRenderer:
        """A renderer for the tokenizer saved in a model or tokenizer directory."""
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as e:
            raise InputError(
                f"cannot load a tokenizer from {path}: {e}",
                hint="pass a directory written by `rlcycle init-model` or save_pretrained",
            ) from None
        return cls(tok, **kw)

    # --- text and ids --------------------------------------------------------------------
    def render_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The conversation as the template renders it (user/tool text neutralised)."""
        msgs = [self.neutralise(m) for m in messages]
        return self.tokenizer.apply_chat_template(
            msgs,
            tools=self.tool_defs or None,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **({"tool_details": True} if self.tool_details else {}),
        )

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
        """Full render: the whole conversation's text tokenised at once."""
        return self.encode(self.render_text(messages, add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added tokens in it are recognised, nothing is prepended."""
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def completion_text(self, token_ids: Sequence[int]) -> str:
        """The text of a completion without its trailing stop token (input of the parser)."""
        ids = list(token_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def neutralise(self, message: dict[str, str]) -> dict[str, str]:
        """User/tool text with every added-token string broken by a zero-width space."""
        if message.get("role") not in NEUTRALISED_ROLES or self._added_re is None:
            return message
        content = message.get("content") or ""
        if "<" not in content:
            return message
        fixed = self._added_re.sub(lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], content)
        return message if fixed == content else {**message, "content": fixed}

    def clip_tool_output(self, text: str) -> str:
        """Head and tail of an over-long tool output around an omission marker."""
        cap = self.max_tool_output_chars
        if cap <= 0 or len(text) <= cap:
            return text
        head, tail = text[: cap // 2], text[len(text) - cap // 2 :]
        return f"{head}\n[... {len(text) - len(head) - len(tail):,} characters omitted ...]\n{tail}"

    def new_transcript(self, messages: Sequence[dict[str, str]]) -> Transcript:
        """A transcript whose first prompt is `messages` + the generation prompt."""
        return Transcript(self, messages)


@dataclass
class Turn:
    """One model call of a transcript: its prompt is `transcript.ids[:prompt_len]`."""

    prompt_len: int
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


@dataclass
class Transcript:
    """Token ids of an episode with a parallel loss mask and behaviour logprobs.

    Alternate `prompt_ids()` → (generate) → `add_completion(...)` → `add_tool_results(...)` or
    `add_user(...)` → `prompt_ids()` ... `ids`, `mask` and `logprobs` always have equal length;
    `mask[i]` is 1 exactly where `ids[i]` was sampled, and `logprobs[i]` is its behaviour
    logprob (0.0 elsewhere).
    """

    renderer: ChatRenderer
    messages: list[dict[str, str]]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def __init__(self, renderer: ChatRenderer, messages: Sequence[dict[str, str]]):
        self.renderer = renderer
        self.messages = [dict(m) for m in messages]
        self._text = renderer.render_text(self.messages, add_generation_prompt=True)
        self.ids = renderer.encode(self._text)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)
        self.turns = []
        self._closing = ""  # template text after the last completion not yet in `ids`
        self._awaiting = "completion"

    def prompt_ids(self) -> list[int]:
        """The ids to generate from (a copy); only valid while a completion is awaited."""
        self._expect("completion", "prompt_ids")
        return list(self.ids)

    def add_completion(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
    ) -> Turn:
        """Append the sampled ids (mask 1) exactly as generated; returns the new Turn."""
        self._expect("completion", "add_completion")
        ids = [int(t) for t in token_ids]
        lps = [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)
        if len(lps) != len(ids):
            raise InputError(
                f"{len(ids)} completion ids but {len(lps)} logprobs",
                hint="pass the policy's Generation.token_ids and .logprobs",
            )
        r = self.renderer
        content = r.completion_text(ids)
        turn = Turn(len(self.ids), ids, lps, finish_reason, content)
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += lps
        self.turns.append(turn)
        self.messages.append({"role": "assistant", "content": content})
        closed = r.render_text(self.messages)
        if not closed.startswith(self._text + content):
            raise self._not_incremental("an assistant message is")
        tail = closed[len(self._text) + len(content) :]
        stop = r.tokenizer.decode(ids[-1:]) if ids and ids[-1] in r.stop_token_ids else ""
        # The sampled stop token already stands for the start of the closing text
        # (e.g. `<|im_end|>` of `<|im_end|>\n`); the rest is template glue, mask 0.
        self._closing = tail[len(stop) :] if stop and tail.startswith(stop) else tail
        self._text = closed
        self._awaiting = "observation"
        return turn

    def add_tool_results(self, outputs: Sequence[str]) -> list[int]:
        """Append one `tool` message per output (in call order) and the generation prompt."""
        clip = self.renderer.clip_tool_output
        return self.add_messages([{"role": "tool", "content": clip(o)} for o in outputs])

    def add_user(self, text: str) -> list[int]:
        """Append a user message (a follow-up, or the answer to `ask_user`)."""
        return self.add_messages([{"role": "user", "content": text}])

    def add_messages(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Append non-assistant messages (mask 0) and the generation prompt; returns their ids."""
        self._expect("observation", "add_messages")
        if any(m.get("role") == "assistant" for m in messages):
            raise InputError(
                "assistant text must come from add_completion (sampled ids)",
                hint="pass the policy's token ids to Transcript.add_completion",
            )
        extended = self.messages + [dict(m) for m in messages]
        text = self.renderer.render_text(extended, add_generation_prompt=True)
        if not text.startswith(self._text):
            raise self._not_incremental("new messages are")
        new = self.renderer.encode(self._closing + text[len(self._text) :])
        self.ids += new
        self.mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        self.messages, self._text, self._closing = extended, text, ""
        self._awaiting = "completion"
        return new

    def samples(self) -> list[tuple[list[int], list[int], list[float]]]:
        """(prompt_ids, completion_ids, logprobs) of every turn: what production logs."""
        return [(self.ids[: t.prompt_len], t.completion_ids, t.logprobs) for t in self.turns]

    def _expect(self, state: str, action: str) -> None:
        if self._awaiting != state:
            raise RlcycleError(
                f"Transcript.{action}: the transcript is waiting for a {self._awaiting}",
                hint="alternate prompt_ids/add_completion with add_tool_results/add_user",
            )

    def _not_incremental(self, what: str) -> RlcycleError:
        return RlcycleError(
            f"the chat template re-renders earlier turns when {what} added, so prompts "
            "cannot be extended token-exactly",
            hint="use ChatRenderer(tokenizer, template='builtin') (rlcycle's ChatML template)",
        )
