"""The agent's system prompt and rlcycle's built-in ChatML chat template.

Production, `simulate` and `eval` build the first messages of every episode with
`initial_messages(task)`, so the policy sees the same words everywhere (docs/design.md: simulate must
never differ from production in tools or prompts). Changing `SYSTEM_PROMPT` changes what the
policy was trained on: bump `PROMPT_VERSION` when you do, and log it as part of the policy version.

The tool *list* is not in the system prompt: the chat template renders it (from
`harness.tools.openai_tools()`), either the model's own template when it supports tools or
`BUILTIN_CHAT_TEMPLATE` below. The built-in template is ChatML with one compact line per tool
(name, description, argument names and types: ~520 tokens for the ten tools instead of ~1,460
for their full JSON schemas, so a small model's prompt stays short and every turn is cheaper):

    <|im_start|>system
    {system prompt}

    # Tools

    <tools>
    {"name": "read_file", "description": "Read a text file ...", "arguments": {"path": "string"}}
    ... one tool per line: name, description, argument names and JSON types
    </tools><|im_end|>
    <|im_start|>user
    {task}<|im_end|>
    <|im_start|>assistant
    {reasoning}<tool_call>{"name": "read_file", "arguments": {"path": "app.py"}}</tool_call><|im_end|>
    <|im_start|>tool
    <tool_response>
    {tool output}
    </tool_response><|im_end|>
    <|im_start|>assistant
    ...

With `tool_details` (the renderer sets it for any tool set that is not the harness's own, e.g.
the tools an agent framework sends through the gateway), each argument is its whole JSON-schema
entry (type, description, enum, ...) and the tool line ends with its `required` list:

    {"name": "bash", "description": "...", "arguments": {"command": {"type": "string",
     "description": "The bash command to execute"}}, "required": ["command"]}

The harness's own tools keep the compact line, so simulate, eval and production prompts are
unchanged (PROMPT_VERSION stays).

Every message is `<|im_start|>{role}\\n{content}<|im_end|>\\n`; a tool result is a `tool`
message whose content is wrapped in `<tool_response>\\n...\\n</tool_response>`, one message
per call, in the order of the calls. The generation prompt is `<|im_start|>assistant\\n`.
"""

from __future__ import annotations

PROMPT_VERSION = "rlcycle-agent-v2"

SYSTEM_PROMPT = """\
You are a coding agent working in a software repository. The user gives you a task; you \
complete it by calling tools, then call `finish` with a short summary.

How to call a tool: write one or more calls at the end of your message, each exactly
<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>
with valid JSON and only the arguments the tool defines. Write nothing after your last call. \
You receive each result in a <tool_response> block in the next message.

Rules:
- Look before you edit: read the relevant files, then change them with `replace_in_file` \
(a few lines), `apply_patch` or `write_file`.
- Check your work with `run_tests` (or `run_shell`) before you call `finish`.
- Ask the user (`ask_user`) only when the task is ambiguous in a way the repository cannot \
answer; asking ends your turn.
- Keep messages short: say what you will do next and why, then call the tool."""

# ChatML with tools (see the module docstring). `{{- ... }}` strips the template's own
# whitespace so only the quoted strings reach the output.
BUILTIN_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if system or tools -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{%- if system -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{%- set f = tool['function'] if 'function' in tool else tool -%}"
    "{{- '\\n{\"name\": ' + (f['name'] | tojson) + ', \"description\": ' + (f['description'] | tojson)"
    " + ', \"arguments\": {' -}}"
    "{%- for key, spec in (f['parameters']['properties'] | default({})).items() -%}"
    "{{- (', ' if not loop.first else '') + (key | tojson) + ': '"
    " + ((spec | tojson) if tool_details is defined and tool_details else (spec['type'] | tojson)) -}}"
    "{%- endfor -%}"
    "{{- '}' -}}"
    "{%- if tool_details is defined and tool_details and f['parameters']['required'] -%}"
    "{{- ', \"required\": ' + (f['parameters']['required'] | tojson) -}}"
    "{%- endif -%}"
    "{{- '}' -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message['content']"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def system_prompt(extra: str | None = None) -> str:
    """The system prompt, optionally followed by task-suite or deployment specific text."""
    return SYSTEM_PROMPT if not extra else f"{SYSTEM_PROMPT}\n\n{extra.strip()}"


def initial_messages(task: str, extra_system: str | None = None) -> list[dict[str, str]]:
    """The first two messages of an episode: the system prompt and the user's task."""
    return [
        {"role": "system", "content": system_prompt(extra_system)},
        {"role": "user", "content": task},
    ]
