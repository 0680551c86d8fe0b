"""edits: a git working tree and the gateway's log in, `edit_outcome` events out.

In:  `--repo` (the working tree the agents edit), the gateway's event logs (files, directories,
     globs, as collect reads them), the state file of earlier runs (rlcycle/edits/state.py).
Out: `OUT/edit_outcomes-<time>.jsonl` (only when there are outcomes: `edit_outcome` events that
     collect joins onto the tool call that made the edit), the updated state file, and an
     `EditsResult` with every count.

    rlcycle edits --repo ~/src/project /var/log/rlcycle-gateway -o /var/log/rlcycle-edits

Run it often (cron, every minute) beside the agents; each run does three things:
1. **Snapshot.** The working tree as a tree id (rlcycle/edits/git.py: a temporary index,
   nothing of the user's touched), kept in the state with the time.
2. **Record finished episodes.** An episode (the gateway's `episode_id`) is finished when its
   last logged call is `settle_s` old. Its *before* tree is the last snapshot taken at or before
   its first call was sent (the logged time minus the call's latency), its *after* tree the first
   one taken `settle_s` after its last call. The lines the after tree adds or changes are the
   agent's only when its logged tool-call arguments carry them (rlcycle/edits/lines.py: the
   user's own edits in the meantime are not the agent's), each attributed to the call that
   wrote it. Per call, the state keeps the hashes of its lines per file: a proposal.
   Without a snapshot before the episode (the first run, or a gap) the episode is skipped,
   counted, never guessed.
3. **Observe due proposals** (`observe_after_s` after their episode ended), once each: the
   repository as it is now (`target`: the working tree, or a branch) and emits one `edit_outcome`
   per proposal, event id `<call_id>-outcome`. The state marks it emitted, so a later run emits
   nothing for it again; if a crash loses the state after the events were written, the re-run
   writes the same event ids, which collect drops as duplicates. Survival rule: a proposed line
   survives when a line with the same whitespace-free content is in the same file of the
   target, or in a file the target added or changed since the episode (a move); each line
   there is matched at most once (multisets). Re-indented, reformatted or moved lines are kept;
   reverted, deleted or rewritten ones are not.
4. **Prune** the state (rlcycle/edits/state.py, "Pruning"): what is older than keep_snapshots_s
   is forgotten, and episodes behind the state's horizon are never recorded again.

The history rule (`target = "worktree"`): the observed HEAD must descend from the HEAD after
the episode; otherwise (a reset, a force pull, another branch checked out) the outcome waits
and, after `give_up_s`, is skipped as `history_rewritten`. With `target` a branch the branch is
what counts: lines on a branch never merged into it by the time of observation are not kept.

Cost: the episode diff and the blobs read per observation are bounded by `max_diff_bytes`
(a larger one is skipped and counted, never truncated into a wrong count); both are linear in
the size of what changed.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from rlcycle import io as rio
from rlcycle.agent.events import event
from rlcycle.collect.sources import expand_inputs, read_source
from rlcycle.config import cfg, check_range
from rlcycle.edits import lines as L
from rlcycle.edits.git import DiffTooLarge, Repo
from rlcycle.edits.state import Edit, State
from rlcycle.errors import InputError, RlcycleError
from rlcycle.stage import Outcome, RunLayout, StageContext


@dataclass
class EditsConfig:
    target: str = cfg(
        "worktree",
        help="What is observed: 'worktree' (the working tree as it is) or a branch/ref (e.g. main, origin/main).",
    )
    observe_after_s: float = cfg(
        4 * 3600.0, help="Observe a proposal this long after its episode ended (keep it below collect's maturity_s)."
    )
    settle_s: float = cfg(
        60.0, help="An episode is finished when its last call is this old; its after-tree is taken this long after."
    )
    give_up_s: float = cfg(
        7 * 86400.0, help="A proposal whose history was rewritten waits this long, then is skipped (counted)."
    )
    max_diff_bytes: int = cfg(
        16 << 20, help="Bytes of diff per episode, and of files per observation, beyond which it is skipped."
    )
    keep_snapshots_s: float = cfg(
        2 * 86400.0,
        help="The state's memory: snapshots last seen, episodes started and outcomes decided longer ago are "
        "forgotten, and older episodes in the logs are ignored (docs/edits.md, State).",
    )
    session_prefix: str = cfg(
        "", help="Only episodes whose session id starts with this (agents of other repositories share the log)."
    )
    tools: list[str] = cfg([], help="Only these tool names can propose lines (empty: any logged tool call).")

    def validate(self) -> list[str]:
        problems: list[str] = []
        for name in ("observe_after_s", "settle_s", "give_up_s", "keep_snapshots_s"):
            check_range(problems, self, name, ge=0)
        check_range(problems, self, "max_diff_bytes", ge=1024)
        if not self.target.strip():
            problems.append("target: empty (use 'worktree' or a branch name)")
        return problems


@dataclass(frozen=True)
class EditsArgs:
    """What one run reads and writes: `run`'s arguments past the config."""

    repo: str
    logs: list[str]
    out: str  # a directory: edit_outcomes-<time>.jsonl is written there
    state: str | None = None  # default: <git dir>/rlcycle/edits-state.json
    quiet: bool = False


@dataclass
class EditsResult:
    repo: str
    state: str
    output: str | None = None  # the events file written (None: no outcome this run)
    tree: str = ""
    episodes_seen: int = 0
    episodes_recorded: int = 0
    episodes_open: int = 0  # last call newer than settle_s
    episodes_before_horizon: int = 0  # in the logs, started before the state's horizon: ignored
    episodes_skipped: Counter = field(default_factory=Counter)  # reason -> n (this run)
    proposals_recorded: int = 0
    lines_proposed: int = 0
    lines_unattributed: int = 0  # added lines no logged call carries (the user's, or computed)
    binary_files: int = 0
    bad_records: int = 0
    outcomes_emitted: int = 0
    lines_surviving: int = 0
    proposals_waiting: int = 0  # not yet observe_after_s old
    proposals_skipped: Counter = field(default_factory=Counter)  # reason -> n (this run)
    pruned: dict[str, int] = field(default_factory=dict)  # what the state forgot this run
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["episodes_skipped"] = dict(sorted(self.episodes_skipped.items()))
        out["proposals_skipped"] = dict(sorted(self.proposals_skipped.items()))
        out["seconds"] = round(self.seconds, 3)
        return out


# --- reading the gateway's log ----------------------------------------------------------------


@dataclass
class Episode:
    episode_id: str
    session_id: str
    policy_version: str | None
    start_ms: int
    end_ms: int
    calls: list[L.Call]


def read_episodes(logs: list[str], config: EditsConfig, result: EditsResult) -> list[Episode]:
    """The episodes of the logs' completion events, each with its tool calls in order."""
    frames = []
    # An empty log directory is no error here (the gateway has not written yet): the snapshot
    # this run takes is what the first episode will need.
    logs = [p for p in logs if not (Path(p).is_dir() and not any(Path(p).rglob("*")))]
    for path in expand_inputs(logs).files if logs else []:
        for chunk in read_source(path):
            result.bad_records += len(chunk.bad)
            comp = chunk.events.filter(pl.col("type") == "completion")
            if config.session_prefix:
                comp = comp.filter(pl.col("session_id").str.starts_with(config.session_prefix))
            if comp.height:
                frames.append(
                    comp.select(
                        "event_id",
                        "session_id",
                        "episode_id",
                        "sample_id",
                        "turn",
                        "policy_version",
                        "ts_ms",
                        pl.col("latency_ms").fill_null(0.0),
                        "tool_calls",
                    )
                )
    if not frames:
        return []
    comp = pl.concat(frames).unique("sample_id", keep="first").sort("episode_id", "ts_ms", "turn")
    episodes = []
    for (episode_id,), rows in comp.group_by("episode_id", maintain_order=True):
        calls = []
        for r in rows.iter_rows(named=True):
            for c in r["tool_calls"] or []:
                if not config.tools or c["name"] in config.tools:
                    calls.append(L.Call(r["sample_id"], c["call_id"], c["name"], c["arguments"] or "", r["ts_ms"]))
        first = rows.row(0, named=True)
        episodes.append(
            Episode(
                str(episode_id),
                first["session_id"],
                first["policy_version"],
                int(first["ts_ms"] - first["latency_ms"]),
                int(rows["ts_ms"].max()),
                calls,
            )
        )
    return episodes


# --- step 2: record what each finished episode proposed ----------------------------------------


def record(repo: Repo, state: State, episodes: list[Episode], now_ms: int, config: EditsConfig, result) -> list[int]:
    """Record the finished episodes not seen before; returns the starts of those still open."""
    settle_ms = int(config.settle_s * 1000)
    open_starts = []
    for ep in episodes:
        result.episodes_seen += 1
        if ep.episode_id in state.episodes:
            continue
        if ep.start_ms < state.horizon_ms:  # forgotten (state.py, "Pruning"): never recorded again
            result.episodes_before_horizon += 1
            continue
        if ep.end_ms + settle_ms > now_ms:
            result.episodes_open += 1
            open_starts.append(ep.start_ms)
            continue
        reason = _record_one(repo, state, ep, settle_ms, config, result)
        state.episodes[ep.episode_id] = {
            "status": "skipped" if reason else "recorded",
            "reason": reason,
            "start_ms": ep.start_ms,
        }
        if reason:
            result.episodes_skipped[reason] += 1
        else:
            result.episodes_recorded += 1
    return open_starts


def _record_one(repo: Repo, state: State, ep: Episode, settle_ms: int, config, result) -> str | None:
    """Record the proposals of one episode; the reason it was skipped, or None."""
    before, after = state.before(ep.start_ms), state.after(ep.end_ms + settle_ms)
    if before is None:
        return "no snapshot before the episode"
    if after is None:  # cannot happen: this run's snapshot is newer
        return "no snapshot after the episode"
    if before.tree == after.tree or not ep.calls:
        return None
    if not (repo.has_object(before.tree) and repo.has_object(after.tree)):
        return "snapshot pruned from the object store"
    attributor = L.Attributor(ep.calls)
    proposed: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    unattributed = binary = 0
    try:
        for diff in repo.added_lines(before.tree, after.tree, config.max_diff_bytes):
            if diff.binary:
                binary += 1
                continue
            for text in diff.added:
                k = L.key(text)
                if not k:
                    continue
                call = attributor.call_for(diff.path, k)
                if call is None:
                    unattributed += 1
                else:
                    proposed[(call.sample_id, call.call_id)][diff.path].append(L.line_hash(k))
    except DiffTooLarge:
        return f"diff over max_diff_bytes ({config.max_diff_bytes:,})"
    result.binary_files += binary
    result.lines_unattributed += unattributed
    for (sample_id, call_id), files in proposed.items():
        edit = Edit(
            sample_id,
            call_id,
            ep.session_id,
            ep.episode_id,
            ep.policy_version,
            ep.end_ms,
            after.head,
            after.tree,
            {p: h for p, h in files.items()},
        )
        state.edits.append(edit)
        result.proposals_recorded += 1
        result.lines_proposed += edit.lines_proposed
    return None


# --- step 3: observe due proposals ------------------------------------------------------------


def observe(repo: Repo, state: State, now_ms: int, head: str | None, config: EditsConfig, result) -> list[dict]:
    """The `edit_outcome` events of every due pending proposal (marked emitted in `state`)."""
    due_ms = int(config.observe_after_s * 1000)
    due: list[Edit] = []
    for e in state.edits:
        if e.status != "pending":
            continue
        if now_ms - e.ended_ms < due_ms:
            result.proposals_waiting += 1
            continue
        if config.target == "worktree" and e.head and not (head and repo.is_ancestor(e.head, head)):
            if now_ms - e.ended_ms >= int(config.give_up_s * 1000):
                _skip(e, "history_rewritten", now_ms, result)
            else:
                result.proposals_waiting += 1
            continue
        due.append(e)
    if not due:
        return []
    target = state.snapshots[-1].tree if config.target == "worktree" else repo.tree_of(config.target)
    events = []
    # One group per episode's after-tree: the files a moved line may have gone to differ by it.
    groups: dict[str, list[Edit]] = defaultdict(list)
    for e in sorted(due, key=lambda e: (e.ended_ms, e.sample_id, e.call_id)):
        groups[e.after_tree].append(e)
    for after_tree, edits in groups.items():
        try:
            found = _line_counts(repo, target, after_tree, edits, config, result)
        except DiffTooLarge:
            for e in edits:
                _skip(e, f"observation over max_diff_bytes ({config.max_diff_bytes:,})", now_ms, result)
            continue
        counts, changed = found
        surviving_of = _match(edits, counts, changed)
        for e in edits:
            surviving = surviving_of[id(e)]
            e.status, e.lines_surviving, e.observed_ms = "emitted", surviving, now_ms
            events.append(
                event(
                    "edit_outcome",
                    f"{e.call_id}-outcome",
                    now_ms,
                    e.session_id,
                    sample_id=e.sample_id,
                    call_id=e.call_id,
                    lines_proposed=e.lines_proposed,
                    lines_surviving=surviving,
                    observed_after_s=round((now_ms - e.ended_ms) / 1000.0, 3),
                )
            )
            result.outcomes_emitted += 1
            result.lines_surviving += surviving
    return events


def _line_counts(repo: Repo, target: str, after_tree: str, edits: list[Edit], config, result):
    """(line-hash multiset per path, the changed paths): the edited files in `target`, and every
    file the target added or changed since `after_tree` (where a moved line can be). Binary
    files count as empty."""
    changed = set(repo.changed_paths(after_tree, target)) if repo.has_object(after_tree) else set()
    paths = {p for e in edits for p in e.files} | changed
    counts: dict[str, Counter] = {}
    for path, data in repo.read_blobs(target, sorted(paths), config.max_diff_bytes):
        hashes = L.file_hashes(data) if data is not None else []
        if hashes is None:
            result.binary_files += 1
            hashes = []
        counts[path] = Counter(hashes)
    return counts, changed


def _match(edits: list[Edit], counts: dict[str, Counter], changed: set[str]) -> dict[int, int]:
    """Surviving lines per edit (by id()). Each line of the target matches at most one proposed
    line: first every edit against its own file, in the order the edits were made, then what is
    left against the lines of the files the target added or changed (moves)."""
    surviving = dict.fromkeys(map(id, edits), 0)
    left: list[tuple[Edit, str, str]] = []
    for e in edits:
        for path, hashes in e.files.items():
            here = counts.get(path, Counter())
            for h in hashes:
                if here[h] > 0:
                    here[h] -= 1
                    surviving[id(e)] += 1
                else:
                    left.append((e, path, h))
    pool: dict[str, list[Counter]] = defaultdict(list)  # hash -> the changed files' counters
    for p in sorted(changed):
        for h in counts.get(p, Counter()):
            pool[h].append(counts[p])
    for e, path, h in left:
        for c in pool.get(h, []):
            if c[h] > 0 and c is not counts.get(path):
                c[h] -= 1
                surviving[id(e)] += 1
                break
    return surviving


def _skip(e: Edit, reason: str, now_ms: int, result: EditsResult) -> None:
    e.status, e.reason, e.observed_ms = "skipped", reason, now_ms
    result.proposals_skipped[reason] += 1


# --- the stage ----------------------------------------------------------------------------------


def default_state_path(repo: Repo) -> Path:
    return repo.git_dir / "rlcycle" / "edits-state.json"


def run(config: EditsConfig, args: EditsArgs) -> EditsResult:
    started = time.monotonic()
    repo = Repo.open(args.repo)
    state_path = Path(args.state) if args.state else default_state_path(repo)
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"-o {args.out}: not a directory", hint="edits writes one file per run into a directory")
    if config.target != "worktree":
        repo.tree_of(config.target)  # an unknown branch is a usage error before anything runs
    result = EditsResult(str(repo.top), str(state_path))
    with rio.FileLock(state_path.with_name(state_path.name + ".lock"), wait=False, holder="rlcycle edits"):
        state = State.load(state_path, str(repo.top))
        # The logs are read before the snapshot is taken, so every call this run sees was
        # answered before the tree it records as "after".
        episodes = read_episodes(args.logs, config, result)
        now_ms = int(time.time() * 1000)
        head = repo.head()
        snap = state.observe(now_ms, repo.snapshot(), head)
        result.tree = snap.tree
        open_starts = record(repo, state, episodes, now_ms, config, result)
        events = observe(repo, state, now_ms, head, config, result)
        if events:
            out_dir.mkdir(parents=True, exist_ok=True)
            stamp = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
            path = out_dir / f"edit_outcomes-{stamp}.jsonl"
            # events first, state second: a crash between them re-emits the same event ids
            rio.atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in events))
            result.output = str(path)
        result.pruned = state.prune(now_ms - int(config.keep_snapshots_s * 1000), open_starts)
        state.save(state_path)
    result.seconds = time.monotonic() - started
    return result


def format_summary(r: EditsResult) -> str:
    lines = [
        f"edits: {r.repo} (tree {r.tree[:12]}) in {r.seconds:.1f}s",
        f"  episodes      {r.episodes_recorded} recorded, {r.episodes_open} still open, "
        f"{sum(r.episodes_skipped.values())} skipped (of {r.episodes_seen} in the logs)",
        f"  proposals     {r.proposals_recorded} recorded ({r.lines_proposed} lines); "
        f"{r.lines_unattributed} added lines no logged call carries",
        f"  outcomes      {r.outcomes_emitted} emitted ({r.lines_surviving} lines surviving), "
        f"{r.proposals_waiting} waiting -> {r.output or 'nothing written'}",
    ]
    if r.episodes_before_horizon:
        lines.append(f"  ignored       {r.episodes_before_horizon} episodes older than the state's horizon")
    for reason, n in sorted({**r.episodes_skipped, **r.proposals_skipped}.items()):
        lines.append(f"  skipped       {n:>5}  {reason}")
    if r.binary_files:
        lines.append(f"  binary files  {r.binary_files} (skipped)")
    if r.bad_records:
        lines.append(f"  bad records   {r.bad_records} in the logs (collect quarantines them)")
    return "\n".join(lines)


class EditsStage:
    """edits as a stage object (rlcycle/stage.py). It runs *beside* the cycle (cron, every minute),
    not in it: it reads a repository that no run directory holds, and it is never cached."""

    name = "edits"
    config_class = EditsConfig
    cacheable, gate, publishes = False, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"edit_outcomes": layout.root / "edits"}

    def args(self, ctx: StageContext) -> EditsArgs:
        raise RlcycleError(
            "edits runs beside the cycle, not in it",
            hint="run `rlcycle edits --repo DIR LOGS -o DIR` from cron and add that directory to the cycle's events",
        )

    def run(self, config: EditsConfig, args: EditsArgs) -> EditsResult:
        return run(config, args)

    def record(self, result: EditsResult) -> Outcome:
        return Outcome(result.as_dict(), format_summary(result))


STAGE = EditsStage()
