"""collect's pass 1 reads ahead in a thread and parses blocks in parallel (`sources.read_ahead`):
the same chunks in the same order as reading one file after the other, errors where the
consumer meets them, and a consumer that stops early stops the threads. The JSON lines parser
reads collect's fields (`READ_SCHEMA`); the gateway checks every field of the events clients
post."""

from __future__ import annotations

import threading

import pytest
from events_factory import episode, write_jsonl

from rlcycle.collect import jsonl, sources
from rlcycle.collect.events import JSON_SCHEMA
from rlcycle.collect.jsonl import parse_block
from rlcycle.errors import InputError


def _logs(tmp_path, n_files=3):
    paths = []
    for k in range(n_files):
        events = episode(f"e{k}", session=f"s{k}", turns=4)
        paths.append(str(write_jsonl(tmp_path / f"events-{k}.jsonl", events)))
    return paths


def _rows(chunks):
    import polars as pl

    return pl.concat([c.events for c in chunks], how="vertical").to_dicts()


def test_same_events_files_and_lines_as_reading_one_file_after_the_other(tmp_path):
    """Small files are parsed together (one parser call), each row keeping its file and line."""
    paths = _logs(tmp_path)
    block = 1 << 16
    want = [c for p in paths for c in sources.read_source(p, block)]
    got = list(sources.read_ahead(paths, block, depth=1))
    assert len(got) < len(want)  # parsed together
    assert _rows(got) == _rows(want)
    assert sum(c.bytes_read for c in got) == sum(c.bytes_read for c in want)
    assert sum(c.lines_read for c in got) == sum(c.lines_read for c in want)


def test_a_bad_line_among_small_files_is_named_by_its_own_file_and_line(tmp_path):
    paths = _logs(tmp_path)
    with open(paths[1], "a") as f:
        f.write('{"event_id": "x", "type": "telemetry", "ts": "2026-11-30T10:00:00Z", "session_id": "s"}\n')
        f.write('{"event_id": "y", "type": \n')
    got = list(sources.read_sources(paths, 1 << 16))
    bad = sorted((b.file, b.line, b.reason.split(" (")[0]) for c in got for b in c.bad)
    n = len(open(paths[1]).read().splitlines())
    assert [(f, ln) for f, ln, _ in bad] == [(paths[1], n - 1), (paths[1], n)]
    assert "unknown event type" in bad[0][2] and "malformed JSON" in bad[1][2]
    want = [c for p in paths for c in sources.read_source(p, 1 << 16)]
    assert _rows(got) == _rows(want)


def test_an_error_in_a_later_file_reaches_the_consumer_after_the_earlier_chunks(tmp_path):
    paths = _logs(tmp_path, 2)
    (tmp_path / "garbage.json").write_text('{\n  "not": \n')  # a JSON document that does not parse
    seen = []
    with pytest.raises(InputError, match="garbage.json"):
        for chunk in sources.read_ahead([*paths, str(tmp_path / "garbage.json")], 1 << 16):
            seen.append(chunk)
    assert sum(c.events.height for c in seen) == sum(
        c.events.height for p in paths for c in sources.read_source(p, 1 << 16)
    )


def _ours():
    return [t.name for t in threading.enumerate() if t.name.startswith("collect-")]


def test_a_consumer_that_stops_early_stops_the_threads(tmp_path):
    paths = _logs(tmp_path, 3)
    chunks = sources.read_ahead(paths, 1 << 10, depth=1)
    next(chunks)
    assert "collect-read-ahead" in _ours()
    chunks.close()
    assert _ours() == []


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_blocks_parsed_in_parallel_come_in_input_order_with_their_lines(tmp_path, workers):
    """Blocks of 64 KiB over files of several blocks each, a bad line among them: the same
    chunks, rows, lines and quarantine records as parsing one block after the other."""
    paths = []
    for k in range(3):
        events = [e for i in range(150) for e in episode(f"e{k}-{i}", session=f"s{k}-{i}", turns=3)]
        extra = ['{"event_id": "bad", "type": '] if k == 1 else []
        paths.append(str(write_jsonl(tmp_path / f"big-{k}.jsonl", events, extra)))
    block = 1 << 16
    want = list(sources.read_sources(paths, block))
    assert len(want) > 2 * len(paths)  # several blocks per file
    got = list(sources.read_ahead(paths, block, workers=workers, prepare=lambda c: (c, c.events.height)))
    assert [n for _, n in got] == [c.events.height for c in want]
    assert _rows([c for c, _ in got]) == _rows(want)
    assert [(b.file, b.line, b.reason) for c, _ in got for b in c.bad] == [
        (b.file, b.line, b.reason) for c in want for b in c.bad
    ]
    assert _ours() == []


def test_an_error_while_preparing_a_block_reaches_the_consumer_at_that_block(tmp_path):
    paths = _logs(tmp_path, 3)
    seen = []

    def prepare(chunk):
        if paths[1] in chunk.events.get_column("_file").to_list():
            raise ValueError("boom")
        return chunk

    with pytest.raises(ValueError, match="boom"):
        for chunk in sources.read_ahead(paths, 1 << 10, prepare=prepare):
            seen.append(chunk)
    assert _rows(seen) == _rows(list(sources.read_source(paths[0], 1 << 10)))  # file 0, then the error
    assert _ours() == []


def test_fields_collect_never_reads_are_not_checked_by_collect_but_are_by_the_gateway():
    line = (
        b'{"event_id":"x","type":"tool_result","ts":"2026-11-30T10:00:00Z","session_id":"s",'
        b'"sample_id":"q","call_id":"c","status":"ok","duration_ms":"slow"}\n'
    )
    assert parse_block(line, "f", 0).events.height == 1  # collect: duration_ms is never read
    bad = parse_block(line, "f", 0, schema=JSON_SCHEMA).bad
    assert len(bad) == 1 and "duration_ms" in bad[0].reason


@pytest.mark.parametrize("last_newline", [True, False])
def test_a_file_read_in_blocks_that_end_at_line_ends_gives_what_a_stream_gives(tmp_path, monkeypatch, last_newline):
    """A plain file's blocks are cut at a line's end before they are read (`jsonl._line_end`,
    positioned reads); a gzip file is a stream, read and then completed to its line's end. Both
    give the same rows, lines, byte and line counts and quarantine records — with a line longer
    than the 64 KiB probe, a bad line and, in one case, no newline at the end."""
    import gzip

    events = [e for i in range(120) for e in episode(f"e{i}", session=f"s{i}", turns=3)]
    events[40]["followup_text"] = "x" * 200_000  # a line longer than one probe and than a block
    data = write_jsonl(tmp_path / "plain.jsonl", events, ['{"event_id": "bad", "type": ']).read_bytes()
    data = data if last_newline else data + b'{"event_id": "cut", "ty'
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(data)
    packed = tmp_path / "packed.jsonl.gz"
    packed.write_bytes(gzip.compress(data))
    block = 1 << 16
    cuts = []
    line_end = jsonl._line_end
    monkeypatch.setattr(jsonl, "_line_end", lambda fd, pos: cuts.append(pos) or line_end(fd, pos))
    want = list(sources.read_source(str(packed), block))
    assert cuts == []  # a stream: no positioned reads
    got = list(sources.read_source(str(plain), block))
    assert len(got) > 4 and len(cuts) >= len(got) - 1  # several blocks, each cut before it was read
    assert _rows(got) == [{**r, "_file": str(plain)} for r in _rows(want)]
    assert [(c.bytes_read, c.lines_read) for c in got] == [(c.bytes_read, c.lines_read) for c in want]
    assert [(b.line, b.reason) for c in got for b in c.bad] == [(b.line, b.reason) for c in want for b in c.bad]
    assert len([b for c in got for b in c.bad]) == (1 if last_newline else 2)


@pytest.mark.parametrize("size", [0, 1, (1 << 18) - 1, 1 << 18, (1 << 20) + 3])
def test_lines_are_counted_as_bytes_count_counts_them(size):
    import random

    from rlcycle.collect.jsonl import count_lines

    rng = random.Random(size)
    body = bytes(rng.choice(b"ab\n") for _ in range(size))
    for block in (body, body + b"\n", body + b"x"):
        assert count_lines(block) == block.count(b"\n") + (0 if not block or block.endswith(b"\n") else 1)
