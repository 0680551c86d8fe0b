"""Where output goes: results to stdout, progress and errors to stderr (docs/design.md, "Conventions").

Rich progress only when stderr is a terminal; plain periodic lines otherwise so cron logs stay
readable. `NO_COLOR` is honoured.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from rich.console import Console

_no_color = bool(os.environ.get("NO_COLOR"))
err = Console(stderr=True, no_color=_no_color, highlight=False, soft_wrap=True)
out = Console(no_color=_no_color, highlight=False, soft_wrap=True)


def info(message: str) -> None:
    """A progress or summary line on stderr."""
    err.print(message, markup=False)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {_escape(message)}")


def print_json(obj: Any) -> None:
    """One JSON object on stdout (the `--json` result)."""
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


class Progress:
    """A throttled progress reporter: a line every `every_s` seconds on stderr.

    Used by long stages; quiet when `quiet` is set (e.g. `--json` runs still report on stderr,
    only tests silence it).
    """

    def __init__(self, label: str, every_s: float = 5.0, quiet: bool = False):
        self.label = label
        self.every_s = every_s
        self.quiet = quiet
        self.start = time.monotonic()
        self._last = self.start

    def update(self, **counts: Any) -> None:
        now = time.monotonic()
        if self.quiet or now - self._last < self.every_s:
            return
        self._last = now
        parts = " ".join(f"{k}={v}" for k, v in counts.items())
        info(f"[{self.label}] {now - self.start:7.1f}s {parts}")
