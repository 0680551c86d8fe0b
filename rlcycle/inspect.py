"""`rlcycle inspect`: what an artifact holds: format, contract, schema, row count, head.

In: an Arrow file, Arrow stream (`-`) or Parquet file. Out: a summary dict and head rows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlcycle import io as rio
from rlcycle import schema as rschema


@dataclass
class Inspection:
    path: str
    format: str
    rows: int
    size_bytes: int | None
    contract: str | None
    contract_version: int | None
    columns: list[dict[str, str]]
    problems: list[str]
    head: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "rows": self.rows,
            "size_bytes": self.size_bytes,
            "contract": self.contract,
            "contract_version": self.contract_version,
            "columns": self.columns,
            "problems": self.problems,
        }


def format_summary(result: Inspection) -> str:
    """What `rlcycle inspect` prints: file, contract, rows, schema, problems, the first rows."""
    size = f", {result.size_bytes:,} bytes" if result.size_bytes is not None else ""
    contract = f"{result.contract} v{result.contract_version}" if result.contract else "none (no rlcycle metadata)"
    lines = [
        f"file: {result.path} ({result.format}{size})",
        f"contract: {contract}",
        f"rows: {result.rows:,}",
        "schema:",
        *(f"  {c['name']}: {c['type']}" for c in result.columns),
    ]
    if result.problems:
        lines += ["problems:", *(f"  {p}" for p in result.problems)]
    lines.append(f"head ({len(result.head)} rows):")
    lines += [json.dumps(row, default=str) for row in result.head]
    return "\n".join(lines)


def run(path: str, head: int = 5, full_prompts: bool = False, output: str | None = None) -> Inspection:
    """Inspect one artifact; reads only the head rows' batches plus metadata where it can.

    `full_prompts`: read the whole table and rebuild every row's `prompt_ids` from the delta
    layout (rlcycle/prompts.py), for the head rows and, with `output`, a file written atomically."""
    if full_prompts:
        from rlcycle import prompts

        table = prompts.with_full_prompts(rio.read_table(path), path)
        if output is not None:
            rio.write_table(table, output)
        return _from_table(
            path,
            "arrow-stream" if path == rio.STDIO else rio.sniff(rio.read_head(path)).value,
            None if path == rio.STDIO else os.path.getsize(path),
            table,
            head,
        )
    if path == rio.STDIO:
        table = rio.read_table(path)
        return _from_table(path, "arrow-stream", None, table, head)
    p = Path(path)
    if not p.exists():
        from rlcycle.errors import InputError

        raise InputError(f"{path}: no such file", hint="check the path")
    fmt = rio.sniff(rio.read_head(p))
    schema = rio.read_schema(p)
    rows, head_rows = _count_and_head(p, fmt, head)
    return _result(path, fmt.value, os.path.getsize(p), schema, rows, head_rows)


def _count_and_head(p: Path, fmt: rio.Format, head: int) -> tuple[int, list[dict[str, Any]]]:
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if fmt is rio.Format.PARQUET:
        pf = pq.ParquetFile(str(p))
        first = next(pf.iter_batches(batch_size=max(head, 1)), None)
        return pf.metadata.num_rows, _rows(first, head)
    if fmt is rio.Format.ARROW_FILE:
        with pa.memory_map(str(p)) as src:
            reader = ipc.open_file(src)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            first = reader.get_batch(0) if reader.num_record_batches else None
            return rows, _rows(first, head)
    rows, first = 0, None
    for batch in rio.iter_batches(p):
        rows += batch.num_rows
        first = first or batch
    return rows, _rows(first, head)


def _rows(batch: pa.RecordBatch | None, head: int) -> list[dict[str, Any]]:
    if batch is None or head <= 0:
        return []
    return batch.slice(0, head).to_pylist()


def _from_table(path: str, fmt: str, size: int | None, table: pa.Table, head: int) -> Inspection:
    return _result(path, fmt, size, table.schema, table.num_rows, table.slice(0, head).to_pylist())


def _result(path, fmt, size, schema: pa.Schema, rows: int, head_rows) -> Inspection:
    contract = rschema.contract_of(schema)
    meta = schema.metadata or {}
    version = meta.get(rschema.VERSION_KEY)
    problems = rschema.validate(schema, contract, path) if contract else []
    return Inspection(
        path=path,
        format=fmt,
        rows=rows,
        size_bytes=size,
        contract=contract.name if contract else None,
        contract_version=int(version) if version else None,
        columns=[{"name": f.name, "type": str(f.type)} for f in schema],
        problems=problems,
        head=head_rows,
    )
