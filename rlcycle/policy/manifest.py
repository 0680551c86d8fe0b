"""Checkpoint ids that mean something: which files make a checkpoint, their manifest, two checks.

In: a checkpoint directory. Out: its content id (`sha256:<64 hex>`), its manifest
(`rlcycle.manifest.json` beside the model files: size, mtime and sha256 of every file that
counts) and a verification that raises `CheckpointChanged` (an InputError) naming the file that
changed, went missing or appeared.

    m = write_manifest(ckpt)             # init-model, train, registry add: after the last model file
    verify(ckpt)                         # cheap: stat every file, re-hash those whose size/mtime moved
    verify(ckpt, full=True)              # full: re-hash every file and recompute the id

Which files count: every regular file under the directory, recursively (symlinks to files
followed), except rlcycle's own metadata at its top level (METADATA):
- `rlcycle.json`: lineage (parent, data, config, metrics, created). It says where the checkpoint
  came from, not what it computes, and it holds the id, which cannot hash itself;
- `rlcycle.manifest.json`: this manifest (it holds the hashes);
- `train_metrics.arrow`: the training run's metrics, which train moves in; their wall-clock
  columns would give two runs that wrote the same model two ids.
Everything else counts: weights (model.safetensors, shards and their index, pytorch_model*.bin,
adapter/adapter_model.safetensors), config.json, generation_config.json, tokenizer files,
chat_template.jinja, adapter/adapter_config.json, and any file rlcycle does not know (custom
model code, a new tokenizer file). An exclude list, not an include list, so that no file that
changes what `from_pretrained` builds can change unnoticed.

The content id: sha256 over one line `<sha256 hex>  <name>\\n` per counted file (sha256sum's
format), sorted by name (the relative POSIX path). The shell reproduces it (for names without
spaces; names with a newline or backslash, which sha256sum would escape, are refused):

    cd CKPT && find . -type f ! -path ./rlcycle.json ! -path ./rlcycle.manifest.json \\
        ! -path ./train_metrics.arrow | cut -c3- | LC_ALL=C sort | xargs sha256sum | sha256sum

The manifest (JSON): {"format", "id", "content_id", "files": [{"name", "size", "mtime_ns",
"sha256"}]}. `id` is the name the checkpoint is known by; it equals `content_id`, except for a
checkpoint made before manifests existed (LEGACY): its rlcycle.json `id` (the sha256 of its
weight files alone) or its registry name (the sha256 of all its files, names and bytes:
`digest.tree_sha256`) is kept, after checking that it matches those bytes, so aliases, verdicts
and logs that name it stay valid; from then on the manifest guards every file. A checkpoint
without a manifest is checked by a full hash against its stated id each time it is opened.

Threat model: this catches accidental change (a file edited, truncated, zeroed, replaced or
added in place; a copy that went wrong), not an adversary. The cheap check trusts size and
mtime, so a writer that restores the mtime after writing passes it (the full check does not);
anyone who can write the files can also rewrite the manifest, except that a registry copy's
directory name is its id, which the full check recomputes from the bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlcycle import digest
from rlcycle import io as rio
from rlcycle.errors import InputError

MANIFEST = "rlcycle.manifest.json"
FORMAT = "rlcycle.manifest/1"
METADATA = frozenset({"rlcycle.json", MANIFEST, "train_metrics.arrow"})
ID_RE = re.compile(r"sha256:[0-9a-f]{64}")
# Linux stamps mtimes from a clock that ticks every few milliseconds: a write in the same tick
# as the manifest's stat would keep the recorded mtime. Recording at least this long after the
# newest file's mtime means any later write gets a different one (see write_manifest).
MTIME_TICK_NS = 20_000_000


@dataclass(frozen=True)
class FileEntry:
    name: str  # relative POSIX path inside the checkpoint
    size: int
    mtime_ns: int
    sha256: str


@dataclass
class Manifest:
    id: str  # what the checkpoint is known by (== content_id unless legacy)
    content_id: str  # the hash of `files` (content_id_of)
    files: dict[str, FileEntry] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        entries = [asdict(self.files[n]) for n in sorted(self.files)]
        return {"format": FORMAT, "id": self.id, "content_id": self.content_id, "files": entries}


@dataclass
class Verified:
    """What a verification found (it raises CheckpointChanged instead when something changed)."""

    path: Path
    id: str
    full: bool
    files: int
    bytes: int
    rehashed: int  # files read and hashed (full: all of them)
    recorded: bool  # False: no manifest; checked by a full hash against the stated id
    manifest: Manifest
    seconds: float = 0.0


class CheckpointChanged(InputError):
    """A checkpoint's files no longer match its manifest or its id; `problems` names each file."""

    def __init__(self, path: Path, cid: str | None, problems: list[str]):
        self.path, self.checkpoint_id, self.problems = Path(path), cid, problems
        super().__init__(
            f"checkpoint {cid or '?'} ({path}) changed since it was made: " + "; ".join(problems),
            hint="make it again, or restore it: `rlcycle registry add SOURCE_DIR` replaces a damaged "
            "registry copy with a source that verifies; `rlcycle registry verify` checks every registered one",
        )


# --- which files, and the id ------------------------------------------------------------------


def content_files(root: str | Path) -> list[tuple[str, Path]]:
    """(name, path) of every file that counts (see the module docstring), sorted by name."""
    files = [(n, p) for n, p in digest.tree_files(root) if n not in METADATA]
    for name, _ in files:
        if "\n" in name or "\\" in name:  # would break the one-line-per-file id format
            raise InputError(f"{Path(root) / name}: a file name with a newline or backslash", hint="rename it")
    return [(Path(n).as_posix(), p) for n, p in files]


def content_id_of(hashes: dict[str, str]) -> str:
    """The content id of {name: sha256 hex}: sha256 over sorted `<hex>  <name>\\n` lines."""
    listing = "".join(f"{hashes[n]}  {n}\n" for n in sorted(hashes))
    return digest.checkpoint_id_of(hashlib.sha256(listing.encode()).hexdigest())


def content_id(root: str | Path) -> str:
    """The content id of a directory's files, hashed now (a full read)."""
    return build_manifest(root).content_id


def _entry(name: str, path: Path) -> FileEntry:
    st = path.stat()  # before reading: a write during the hash then shows as a moved mtime
    return FileEntry(name, st.st_size, st.st_mtime_ns, digest.file_sha256(path))


def build_manifest(root: str | Path, cid: str | None = None) -> Manifest:
    """Hash every counted file of `root` now; `cid`: the id to record (default: the content id)."""
    files = {n: _entry(n, p) for n, p in content_files(root)}
    computed = content_id_of({n: e.sha256 for n, e in files.items()})
    return Manifest(cid or computed, computed, files)


# --- the manifest on disk ---------------------------------------------------------------------


def write_manifest(root: str | Path, manifest: Manifest | None = None) -> Manifest:
    """Write `manifest` (default: one built now) into `root` atomically; return it.

    Call it after the last model file is written. It first waits until the clock is a tick past
    the newest mtime (at most MTIME_TICK_NS), so that a later in-place write cannot keep an mtime
    the manifest recorded and slip past the cheap check."""
    root = Path(root)
    m = manifest or build_manifest(root)
    newest = max((e.mtime_ns for e in m.files.values()), default=0)
    wait = newest + MTIME_TICK_NS - time.time_ns()
    if 0 < wait <= MTIME_TICK_NS:
        time.sleep(wait / 1e9)
    rio.atomic_write_text(root / MANIFEST, json.dumps(m.as_json(), indent=1) + "\n")
    return m


def read_manifest(root: str | Path) -> Manifest | None:
    """The manifest of `root`, or None when it has none (a checkpoint made before manifests)."""
    path = Path(root) / MANIFEST
    try:
        doc = json.loads(path.read_text())
        files = {f["name"]: FileEntry(f["name"], int(f["size"]), int(f["mtime_ns"]), f["sha256"]) for f in doc["files"]}
        return Manifest(str(doc["id"]), str(doc["content_id"]), files)
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        # a damaged checkpoint like any other, so `registry verify` reports it and goes on
        raise CheckpointChanged(root, None, [f"{MANIFEST}: not a valid manifest ({type(e).__name__}: {e})"]) from None


def stated_id(root: str | Path) -> str | None:
    """The id rlcycle.json states (None without one)."""
    meta = Path(root) / "rlcycle.json"
    if not meta.exists():
        return None
    try:
        found = json.loads(meta.read_text()).get("id")
    except (json.JSONDecodeError, AttributeError) as e:
        raise CheckpointChanged(root, None, [f"rlcycle.json: not a JSON object ({e})"]) from None
    return str(found) if found else None


# --- verification -----------------------------------------------------------------------------


def verify(root: str | Path, full: bool = False, expected_id: str | None = None) -> Verified:
    """Check the checkpoint `root` against its manifest; raise CheckpointChanged if it changed.

    cheap (`full=False`, for opening a checkpoint to train or sample): stat every listed file;
    a file whose size differs has changed; one whose mtime differs is re-hashed (an in-place
    write moves the mtime, so 64 zeroed bytes are caught); files not listed are named too.
    full: re-hash every file and recompute the id. `expected_id`: the id the caller knows the
    checkpoint by (a directory named like an id, as registry copies are, is held to its name).
    Without a manifest (a checkpoint made before them) both levels hash every file and check
    the id it states (see the module docstring, LEGACY)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: not a checkpoint directory", hint="pass the directory train or init-model wrote")
    start = time.perf_counter()
    expected = expected_id or (root.name if ID_RE.fullmatch(root.name) else None)
    recorded = read_manifest(root)
    if recorded is None:
        m, rehashed = _check_unrecorded(root, expected), None
    else:
        m, rehashed = _check_recorded(root, recorded, full, expected)
    n_bytes = sum(e.size for e in m.files.values())
    hashed = len(m.files) if rehashed is None else rehashed
    seconds = time.perf_counter() - start
    return Verified(root, m.id, full, len(m.files), n_bytes, hashed, recorded is not None, m, seconds)


def _check_recorded(root: Path, m: Manifest, full: bool, expected: str | None) -> tuple[Manifest, int]:
    """Files against the manifest, then the ids; (manifest, files re-hashed)."""
    problems, seen, rehashed = _compare_files(root, m, full)
    if problems:
        raise CheckpointChanged(root, m.id, problems)
    hashes = {n: e.sha256 for n, e in seen.items()}
    computed = content_id_of(hashes)
    if computed != m.content_id:  # the manifest itself was edited
        problems.append(f"{MANIFEST}: its content_id {m.content_id} is not the hash of the files it lists ({computed})")
    elif m.id != m.content_id and full:  # a legacy id: recheck it against the bytes
        legacy = _legacy_id(root, hashes)
        if legacy != m.id:
            problems.append(f"{MANIFEST}: id {m.id} is neither its content id nor its pre-manifest hash ({legacy})")
    for who, claim in (("rlcycle.json", stated_id(root)), ("its directory name", expected)):
        if claim and claim != m.id:
            problems.append(f"{who} says id {claim}, its manifest {m.id}")
    if problems:
        raise CheckpointChanged(root, m.id, problems)
    # The files as seen now (same hashes; the mtimes this copy has), so a copy of it (registry
    # add) can record its own mtimes instead of re-hashing every file whose mtime a `cp` changed.
    return Manifest(m.id, m.content_id, seen), rehashed


def _compare_files(root: Path, m: Manifest, full: bool) -> tuple[list[str], dict[str, FileEntry], int]:
    """(problems, {name: the entry as seen now}, files re-hashed): each listed file by size,
    then by hash when `full` or its mtime moved; and every counted file the manifest does not list."""
    on_disk = dict(content_files(root))
    problems: list[str] = []
    seen: dict[str, FileEntry] = {}
    rehashed = 0
    for name, want in sorted(m.files.items()):
        path = on_disk.pop(name, None)
        if path is None:
            problems.append(f"{name}: missing")
            continue
        st = path.stat()
        if st.st_size != want.size:
            problems.append(f"{name}: changed (size {st.st_size:,} bytes, the manifest says {want.size:,})")
            continue
        got = want.sha256
        if full or st.st_mtime_ns != want.mtime_ns:
            got, rehashed = digest.file_sha256(path), rehashed + 1
        if got != want.sha256:
            problems.append(f"{name}: changed (sha256 {got[:16]}…, the manifest says {want.sha256[:16]}…)")
        seen[name] = FileEntry(name, st.st_size, st.st_mtime_ns, got)  # stat before the hash
    problems += [f"{name}: unexpected file (not in the manifest)" for name in sorted(on_disk)]
    return problems, seen, rehashed


def _check_unrecorded(root: Path, expected: str | None) -> Manifest:
    """A checkpoint without a manifest: hash every file; the id it states (rlcycle.json's, or
    its directory name) must be its content id or its pre-manifest hash. Nothing stated: its
    content id is its id."""
    m = build_manifest(root)
    claims = [(who, c) for who, c in (("rlcycle.json", stated_id(root)), ("its directory name", expected)) if c]
    hashes = {n: e.sha256 for n, e in m.files.items()}
    legacy = None
    problems = []
    for who, claim in claims:
        if claim == m.content_id:
            continue
        legacy = legacy or _legacy_id(root, hashes)
        if claim != legacy:
            problems.append(
                f"{who} says id {claim}, but its files hash to {m.content_id} "
                f"({legacy} by the pre-manifest rule); it has no manifest, so the changed file cannot be named"
            )
    if problems:
        raise CheckpointChanged(root, claims[0][1], problems)
    if claims:
        m.id = claims[0][1]
    return m


def _legacy_id(root: Path, hashes: dict[str, str]) -> str:
    """The id rlcycle gave this checkpoint before manifests: with an rlcycle.json (train,
    init-model), the sha256 of its weight files' bytes concatenated in name order; without one
    (the registry's own), the sha256 of all its files, names and bytes (digest.tree_sha256)."""
    if (root / "rlcycle.json").exists():
        weights = sorted(root.glob("*.safetensors")) or sorted(root.glob("pytorch_model*.bin"))
        if len(weights) == 1 and weights[0].name in hashes:  # one file: its hash, already known
            return digest.checkpoint_id_of(hashes[weights[0].name])
        return digest.checkpoint_id_of(digest.files_sha256((None, f) for f in weights))
    return digest.checkpoint_id_of(digest.files_sha256((n, p) for n, p in digest.tree_files(root) if n != MANIFEST))
