"""collect: production event logs in, `trajectories.arrow` out (one row per model sample).

In:  event logs — files, directories, globs or `-` — as JSON lines (optionally gzipped), Arrow,
     Parquet or OpenTelemetry GenAI spans (OTLP/JSON); see docs/design.md "Events".
Out: `trajectories.arrow` (the `trajectories` contract), bad records in
     `<output>.quarantine.jsonl` (file, line, reason, redacted record), and a `CollectResult`
     with every count (in, duplicates, quarantined, joined, held back, orphans, redactions, and
     the files of a directory passed over as not event logs: `skipped_files`, sources.py).

    rlcycle collect sample_data/events -o runs/demo/trajectories.arrow

How it keeps memory bounded: pass 1 parses the input in blocks (`parse_workers` at once) and
appends each valid event to one of N partition files on disk, chosen by a hash of its
`session_id` (every event of an episode carries the same session, so each partition joins on its
own). N grows with the input size (`bucket_bytes` of input per partition; at least
`min_partitions`). Pass 2 joins `join_workers` partitions at a time in memory and appends their
trajectories to the output. Peak memory is about that many partitions, whatever the input size.

Where pass 2 runs (`executor`): here, or one Ray task per partition (collect/ray_join.py; pass 1
stays here) with the same output, byte for byte, and the same counts. A log the gateway wrote
already bucketed by session (collect/buckets.py) skips pass 1: each bucket is parsed and joined
as one job (`repartitioned` is false in the result).

Join rules (late and out-of-order events are normal, so nothing depends on arrival order):
- duplicates: the first event of each `event_id` wins; later copies are counted.
- tool results join their call by (sample_id, call_id); the latest result wins. A result for
  a call the completion did not list is kept as a call with no name (never dropped).
- edit outcomes join by (sample_id, call_id); `edit_lines_*` sum over the sample's edits.
- the first user message of an episode is its `followup_text`.
- feedback: the latest sample-level value, else the latest episode-level one
  (`feedback_scope` says which).
- maturity: an episode with an `ok` edit call whose outcome has not arrived yet is held back
  (counted, not written) until it is `maturity_s` old at `as_of`; after that it is written
  with the outcome missing (`edit_outcomes_missing` counts them).
- filters: `policy_versions` per sample; `since`/`until` on the episode's first sample, so an
  episode is never cut in half.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tempfile
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlcycle import console
from rlcycle import io as rio
from rlcycle.collect import redact
from rlcycle.collect.buckets import read_layout
from rlcycle.collect.events import BadRecord, Chunk
from rlcycle.collect.partitions import Job, Joined, JoinSettings, Partitioner, add_counts, run_job
from rlcycle.collect.sources import BLOCK_BYTES, expand_inputs, not_events, read_ahead
from rlcycle.config import cfg, check_range
from rlcycle.console import Progress
from rlcycle.errors import InputError
from rlcycle.faults import crash_point
from rlcycle.rollout import EXECUTORS
from rlcycle.schema import TRAJECTORIES
from rlcycle.stage import Outcome, RunLayout, StageContext, content_key


@dataclass
class CollectConfig:
    policy_versions: list[str] = cfg([], help="Keep only samples of these policy versions (all when empty).")
    since: str | None = cfg(None, help="Keep episodes whose first sample is at or after this time (RFC 3339).")
    until: str | None = cfg(None, help="Keep episodes whose first sample is before this time (RFC 3339).")
    maturity_s: float = cfg(
        6 * 3600.0, help="Hold back an episode with edit outcomes still due until it is this old (seconds)."
    )
    as_of: str | None = cfg(None, help="'Now' for the maturity rule (RFC 3339); default: the wall clock.")
    edit_tools: list[str] = cfg(
        ["write_file", "apply_patch", "replace_in_file"], help="Tool names whose ok calls get edit outcomes."
    )
    strict: bool = cfg(False, help="Fail with exit 2 on the first bad record instead of quarantining it.")
    redact: bool = cfg(True, help="Redact secrets in text fields before anything is written.")
    secret_patterns: dict[str, str] = cfg({}, help="Extra secret patterns to redact: name = regex.")
    bucket_bytes: int = cfg(256 << 20, help="Input bytes per join partition (lower: less memory, more files).")
    block_bytes: int = cfg(
        BLOCK_BYTES,
        help="Bytes of JSON lines parsed per block (docs/performance.md: why not bigger).",
    )
    parse_workers: int = cfg(
        2,
        help="Blocks parsed at once in pass 1, and within each bucket of a bucketed log (threads; each holds one block).",
    )
    min_partitions: int = cfg(
        1, help="Join in at least this many partitions (rounded up to a power of two); with executor=ray: parallelism."
    )
    join_workers: int = cfg(
        2,
        help="Partitions joined at once by the local executor (threads; each holds one partition in memory).",
    )
    executor: str = cfg(
        "local",
        help="Where the join runs: local (this process) or ray (one Ray task per partition; docs/collect.md).",
    )
    ray_address: str | None = cfg(
        None,
        help="Ray cluster to join (e.g. ray://head:10001 or auto); default: RAY_ADDRESS, else a local Ray.",
    )

    def validate(self) -> list[str]:
        problems = []
        for name in ("since", "until", "as_of"):
            value = getattr(self, name)
            if value is not None:
                try:
                    parse_time(value)
                except ValueError:
                    problems.append(f"{name}={value!r}: not an RFC 3339 time (e.g. 2026-11-30T10:00:00Z)")
        check_range(problems, self, "maturity_s", ge=0)
        check_range(problems, self, "bucket_bytes", ge=1 << 20)  # 1 MiB
        check_range(problems, self, "block_bytes", ge=1 << 16)  # 64 KiB
        check_range(problems, self, ("min_partitions", "join_workers", "parse_workers"), ge=1)
        if self.executor not in EXECUTORS:
            problems.append(f"executor={self.executor!r}: one of {', '.join(EXECUTORS)}")
        return problems


@dataclass
class CollectResult:
    output: str
    quarantine: str | None
    files: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"}: not event logs
    bytes_read: int = 0
    lines_read: int = 0
    events_in: int = 0
    duplicates: int = 0
    quarantined: int = 0
    quarantine_reasons: Counter = field(default_factory=Counter)
    samples_out: int = 0
    episodes_out: int = 0
    held_back_episodes: int = 0
    held_back_samples: int = 0
    filtered_samples: int = 0
    duplicate_samples: int = 0
    # Prompts stored once (collect/prompt_refs.py): ids the input held, ids written, ids the
    # whole prompts of the rows written would take; segments and sessions written; retries.
    prompt_tokens_logged: int = 0
    prompt_tokens_stored: int = 0
    prompt_tokens_full: int = 0
    segments: int = 0
    segments_per_session_max: int = 0
    sessions_out: int = 0
    retried: int = 0
    orphans: Counter = field(default_factory=Counter)
    redactions: Counter = field(default_factory=Counter)
    quarantine_truncated: int = 0  # quarantined fields cut at QUARANTINE_FIELD_CHARS
    per_policy_version: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    partitions: int = 0
    repartitioned: bool = True  # False: a bucketed log was joined bucket by bucket (no pass 1)
    executor: str = "local"
    inputs: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "quarantine": self.quarantine,
            "files": self.files,
            "skipped_files": len(self.skipped),
            "skipped": self.skipped,
            "bytes_read": self.bytes_read,
            "lines_read": self.lines_read,
            "events_in": self.events_in,
            "duplicates": self.duplicates,
            "quarantined": self.quarantined,
            "quarantine_reasons": dict(self.quarantine_reasons.most_common()),
            "quarantine_truncated": self.quarantine_truncated,
            "samples_out": self.samples_out,
            "episodes_out": self.episodes_out,
            "held_back_episodes": self.held_back_episodes,
            "held_back_samples": self.held_back_samples,
            "filtered_samples": self.filtered_samples,
            "duplicate_samples": self.duplicate_samples,
            "prompt_tokens_logged": self.prompt_tokens_logged,
            "prompt_tokens_stored": self.prompt_tokens_stored,
            "prompt_tokens_full": self.prompt_tokens_full,
            "segments": self.segments,
            "segments_per_session_max": self.segments_per_session_max,
            "sessions_out": self.sessions_out,
            "retried": self.retried,
            "orphans": dict(sorted(self.orphans.items())),
            "redactions": dict(sorted(self.redactions.items())),
            "per_policy_version": {k: dict(sorted(v.items())) for k, v in sorted(self.per_policy_version.items())},
            "partitions": self.partitions,
            "repartitioned": self.repartitioned,
            "executor": self.executor,
            "seconds": round(self.seconds, 3),
        }


def parse_time(value: str) -> datetime:
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _ms(value: str | None) -> int | None:
    return None if value is None else int(parse_time(value).timestamp() * 1000)


def default_quarantine_path(out: str) -> str:
    return "collect.quarantine.jsonl" if out == rio.STDIO else f"{out}.quarantine.jsonl"


# --- the stage ---------------------------------------------------------------------------------


def run(
    config: CollectConfig,
    inputs: list[str],
    out: str,
    quarantine: str | None = None,
    quiet: bool = False,
) -> CollectResult:
    """Collect `inputs` into trajectories at `out` (path or `-`); see the module docstring."""
    started = time.monotonic()
    rio.format_for_output(out)  # reject a bad extension before reading anything
    qpath = quarantine or default_quarantine_path(out)
    patterns = redact.patterns_with(config.secret_patterns) if config.redact else ()
    layout = read_layout(inputs[0]) if len(inputs) == 1 else None
    if layout is not None and not layout.trusted:
        console.warn(f"collect: {layout.root} is bucketed, but {layout.why}: repartitioning it")
    qwriter = rio.AtomicTextWriter(qpath)
    progress = Progress("collect", quiet=quiet)
    try:
        if layout is not None and layout.trusted:
            result = _collect_buckets(config, layout, inputs, out, qwriter, patterns, progress)
        else:
            result = _collect_flat(config, inputs, out, qwriter, patterns, progress)
        qwriter.commit()
    except BaseException:
        qwriter.abort()
        raise
    result.quarantine = qpath if qwriter.count else None
    result.seconds = time.monotonic() - started
    return result


def _collect_flat(config: CollectConfig, inputs: list[str], out: str, qwriter, patterns, progress) -> CollectResult:
    """Any event logs: pass 1 (here) partitions them by session onto disk, pass 2 joins each."""
    found = expand_inputs(inputs)
    if found.files.count(rio.STDIO) > 1:
        raise InputError("stdin (-) given more than once")
    files, skipped = _event_logs(found)
    result = CollectResult(output=out, quarantine=None, files=len(files), skipped=skipped, executor=config.executor)
    result.inputs = list(inputs)
    sizes = [os.path.getsize(f) for f in files if f != rio.STDIO]
    n_parts = max(1, math.ceil(sum(sizes) / config.bucket_bytes), config.min_partitions)
    if rio.STDIO in files:
        n_parts = max(n_parts, 16)  # unknown size: spread it
    n_parts = 1 << (n_parts - 1).bit_length()  # a power of two: see Partitioner
    result.partitions = n_parts
    with rio.scratch_dir(_workdir_name(out)) as tmp:
        parts = Partitioner(tmp, n_parts)
        # Blocks are parsed and split by partition in parallel, and taken in input order.
        blocks = read_ahead(
            files,
            config.block_bytes,
            workers=config.parse_workers,
            prepare=lambda chunk: (chunk, parts.pieces(chunk.events)),
        )
        for chunk, pieces in blocks:
            _take_chunk(chunk, pieces, result, parts, qwriter, patterns, config.strict)
            progress.update(events=result.events_in, quarantined=result.quarantined)
        parts.close()
        crash_point("collect:partitioned")  # fault injection: a kill -9 with partitions on disk
        if result.events_in == 0 and result.quarantined == 0:
            _empty(result)
        _join_all(config, parts.jobs(), out, result, qwriter, patterns, progress)
    return result


def _collect_buckets(config: CollectConfig, layout, inputs, out, qwriter, patterns, progress) -> CollectResult:
    """A bucketed gateway log (collect/buckets.py): every session's events are already in one
    bucket, so there is no pass 1: each bucket is parsed and joined as one job."""
    files = {k: fs for k, fs in layout.files.items() if fs}
    result = CollectResult(output=out, quarantine=None, files=sum(len(fs) for fs in files.values()))
    result.inputs, result.executor, result.repartitioned = list(inputs), config.executor, False
    result.partitions = layout.buckets
    jobs = [Job(i, files=tuple(fs), bucket=(k, layout.buckets)) for i, (k, fs) in enumerate(sorted(files.items()))]
    _join_all(config, jobs, out, result, qwriter, patterns, progress)
    return result


def _workdir_name(out: str) -> Path:
    """What the partitions' working directory is named for (rlcycle.io.scratch_dir): beside the
    output, or in the temp directory for stdout. A run killed mid-way leaves it; the next run
    of the same output removes it."""
    if out == rio.STDIO:
        return Path(tempfile.gettempdir()) / "rlcycle-collect-stdout"
    return Path(out).with_name(f"rlcycle-collect-{Path(out).name}")


def _event_logs(found) -> tuple[list[str], list[dict[str, str]]]:
    """The files to read and those passed over (see sources.py): a listed file that is not an
    event log by its content is skipped; a named one is an error."""
    files, skipped = [], list(found.skipped)
    for path in found.files:
        listed = path in found.listed
        why = not_events(path) if path != rio.STDIO else None
        if why is None:
            files.append(path)
        elif listed:
            skipped.append({"file": path, "reason": why[0]})
        elif not why[1]:  # named on its own: the readers would take it as all-bad records
            raise InputError(
                f"{path}: not an event log ({why[0]})",
                hint="pass event logs (JSON lines with event_id/type/session_id/ts, Arrow, Parquet, OTel)",
            )
        else:
            files.append(path)  # its reader raises the precise error
    return files, sorted(skipped, key=lambda s: s["file"])


def _take_chunk(chunk: Chunk, pieces, result: CollectResult, parts: Partitioner, qwriter, patterns, strict) -> None:
    result.bytes_read += chunk.bytes_read
    result.lines_read += chunk.lines_read
    if chunk.bad:
        _quarantine(chunk.bad, result, qwriter, patterns, strict)
    result.events_in += chunk.events.height
    parts.add(pieces)


# A quarantined record is kept for a person to read, not to be replayed: past this many
# characters a field is cut and ends with a marker saying how much was dropped (and the cut is
# counted), so one runaway line cannot fill the disk with a second copy of itself.
QUARANTINE_FIELD_CHARS = 64 * 1024


def _quarantine(bads: list[BadRecord], result: CollectResult, qwriter, patterns, strict: bool) -> None:
    """Write a chunk's bad records: redacted (all at once, linear time), then size-capped."""
    if strict:
        bad = bads[0]
        raise InputError(
            f"{bad.file}:{bad.line}: {_cap(bad.reason, 2000, result)}",
            hint="fix or remove that record, or drop --strict to quarantine bad records and go on",
        )
    records = [b.record for b in bads]
    reasons = [b.reason for b in bads]
    if patterns:  # reasons may quote a value from the record, so they are redacted as well
        records = redact.redact_texts(records, patterns, result.redactions)
        reasons = redact.redact_texts(reasons, patterns, result.redactions)
    for bad, record, reason in zip(bads, records, reasons, strict=True):
        result.quarantined += 1
        result.quarantine_reasons[_reason_kind(reason)] += 1
        row = {
            **bad.as_dict(),
            "reason": _cap(reason, QUARANTINE_FIELD_CHARS, result),
            "record": _cap(record, QUARANTINE_FIELD_CHARS, result),
        }
        qwriter.write_line(json.dumps(row, ensure_ascii=False))


def _cap(text: str | None, limit: int, result: CollectResult) -> str | None:
    """`text` cut to `limit` characters plus a visible marker; each cut counted in the result."""
    if text is None or len(text) <= limit:
        return text
    result.quarantine_truncated += 1
    return f"{text[:limit]}…[truncated: {len(text) - limit} more characters]"


_QUOTED_VALUE = re.compile(r"(?<!field )(?<!column )(?<!type )'[^']*'")
_COUNT = re.compile(r"\b\d+ (?=complet)")  # "2 completion_ids", "3 complete batch(es)"


def _reason_kind(reason: str) -> str:
    """A short category for the summary: the reason without its details (column, the value
    that was given, counts), keeping which field, column or event type it is about."""
    head = reason.split(" at column")[0].split(", got ")[0].split(" (")[0]
    return _QUOTED_VALUE.sub("'…'", _COUNT.sub("N ", head))


# --- pass 2: join each partition, here or on Ray ------------------------------------------------


def _join_all(config: CollectConfig, jobs: list[Job], out: str, result: CollectResult, qwriter, patterns, progress):
    """Join every job and append its trajectories to `out` in job order (= hash-range order),
    adding up its counts; with executor=ray each job is a Ray task (collect/ray_join.py)."""
    as_of = _ms(config.as_of) if config.as_of else int(time.time() * 1000)
    settings = JoinSettings(config, as_of, _ms(config.since), _ms(config.until), patterns)
    if config.executor == "ray":
        from rlcycle.collect.ray_join import joined_on_ray

        joined = joined_on_ray(jobs, settings, config.ray_address, _new_counts)
    else:
        joined = _joined_here(jobs, settings, config.join_workers)
    with rio.ArtifactWriter(out, TRAJECTORIES.arrow) as writer:
        for part in joined:
            if part.bad:  # found while parsing a bucket: quarantined in bucket order
                _quarantine(part.bad, result, qwriter, patterns, config.strict)
            add_counts(result, part.counts)
            if part.table is not None:
                writer.write(part.table)
            progress.update(events=result.events_in, samples=result.samples_out, held_back=result.held_back_samples)
        if result.events_in == 0 and result.quarantined == 0:  # raised inside: no output is left
            _empty(result)


def _joined_here(jobs: list[Job], settings: JoinSettings, workers: int) -> Iterator[Joined]:
    """Each job's `Joined`, in job order, joined by `workers` threads (polars, Arrow and numpy
    release the GIL): at most `workers` partitions are in memory beside the one being written.
    Each partition file is removed as soon as it is read (`consume`)."""

    def one(job: Job) -> Joined:
        return run_job(job, settings, _new_counts(), consume=True)

    if workers <= 1 or len(jobs) <= 1:
        yield from map(one, jobs)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: deque[Future] = deque()
        todo = iter(jobs)
        try:
            for job in itertools.islice(todo, workers):
                pending.append(pool.submit(one, job))
            while pending:
                done = pending.popleft().result()
                for job in itertools.islice(todo, 1):
                    pending.append(pool.submit(one, job))
                yield done
        finally:
            for f in pending:  # the run stopped early (an error): the rest is not needed
                f.cancel()


def _new_counts() -> CollectResult:
    """An empty result: what one job counts into (add_counts sums them)."""
    return CollectResult(output="", quarantine=None)


def _empty(result: CollectResult) -> None:
    passed = f" ({len(result.skipped)} file(s) skipped as not event logs)" if result.skipped else ""
    raise InputError(
        f"no events in {', '.join(result.inputs)}: the input is empty{passed}",
        hint="point collect at production event logs (JSON lines, Arrow, Parquet, OTel)",
    )


def format_summary(r: CollectResult) -> str:
    """The human-readable lines `rlcycle collect` prints on stderr after a run."""
    mb = r.bytes_read / 1e6
    lines = [
        f"collect: {r.events_in + r.quarantined:,} records from {r.files} file(s) "
        f"({mb:,.1f} MB) in {r.seconds:.1f}s, {r.partitions} partition(s)",
        f"  trajectories   {r.samples_out:,} samples in {r.episodes_out:,} episodes -> {r.output}",
        f"  prompts        {r.prompt_tokens_stored:,} token ids stored for {r.prompt_tokens_full:,} in whole prompts; "
        f"{r.segments:,} segments in {r.sessions_out:,} sessions (at most {r.segments_per_session_max:,} in one); "
        f"{r.retried:,} retried (left out by train)",
        f"  duplicates     {r.duplicates:,} events"
        + (f", {r.duplicate_samples} repeated sample ids" if r.duplicate_samples else ""),
        f"  held back      {r.held_back_episodes:,} episodes ({r.held_back_samples:,} samples): edit outcomes still due",
        f"  filtered out   {r.filtered_samples:,} samples (policy version / time window)",
        f"  quarantined    {r.quarantined:,}" + (f" -> {r.quarantine}" if r.quarantine else ""),
    ]
    if r.skipped:
        lines.append(f"  skipped        {len(r.skipped):,} file(s) that are not event logs:")
        for s in r.skipped[:8]:
            lines.append(f"    {s['file']}: {s['reason']}")
        if len(r.skipped) > 8:
            lines.append(f"    ... and {len(r.skipped) - 8:,} more (--json lists them all)")
    for reason, n in r.quarantine_reasons.most_common(8):
        lines.append(f"    {n:>8,}  {reason}")
    if r.orphans:
        lines.append(
            "  orphans        "
            + ", ".join(f"{k}={v:,}" for k, v in sorted(r.orphans.items()))
            + " (their sample or episode is not in this input)"
        )
    if r.redactions:
        lines.append("  redacted       " + ", ".join(f"{k}={v:,}" for k, v in sorted(r.redactions.items())))
    if r.per_policy_version:
        lines.append("  per policy version:")
        for version, c in sorted(r.per_policy_version.items()):
            lines.append(
                f"    {version}: {c['samples_out']:,} samples, {c['episodes_out']:,} episodes, "
                f"{c['held_back_samples']:,} held back, {c['filtered']:,} filtered, "
                f"{c['invalid_tool_calls']:,} invalid tool calls"
            )
    return "\n".join(lines)


# --- the stage object (rlcycle/stage.py): what `rlcycle collect` and the cycle both run --------

# What the cycle's manifest keeps of a CollectResult (`cycle --json` shows it).
_CYCLE_KEYS = ("samples_out", "episodes_out", "quarantined", "duplicates", "held_back_episodes", "skipped_files")


@dataclass(frozen=True)
class CollectArgs:
    """What one collect reads and writes: `run`'s arguments past the config."""

    events: list[str]  # files, directories, globs or `-`
    out: str  # trajectories.arrow (or .parquet), or `-`
    quarantine: str | None = None  # default: OUT.quarantine.jsonl
    quiet: bool = False


class CollectStage:
    """collect as a stage: event logs (simulate's, or the production logs) -> trajectories."""

    name = "collect"
    config_class = CollectConfig
    cacheable, gate, publishes = True, False, False

    def inputs(self, ctx: StageContext) -> dict[str, str]:
        return {"events": content_key(list(ctx.events), pending_ok=True)}

    def outputs(self, layout: RunLayout) -> dict[str, Path]:
        return {"trajectories": layout.file("trajectories")}

    def args(self, ctx: StageContext) -> CollectArgs:
        return CollectArgs(list(ctx.events), str(ctx.layout.file("trajectories")), quiet=ctx.quiet)

    def run(self, config: CollectConfig, args: CollectArgs) -> CollectResult:
        return run(config, args.events, args.out, quarantine=args.quarantine, quiet=args.quiet)

    def record(self, result: CollectResult) -> Outcome:
        return Outcome({k: v for k, v in result.as_dict().items() if k in _CYCLE_KEYS}, format_summary(result))


STAGE = CollectStage()
