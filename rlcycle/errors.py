"""The one error type of rlcycle: what went wrong, where the value came from, and a hint.

Exit codes a cron job can branch on (docs/design.md, "Exit codes"):
0 ok (also "up to date"), 1 runtime failure, 2 usage/config/schema/input error,
3 the eval gate refused the candidate, 130 interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_GATE_REFUSED = 3
EXIT_INTERRUPTED = 130


class RlcycleError(Exception):
    """An error a user can act on.

    `message` names the object and where the value came from (file, line, column, option);
    `hint` is the command or change that fixes it; `exit_code` is what the CLI exits with.
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_FAILURE):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class InputError(RlcycleError):
    """Bad input, config or usage: exits 2."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint, EXIT_USAGE)
