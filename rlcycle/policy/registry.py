"""The model registry: content-addressed checkpoints and aliases on disk, updated atomically.

Layout of a registry directory (the caller names it: `Registry(root)`; the CLI's default is
`$RLCYCLE_HOME/registry`, RLCYCLE_HOME defaulting to ~/.rlcycle, resolved in rlcycle/cli/options.py;
a cycle's is `<registry_home>/registry`):

    checkpoints/<id>/     an HF checkpoint (loadable as is) + rlcycle.json + rlcycle.manifest.json;
                          never modified (a damaged copy is replaced whole by `add`)
    state.json            {"seq", "aliases": {name: id}, "canary": {...}, "last": <entry>}
    deployments.arrow     history, one row per promotion/rollback (the `deployments` contract)
    .lock                 rlcycle.io.FileLock: one writer at a time

Atomicity: the only commit point is the rename of `state.json`. A checkpoint is copied into a
temp dir and renamed into `checkpoints/` before any state refers to it; `deployments.arrow` is
derived — if a process died after committing state but before appending history, the next
open appends `state.last` (its `seq` says whether it is already there). So a process killed at
any instant leaves a registry whose aliases all point at complete checkpoints.

A writer killed mid-copy leaves its temp dir (`checkpoints/.<id>.<host>-<pid>.<random>.tmp`, a
partial copy; rlcycle/io.py `atomic_dir`).
Opening the registry removes every such dot-entry under `checkpoints/`, and does it while
holding `.lock`: temps are only made by `add`, which runs under that lock, and the kernel drops
a dead holder's lock, so a temp seen while we hold the lock has no live writer.

A checkpoint's id is its content id: `sha256:` over the hashes of every file that changes what
it does (weights, configs, tokenizer, chat template, adapter; not rlcycle's metadata), recorded
with each file's size and mtime in its manifest `rlcycle.manifest.json` (rlcycle/policy/manifest.py
says which files count and how the id is spelled). init-model and train write the manifest; `add`
checks a checkpoint against it (cheap: re-hashing only files whose size or mtime moved), and
writes one into the registry's copy of a checkpoint that has none. `verify_checkpoint(path,
full=True)` re-hashes everything: deploy and rollback run it on what they are about to serve,
`rlcycle registry verify` on every checkpoint. A checkpoint made before manifests keeps the id
it had (rlcycle.json's, or the registry's hash of its files) once its bytes are checked against it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlcycle import io as rio
from rlcycle.errors import InputError, RlcycleError
from rlcycle.faults import crash_point
from rlcycle.policy import manifest as M
from rlcycle.policy.manifest import CheckpointChanged, Verified
from rlcycle.schema import DEPLOYMENTS

__all__ = ["Check", "CheckpointChanged", "Registry", "Verified", "checkpoint_dir", "checkpoint_id", "verify_checkpoint"]


def checkpoint_id(path: str | Path) -> str:
    """The id of a checkpoint directory, as recorded (rlcycle.json's, else its manifest's);
    computed from its files (a full read) when neither records one. The two agree in every
    checkpoint rlcycle makes; where they do not, `verify_checkpoint` refuses it. Does not verify."""
    p = Path(path)
    stated = M.stated_id(p)
    if stated:
        return stated
    recorded = M.read_manifest(p)
    return recorded.id if recorded is not None else M.content_id(p)


def verify_checkpoint(path: str | Path, full: bool = False, expected_id: str | None = None) -> Verified:
    """Check a checkpoint's files against its manifest; raise CheckpointChanged (an InputError
    naming the checkpoint and each changed, missing or unexpected file) when they differ.

    `full=False` (opening it to train or sample): sizes and mtimes, re-hashing only files whose
    mtime moved. `full=True` (before serving; `rlcycle registry verify`): re-hash every file and
    recompute the id. `expected_id`: the id the caller knows it by (a registry copy's directory
    name is checked anyway). Returns what was checked (`Verified`: id, files, bytes, rehashed)."""
    return M.verify(path, full=full, expected_id=expected_id)


def checkpoint_dir(ref: str, registry: Registry | str | Path | None) -> Path:
    """The checkpoint directory `ref` names: a directory as is, else an alias, id or
    `registry:<alias>` of `registry` (a `Registry`, or its directory: then opened read-only, so
    naming a checkpoint creates, locks and repairs nothing)."""
    path = Path(ref)
    if path.is_dir():
        return path
    if registry is None:
        raise InputError(
            f"policy {ref!r}: not a directory, and no registry was given to resolve it as an alias",
            hint="pass a checkpoint directory, or name the registry (the CLI's default: $RLCYCLE_HOME/registry)",
        )
    reg = registry if isinstance(registry, Registry) else Registry(registry, readonly=True)
    return reg.resolve(ref)  # raises a clear error naming the known aliases


@dataclass
class Check:
    """What `Registry.verify` found for one checkpoint (`rlcycle registry verify` prints it)."""

    ref: str
    path: str
    id: str | None
    ok: bool
    problems: list[str]  # one per changed, missing or unexpected file (or id that disagrees)
    aliases: list[str]
    files: int = 0
    bytes: int = 0
    recorded: bool = True  # False: no manifest (made before them), checked against its stated id
    seconds: float = 0.0


@dataclass
class Entry:
    action: str
    alias: str
    checkpoint_id: str | None
    previous_id: str | None
    verdict: str | None = None
    decision: str | None = None
    actor: str | None = None
    note: str | None = None
    ts: float = 0.0
    seq: int = 0

    def row(self) -> dict[str, Any]:
        return {
            "ts": datetime.fromtimestamp(self.ts, tz=timezone.utc),
            "action": self.action,
            "alias": self.alias,
            "checkpoint_id": self.checkpoint_id,
            "previous_id": self.previous_id,
            "verdict": self.verdict,
            "decision": self.decision,
            "actor": self.actor,
            "note": self.note,
        }


class Registry:
    """Open (and repair) a registry; every mutation happens under `with reg.locked():`."""

    def __init__(self, root: str | Path, readonly: bool = False):
        """`readonly`: only read it (a dry run): nothing is created, locked or repaired, and a
        registry that does not exist reads as empty."""
        self.root = Path(root)
        self.ckpts = self.root / "checkpoints"
        if readonly:
            return
        self.ckpts.mkdir(parents=True, exist_ok=True)
        with self.locked():  # finishes a history append a killed writer left undone
            self._remove_stale_temps()

    # --- reading ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        path = self.root / "state.json"
        if not path.exists():
            return {"seq": 0, "aliases": {}, "canary": None, "last": None}
        return json.loads(path.read_text())

    def aliases(self) -> dict[str, str]:
        return dict(self.state()["aliases"])

    def resolve(self, ref: str) -> Path:
        """A checkpoint directory for an alias, an id, `registry:<alias>` or a path."""
        name = ref.removeprefix("registry:")
        aliases = self.aliases()
        if name in aliases:
            return self.ckpts / aliases[name]
        stored = self.stored_id(name)
        if stored is not None:
            return self.ckpts / stored
        if Path(ref).is_dir():
            return Path(ref)
        known = ", ".join(sorted(aliases)) or "none yet"
        raise InputError(
            f"{ref!r} is not a registry alias (known: {known}), checkpoint id, or directory",
            hint="`rlcycle registry ls` lists them; `rlcycle registry add DIR --alias production` registers one",
        )

    def stored_id(self, cid: str) -> str | None:
        """`cid` when a checkpoint is stored under it (never a dot-entry or a path), else None."""
        if cid and not cid.startswith(".") and "/" not in cid and (self.ckpts / cid).is_dir():
            return cid
        return None

    def checkpoints(self) -> list[dict[str, Any]]:
        out = []
        aliases = self.aliases()
        for d in sorted(self.ckpts.iterdir()):
            if not d.is_dir() or d.name.startswith("."):
                continue
            meta = _read_meta(d)
            out.append(
                {
                    "id": d.name,
                    "aliases": sorted(a for a, i in aliases.items() if i == d.name),
                    "parent": meta.get("parent"),
                    "created": meta.get("created"),
                    "path": str(d),
                }
            )
        return out

    def verify(self, refs: list[str] | tuple[str, ...] = ()) -> list[Check]:
        """Re-hash every file of the checkpoints `refs` name (aliases, ids or directories; none:
        every stored checkpoint) against their manifests and ids: one Check each. A ref that
        names nothing raises InputError before anything is hashed."""
        aliases = self.aliases()
        if refs:
            targets = [(ref, self.resolve(ref)) for ref in refs]
        else:
            targets = [(c["id"], Path(c["path"])) for c in self.checkpoints()]
        out = []
        for ref, path in targets:
            names = sorted(a for a, i in aliases.items() if self.ckpts / i == path)
            try:
                v = verify_checkpoint(path, full=True)
            except CheckpointChanged as e:
                out.append(Check(ref, str(path), e.checkpoint_id, False, e.problems, names))
                continue
            out.append(Check(ref, str(path), v.id, True, [], names, v.files, v.bytes, v.recorded, v.seconds))
        return out

    def history(self) -> pa.Table:
        path = self.root / "deployments.arrow"
        if not path.exists():
            return DEPLOYMENTS.arrow.empty_table()
        return rio.read_table(path)

    # --- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[Registry]:
        with rio.FileLock(self.root / ".lock"):
            self._repair_history()
            yield self

    def add(self, src: str | Path, full: bool = False) -> str:
        """Copy a checkpoint in (idempotent); returns its id. Call under `locked()`.

        The source is verified first (`full`: every file re-hashed, as deploy asks for what it
        will serve; else the cheap check); when the id is stored already, that stored copy is
        verified too, since it is what gets served, and replaced by the source if it was damaged.
        A source without a manifest is hashed whole and its copy gets one. Raises
        CheckpointChanged, leaving the registry as it was."""
        src = Path(src)
        if not src.is_dir():
            raise InputError(f"{src}: not a checkpoint directory")
        if not any(src.glob("config.json")):
            raise InputError(f"{src}: no config.json — not an HF checkpoint", hint="pass the directory train wrote")
        checked = verify_checkpoint(src)  # without a manifest this hashes every file anyway
        stored = self.stored_id(checked.id)
        if stored is not None and (self.ckpts / stored).resolve() == src.resolve():
            return verify_checkpoint(src, full=full).id  # src is the registry's copy
        if stored is not None:
            try:
                return verify_checkpoint(self.ckpts / stored, full=full).id
            except CheckpointChanged:
                pass  # a damaged registry copy: the source, once verified, replaces it below
        if full and checked.recorded:
            checked = verify_checkpoint(src, full=True)
        with rio.atomic_dir(self.ckpts / checked.id) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True, copy_function=_copy_file)
            crash_point("copied")
            # The manifest as the source was checked (the same hashes, the mtimes it has now, which
            # copy2 kept): a source without one gets one, a `cp`'d one its own mtimes back.
            M.write_manifest(tmp, checked.manifest)
            # Cheap, as the copy kept the source's mtimes: a file that changed between the check
            # above and its copy has another mtime, is re-hashed here, and stops the add.
            verify_checkpoint(tmp, expected_id=checked.id)
        return checked.id

    def commit(self, aliases: dict[str, str], entry: Entry, canary: dict[str, Any] | None = None) -> None:
        """Atomically replace the state (the commit point), then append the history row."""
        state = self.state()
        for name, cid in aliases.items():
            if not (self.ckpts / cid).is_dir():
                raise RlcycleError(f"alias {name!r} would point at missing checkpoint {cid}")
        entry.seq = state["seq"] + 1
        entry.ts = entry.ts or time.time()
        new = {
            "seq": entry.seq,
            "aliases": aliases,
            "canary": canary if canary is not None else state.get("canary"),
            "last": entry.__dict__,
        }
        crash_point("before-state")
        crash_point(f"before-state:{entry.action}")
        rio.atomic_write_text(self.root / "state.json", json.dumps(new, indent=2) + "\n")
        crash_point("after-state")
        crash_point(f"after-state:{entry.action}")
        self._repair_history()

    def _remove_stale_temps(self) -> None:
        """Delete partial copies killed writers left in checkpoints/. Call under `locked()`."""
        for d in self.ckpts.iterdir():
            if not d.name.startswith("."):
                continue
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
            else:
                d.unlink(missing_ok=True)

    def _repair_history(self) -> None:
        """Append the last committed entry to deployments.arrow if it is not there yet."""
        state_path = self.root / "state.json"
        if not state_path.exists():
            return
        state = json.loads(state_path.read_text())
        hist = self.history()
        if hist.num_rows >= state["seq"] or not state.get("last"):
            return
        entry = Entry(**state["last"])
        table = pa.concat_tables([hist, pa.Table.from_pylist([entry.row()], schema=DEPLOYMENTS.arrow)])
        rio.write_table(table, self.root / "deployments.arrow")


def _copy_file(src: str, dst: str, *, follow_symlinks: bool = True) -> str:
    """shutil.copy2, then the `copying` crash point: a kill there leaves a half-copied temp."""
    out = shutil.copy2(src, dst, follow_symlinks=follow_symlinks)
    crash_point("copying")
    return out


def _read_meta(d: Path) -> dict[str, Any]:
    try:
        return json.loads((d / "rlcycle.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def actor() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
