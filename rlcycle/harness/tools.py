"""The agent's tools: names, descriptions and JSON-schema arguments.

These names are public interface: production logs, `simulate`, `eval` and the sandbox executor
all use them (docs/design.md "Shared pieces"). Extend the list, never rename a tool.

Arguments are described in the subset of JSON Schema that the strict parser (`harness.parse`)
checks: an object with typed `properties`, a `required` list and `additionalProperties: false`.
`replace_in_file` is the short edit production agents use most (Claude Code's `Edit`, the
`str_replace` of the text-editor tools): the exact `old` text must occur once in the file, so a
one-line change is one short call instead of a diff or the whole file.
`ask_user` and `finish` are *terminal*: calling either ends the episode and hands control back
to the user (the first asks a clarifying question, the second reports the work done).

    >>> from rlcycle.harness.tools import TOOLS, openai_tools
    >>> [t.name for t in TOOLS][:3]
    ['read_file', 'write_file', 'apply_patch']
    >>> openai_tools()[0]["function"]["name"]
    'read_file'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, its argument schema, and whether it ends the episode."""

    name: str
    description: str
    properties: dict[str, dict[str, Any]] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    terminal: bool = False

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON-schema object describing the arguments."""
        return {
            "type": "object",
            "properties": {k: dict(v) for k, v in self.properties.items()},
            "required": list(self.required),
            "additionalProperties": False,
        }

    def openai(self) -> dict[str, Any]:
        """The OpenAI / HF chat-template tool format: {"type": "function", "function": {...}}."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def _s(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read_file",
        "Read a text file of the repository and return its content.",
        {"path": _s("File path, relative to the repository root.")},
        ("path",),
    ),
    ToolSpec(
        "write_file",
        "Create or overwrite a file with the given content.",
        {
            "path": _s("File path, relative to the repository root."),
            "content": _s("The complete new content of the file."),
        },
        ("path", "content"),
    ),
    ToolSpec(
        "apply_patch",
        "Apply a unified diff (---/+++ headers, @@ hunks) to one file.",
        {
            "path": _s("File path, relative to the repository root."),
            "patch": _s("A unified diff of that file."),
        },
        ("path", "patch"),
    ),
    ToolSpec(
        "replace_in_file",
        "Replace an exact piece of text in a file. `old` must occur exactly once in the file.",
        {
            "path": _s("File path, relative to the repository root."),
            "old": _s("The exact text to replace, as it appears in the file (spaces included)."),
            "new": _s("The text to put in its place."),
        },
        ("path", "old", "new"),
    ),
    ToolSpec(
        "list_files",
        "List the files under a directory, recursively.",
        {"path": _s("Directory, relative to the repository root ('.' for the root).")},
        ("path",),
    ),
    ToolSpec(
        "search",
        "Search file contents for a regular expression; returns matching lines with paths.",
        {
            "pattern": _s("A regular expression."),
            "path": _s("Directory or file to search ('.' for the whole repository)."),
        },
        ("pattern", "path"),
    ),
    ToolSpec(
        "run_shell",
        "Run a shell command in the repository root; returns exit code, stdout and stderr.",
        {"command": _s("The command line.")},
        ("command",),
    ),
    ToolSpec(
        "run_tests",
        "Run the repository's test suite; returns a pass/fail summary and failing output.",
    ),
    ToolSpec(
        "ask_user",
        "Ask the user a clarifying question. Ends your turn: the user answers later.",
        {"question": _s("One specific question.")},
        ("question",),
        terminal=True,
    ),
    ToolSpec(
        "finish",
        "Stop and report what you did. Ends your turn.",
        {"summary": _s("A short summary of the changes made and how they were checked.")},
        ("summary",),
        terminal=True,
    ),
)

TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in TOOLS)
# Tools that change files: their ok calls are edits (lines proposed, later an edit outcome).
EDIT_TOOLS: tuple[str, ...] = ("write_file", "apply_patch", "replace_in_file")
# What replace_in_file answers when it applied (the executor and the warm-start demos say the same).
REPLACED = "Replaced the text in {path}."
TERMINAL_TOOLS: frozenset[str] = frozenset(t.name for t in TOOLS if t.terminal)
_BY_NAME = {t.name: t for t in TOOLS}


def get_tool(name: str, tools: tuple[ToolSpec, ...] = TOOLS) -> ToolSpec | None:
    """The tool called `name`, or None."""
    if tools is TOOLS:
        return _BY_NAME.get(name)
    return next((t for t in tools if t.name == name), None)


def openai_tools(tools: tuple[ToolSpec, ...] = TOOLS) -> list[dict[str, Any]]:
    """Tool definitions as a chat template's `tools` variable expects them."""
    return [t.openai() for t in tools]
