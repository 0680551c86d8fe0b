"""Finding collect's inputs and dispatching each to the reader of its format.

In: paths (files, directories, globs) or `-`. `expand_inputs` turns them into `Inputs`: the
files to read, and the files passed over with the reason; `read_source` sniffs each one (gzip,
JSON lines, OTLP/JSON, Arrow IPC file or stream, Parquet) and yields the `Chunk`s of the
matching reader. Nothing is dropped silently: every input line becomes either a row or a
quarantine record, and every file passed over is counted and named in the result.

Which files are passed over. A directory (or a glob) is a listing, and a run directory holds
more than event logs, so a listed file is skipped when it is not an event log
- by name: hidden (dot) files and anything under a dot directory (writers' temp files), and the
  files rlcycle writes beside its outputs (`SIDECARS`: `OUT.config.json`, `manifest.json`, ...);
- by content (`not_events`): a JSON document that is not an OTLP/JSON export (e.g. `--json`
  output saved there), JSON lines whose first record is an object with no event key, an
  Arrow/Parquet table with no event column (e.g. collect's own trajectories.arrow), or a file
  in none of the formats.
A file named on its own is meant to be read: a sidecar name, or content the readers would take
as all-bad records, is an error naming the file instead (the readers raise the rest).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import queue
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from rlcycle import io as rio
from rlcycle.collect.arrow import read_arrow
from rlcycle.collect.events import Chunk, empty_events
from rlcycle.collect.jsonl import done, first_line, is_otel, jsonl_tasks, parse_files_together, ready
from rlcycle.errors import InputError

# Bytes of JSON lines per block. Not more than 16 MiB: glibc serves each buffer of 32 MiB or more
# (where its mmap threshold tops out) from fresh pages of its own mmap, so every block costs
# page faults again; smaller ones reuse the heap (docs/performance.md, "2026-12-07").
BLOCK_BYTES = 16 << 20


# What rlcycle writes beside its outputs (by exact name, then by ending): never event logs.
SIDECARS = {
    "manifest.json": "a cycle stage's manifest",
    "run.json": "a cycle run's run.json",
    "verdict.json": "an eval verdict",
    "reward_report.json": "distill's reward report",
    "rlcycle-buckets.json": "the marker of a bucketed gateway log (collect/buckets.py)",
    ".config.json": "a resolved config saved beside an output (OUT.config.json)",
    ".quarantine.jsonl": "collect's quarantine file",
    ".tmp": "a writer's temp file",
}
# Keys (JSON) or columns (Arrow) every event has (collect's trajectories have neither).
EVENT_KEYS = ("event_id", "type")


@dataclass
class Inputs:
    """What `expand_inputs` found: files to read, in order, and files passed over by name."""

    files: list[str]
    listed: set[str] = field(default_factory=set)  # found in a directory or by a glob, not named
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"}


def sidecar(path: str) -> str | None:
    """What rlcycle file `path` is by its name, or None when the name says nothing."""
    name = os.path.basename(path)
    return SIDECARS.get(name) or next(
        (what for end, what in SIDECARS.items() if end.startswith(".") and name.endswith(end)), None
    )


def expand_inputs(specs: list[str]) -> Inputs:
    """Files for the given files, directories (recursively, sorted) and globs; `-` kept."""
    found = Inputs([])
    problems = []
    for spec in specs:
        if spec == rio.STDIO:
            found.files.append(spec)
        elif os.path.isdir(spec):
            files = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file())
            if not files:
                problems.append(f"{spec}: directory holds no files")
            for f in files:
                if any(part.startswith(".") for part in Path(f).relative_to(spec).parts):
                    found.skipped.append({"file": f, "reason": "hidden (a dot file or under a dot directory)"})
                else:
                    _add_listed(found, f)
        elif os.path.exists(spec):
            what = sidecar(spec)
            if what and not os.path.isdir(spec):
                problems.append(f"{spec}: not an event log ({what})")
            found.files.append(spec)
        elif glob.has_magic(spec):
            files = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            if not files:
                problems.append(f"{spec}: glob matches no files")
            for f in files:
                _add_listed(found, f)
        else:
            problems.append(f"{spec}: no such file or directory")
    if problems:
        raise InputError("; ".join(problems), hint="pass event logs as files, directories, globs or -")
    # The same file named twice would count every event as a duplicate; read it once.
    seen: set[str] = set()
    found.files = [f for f in found.files if f == rio.STDIO or not (f in seen or seen.add(f))]
    return found


def _add_listed(found: Inputs, path: str) -> None:
    what = sidecar(path)
    if what:
        found.skipped.append({"file": path, "reason": what})
    else:
        found.files.append(path)
        found.listed.add(path)


def not_events(path: str) -> tuple[str, bool] | None:
    """Why the file at `path` holds no events by its first bytes, records or schema, or None.

    The flag says whether the readers refuse it anyway (a JSON document, an unknown format);
    otherwise they would read it as records that are all bad. Damaged files (a malformed first
    line, a cut Arrow file) are event logs: their reader quarantines what it cannot read."""
    with open(path, "rb") as raw:
        stream = _buffered(raw)
        fmt = rio.sniff(_peek(stream, 8))
        gzipped = fmt is rio.Format.GZIP
        if gzipped:
            stream = _buffered(gzip.GzipFile(fileobj=stream))
            fmt = rio.sniff(_peek(stream, 8))
        if fmt is rio.Format.JSON:
            return _json_not_events(stream)
        if fmt in (rio.Format.ARROW_FILE, rio.Format.ARROW_STREAM, rio.Format.PARQUET):
            try:
                names = _arrow_columns(path, stream, fmt, gzipped)
            except (pa.ArrowInvalid, OSError):
                return None
            if not any(k in names for k in EVENT_KEYS):
                return f"an Arrow/Parquet table with none of the event columns {', '.join(EVENT_KEYS)}", False
            return None
        if fmt is rio.Format.UNKNOWN:
            return "not JSON lines, Arrow, Parquet or OTel JSON", True
    return None


def _json_not_events(stream: Any) -> tuple[str, bool] | None:
    probe = _peek(stream, 1 << 20)
    if b'"resourceSpans"' in probe:
        return None  # OTLP/JSON: otel.py reads it
    line = first_line(stream)
    if line is None:
        return "a JSON document that is not an OTLP/JSON trace export", True
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a bad first line of an event log: quarantined by the reader
    if isinstance(obj, dict) and not any(k in obj for k in EVENT_KEYS):
        return f"its first record is a JSON object with none of the event keys {', '.join(EVENT_KEYS)}", False
    return None


def _arrow_columns(path: str, stream: Any, fmt: rio.Format, gzipped: bool) -> list[str]:
    """The column names, reading no more than the schema (a Parquet footer, or the first IPC
    message: an Arrow file's body after its 8-byte magic is a stream, so a cut file works too)."""
    if fmt is rio.Format.PARQUET:
        return pq.read_schema(pa.BufferReader(stream.read()) if gzipped else path).names
    if fmt is rio.Format.ARROW_FILE:
        stream.read(8)
    return ipc.open_stream(stream).schema.names


def read_source(path: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Chunk]:
    """Chunks of normalised events from one input, whatever its format."""
    for task in source_tasks(path, block_bytes):
        yield task()


def source_tasks(path: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Callable[[], Chunk]]:
    """`read_source` as tasks, one per chunk, in order: reading happens here, and a JSON lines
    block is parsed when its task is called (jsonl.jsonl_tasks)."""
    name = "<stdin>" if path == rio.STDIO else path
    raw: BinaryIO = rio.open_binary(path)
    stream = _buffered(raw)
    try:
        head = _peek(stream, 8)
        fmt = rio.sniff(head)
        if fmt is rio.Format.GZIP:
            stream = _buffered(gzip.GzipFile(fileobj=stream))
            head = _peek(stream, 8)
            fmt = rio.sniff(head)
        if fmt is rio.Format.EMPTY:
            yield done(Chunk(empty_events()))
        elif fmt is rio.Format.JSON:
            plain = raw is stream.raw and raw is not sys.stdin.buffer and _regular(raw)  # not gzip, not a pipe
            yield from jsonl_tasks(stream, name, block_bytes, raw.fileno() if plain else None)
        elif fmt in (rio.Format.ARROW_FILE, rio.Format.ARROW_STREAM, rio.Format.PARQUET):
            yield from ready(read_arrow(stream, name, fmt))
        else:
            raise InputError(
                f"{name}: not JSON lines, Arrow, Parquet or OTel JSON (first bytes {head[:8]!r})",
                hint="collect reads events as .jsonl(.gz), .arrow, .parquet or an OTLP/JSON export",
            )
    finally:
        if raw is not sys.stdin.buffer:
            raw.close()


def read_sources(paths: list[str], block_bytes: int = BLOCK_BYTES) -> Iterator[Chunk]:
    """`read_source` of each path in turn, except that consecutive small JSON lines files (a
    rotated or bucketed log) are parsed together, up to `block_bytes` at a time
    (`jsonl.parse_files_together`); the same events, files and lines either way."""
    for task in _tasks(paths, block_bytes):
        yield task()


def _tasks(paths: list[str], block_bytes: int) -> Iterator[Callable[[], Chunk]]:
    """`read_sources` as tasks (`source_tasks`). A group of small files is parsed together
    here, when the group is complete: only if that fails are its files read one by one."""
    group: list[tuple[str, bytes]] = []
    size = 0

    def flush() -> Iterator[Callable[[], Chunk]]:
        nonlocal group, size
        files, group, size = group, [], 0
        together = parse_files_together(files) if len(files) > 1 else None
        if together is not None:
            yield done(together)
            return
        for name, _ in files:
            yield from source_tasks(name, block_bytes)

    for path in paths:
        small = path != rio.STDIO and path.endswith(".jsonl") and os.path.getsize(path) < block_bytes // 4
        data = _plain_json(path) if small else None
        if data is None or size + len(data) > block_bytes:
            yield from flush()
        if data is None:
            yield from source_tasks(path, block_bytes)
            continue
        group.append((path, data))
        size += len(data)
    yield from flush()


def _plain_json(path: str) -> bytes | None:
    """The whole content of a JSON lines file of events, or None (gzip, Arrow, a JSON document,
    an OTel export, empty: the general reader's cases)."""
    with open(path, "rb") as f:
        data = f.read()
    if rio.sniff(data[:8]) is not rio.Format.JSON:
        return None
    first = data[: data.find(b"\n") + 1 or len(data)].strip()
    if first in (b"{", b"[") or is_otel(first):
        return None
    return data


def read_ahead(
    paths: list[str],
    block_bytes: int = BLOCK_BYTES,
    depth: int = 2,
    workers: int = 2,
    prepare: Callable[[Chunk], Any] | None = None,
) -> Iterator[Any]:
    """`read_sources(paths)`, read by a thread and parsed by `workers` threads at once, up to
    `depth` chunks ahead of the consumer (polars and file reads release the GIL, so block k+1
    parses while block k is parsed or consumed). Each chunk goes through `prepare` (in the
    worker, so that work runs in parallel too) and the consumer gets `prepare(chunk)` (default:
    the chunk). Same chunks, same order; an error is raised where the consumer would have met
    it, and a consumer that stops early stops the threads."""
    pending: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="collect-parse")

    def work(task: Callable[[], Chunk]) -> Any:
        chunk = task()
        return chunk if prepare is None else prepare(chunk)

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                pending.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for task in _tasks(paths, block_bytes):
                if stop.is_set() or not put(pool.submit(work, task)):
                    return
            put(end)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)

    thread = threading.Thread(target=produce, name="collect-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = pending.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item.result()
    finally:
        stop.set()
        thread.join()
        while not pending.empty():
            item = pending.get_nowait()
            if isinstance(item, Future):
                item.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _regular(raw: Any) -> bool:
    """Whether `raw` is an open regular file (positioned reads work, and its size is known)."""
    try:
        return stat.S_ISREG(os.fstat(raw.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


def _peek(stream: Any, n: int) -> bytes:
    return stream.peek(n)[:n]


def _buffered(stream: Any) -> io.BufferedReader:
    """A reader whose peek() sees up to 1 MiB, enough to sniff a format and a first line."""
    return io.BufferedReader(stream, buffer_size=1 << 20)
