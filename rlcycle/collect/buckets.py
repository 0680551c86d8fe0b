"""Session buckets: which join partition a session belongs to, and event logs already laid out so.

Collect joins each session alone, so its events can be split by session into N buckets that
join independently. A session's bucket is the top log2(N) bits of `join.SESSION_HASH` (polars'
`hash(seed=7)` of `session_id`; N a power of two): the buckets are *ranges* of the hash, so
joining them in order gives one global row order whatever N is (see join._in_output_order). Collect's
Partitioner and the gateway's bucketed log (rlcycle/gateway/logwriter.py) both call
`bucket_expr`/`bucket_of` here, so they agree by construction.

A bucketed log directory (docs/gateway.md, "Bucketed log"):

    LOGDIR/rlcycle-buckets.json                      the marker: {"layout", "buckets", "probe", ...}
    LOGDIR/<YYYY-MM-DD>/bucket=<k>-of-<N>/events-....jsonl

`read_layout` finds the marker (never guesses from names) and lists each bucket's files over
every date. polars does not promise its hash across versions, so the marker holds the hash of a
fixed probe string as the writer computed it: a collect whose polars hashes it differently
does not trust the layout and repartitions (`CollectResult.repartitioned` says which ran).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from rlcycle.collect.join import SESSION_HASH
from rlcycle.errors import InputError

MARKER = "rlcycle-buckets.json"
LAYOUT = "rlcycle-session-buckets/1"
_PROBE = "rlcycle-bucket-probe"
_BUCKET_DIR = re.compile(r"^bucket=(\d+)-of-(\d+)$")


def bucket_expr(n: int) -> pl.Expr:
    """The bucket (0..n-1) of each row's session_id, as a polars expression (n a power of two)."""
    if n == 1:
        return pl.lit(0, dtype=pl.UInt64)
    shift = 64 - (n.bit_length() - 1)
    return SESSION_HASH // pl.lit(1 << shift, dtype=pl.UInt64)  # the top bits of the hash


def bucket_of(session_ids: list[str], n: int) -> list[int]:
    """The bucket of each session id (the gateway's writer: the same expression as collect's)."""
    frame = pl.DataFrame({"session_id": session_ids}, schema={"session_id": pl.String})
    return frame.select(bucket_expr(n).alias("b")).get_column("b").to_list()


def probe() -> int:
    """This polars' hash of a fixed string: equal in writer and reader means equal buckets."""
    return pl.DataFrame({"session_id": [_PROBE]}).select(SESSION_HASH).item()


def _is_log(name: str) -> bool:
    return not name.startswith(".") and name.endswith((".jsonl", ".jsonl.gz"))


def bucket_dir(day: str, k: int, n: int) -> str:
    """A bucket's directory under LOGDIR for one UTC day (YYYY-MM-DD)."""
    return f"{day}/bucket={k}-of-{n}"


def write_marker(log_dir: Path, n: int) -> None:
    """Write (atomically) the marker that says LOGDIR is bucketed in n buckets; an existing
    marker for another n is an error (the old files would sit in the wrong buckets)."""
    path = log_dir / MARKER
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("buckets") != n or old.get("probe") != probe():
            raise InputError(
                f"{path}: this log directory is bucketed in {old.get('buckets')} buckets "
                f"(hash probe {old.get('probe')}), not {n} (probe {probe()})",
                hint="log to a new directory, or keep log_buckets at the value it was written with",
            )
        return
    body = {"layout": LAYOUT, "buckets": n, "hash": "polars hash(seed=7) of session_id, top bits", "probe": probe()}
    tmp = path.with_name(f".{MARKER}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


@dataclass
class Layout:
    """A bucketed log directory as collect reads it."""

    root: Path
    buckets: int
    files: dict[int, list[str]]  # bucket -> its files over every day, sorted
    trusted: bool  # this polars hashes as the writer's did
    why: str = ""  # why not trusted


def read_layout(path: str) -> Layout | None:
    """The layout of `path` when it is a directory holding the marker, else None."""
    root = Path(path)
    marker = root / MARKER
    if path == "-" or not marker.is_file():
        return None
    try:
        meta = json.loads(marker.read_text())
        n = int(meta["buckets"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"{marker}: not a bucket marker ({e})", hint=f"it is written by the gateway: {LAYOUT}"
        ) from None
    if meta.get("layout") != LAYOUT or n < 1 or n & (n - 1):
        raise InputError(
            f"{marker}: layout {meta.get('layout')!r} with {n} buckets is not {LAYOUT} with a power of two",
            hint="remove the marker to read the directory as plain logs",
        )
    files: dict[int, list[str]] = {k: [] for k in range(n)}
    for day in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for sub in sorted(day.iterdir()):
            m = _BUCKET_DIR.match(sub.name)
            if not m or int(m.group(2)) != n or int(m.group(1)) >= n:
                raise InputError(
                    f"{sub}: not a bucket of this layout (bucket=<k>-of-{n})",
                    hint=f"{marker} says {n} buckets; move other files out of {root}",
                )
            files[int(m.group(1))] += sorted(str(f) for f in sub.iterdir() if f.is_file() and _is_log(f.name))
    trusted = meta.get("probe") == probe()
    why = "" if trusted else f"the writer's polars hashed the probe to {meta.get('probe')}, this one to {probe()}"
    return Layout(root, n, files, trusted, why)
