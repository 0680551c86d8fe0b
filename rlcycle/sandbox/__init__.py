"""Hardened Docker sandboxes for the agent's tool calls (eval, simulate, rewards).

    from rlcycle.sandbox import SandboxPool, ensure_image

    with SandboxPool(size=4) as pool:
        with pool.acquire() as sb:
            r = sb.exec("python3 -c 'print(1)'", timeout=10)

Modules: config (SandboxConfig), images (build + content-hash tag), executor (runs inside the
container), channel (host end of its pipe), sandbox (one container), pool (warm containers over
one or more engines), cleanup (labels, signals, gc). docs/sandbox.md has the threat model.
"""

from rlcycle.sandbox.cleanup import gc, list_leftovers
from rlcycle.sandbox.config import SandboxConfig
from rlcycle.sandbox.images import ensure_image, image_tag
from rlcycle.sandbox.pool import SandboxPool
from rlcycle.sandbox.sandbox import ExecResult, Sandbox, SandboxError, Status, run_once

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPool",
    "Status",
    "ensure_image",
    "gc",
    "image_tag",
    "list_leftovers",
    "run_once",
]
