"""The state file of `rlcycle edits`: what one run leaves for the next, never code.

In/out: one JSON document (written atomically, then renamed), by default
`<git dir>/rlcycle/edits-state.json`, so it stays with the repository and outside the work tree
(git never commits what is in its own directory). It holds
- `snapshots`: the working tree as a tree id over [first_ms, last_ms] (the run times that saw
  it), and HEAD then: where an episode's before/after trees come from;
- `episodes`: episode id -> how it was handled (recorded, or skipped and why) and when it
  started, so a later run neither records nor counts it again;
- `edits`: one per tool call that proposed lines: its sample and call ids, when its episode
  ended, the HEAD and tree after it, and per file the *hashes* of the lines it proposed
  (rlcycle/edits/lines.py), then `status` pending / emitted / skipped;
- `horizon_ms`: episodes of the logs that started before it are not looked at (forgotten).
File paths and line hashes are all it keeps of the repository.

Pruning (`prune`, every run, after its work): with c = now - keep_snapshots_s, held back to the
start of any episode still open, the state forgets the snapshots last seen before c (but keeps
the one in force at c, which an episode starting then needs, and always the newest), the
proposals emitted or skipped before c (pending ones are kept whatever their age), and the
episodes that started before c; `horizon_ms` moves up to c. Forgetting is safe because nothing
is decided twice: a forgotten episode is behind the horizon, so a later run ignores it in the
logs (counted as `episodes_before_horizon`) and never records its lines again, hence never
re-emits its outcomes.
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
    observed_ms: int | None = None  # when it was emitted or skipped

    @property
    def lines_proposed(self) -> int:
        return sum(len(h) for h in self.files.values())


@dataclass
class State:
    repo: str
    snapshots: list[Snapshot] = field(default_factory=list)
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)
    horizon_ms: int = 0  # episodes that started before it are forgotten (module docstring)

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
                int(data.get("horizon_ms", 0)),
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
            "horizon_ms": self.horizon_ms,
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

    def prune(self, cutoff_ms: int, open_starts: list[int]) -> dict[str, int]:
        """Forget what can never matter again (module docstring, "Pruning"): `cutoff_ms` is now -
        keep_snapshots_s, `open_starts` the starts of the episodes still open. Returns how many
        snapshots, episodes and proposals were forgotten."""
        c = min([cutoff_ms, *open_starts])
        in_force = self.before(c)
        kept = [s for s in self.snapshots[:-1] if s.last_ms >= c or s is in_force] + self.snapshots[-1:]
        self.horizon_ms = max(self.horizon_ms, c)
        episodes = {
            k: v for k, v in self.episodes.items() if v.get("start_ms") is None or v["start_ms"] >= self.horizon_ms
        }
        edits = [e for e in self.edits if e.status == "pending" or (e.observed_ms or e.ended_ms) >= c]
        pruned = {
            "snapshots": len(self.snapshots) - len(kept),
            "episodes": len(self.episodes) - len(episodes),
            "proposals": len(self.edits) - len(edits),
        }
        self.snapshots, self.episodes, self.edits = kept, episodes, edits
        return pruned
