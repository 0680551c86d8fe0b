"""The agent harness: system prompt, tools, rendering to token ids, and the tool-call parser.

Production, `simulate` and `eval` all use this one harness, so training sees exactly what
production sees (docs/design.md "Shared pieces").

    from rlcycle.harness import ChatRenderer, initial_messages, parse_completion
    renderer = ChatRenderer.from_pretrained("runs/demo/policy")
    transcript = renderer.new_transcript(initial_messages("Fix the failing test"))
    [gen] = policy.generate([transcript.prompt_ids()], params)
    transcript.add_completion(gen.token_ids, gen.logprobs, gen.finish_reason)
    parsed = parse_completion(renderer.completion_text(gen.token_ids))
    ...  # run parsed.calls in the sandbox, then
    transcript.add_tool_results(outputs)
"""

from rlcycle.harness.parse import ParsedCompletion, ParseLimits, ToolCall, parse_completion
from rlcycle.harness.prompt import PROMPT_VERSION, SYSTEM_PROMPT, initial_messages, system_prompt
from rlcycle.harness.render import ChatRenderer, Transcript, Turn, supports_tools
from rlcycle.harness.tools import (
    EDIT_TOOLS,
    TERMINAL_TOOLS,
    TOOL_NAMES,
    TOOLS,
    ToolSpec,
    get_tool,
    openai_tools,
)

__all__ = [
    "EDIT_TOOLS",
    "PROMPT_VERSION",
    "SYSTEM_PROMPT",
    "TERMINAL_TOOLS",
    "TOOLS",
    "TOOL_NAMES",
    "ChatRenderer",
    "ParseLimits",
    "ParsedCompletion",
    "ToolCall",
    "ToolSpec",
    "Transcript",
    "Turn",
    "get_tool",
    "initial_messages",
    "openai_tools",
    "parse_completion",
    "supports_tools",
    "system_prompt",
]
