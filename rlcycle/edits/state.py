"""The state file of `rlcycle edits`: what one run leaves for the next, never code.

In/out: one JSON document (written atomically, then renamed), by default
`<git dir>/rlcycle/edits-state.json`, so it stays with the repository and outside the work tree
(git never commits what is in its own directory). It holds
- `snapshots`: the working tree as a tree id over [first_ms, last_ms] (the run times that saw
  it), and HEAD then: where an episode's before/after trees come from;
- `episodes`: episode id -> how it was handled (recorded, or skipped and why), so a later run
  neither records nor counts it again;
- `edits`: one per tool call that proposed lines: its sample and call ids, when its episode
  ended, the HEAD and tree after it, and per file the *hashes* of the lines it proposed
  (rlcycle/edits/lines.py), then `status` pending / emitted / skipped.
File paths and line hashes are all it keeps of the repository.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle.errors import InputError

VERSION = 1


@dataclass
class Snapshot:
    first_ms: int
    last_ms: int
    tree: str
    head: str | None


@dataclass
class Edit:
    sample_id: str
    call_id: str
    session_id: str
    episode_id: str
    policy_version: str | None
    ended_ms: int  # the episode's last call
    head: str | None  # HEAD at the after-snapshot
    after_tree: str
    files: dict[str, list[str]]  # path -> line hashes the call proposed there
    status: str = "pending"  # pending / emitted / skipped
    reason: str | None = None  # why skipped
    lines_surviving: int | None = None
    observed_ms: int | None = None

    @property
    def lines_proposed(self) -> int:
        return sum(len(h) for h in self.files.values())


@dataclass
class State:
    repo: str
    snapshots: list[Snapshot] = field(default_factory=list)
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, repo: str) -> State:
        if not path.exists():
            return cls(repo)
        try:
            data = json.loads(path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, this rlcycle reads {VERSION}")
            state = cls(
                data["repo"],
                [Snapshot(**s) for s in data["snapshots"]],
                data["episodes"],
                [Edit(**e) for e in data["edits"]],
            )
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(
                f"state file {path}: unreadable ({e})",
                hint="move it away to start over (episodes already recorded are then recorded again)",
            ) from None
        if state.repo != repo:
            raise InputError(
                f"state file {path} belongs to the repository {state.repo}, not {repo}",
                hint="give each repository its own --state",
            )
        return state

    def save(self, path: Path) -> None:
        doc = {
            "version": VERSION,
            "repo": self.repo,
            "snapshots": [asdict(s) for s in self.snapshots],
            "episodes": self.episodes,
            "edits": [asdict(e) for e in self.edits],
        }
        rio.atomic_write_text(path, json.dumps(doc, separators=(",", ":")) + "\n")

    # --- snapshots ---------------------------------------------------------------------------
    def observe(self, now_ms: int, tree: str, head: str | None) -> Snapshot:
        """Add this run's snapshot (extending the last one when nothing changed)."""
        last = self.snapshots[-1] if self.snapshots else None
        if last is not None and last.tree == tree and last.head == head and now_ms >= last.last_ms:
            last.last_ms = now_ms
            return last
        snap = Snapshot(now_ms, now_ms, tree, head)
        self.snapshots.append(snap)
        return snap

    def before(self, ms: int) -> Snapshot | None:
        """The last tree seen at or before `ms` (None: no run saw the tree before then)."""
        seen = [s for s in self.snapshots if s.first_ms <= ms]
        return seen[-1] if seen else None

    def after(self, ms: int) -> Snapshot | None:
        """The first tree seen at or after `ms`."""
        return next((s for s in self.snapshots if s.last_ms >= ms), None)

    def prune(self, older_than_ms: int) -> None:
        """Forget snapshots last seen before `older_than_ms` (the newest one always stays)."""
        self.snapshots = [s for s in self.snapshots[:-1] if s.last_ms >= older_than_ms] + self.snapshots[-1:]
