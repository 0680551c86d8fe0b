"""Lines as `rlcycle edits` compares them: whitespace-free content, hashed, and who wrote them.

In:  line text (from a diff or a file) and the episode's logged tool calls. Out: line keys
(`key`: the line with every whitespace character removed, so re-indenting and a formatter's
spacing do not change it, as `git diff -w` ignores them), their hashes (`line_hash`: what the
state file keeps; never the code), and which call proposed a line (`Attributor`).

Who wrote a line. The repository cannot say whether the agent or the user typed a line, and the
user may edit the same files while the agent works. The gateway logged every tool call's
arguments, so a line counts as the agent's only when its key occurs in the key of one of the
episode's tool-call arguments (the string values of the arguments JSON, whitespace removed).
`cat > f.py <<EOF ... EOF`, `write_file(path, content)`, `apply_patch(diff)` and
`echo x > f` all carry the lines they write; a line the user typed does not appear there, so
it is never the agent's. Lines a command computed (`sed -i`, a code generator) appear in no
argument: they are counted as `unattributed`, not proposed (no outcome is ever guessed).
A user line identical to a line of the agent's arguments cannot be told apart and counts as
the agent's.

Which call: among the calls whose arguments carry the line, the latest one whose arguments
also name the file (its path or base name), else the latest one carrying it: the last writer
of a line is the one whose version is on disk.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

MIN_KEY_CHARS = 1  # a key must have content: blank lines are never proposals


def key(line: str) -> str:
    """The line's content with all whitespace removed (`git diff -w`'s notion of equal)."""
    return "".join(line.split())


def line_hash(k: str) -> str:
    """16 hex digits of sha256 of a line key: what leaves the repository, never the line."""
    return hashlib.sha256(k.encode("utf-8", errors="surrogateescape")).hexdigest()[:16]


def file_hashes(content: bytes) -> list[str] | None:
    """The line hashes of a file's content (blank lines left out); None for a binary file."""
    if b"\0" in content[:8000]:
        return None
    text = content.decode("utf-8", errors="replace")
    return [line_hash(k) for k in map(key, text.splitlines()) if len(k) >= MIN_KEY_CHARS]


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def argument_text(arguments: str | None) -> str:
    """Every string value of a call's arguments JSON, joined; the raw text if it is not JSON."""
    if not arguments:
        return ""
    try:
        parsed = json.loads(arguments)
    except (ValueError, TypeError):
        return arguments
    parts: list[str] = []
    _strings(parsed, parts)
    return "\n".join(parts)


@dataclass(frozen=True)
class Call:
    """One logged tool call of an episode, in the order the agent made them."""

    sample_id: str
    call_id: str
    name: str
    arguments: str
    ts_ms: int


class Attributor:
    """Which of an episode's calls proposed a line (None: none of them carries it)."""

    def __init__(self, calls: list[Call]):
        self.calls = calls
        self._raw = [argument_text(c.arguments) for c in calls]
        self._keys = [key(t) for t in self._raw]

    def call_for(self, path: str, line_key: str) -> Call | None:
        if len(line_key) < MIN_KEY_CHARS:
            return None
        base = path.rsplit("/", 1)[-1]
        carrying = [i for i, k in enumerate(self._keys) if line_key in k]
        if not carrying:
            return None
        naming = [i for i in carrying if path in self._raw[i] or base in self._raw[i]]
        return self.calls[(naming or carrying)[-1]]
