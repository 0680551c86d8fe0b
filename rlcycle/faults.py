"""Fault injection for crash-safety tests: kill this process at a named point.

`RLCYCLE_CRASH_AT=NAME` makes `crash_point(NAME)` send SIGKILL to its own process, the way a
power cut or the OOM killer would stop it: no `finally`, no atexit, no flush. The registry and
the cycle call it at their commit points, so a test can check that every crash leaves a state
that the next run reads or repairs. Unset (always, outside tests), it costs one getenv.
"""

from __future__ import annotations

import os
import signal

ENV = "RLCYCLE_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process when RLCYCLE_CRASH_AT is `name`."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
