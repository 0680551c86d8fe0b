"""Content hashes of files and directory trees, and the one spelling of a checkpoint id.

In: paths. Out: sha256 hex digests, read with `hashlib.file_digest` (no file is read whole).

    file_sha256("examples.arrow")            # the file's bytes
    tree_sha256("runs/x/checkpoint")         # every file under a directory: name, NUL, bytes
    checkpoint_id_of(hexdigest)              # "sha256:" + 64 hex

A checkpoint id is `sha256:` + 64 hex digits; which files and bytes it covers is
rlcycle/policy/manifest.py's (`tree_sha256` was the registry's id before manifests).
This module imports nothing of rlcycle's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

PREFIX = "sha256:"


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
