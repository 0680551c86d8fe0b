"""Reading and writing rlcycle artifacts by path or `-` (docs/design.md, "Conventions").

Formats, chosen by the path when writing and sniffed by magic bytes when reading:
- `.arrow` (or `.feather`/`.ipc`): uncompressed Arrow IPC *file* (memory-mappable; `pl.scan_ipc`)
- `-`: Arrow IPC *stream* on stdout/stdin (pipes cannot seek)
- `.parquet`: Parquet
- `.jsonl` / `.json` (optionally `.gz`): JSON lines, for events and quarantine files

Every write is atomic: a temp file beside the target, renamed into place on success, removed
on failure, so an output path never holds a partial file. A writer killed before it could
remove its temp file (kill -9, OOM) leaves it behind; the temp name carries the writer's host
and pid (`.<name>.<host>-<pid>.XXXXXXXX.tmp`), so the next write of the same target removes
those of dead writers on this host (`reclaim_temps`) and never a live one's. Binary is never written to a
terminal. Directories (checkpoints) get the same treatment with `atomic_dir`, a stage's working
directory (collect's partitions) with `scratch_dir`; `FileLock` is the one inter-process lock
(a registry writer, one cycle per RLCYCLE_HOME).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import IO, BinaryIO

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from rlcycle.errors import InputError, RlcycleError

STDIO = "-"


class Format(str, Enum):
    ARROW_FILE = "arrow-file"
    ARROW_STREAM = "arrow-stream"
    PARQUET = "parquet"
    GZIP = "gzip"
    JSON = "json"  # JSON lines or one JSON document (OTel export)
    EMPTY = "empty"
    UNKNOWN = "unknown"


ARROW_FILE_MAGIC = b"ARROW1"
PARQUET_MAGIC = b"PAR1"
GZIP_MAGIC = b"\x1f\x8b"
STREAM_CONTINUATION = b"\xff\xff\xff\xff"


def sniff(head: bytes) -> Format:
    """The format of a file from its first bytes (at least 8 are enough)."""
    if not head:
        return Format.EMPTY
    if head.startswith(ARROW_FILE_MAGIC):
        return Format.ARROW_FILE
    if head.startswith(PARQUET_MAGIC):
        return Format.PARQUET
    if head.startswith(GZIP_MAGIC):
        return Format.GZIP
    if head.startswith(STREAM_CONTINUATION):
        return Format.ARROW_STREAM
    stripped = head.lstrip()
    if stripped.startswith((b"{", b"[")):
        return Format.JSON
    if not stripped:
        return Format.EMPTY
    return Format.UNKNOWN


def format_for_output(path: str | Path) -> Format:
    """The format a path asks for when writing."""
    s = str(path)
    if s == STDIO:
        return Format.ARROW_STREAM
    suffix = Path(s).suffix.lower()
    if suffix == ".parquet":
        return Format.PARQUET
    if suffix in (".arrow", ".feather", ".ipc", ""):
        return Format.ARROW_FILE
    if suffix in (".jsonl", ".json"):
        return Format.JSON
    raise InputError(
        f"output {s}: unknown extension {suffix!r}",
        hint="use .arrow (Arrow IPC file), .parquet, or - for an Arrow stream on stdout",
    )


# --- reading ---------------------------------------------------------------------------------


def open_binary(path: str | Path) -> BinaryIO:
    """A readable binary stream for a path or `-` (stdin), peekable for sniffing."""
    if str(path) == STDIO:
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint="check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a file") from None


def read_head(path: str | Path, n: int = 8) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def iter_batches(path: str | Path, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """Record batches of an Arrow file, Arrow stream or Parquet file (or `-`), lazily."""
    if str(path) == STDIO:
        data = sys.stdin.buffer.read()
        yield from _iter_buffer(data, "<stdin>")
        return
    fmt = sniff(read_head(path))
    if fmt is Format.ARROW_FILE:
        with pa.memory_map(str(path)) as src:
            try:
                reader = ipc.open_file(src)
            except pa.ArrowInvalid as e:
                raise InputError(
                    f"{path}: unreadable Arrow file ({e})", hint="is it truncated? `rlcycle inspect` it"
                ) from None
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    elif fmt is Format.ARROW_STREAM:
        with open(path, "rb") as f:
            yield from ipc.open_stream(f)
    elif fmt is Format.PARQUET:
        yield from pq.ParquetFile(str(path)).iter_batches(batch_size=batch_rows)
    else:
        raise InputError(
            f"{path}: not an Arrow or Parquet file (looks like {fmt.value})",
            hint="artifacts are .arrow (IPC file), .parquet, or an IPC stream on stdin",
        )


def _iter_buffer(data: bytes, name: str) -> Iterator[pa.RecordBatch]:
    fmt = sniff(data[:8])
    buf = pa.py_buffer(data)
    if fmt is Format.ARROW_STREAM:
        yield from ipc.open_stream(buf)
    elif fmt is Format.ARROW_FILE:
        reader = ipc.open_file(buf)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    elif fmt is Format.PARQUET:
        yield from pq.ParquetFile(pa.BufferReader(buf)).iter_batches()
    else:
        raise InputError(
            f"{name}: not an Arrow stream, Arrow file or Parquet (looks like {fmt.value})",
            hint="pipe the output of an rlcycle stage written with -o -",
        )


def read_schema(path: str | Path) -> pa.Schema:
    """The schema of an Arrow/Parquet artifact without reading its rows (files only)."""
    fmt = sniff(read_head(path))
    if fmt is Format.ARROW_FILE:
        with pa.memory_map(str(path)) as src:
            return ipc.open_file(src).schema
    if fmt is Format.ARROW_STREAM:
        with open(path, "rb") as f:
            return ipc.open_stream(f).schema
    if fmt is Format.PARQUET:
        return pq.read_schema(str(path))
    raise InputError(f"{path}: not an Arrow or Parquet file (looks like {fmt.value})")


def read_table(path: str | Path) -> pa.Table:
    """A whole artifact as a table (small artifacts; big ones stream with iter_batches)."""
    if str(path) == STDIO:
        batches = list(iter_batches(path))
        if not batches:
            raise InputError("<stdin>: no Arrow data", hint="pipe an rlcycle stage's `-o -` output")
        return pa.Table.from_batches(batches)
    fmt = sniff(read_head(path))
    if fmt is Format.PARQUET:
        return pq.read_table(str(path))
    if fmt is Format.ARROW_FILE:
        with pa.memory_map(str(path)) as src:
            return ipc.open_file(src).read_all()
    schema = read_schema(path)
    return pa.Table.from_batches(list(iter_batches(path)), schema=schema)


# --- writing ---------------------------------------------------------------------------------


def refuse_terminal(stream: IO) -> None:
    """Binary on a terminal helps nobody: refuse with a hint."""
    if hasattr(stream, "isatty") and stream.isatty():
        raise InputError(
            "refusing to write binary Arrow data to a terminal",
            hint="redirect it (`> out.arrow`), pipe it (`| rlcycle inspect -`), or pass -o FILE",
        )


def _writer_tag() -> str:
    """This process as temp names carry it: host (dots and dashes as `_`) and pid."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', socket.gethostname())}-{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie or another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reclaim_temps(path: str | Path) -> list[Path]:
    """Remove the temp files and directories that dead writers of `path` left beside it; return them.

    Only names of this target's pattern (`.<name>.<host>-<pid>.XXXXXXXX.tmp`, XXXXXXXX from
    mkstemp/mkdtemp) with this host and a pid that no longer runs: a live writer's temp, another
    target's, or one written on another host of a shared filesystem is never touched."""
    target = Path(path)
    host = _writer_tag().rsplit("-", 1)[0]
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(host)}-(\d+)\.[a-z0-9_]{{8}}\.tmp")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if not m or pid_alive(int(m.group(1))):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)
        removed.append(Path(entry.path))
    return removed


def _temp_dir(target: Path) -> Path:
    """A fresh directory beside `target`, named for it and this writer (`reclaim_temps` pattern),
    after removing the ones dead writers of `target` left."""
    target.parent.mkdir(parents=True, exist_ok=True)
    reclaim_temps(target)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{_writer_tag()}.", suffix=".tmp", dir=target.parent))


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside `path`; renamed onto it when the block succeeds, removed otherwise.
    Temp files that killed writers of `path` left are removed first (`reclaim_temps`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    reclaim_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{_writer_tag()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():
            os.chmod(tmp_path, 0o644)  # mkstemp makes 0600; an artifact is for other readers too
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A fresh temp directory beside `path`, swapped onto it when the block succeeds.

    On success the directory gets the modes the umask allows (mkdtemp makes 0700) and
    `replace_dir` puts it in place; on any exception it is removed. Its name starts with a dot
    (`.<name>.<host>-<pid>.XXXXXXXX.tmp`), so listings that skip dot-entries never see
    a partial one, and one a killed writer left is removed by the next `atomic_dir` of `path`.
    """
    target = Path(path)
    tmp = _temp_dir(target)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def scratch_dir(path: str | Path) -> Iterator[Path]:
    """A working directory beside `path` (`.<name>.<host>-<pid>.XXXXXXXX.tmp`), removed when the
    block ends; one that a killed process left is removed by the next `scratch_dir(path)`."""
    tmp = _temp_dir(Path(path))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: str | Path, path: str | Path) -> None:
    """Rename the finished directory `tmp` onto `path` (same filesystem).

    An empty directory at `path` is simply replaced; anything else there (a directory or a file)
    is renamed aside first and removed after, so `path` is at every instant either the old
    content or the new one, never a mix.
    """
    tmp, target = Path(tmp), Path(path)
    old = None
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def open_empty(path: Path) -> pa.NativeFile:
    """The empty file `atomic_path` made, opened to write, without truncating it.

    Opening it "wb" would truncate it (to the size it already has), and ext4 takes a file
    truncated to zero and written again for a replace-by-truncate (`auto_da_alloc`): closing it
    then starts writeback of all its data and waits for the blocks to be allocated, ~0.2 s for
    collect's 512 MB output here (docs/performance.md). Append mode on an empty file writes the
    same bytes; the data reaches the disk by the kernel's background writeback instead, as for
    any file never fsynced (atomic_path promises old-or-new after a crash of the process, not
    of the machine)."""
    return pa.OSFile(str(path), "ab")


class ArtifactWriter:
    """Write record batches to an artifact path atomically; `-` streams IPC to stdout.

    with ArtifactWriter("out.arrow", schema) as w:
        w.write(batch)
    The file appears at its path only when the block exits without an exception.
    """

    def __init__(self, path: str | Path, schema: pa.Schema, row_group_rows: int = 131072):
        self.path = str(path)
        self.schema = schema
        self.fmt = format_for_output(path)
        if self.fmt is Format.JSON:
            raise InputError(
                f"output {path}: artifacts are Arrow or Parquet, not JSON",
                hint="use .arrow or .parquet",
            )
        self.rows = 0
        self._ctx: contextlib.AbstractContextManager | None = None
        self._sink = None
        self._writer = None
        self._row_group_rows = row_group_rows

    def __enter__(self) -> ArtifactWriter:
        if self.path == STDIO:
            refuse_terminal(sys.stdout)
            self._sink = sys.stdout.buffer
            self._writer = ipc.new_stream(self._sink, self.schema)
            return self
        self._ctx = atomic_path(self.path)
        tmp = self._ctx.__enter__()
        self._sink = open_empty(tmp)
        if self.fmt is Format.PARQUET:
            self._writer = pq.ParquetWriter(self._sink, self.schema)
        else:
            self._writer = ipc.new_file(self._sink, self.schema)
        return self

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        if data.num_rows == 0:
            return
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        if not data.schema.equals(self.schema, check_metadata=False):
            data = data.cast(self.schema)
        if self.fmt is Format.PARQUET:
            self._writer.write_table(data, row_group_size=self._row_group_rows)
        else:
            self._writer.write_table(data)
        self.rows += data.num_rows

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
            if self._sink is not None and self.path != STDIO:
                self._sink.close()
            elif self.path == STDIO:
                sys.stdout.buffer.flush()
        finally:
            if self._ctx is not None:
                self._ctx.__exit__(exc_type, exc, tb)


def write_table(table: pa.Table, path: str | Path) -> int:
    """Write a whole table atomically; returns the row count."""
    with ArtifactWriter(path, table.schema) as w:
        w.write(table)
    return w.rows


class AtomicTextWriter:
    """A text file (e.g. a quarantine JSONL) that appears only on success; created lazily.

    Nothing is created when nothing is written, so a clean run leaves no empty quarantine.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.count = 0
        self._ctx: contextlib.AbstractContextManager | None = None
        self._fh: IO[str] | None = None

    def write_line(self, line: str) -> None:
        if self._fh is None:
            self._ctx = atomic_path(self.path)
            self._fh = open(self._ctx.__enter__(), "w")
        self._fh.write(line if line.endswith("\n") else line + "\n")
        self.count += 1

    def commit(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._ctx.__exit__(None, None, None)
            self._fh = None

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._ctx.__exit__(RlcycleError, RlcycleError("aborted"), None)
            self._fh = None


class LockBusy(RlcycleError):
    """A `FileLock(..., wait=False)` that another process holds; `holder` is what it wrote."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is locked by {holder or 'another process'}")
        self.path, self.holder = path, holder


class FileLock:
    """An exclusive `flock` on a file, for one process at a time (created if missing).

    The kernel drops the lock when the holder's process dies, however it dies, so a crashed
    holder's lock is free at once: there is no stale lock to clean up. `wait=False` raises
    `LockBusy` instead of waiting; `holder` is written into the file once the lock is held, so
    a refused process can say who holds it. Not re-entrant: two opens of one file in one
    process are two lockers (flock locks an open file description).

        with FileLock(home / "cycle.lock", wait=False, holder=f"pid {os.getpid()}"):
            ...
    """

    def __init__(self, path: str | Path, *, wait: bool = True, holder: str | None = None):
        self.path = Path(path)
        self.wait, self.holder = wait, holder
        self._fh: IO[str] | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            raise LockBusy(self.path, holder) from None
        except BaseException:
            fh.close()
            raise
        if self.holder is not None:
            fh.seek(0)
            fh.truncate()
            fh.write(self.holder + "\n")
            fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
