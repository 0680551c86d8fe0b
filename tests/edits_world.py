"""Helpers of the `rlcycle edits` tests: a real git repository and a gateway-shaped event log.

The log is what the gateway writes for a session (rlcycle/gateway/chat.py: one `completion`
event per model call, its tool calls with their arguments, `ts` when it answered), built with
the one event writer (rlcycle/agent/events.py); the repository is driven by the git CLI.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from rlcycle.agent.events import call_id_of, event

GIT_USER = ["-c", "user.email=user@example.com", "-c", "user.name=user"]


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", *GIT_USER, *args], cwd=repo, capture_output=True, text=True, check=True)
    return r.stdout


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("project\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    return repo


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


class GatewayLog:
    """Completion events of agent sessions, as the gateway logs them, appended to one file."""

    def __init__(self, log_dir: Path):
        self.dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / "gateway-0001.jsonl"
        self.turns: dict[str, int] = {}

    def call(self, episode_id: str, calls: list[tuple[str, dict]], version: str = "v1", session: str = "") -> str:
        """Log one model call of `episode_id` whose tool calls are (name, arguments); returns its
        sample id. Its `ts` is now (the answer's time), 5 ms after the request."""
        time.sleep(0.01)  # strictly after the snapshot the previous `edits` run took
        turn = self.turns.get(episode_id, 0)
        self.turns[episode_id] = turn + 1
        sample_id = f"{episode_id}-t{turn}"
        tool_calls = [
            {"call_id": call_id_of(sample_id, i), "name": n, "arguments": json.dumps(a)}
            for i, (n, a) in enumerate(calls)
        ]
        ev = event(
            "completion",
            f"{sample_id}-completion",
            time.time() * 1000,
            session or episode_id.rsplit("-e", 1)[0],
            episode_id=episode_id,
            sample_id=sample_id,
            turn=turn,
            policy_version=version,
            prompt_ids=[1, 2, 3],
            completion_ids=[4, 5],
            completion_logprobs=[-0.5, -0.5],
            tool_calls=tool_calls,
            latency_ms=5.0,
            temperature=1.0,
        )
        with self.path.open("a") as f:
            f.write(json.dumps(ev) + "\n")
        time.sleep(0.01)
        return sample_id


def write(repo: Path, path: str, content: str) -> dict:
    """Write a file as the agent's `write_file(path, content)` call would; returns its arguments."""
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    return {"path": path, "content": content}


def read_outcomes(out_dir: Path) -> dict[str, dict]:
    """call_id -> its edit_outcome event, over every file `edits` wrote."""
    found = {}
    for f in sorted(out_dir.glob("edit_outcomes-*.jsonl")):
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            assert ev["type"] == "edit_outcome" and ev["call_id"] not in found, ev
            found[ev["call_id"]] = ev
    return found
