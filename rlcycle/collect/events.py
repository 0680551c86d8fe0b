"""The event model of collect: the events contract as JSON sees it, and the rules a row must pass.

In: polars frames parsed by a reader (jsonl.py, arrow.py, otel.py) in the `JSON_SCHEMA` shape.
Out: `normalise` adds `ts_ms` (epoch ms) and `_file`; `split_invalid` separates the rows that
break a rule, each with the first failing rule as its reason; `BadRecord` is one quarantined
record (file, line, reason, raw text) and `Chunk` what every reader yields. Nothing here reads
files: the readers import this module, never the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from rlcycle.schema import EVENT_TYPES, FEEDBACK_KINDS, REQUIRED_BY_TYPE, TOOL_STATUSES

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
    # The prompt stored once (rlcycle/prompts.py): a reference, a shared length, what it adds.
    "prompt_parent": pl.String,
    "prompt_shared": pl.Int64,
    "prompt_added": pl.List(pl.Int32),
    "completion_ids": pl.List(pl.Int32),
    "completion_logprobs": pl.List(pl.Float32),
    "prompt_messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
    "completion_text": pl.String,
    "tool_calls": pl.List(pl.Struct({"call_id": pl.String, "name": pl.String, "arguments": pl.String})),
    "latency_ms": pl.Float64,
    "temperature": pl.Float64,
    "max_new_tokens": pl.Int64,
    "greedy": pl.Boolean,
    "top_p": pl.Float64,
    "pair_key": pl.String,
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
    "request_id": pl.String,
}
# What collect parses from JSON lines: every field but those it never reads (prompt and
# completion text, tool durations, edit observation delays). Those are skipped by the parser,
# not checked: a collect run costs what it uses (docs/performance.md). The gateway checks the
# events clients post against the whole JSON_SCHEMA.
UNREAD = ("prompt_messages", "completion_text", "duration_ms", "observed_after_s")
READ_SCHEMA: dict[str, pl.DataType] = {k: v for k, v in JSON_SCHEMA.items() if k not in UNREAD}
# Epoch-ms bounds that catch seconds passed as milliseconds (and garbage).
TS_MIN_MS = 946_684_800_000  # 2000-01-01
TS_MAX_MS = 4_102_444_800_000  # 2100-01-01


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


def raw_text(raw: bytes) -> str:
    """A raw input line as text for a quarantine record (bad UTF-8 replaced, never an error)."""
    return raw.decode("utf-8", errors="replace")


# --- normalising and validating ----------------------------------------------------------------


def empty_json_frame() -> pl.DataFrame:
    return pl.DataFrame(schema={**JSON_SCHEMA, "_line": pl.Int64})


def empty_events() -> pl.DataFrame:
    """No events, with every column of a normalised chunk."""
    return normalise(empty_json_frame(), "")


def normalise(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """ts (RFC 3339 text or epoch ms) to epoch ms as `ts_ms`; add `_file`; keep `ts` text."""
    # The common cases first, without regexes: the form rlcycle's writer uses (from the digits),
    # epoch milliseconds as digits, any other UTC time with a Z. Any other form anywhere in the
    # frame takes the general parse below for the frame.
    # (Series operations: the same parse as expressions, in about half the time on a block.)
    text = df.get_column("ts")
    ms = _writer_form_ms(text)  # rlcycle's own form, from the digits (fast)
    if ms is None:
        ms = text.str.to_integer(strict=False)
    elif ms.null_count() > text.null_count():
        ms = ms.fill_null(text.str.to_integer(strict=False))
    if ms.null_count() > text.null_count():  # any other RFC 3339 UTC time with a Z
        ms = ms.fill_null(text.str.to_datetime("%Y-%m-%dT%H:%M:%S%.fZ", strict=False, time_zone="UTC").dt.epoch("ms"))
    if not (ms.is_null() & text.is_not_null()).any():
        return df.hstack([ms.alias("ts_ms"), pl.repeat(name, df.height, dtype=pl.String, eager=True).alias("_file")])
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


# `YYYY-MM-DDTHH:MM:SS.mmmZ`, the form rlcycle's event writer uses (agent/events.py): the
# positions of its separators and of its digits.
_WRITER_FORM = np.frombuffer(b"0000-00-00T00:00:00.000Z", np.uint8)
_SEPARATORS = np.flatnonzero(_WRITER_FORM != ord("0"))
_DIGITS = np.flatnonzero(_WRITER_FORM == ord("0"))
_MONTH_DAYS = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])


def _writer_form_ms(text: pl.Series) -> pl.Series | None:
    """Epoch ms of each ts that has the writer's form (with a valid date and time from 1900
    on), computed from its digits with numpy; null for any other ts (None when none has it).
    The same values as polars' `to_datetime` with that format: 1.4 against 3.7 ms on a 16 MiB
    block of the bench's logs, 0.1 ms when every ts has the form (docs/performance.md);
    tests/test_collect_ts.py compares them."""
    n = text.len()
    if not n:
        return None
    arr = text.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    width = len(_WRITER_FORM)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    rows = np.flatnonzero(np.diff(offsets) == width)  # a null has no characters
    if not rows.size:
        return None
    data = np.frombuffer(arr.buffers()[2], np.uint8)
    if rows.size == n and offsets[-1] - offsets[0] == n * width:  # the common case: a view
        chars = data[offsets[0] : offsets[-1]].reshape(n, width)
    else:
        chars = data[offsets[rows][:, None] + np.arange(width)]
    digits = chars[:, _DIGITS].astype(np.int64) - ord("0")
    ok = (chars[:, _SEPARATORS] == _WRITER_FORM[_SEPARATORS]).all(axis=1) & ((digits >= 0) & (digits <= 9)).all(axis=1)
    d = digits.T
    year = d[0] * 1000 + d[1] * 100 + d[2] * 10 + d[3]
    month, day = d[4] * 10 + d[5], d[6] * 10 + d[7]
    hour, minute, second = d[8] * 10 + d[9], d[10] * 10 + d[11], d[12] * 10 + d[13]
    milli = d[14] * 100 + d[15] * 10 + d[16]
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_days = _MONTH_DAYS[np.clip(month, 0, 12)] + ((month == 2) & leap)
    # Leap seconds and impossible dates are left to the general parse, which says what they are.
    ok &= (year >= 1900) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
    ok &= (hour <= 23) & (minute <= 59) & (second <= 59)
    # Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    values = np.zeros(n, np.int64)
    values[rows] = (((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + milli
    valid = np.zeros(n, bool)
    valid[rows] = ok
    if arr.null_count:  # Arrow lets a null slot span characters: it stays null
        valid &= arr.is_valid().to_numpy(zero_copy_only=False)
    return pl.Series("ts", pa.array(values, mask=~valid))


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
    """(valid rows, invalid rows with a `_reason`): the first failing rule names the reason.
    The reasons (text formatted per row) are built only when some row breaks a rule."""
    rules = _rules()
    if not df.select(pl.any_horizontal(cond.fill_null(False) for cond, _ in rules).any()).item():
        return df, df.clear().with_columns(pl.lit(None, pl.String).alias("_reason"))
    cond, reason = rules[0]
    expr = pl.when(cond.fill_null(False)).then(reason)
    for cond, reason in rules[1:]:
        expr = expr.when(cond.fill_null(False)).then(reason)
    df = df.with_columns(expr.otherwise(None).cast(pl.String).alias("_reason"))
    bad = df.filter(pl.col("_reason").is_not_null())
    if bad.height == 0:
        return df.drop("_reason"), bad
    return df.filter(pl.col("_reason").is_null()).drop("_reason"), bad


def bad_from_rows(rows: pl.DataFrame, raw_by_line: dict[int, bytes] | None) -> list[BadRecord]:
    out = []
    for r in rows.select("_file", "_line", "_reason").iter_rows():
        raw = raw_by_line.get(r[1]) if raw_by_line else None
        out.append(BadRecord(r[0], r[1], r[2], raw_text(raw) if raw is not None else None))
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
