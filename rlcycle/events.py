"""Reading production event logs into normalised event frames, with bad records set aside.

In: paths (files, directories, globs) or `-`, each JSON lines (optionally gzipped), Arrow
(IPC file or stream), Parquet, or an OpenTelemetry OTLP/JSON trace export.
Out: an iterator of `Chunk`s: a polars DataFrame of events in the shape of the `events`
contract (ts as epoch ms) plus `_file`/`_line` provenance, and the chunk's bad records, each
with file, line and reason. Nothing is dropped silently: every input line becomes either a
row or a quarantine record.

JSON lines are parsed by polars in large blocks (fast path). A block that fails to parse is
bisected until the bad lines are isolated, so one bad line costs O(log n) re-parses, and the
reason names the field and the value (`explain_line`).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from rlcycle import io as rio
from rlcycle.errors import InputError
from rlcycle.schema import EVENT_TYPES, FEEDBACK_KINDS, TOOL_STATUSES

# How events look in JSON: ts stays a string here (RFC 3339 or epoch ms) and is parsed below.
JSON_SCHEMA: dict[str, pl.DataType] = {
    "event_id": pl.String,
    "type": pl.String,
    "ts": pl.String,
    "session_id": pl.String,
    "episode_id": pl.String,
    "sample_id": pl.String,
    "turn": pl.Int64,
    "policy_version": pl.String,
    # Token ids fit in int32 (every vocabulary does); half the memory of int64.
    "prompt_ids": pl.List(pl.Int32),
    "completion_ids": pl.List(pl.Int32),
    "completion_logprobs": pl.List(pl.Float32),
    "prompt_messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
    "completion_text": pl.String,
    "tool_calls": pl.List(
        pl.Struct({"call_id": pl.String, "name": pl.String, "arguments": pl.String})
    ),
    "latency_ms": pl.Float64,
    "temperature": pl.Float64,
    "call_id": pl.String,
    "status": pl.String,
    "error": pl.String,
    "duration_ms": pl.Float64,
    "lines_proposed": pl.Int64,
    "lines_surviving": pl.Int64,
    "observed_after_s": pl.Float64,
    "text": pl.String,
    "value": pl.Float64,
    "kind": pl.String,
}
# Epoch-ms bounds that catch seconds passed as milliseconds (and garbage).
TS_MIN_MS = 946_684_800_000  # 2000-01-01
TS_MAX_MS = 4_102_444_800_000  # 2100-01-01
BLOCK_BYTES = 32 << 20


@dataclass
class BadRecord:
    file: str
    line: int  # 1-based line (JSON lines) or row (Arrow/Parquet) or span (OTel)
    reason: str
    record: str | None = None  # the raw text, redacted before it is written

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "reason": self.reason, "record": self.record}


@dataclass
class Chunk:
    events: pl.DataFrame  # JSON_SCHEMA columns, ts as Int64 epoch ms, plus _file, _line
    bad: list[BadRecord] = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0


# --- finding inputs ----------------------------------------------------------------------------


def expand_inputs(specs: list[str]) -> list[str]:
    """Files for the given files, directories (recursively, sorted) and globs; `-` kept."""
    files: list[str] = []
    problems = []
    for spec in specs:
        if spec == rio.STDIO:
            files.append(spec)
        elif os.path.isdir(spec):
            found = sorted(
                str(p) for p in Path(spec).rglob("*") if p.is_file() and not p.name.startswith(".")
            )
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
            yield from _read_json(stream, name, block_bytes)
        elif fmt in (rio.Format.ARROW_FILE, rio.Format.ARROW_STREAM, rio.Format.PARQUET):
            from rlcycle.events_arrow import read_arrow

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


# --- JSON lines -------------------------------------------------------------------------------


def _read_json(stream: BinaryIO, name: str, block_bytes: int) -> Iterator[Chunk]:
    first = _first_line(stream)
    if first is not None and _is_otel(first):
        from rlcycle.otel import read_otel

        yield from read_otel(stream.read(), name)
        return
    if first is None:  # not one object per line: a whole JSON document
        doc = stream.read()
        try:
            obj = json.loads(doc)
        except json.JSONDecodeError as e:
            raise InputError(
                f"{name}:{e.lineno}:{e.colno}: neither JSON lines nor a JSON document ({e.msg})",
                hint="events are one JSON object per line",
            ) from None
        if isinstance(obj, dict) and "resourceSpans" in obj:
            from rlcycle.otel import read_otel

            yield from read_otel(doc, name)
            return
        raise InputError(
            f"{name}: a JSON document that is not an OTLP/JSON trace export",
            hint="events are one JSON object per line; OTel exports have resourceSpans",
        )
    line_no = 0
    tail = b""
    while True:
        data = stream.read(block_bytes)
        if not data:
            break
        block = tail + data
        cut = block.rfind(b"\n")
        if cut < 0:
            tail = block
            continue
        block, tail = block[: cut + 1], block[cut + 1 :]
        chunk = parse_block(block, name, line_no)
        line_no += block.count(b"\n")
        yield chunk
    if tail.strip():
        yield parse_block(tail + b"\n", name, line_no)


def _first_line(stream: Any) -> bytes | None:
    """The first non-blank line, or None when the input is a pretty-printed JSON document.

    A malformed first line is still returned: the file is JSON lines with a bad line 1.
    """
    probe = _peek(stream, 1 << 20)
    for line in probe.split(b"\n"):
        if line.strip():
            return None if line.strip() in (b"{", b"[") else line
    return None


def _is_otel(line: bytes) -> bool:
    return b'"resourceSpans"' in line[:4096]


def parse_block(block: bytes, name: str, first_line_index: int) -> Chunk:
    """Parse a block of whole lines; `first_line_index` is the 0-based index of its first line."""
    lines = block.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    numbered = [(first_line_index + i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    frames: list[pl.DataFrame] = []
    bad: list[BadRecord] = []
    _parse_bisect(numbered, name, frames, bad)
    events = pl.concat(frames, how="vertical") if frames else _empty_json_frame()
    events = normalise(events, name)
    good, rejected = split_invalid(events)
    bad.extend(_bad_from_rows(rejected, dict(numbered)))
    return Chunk(good, bad, bytes_read=len(block), lines_read=len(lines))


def _parse_bisect(numbered, name, frames, bad) -> None:
    """Parse numbered lines with polars; bisect failing ranges down to the bad lines."""
    if not numbered:
        return
    payload = b"\n".join(ln for _, ln in numbered)
    try:
        df = pl.read_ndjson(payload, schema=JSON_SCHEMA)
    except Exception as e:  # polars raises ComputeError/SchemaError/… for any bad line
        if len(numbered) == 1:
            line_no, raw = numbered[0]
            bad.append(BadRecord(name, line_no, explain_line(raw, e), _text(raw)))
            return
        mid = len(numbered) // 2
        _parse_bisect(numbered[:mid], name, frames, bad)
        _parse_bisect(numbered[mid:], name, frames, bad)
        return
    if df.height != len(numbered):  # should not happen; never lose lines silently
        for line_no, raw in numbered:
            _parse_bisect([(line_no, raw)], name, frames, bad)
        return
    frames.append(df.with_columns(pl.Series("_line", [n for n, _ in numbered], dtype=pl.Int64)))


def explain_line(raw: bytes, error: Exception) -> str:
    """Why one JSON line failed: malformed JSON (with column), not an object, or a field type."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return f"malformed JSON at column {e.colno}: {e.msg}"
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for key, dtype in JSON_SCHEMA.items():
        if key in obj and obj[key] is not None and not _json_type_ok(obj[key], dtype):
            return f"field {key!r}: expected {_describe(dtype)}, got {json.dumps(obj[key])[:60]}"
    return f"unparseable event ({str(error).splitlines()[0][:120]})"


def _json_type_ok(value: Any, dtype: pl.DataType) -> bool:
    if dtype == pl.Int32:
        return isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31
    if dtype == pl.Float32:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if dtype == pl.Int64:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().lstrip("-").isdigit()
        )
    if dtype == pl.Float64:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(dtype, pl.List):
        return isinstance(value, list) and all(
            v is None or _json_type_ok(v, dtype.inner) for v in value
        )
    if isinstance(dtype, pl.Struct):
        return isinstance(value, dict)
    return True  # strings accept anything (objects become JSON text)


def _describe(dtype: pl.DataType) -> str:
    if isinstance(dtype, pl.List):
        return f"a list of {_describe(dtype.inner)}"
    return {pl.Int64: "an integer", pl.Int32: "a 32-bit integer", pl.Float64: "a number",
            pl.Float32: "a number", pl.String: "a string"}.get(
        dtype, "an object"
    )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


# --- normalising and validating ----------------------------------------------------------------


def _empty_json_frame() -> pl.DataFrame:
    return pl.DataFrame(schema={**JSON_SCHEMA, "_line": pl.Int64})


def empty_events() -> pl.DataFrame:
    """No events, with every column of a normalised chunk."""
    return normalise(_empty_json_frame(), "")


def normalise(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """ts (RFC 3339 text or epoch ms) to epoch ms as `ts_ms`; add `_file`; keep `ts` text."""
    ts = pl.col("ts").str.strip_chars()
    numeric = ts.str.contains(r"^-?\d+(\.\d+)?$")
    parsed = (
        ts.str.replace(r"[zZ]$", "+00:00")
        .str.replace(r"^(\d{4}-\d\d-\d\d) ", "${1}T")
        .str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_zone="UTC")
        .dt.epoch("ms")
    )
    ms = pl.when(numeric).then(ts.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False))
    return df.with_columns(
        ms.otherwise(parsed).alias("ts_ms"),
        pl.lit(name, dtype=pl.String).alias("_file"),
    )


def _rule(cond: pl.Expr, reason: str | pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    return cond, (pl.lit(reason) if isinstance(reason, str) else reason)


def _rules() -> list[tuple[pl.Expr, pl.Expr]]:
    t = pl.col("type")
    rules = [
        _rule(pl.col("event_id").is_null(), "missing event_id"),
        _rule(t.is_null(), "missing type"),
        _rule(
            ~t.is_in(EVENT_TYPES),
            pl.format("unknown event type '{}' (expected one of {})", t, pl.lit(", ".join(EVENT_TYPES))),
        ),
        _rule(pl.col("session_id").is_null(), "missing session_id"),
        _rule(pl.col("ts").is_null(), "missing ts"),
        _rule(
            pl.col("ts_ms").is_null(),
            pl.format("ts '{}' is neither RFC 3339 nor epoch milliseconds", pl.col("ts")),
        ),
        _rule(
            (pl.col("ts_ms") < TS_MIN_MS) | (pl.col("ts_ms") > TS_MAX_MS),
            pl.format("ts {} is outside 2000–2100 (epoch milliseconds expected)", pl.col("ts")),
        ),
    ]
    from rlcycle.schema import REQUIRED_BY_TYPE

    for etype, required in REQUIRED_BY_TYPE.items():
        for col in required:
            rules.append(_rule((t == etype) & pl.col(col).is_null(), f"{etype}: missing {col}"))
    ids, lps = pl.col("completion_ids"), pl.col("completion_logprobs")
    rules += [
        _rule(
            (t == "completion") & lps.is_not_null() & (lps.list.len() != ids.list.len()),
            pl.format(
                "completion: {} completion_logprobs for {} completion_ids",
                lps.list.len(),
                ids.list.len(),
            ),
        ),
        _rule((t == "completion") & (pl.col("turn") < 0), "completion: negative turn"),
        _rule(
            (t == "tool_result") & ~pl.col("status").is_in(TOOL_STATUSES),
            pl.format("tool_result: status '{}' is not one of ok, error, invalid, timeout", pl.col("status")),
        ),
        _rule(
            (t == "edit_outcome")
            & ((pl.col("lines_surviving") < 0) | (pl.col("lines_surviving") > pl.col("lines_proposed"))),
            "edit_outcome: lines_surviving must be between 0 and lines_proposed",
        ),
        _rule(
            (t == "feedback") & pl.col("sample_id").is_null() & pl.col("episode_id").is_null(),
            "feedback: needs sample_id or episode_id",
        ),
        _rule(
            (t == "feedback") & ((pl.col("value") < -1) | (pl.col("value") > 1) | pl.col("value").is_nan()),
            "feedback: value must be within -1…1",
        ),
        _rule(
            (t == "feedback") & pl.col("kind").is_not_null() & ~pl.col("kind").is_in(FEEDBACK_KINDS),
            pl.format("feedback: kind '{}' is not one of thumbs, accept, reject", pl.col("kind")),
        ),
    ]
    return rules


def split_invalid(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(valid rows, invalid rows with a `_reason`): the first failing rule names the reason."""
    rules = _rules()
    cond, reason = rules[0]
    expr = pl.when(cond.fill_null(False)).then(reason)
    for cond, reason in rules[1:]:
        expr = expr.when(cond.fill_null(False)).then(reason)
    df = df.with_columns(expr.otherwise(None).cast(pl.String).alias("_reason"))
    bad = df.filter(pl.col("_reason").is_not_null())
    if bad.height == 0:
        return df.drop("_reason"), bad
    return df.filter(pl.col("_reason").is_null()).drop("_reason"), bad


def _bad_from_rows(rows: pl.DataFrame, raw_by_line: dict[int, bytes] | None) -> list[BadRecord]:
    out = []
    for r in rows.select("_file", "_line", "_reason").iter_rows():
        raw = raw_by_line.get(r[1]) if raw_by_line else None
        out.append(BadRecord(r[0], r[1], r[2], _text(raw) if raw is not None else None))
    return out


def rows_as_records(rows: pl.DataFrame) -> list[BadRecord]:
    """Bad rows from non-JSON sources: the record is the row itself as JSON."""
    out = []
    for row in rows.iter_rows(named=True):
        reason = row.pop("_reason")
        file, line = row.pop("_file"), row.pop("_line")
        row.pop("ts_ms", None)
        out.append(BadRecord(file, line, reason, json.dumps(row, default=str)))
    return out
