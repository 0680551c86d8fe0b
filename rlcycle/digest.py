"""Content hashes of files and directory trees, and the one spelling of a checkpoint id.

In: paths. Out: sha256 hex digests, read with `hashlib.file_digest` (no file is read whole).

    file_sha256("examples.arrow")            # the file's bytes
    tree_sha256("runs/x/checkpoint")         # every file under a directory: name, NUL, bytes
    checkpoint_id_of(tree_sha256(d))         # "sha256:" + 64 hex

A checkpoint id is `sha256:` + 64 hex digits (init-model, train and the registry all write this).
Versions before it named a checkpoint without rlcycle.json `sha256-` + the first 32 hex digits of
the same tree hash; those ids are still *read*: `same_checkpoint` and `version_key` treat an old id
and the new id of the same content as one checkpoint, and `legacy_id` gives the old spelling of a
new id so a registry entry stored under it is still found. This module imports nothing of rlcycle's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

PREFIX = "sha256:"
LEGACY_PREFIX = "sha256-"  # read, never written
LEGACY_HEX = 32  # hex digits of a legacy id


def _feed(h: hashlib._Hash, path: Path) -> None:
    """Stream a file's bytes into the running hash `h`."""
    with open(path, "rb") as f:
        hashlib.file_digest(f, lambda: h)  # file_digest updates and returns the object we give it


def file_sha256(path: str | Path) -> str:
    """The sha256 of one file's bytes, as hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def files_sha256(files: Iterable[tuple[str | None, Path]]) -> str:
    """One sha256 over files in the given order: for each, its name and a NUL (unless the name
    is None), then its bytes. With no names it is the hash of the files' bytes concatenated."""
    h = hashlib.sha256()
    for name, path in files:
        if name is not None:
            h.update(name.encode() + b"\0")
        _feed(h, path)
    return h.hexdigest()


def tree_files(root: str | Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under `root`, in sorted path order."""
    root = Path(root)
    return [(str(f.relative_to(root)), f) for f in sorted(x for x in root.rglob("*") if x.is_file())]


def tree_sha256(root: str | Path) -> str:
    """The sha256 over every file under `root`: relative names and bytes, sorted (hex)."""
    return files_sha256(tree_files(root))


def checkpoint_id_of(hexdigest: str) -> str:
    """The checkpoint id of a sha256 hex digest: `sha256:` + 64 hex."""
    return PREFIX + hexdigest


def legacy_id(cid: str) -> str | None:
    """The pre-`sha256:` spelling of a new id (`sha256-` + 32 hex), or None for other ids."""
    if cid.startswith(PREFIX) and len(cid) == len(PREFIX) + 64:
        return LEGACY_PREFIX + cid[len(PREFIX) : len(PREFIX) + LEGACY_HEX]
    return None


def version_key(version: str) -> str:
    """A policy version / checkpoint id with an old `sha256-` id respelled `sha256:` (still
    32 hex): it is then a prefix of the new id of the same checkpoint; other strings unchanged."""
    if version.startswith(LEGACY_PREFIX):
        return PREFIX + version[len(LEGACY_PREFIX) :]
    return version


def same_checkpoint(a: str | None, b: str | None) -> bool:
    """True when two ids name one checkpoint: equal, or an old id and the new id it abbreviates."""
    if not a or not b:
        return False
    if a == b:
        return True
    old, new = (a, b) if a.startswith(LEGACY_PREFIX) else (b, a)
    return old.startswith(LEGACY_PREFIX) and legacy_id(new) == old
