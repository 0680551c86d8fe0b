"""collect's pass 1 parses the next block in a thread (`sources.read_ahead`): the same chunks in
the same order as reading one file after the other, errors where the consumer meets them, and
a consumer that stops early stops the thread. The JSON lines parser reads collect's fields
(`READ_SCHEMA`); the gateway checks every field of the events clients post."""

from __future__ import annotations

import threading

import pytest
from events_factory import episode, write_jsonl

from rlcycle.collect import sources
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


def test_a_consumer_that_stops_early_stops_the_thread(tmp_path):
    paths = _logs(tmp_path, 3)
    chunks = sources.read_ahead(paths, 1 << 10, depth=1)
    next(chunks)
    assert any(t.name == "collect-read-ahead" for t in threading.enumerate())
    chunks.close()
    assert not any(t.name == "collect-read-ahead" for t in threading.enumerate())


def test_fields_collect_never_reads_are_not_checked_by_collect_but_are_by_the_gateway():
    line = (
        b'{"event_id":"x","type":"tool_result","ts":"2026-11-30T10:00:00Z","session_id":"s",'
        b'"sample_id":"q","call_id":"c","status":"ok","duration_ms":"slow"}\n'
    )
    assert parse_block(line, "f", 0).events.height == 1  # collect: duration_ms is never read
    bad = parse_block(line, "f", 0, schema=JSON_SCHEMA).bad
    assert len(bad) == 1 and "duration_ms" in bad[0].reason
