"""The serving hook `deploy` calls after it moves an alias: a shell command or an HTTP POST.

In: the hook (`DeployConfig.hook`: a command line, or an http(s) URL), the checkpoint directory
and id. Out: None when the serving side took the checkpoint, else a one-line reason; `deploy`
(or `rollback`) then restores the previous aliases. A command sees RLCYCLE_CHECKPOINT_DIR,
RLCYCLE_CHECKPOINT_ID, RLCYCLE_ALIAS, RLCYCLE_CANARY_FRACTION and RLCYCLE_DEPLOY_ACTION (promote,
canary or rollback); a URL receives the same as a JSON object (`action`), with
`Authorization: Bearer KEY` when an API key is given (deploy reads it from the environment
variable named by `DeployConfig.hook_api_key_env`; the key itself is never in a config file).
A command gets no key from here: it reads its own variable (e.g. `rlcycle deploy-vllm
--api-key-env VAR`), since it inherits deploy's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path


def call_hook(
    hook: str,
    path: Path,
    cid: str,
    alias: str,
    canary_fraction: float | None,
    timeout_s: float,
    api_key: str | None = None,
    action: str = "promote",
) -> str | None:
    """Run the serving hook; None when it succeeded, else what went wrong (the key never in it)."""
    payload = {
        "checkpoint_dir": str(path),
        "checkpoint_id": cid,
        "alias": alias,
        "canary_fraction": canary_fraction,
        "action": action,
    }
    if hook.startswith(("http://", "https://")):
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        req = urllib.request.Request(hook, data=json.dumps(payload).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        except Exception as e:  # connection refused, HTTP error, timeout: all mean "not served"
            return f"{type(e).__name__}: {e}"
    env = dict(
        os.environ,
        RLCYCLE_CHECKPOINT_DIR=str(path),
        RLCYCLE_CHECKPOINT_ID=cid,
        RLCYCLE_ALIAS=alias,
        RLCYCLE_CANARY_FRACTION="" if canary_fraction is None else str(canary_fraction),
        RLCYCLE_DEPLOY_ACTION=action,
    )
    try:
        proc = subprocess.run(hook, shell=True, env=env, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s}s"
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {_tail(proc.stderr)}"
    return None


def _tail(stderr: str, limit: int = 600) -> str:
    """What a failed command said: from its last `Error:` line (rlcycle's format) if it printed
    one, so progress lines and tracebacks before it do not crowd it out; else the last lines."""
    text = stderr.strip()
    at = text.rfind("Error:")
    return (text[at:] if at >= 0 else text)[-limit:]
