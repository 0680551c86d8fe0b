"""collect's unit of work: one partition of sessions, joined on its own (locally or as a Ray task).

In:  a `Job`: either a partition file written by pass 1 (`Partitioner`, an Arrow stream of
     events of the sessions whose hash falls in that partition's range), or the files of one
     bucket of a bucketed gateway log (collect/buckets.py), parsed here, so no pass 1 ran.
Out: `Joined`: the partition's trajectories (conformed to the contract, ready to append), its
     counts in a fresh `CollectResult` that the driver adds up (`add_counts`), and the bad
     records found while parsing (the driver redacts and writes them, in job order).

The local run and `--executor ray` call the very same `run_job`, and the driver writes the
tables in job order (= hash-range order), so both give byte-identical trajectories.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from rlcycle.collect import join
from rlcycle.collect.buckets import bucket_expr
from rlcycle.collect.events import BadRecord
from rlcycle.collect.sources import read_ahead
from rlcycle.errors import InputError
from rlcycle.schema import TRAJECTORIES, conform

# The columns the join reads (join.READ); the rest of each event is not carried to disk. `_file`
# and `_line` say where each event was read: quarantine records found in the join (a bad prompt
# reference) name them.
KEEP = join.READ


# --- pass 1: partition by session ----------------------------------------------------------------


class Partitioner:
    """Append events to N Arrow stream files on disk, by a stable hash of session_id.

    N is a power of two and a session's partition is the top log2(N) bits of its hash
    (buckets.bucket_expr): the partitions are *ranges* of the hash, so writing them in order,
    each sorted by hash, gives one global order whatever N is (the same output for a file and
    for stdin, and for a bucketed log).

    Splitting a block (`pieces`) touches no state, so blocks are split in parallel as they are
    parsed (sources.read_ahead); `add` writes one block's pieces, blocks in input order.
    """

    def __init__(self, root: Path, n: int):
        self.root, self.n = root, n
        self._writers: dict[int, tuple[Any, Any]] = {}

    def pieces(self, events: pl.DataFrame) -> list[tuple[int, pa.Table]]:
        """A block's events split by partition, each piece as Arrow (to_arrow copies it into
        buffers of its own)."""
        events = events.select(KEEP)
        if not events.height:
            return []
        if self.n == 1:
            return [(0, events.to_arrow())]
        part = bucket_expr(self.n).alias("_part")
        groups = events.with_columns(part).partition_by("_part", as_dict=True)
        return [(int(idx), group.drop("_part").to_arrow()) for (idx,), group in groups.items()]

    def add(self, pieces: list[tuple[int, pa.Table]]) -> None:
        for idx, table in pieces:
            if idx not in self._writers:
                sink = pa.OSFile(str(self.path(idx)), "wb")
                self._writers[idx] = (sink, ipc.new_stream(sink, table.schema))
            self._writers[idx][1].write_table(table)

    def path(self, idx: int) -> Path:
        return self.root / f"part-{idx:05d}.arrows"

    def close(self) -> None:
        for sink, writer in self._writers.values():
            writer.close()
            sink.close()

    def jobs(self) -> list[Job]:
        """One job per partition that received events, in partition (= hash range) order."""
        return [Job(i, partition=str(self.path(idx))) for i, idx in enumerate(sorted(self._writers))]


def read_partition(path: str) -> pl.DataFrame:
    if not Path(path).is_file():
        raise InputError(
            f"partition file {path} is not visible here",
            hint="collect --executor ray reads pass 1's partitions beside the output: every node must mount "
            "that directory (docs/collect.md, 'On Ray')",
        )
    with pa.memory_map(path) as src:
        table = ipc.open_stream(src).read_all()
    # As read: one chunk per parsed block. Not rechunked: the join's first step, the split by
    # event type, is a gather that writes each type's rows contiguously anyway, and everything
    # after it works on those (a rechunk here copied the whole partition once more: same speed
    # without it, ~60 MB less peak RSS on the 1M-event delta log, docs/performance.md).
    return pl.from_arrow(table)


# --- pass 2: one job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    index: int  # position in the output
    partition: str | None = None  # an Arrow stream file of pass 1
    files: tuple[str, ...] = ()  # or: the files of one bucket of a bucketed log
    bucket: tuple[int, int] | None = None  # (k, n) of that bucket


@dataclass(frozen=True)
class JoinSettings:
    """What every job needs besides its events (picklable: it travels to Ray tasks)."""

    config: Any  # CollectConfig
    as_of_ms: int
    since_ms: int | None
    until_ms: int | None
    patterns: tuple


@dataclass
class Joined:
    table: pa.Table | None
    counts: Any  # CollectResult holding this job's counts only
    bad: list[BadRecord]


def run_job(job: Job, settings: JoinSettings, counts: Any, consume: bool = False) -> Joined:
    """Join one job's sessions; `counts` is a fresh CollectResult that receives its counts.
    `consume`: remove the partition file once it is read (the local run: its disk space and page
    cache are given back while the other partitions are joined, not all at the end; not on Ray,
    where a retried task reads its partition again)."""
    bad: list[BadRecord] = []
    if job.partition is not None:
        events = read_partition(job.partition)
        if consume:
            Path(job.partition).unlink()
    else:
        events = _read_bucket(job, settings.config.block_bytes, settings.config.parse_workers, counts, bad)
    c = settings.config
    traj = join.join_partition(
        events, c, settings.as_of_ms, settings.since_ms, settings.until_ms, settings.patterns, counts, bad
    )
    table = conform(traj.to_arrow(), TRAJECTORIES) if traj.height else None
    return Joined(table, counts, bad)


def _read_bucket(job: Job, block_bytes: int, workers: int, counts: Any, bad: list[BadRecord]) -> pl.DataFrame:
    """Parse every file of one bucket (what pass 1 does, for sessions already together): read
    by a thread and parsed `workers` blocks at a time, small files together (sources.read_ahead;
    one block after the other: 14.1-15.1 s against 10.7-11.8 s on docs/performance.md's bucketed log)."""
    frames = []
    for chunk in read_ahead(list(job.files), block_bytes, workers=workers):
        counts.bytes_read += chunk.bytes_read
        counts.lines_read += chunk.lines_read
        bad.extend(chunk.bad)
        if chunk.events.height:
            counts.events_in += chunk.events.height
            frames.append(chunk.events.select(KEEP))
    if not frames:
        from rlcycle.collect.events import empty_events

        return empty_events().select(KEEP)
    events = pl.concat(frames, how="vertical").rechunk()
    k, n = job.bucket or (0, 1)
    stray = events.filter(bucket_expr(n) != k)
    if stray.height:  # a file moved between buckets, or a writer that hashed differently
        raise InputError(
            f"bucketed log: session {stray['session_id'][0]!r} is in bucket {k} of {n} "
            f"({', '.join(job.files[:3])}), but hashes to another bucket",
            hint="read the directory as plain logs: copy its .jsonl files elsewhere (without rlcycle-buckets.json)",
        )
    return events


def add_counts(total: Any, part: Any) -> None:
    """Add one job's counts (a CollectResult that started at zero) into the run's total."""
    for f in fields(total):
        mine, theirs = getattr(total, f.name), getattr(part, f.name)
        if isinstance(theirs, bool) or f.name == "seconds":
            continue
        if isinstance(theirs, Counter):
            mine.update(theirs)
        elif isinstance(theirs, dict):  # per_policy_version: version -> Counter
            for key, counter in theirs.items():
                mine[key].update(counter)
        elif f.name.endswith("_max"):  # a maximum over jobs, not a sum
            setattr(total, f.name, max(mine, theirs))
        elif isinstance(theirs, (int, float)) and theirs:
            setattr(total, f.name, mine + theirs)
