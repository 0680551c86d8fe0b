"""The gateway's event log: append-only JSON lines, rotated, fsync'd in batches, redacted.

In: event dicts (`append`), from any thread. Out: files `LOGDIR/events-<UTC start>-<pid>-<n>.jsonl`
that `rlcycle collect LOGDIR` reads unchanged, even while they are being written. With
`buckets=N` (a power of two), the log is written already split by session and dated:
`LOGDIR/<UTC day>/bucket=<k>-of-<N>/events-....jsonl`, k the session's bucket as collect computes
it (rlcycle.collect.buckets), with the marker `LOGDIR/rlcycle-buckets.json`; collect then joins
bucket by bucket and skips its repartition pass (docs/gateway.md, "Bucketed log").

How it stays crash-safe and cheap on the request path:
- `append` only queues the dict (a lock and a list append); a writer thread wakes every
  `flush_interval_s`, takes everything queued, redacts it, serialises it to complete lines and
  hands them to the kernel in one `write` on an O_APPEND descriptor, then `fsync`s. A `kill -9`
  loses what was queued since the last batch (at most `flush_interval_s` of events); what was
  written is in the page cache and survives the process (fsync covers a power loss too).
- every line is whole JSON before it is written, so the only line a reader can ever find cut
  is the last one of a file (a write interrupted by a power loss, or one being read while it
  is written); collect skips and counts such a last line (collect/jsonl.py).
- a file is rotated after `rotate_bytes` or `rotate_s`; names sort by time, and the same
  process never reopens a file, so every file is append-only from creation to close. Bucketed,
  each (day, bucket) has its own open file, rotated alike; a batch is one write per file it
  touches, each fsync'd.

Redaction (collect's rules, `rlcycle.collect.redact`) runs in the writer thread, one vectorised
pass per batch over every text field: completion_text, text, error, tool-call arguments and
message contents. Token ids cannot be redacted (see docs/gateway.md, "Threat model").
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle.collect import redact
from rlcycle.collect.buckets import bucket_dir, bucket_of, write_marker
from rlcycle.errors import InputError

TEXT_FIELDS = ("completion_text", "text", "error")


@dataclass
class LogStats:
    appended: int = 0  # events accepted by append()
    written: int = 0  # events written and fsync'd
    batches: int = 0
    bytes: int = 0
    files: int = 0
    write_seconds: float = 0.0  # wall time spent redacting, serialising, writing and fsyncing
    cpu_seconds: float = 0.0  # CPU time of that (the rest is waiting on the disk)
    redactions: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "appended": self.appended,
            "written": self.written,
            "pending": self.appended - self.written,
            "batches": self.batches,
            "bytes": self.bytes,
            "files": self.files,
            "write_seconds": round(self.write_seconds, 6),
            "cpu_seconds": round(self.cpu_seconds, 6),
            "redactions": dict(self.redactions),
        }


@dataclass
class _File:
    """One open log file: where new files of its stream go, and the current one."""

    dir: Path
    fd: int | None = None
    opened_at: float = 0.0
    size: int = 0
    path: Path | None = None


class EventLog:
    """Batched, fsync'd, rotated JSON-lines writer (see the module docstring)."""

    def __init__(
        self,
        log_dir: str | Path,
        flush_interval_s: float = 0.5,
        rotate_bytes: int = 64 << 20,
        rotate_s: float = 3600.0,
        patterns: tuple[redact.Pattern, ...] | None = redact.DEFAULT_PATTERNS,
        buckets: int = 0,
    ):
        self.dir = Path(log_dir)
        if buckets < 0 or buckets & (buckets - 1):
            raise InputError(f"log_buckets={buckets}: 0 (one flat log) or a power of two", hint="e.g. 16")
        self.buckets = buckets
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(
                f"cannot create the log directory {self.dir}: {e}", hint="pass a writable --log-dir"
            ) from None
        if buckets:
            write_marker(self.dir, buckets)
        self.flush_interval_s = flush_interval_s
        self.rotate_bytes = rotate_bytes
        self.rotate_s = rotate_s
        self.patterns = patterns or ()
        self.stats = LogStats()
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()  # one batch written at a time (thread, flush(), close())
        self._wake = threading.Event()
        self._closed = False
        self._files: dict[tuple[str, int], _File] = {}  # (day, bucket) -> its open file; ("", 0) flat
        self._seq = 0
        self.current: Path | None = None  # the file written last
        self._thread = threading.Thread(target=self._loop, name="rlcycle-gateway-log", daemon=True)
        self._thread.start()

    # --- producer side ------------------------------------------------------------------------
    def append(self, *events: dict[str, Any]) -> None:
        """Queue events; they reach disk within `flush_interval_s`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the event log is closed")
            self._pending.extend(events)
            self.stats.appended += len(events)

    def flush(self) -> None:
        """Write and fsync everything queued so far (blocking)."""
        self._write_batch()

    def close(self) -> None:
        """Flush, stop the writer thread, close the file."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._write_batch()
        with self._io_lock:
            for f in self._files.values():
                if f.fd is not None:
                    os.close(f.fd)
                    f.fd = None

    # --- writer side --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self._write_batch()
            except OSError as e:  # disk full, directory removed: keep the events, retry next tick
                from rlcycle import console

                console.warn(f"gateway: cannot write events to {self.dir}: {e} (retrying)")
            if self._closed:
                return

    def _write_batch(self) -> None:
        with self._io_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                if self.patterns:
                    self._redact(batch)
                data = self._write_all(batch)
            except OSError:
                with self._lock:  # nothing of this batch is counted as written: put it back
                    self._pending[:0] = batch
                raise
            self.stats.written += len(batch)
            self.stats.batches += 1
            self.stats.bytes += len(data)
            self.stats.write_seconds += time.perf_counter() - t0
            self.stats.cpu_seconds += time.thread_time() - c0

    def _write_all(self, batch: list[dict[str, Any]]) -> bytes:
        """Serialise the batch and write it: to one file, or one file per (day, bucket)."""
        lines = [json.dumps(ev, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for ev in batch]
        now = time.time()
        if not self.buckets:
            data = b"".join(lines)
            self._write(self._file("", 0), data, now)
            return data
        day = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%d")
        ks = bucket_of([str(ev.get("session_id") or "") for ev in batch], self.buckets)
        by_bucket: dict[int, list[bytes]] = {}
        for k, line in zip(ks, lines, strict=True):
            by_bucket.setdefault(k, []).append(line)
        for k in sorted(by_bucket):
            self._write(self._file(day, k), b"".join(by_bucket[k]), now)
        return b"".join(lines)

    def _file(self, day: str, k: int) -> _File:
        if (day, k) not in self._files:
            for key in [key for key in self._files if key[0] != day]:  # yesterday's files: closed
                old = self._files.pop(key)
                if old.fd is not None:
                    os.close(old.fd)
            where = self.dir / bucket_dir(day, k, self.buckets) if self.buckets else self.dir
            self._files[day, k] = _File(where)
        return self._files[day, k]

    def _write(self, f: _File, data: bytes, now: float) -> None:
        if f.fd is None or f.size >= self.rotate_bytes or now - f.opened_at >= self.rotate_s:
            self._rotate(f, now)
        view = memoryview(data)
        while view:  # os.write may write less than asked (signals, pipes); never half a batch
            n = os.write(f.fd, view)
            view = view[n:]
        os.fsync(f.fd)
        f.size += len(data)
        self.current = f.path

    def _rotate(self, f: _File, now: float) -> None:
        if f.fd is not None:
            os.close(f.fd)
        new_dir = not f.dir.exists()
        f.dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y%m%dT%H%M%S")
        self._seq += 1
        f.path = f.dir / f"events-{stamp}-{os.getpid()}-{self._seq:04d}.jsonl"
        f.fd = os.open(f.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        f.opened_at, f.size = now, 0
        self.stats.files += 1
        for d in [f.dir, *([f.dir.parent, f.dir.parent.parent] if new_dir and self.buckets else [])]:
            dir_fd = os.open(d, os.O_RDONLY)  # make the new names themselves durable
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _redact(self, batch: list[dict[str, Any]]) -> None:
        """Redact every text field of the batch in one engine call, in place."""
        slots: list[tuple[dict[str, Any], str]] = []
        for ev in batch:
            slots += [(ev, k) for k in TEXT_FIELDS if isinstance(ev.get(k), str)]
            for call in ev.get("tool_calls") or ():
                if isinstance(call, dict) and isinstance(call.get("arguments"), str):
                    slots.append((call, "arguments"))
            for msg in ev.get("prompt_messages") or ():
                if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                    slots.append((msg, "content"))
        if not slots:
            return
        texts = redact.redact_texts([d[k] for d, k in slots], self.patterns, self.stats.redactions)
        for (d, k), text in zip(slots, texts, strict=True):
            d[k] = text
