"""Finding collect's inputs and dispatching each to the reader of its format.

In: paths (files, directories, globs) or `-`. `expand_inputs` turns them into a list of files;
`read_source` sniffs each one (gzip, JSON lines, OTLP/JSON, Arrow IPC file or stream, Parquet)
and yields the `Chunk`s of the matching reader. Nothing is dropped silently: every input line
becomes either a row or a quarantine record.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rlcycle import io as rio
from rlcycle.collect.arrow import read_arrow
from rlcycle.collect.events import Chunk, empty_events
from rlcycle.collect.jsonl import read_jsonl
from rlcycle.errors import InputError

BLOCK_BYTES = 32 << 20


def expand_inputs(specs: list[str]) -> list[str]:
    """Files for the given files, directories (recursively, sorted) and globs; `-` kept."""
    files: list[str] = []
    problems = []
    for spec in specs:
        if spec == rio.STDIO:
            files.append(spec)
        elif os.path.isdir(spec):
            found = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                problems.append(f"{spec}: directory holds no files")
            files.extend(found)
        elif os.path.exists(spec):
            files.append(spec)
        elif glob.has_magic(spec):
            found = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            if not found:
                problems.append(f"{spec}: glob matches no files")
            files.extend(found)
        else:
            problems.append(f"{spec}: no such file or directory")
    if problems:
        raise InputError("; ".join(problems), hint="pass event logs as files, directories, globs or -")
    # The same file named twice would count every event as a duplicate; read it once.
    seen: set[str] = set()
    return [f for f in files if f == rio.STDIO or not (f in seen or seen.add(f))]


def read_source(path: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Chunk]:
    """Chunks of normalised events from one input, whatever its format."""
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
            yield Chunk(empty_events())
        elif fmt is rio.Format.JSON:
            yield from read_jsonl(stream, name, block_bytes)
        elif fmt in (rio.Format.ARROW_FILE, rio.Format.ARROW_STREAM, rio.Format.PARQUET):
            yield from read_arrow(stream, name, fmt)
        else:
            raise InputError(
                f"{name}: not JSON lines, Arrow, Parquet or OTel JSON (first bytes {head[:8]!r})",
                hint="collect reads events as .jsonl(.gz), .arrow, .parquet or an OTLP/JSON export",
            )
    finally:
        if raw is not sys.stdin.buffer:
            raw.close()


def _peek(stream: Any, n: int) -> bytes:
    return stream.peek(n)[:n]


def _buffered(stream: Any) -> io.BufferedReader:
    """A reader whose peek() sees up to 1 MiB, enough to sniff a format and a first line."""
    return io.BufferedReader(stream, buffer_size=1 << 20)
