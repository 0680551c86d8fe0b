"""Events stored as Arrow (IPC file or stream) or Parquet, normalised like JSON lines.

In: a binary stream (or its path) sniffed as Arrow/Parquet. Out: `Chunk`s per record batch.
Columns are matched by name; missing ones are null; a value that cannot be cast to the
events contract quarantines its row (named by row number and column). A truncated IPC file
gives up every complete batch it still holds and one bad record for the unreadable rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from rlcycle import io as rio
from rlcycle.collect.events import (
    JSON_SCHEMA,
    BadRecord,
    Chunk,
    empty_events,
    normalise,
    rows_as_records,
    split_invalid,
)


def read_arrow(stream: BinaryIO, name: str, fmt: rio.Format) -> Iterator[Chunk]:
    row = 0
    for batch, bad in _batches(stream, name, fmt):
        if batch is not None and batch.num_rows:
            chunk = _normalise_batch(batch, name, row)
            row += batch.num_rows
            yield chunk
        if bad is not None:
            bad.line = row + 1
            yield Chunk(empty_events(), [bad])


def _batches(stream: BinaryIO, name: str, fmt: rio.Format):
    """(batch, None) for each readable batch; (None, BadRecord) if the file is cut short."""
    if fmt is rio.Format.PARQUET:
        source = name if os.path.exists(name) else pa.BufferReader(stream.read())
        try:
            pf = pq.ParquetFile(source)
        except (pa.ArrowInvalid, OSError) as e:
            yield None, BadRecord(name, 1, f"unreadable Parquet file ({e})")
            return
        for i in range(pf.num_row_groups):
            try:
                table = pf.read_row_group(i)
            except (pa.ArrowInvalid, OSError) as e:
                yield None, BadRecord(name, 0, f"Parquet row group {i} unreadable ({e})")
                return
            for b in table.to_batches():
                yield b, None
        return
    data = pa.py_buffer(stream.read())
    if fmt is rio.Format.ARROW_FILE:
        try:
            reader = ipc.open_file(data)
        except (pa.ArrowInvalid, OSError):
            # No valid footer: the file was cut short. Its body is an IPC stream after the
            # 8-byte magic, so read every complete batch from there.
            yield from _salvage_stream(data.slice(8), name, "truncated Arrow file")
            return
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i), None
        return
    yield from _salvage_stream(data, name, "truncated Arrow stream")


def _salvage_stream(buf: pa.Buffer, name: str, what: str):
    recovered = 0
    try:
        reader = ipc.open_stream(buf)
        for batch in reader:
            recovered += 1
            yield batch, None
    except (pa.ArrowInvalid, OSError) as e:
        yield (
            None,
            BadRecord(name, 0, f"{what}: {recovered} complete batch(es) recovered, the rest is unreadable ({e})"),
        )
        return
    if what == "truncated Arrow file":
        # Every batch was readable but the footer is gone: say so, the file is damaged.
        yield None, BadRecord(name, 0, f"{what}: footer missing, {recovered} batch(es) recovered")


def _normalise_batch(batch: pa.RecordBatch, name: str, first_row: int) -> Chunk:
    df = pl.from_arrow(batch)
    assert isinstance(df, pl.DataFrame)
    cols, cast_problems = [], []
    for col, dtype in JSON_SCHEMA.items():
        if col not in df.columns:
            cols.append(pl.lit(None, dtype=dtype).alias(col))
            continue
        src = df.get_column(col)
        if col == "ts":
            cols.append(_ts_text(src))
            continue
        cast = src.cast(dtype, strict=False) if src.dtype != dtype else src
        lost = src.is_not_null() & cast.is_null()
        if lost.any():
            cast_problems.append((col, lost, dtype))
        cols.append(cast.alias(col))
    out = df.select(cols).with_columns(
        pl.int_range(first_row + 1, first_row + 1 + df.height, dtype=pl.Int64).alias("_line")
    )
    reason = pl.Series("_castfail", [None] * df.height, dtype=pl.String)
    for col, lost, dtype in cast_problems:
        reason = pl.select(
            pl.when(lost & reason.is_null()).then(pl.lit(f"column {col!r}: value is not {dtype}")).otherwise(reason)
        ).to_series()
    events = normalise(out, name)
    bad_cast = events.filter(reason.is_not_null()).with_columns(_reason=reason.filter(reason.is_not_null()))
    events = events.filter(reason.is_null())
    good, rejected = split_invalid(events)
    return Chunk(good, rows_as_records(pl.concat([bad_cast, rejected])) if bad_cast.height or rejected.height else [])


def _ts_text(s: pl.Series) -> pl.Series:
    """Any ts column (timestamp, integer epoch ms, text) as text that `normalise` parses."""
    if s.dtype == pl.String:
        return s.alias("ts")
    if isinstance(s.dtype, pl.Datetime):
        utc = s.dt.convert_time_zone("UTC") if s.dtype.time_zone else s.dt.replace_time_zone("UTC")
        return utc.dt.epoch("ms").cast(pl.String).alias("ts")
    return s.cast(pl.String, strict=False).alias("ts")
