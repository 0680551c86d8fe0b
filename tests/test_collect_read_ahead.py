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


def test_same_chunks_in_the_same_order(tmp_path):
    paths = _logs(tmp_path)
    block = 1 << 16
    want = [c for p in paths for c in sources.read_source(p, block)]
    got = list(sources.read_ahead(paths, block, depth=1))
    assert [c.events.to_dicts() for c in got] == [c.events.to_dicts() for c in want]
    assert [(c.bytes_read, c.lines_read) for c in got] == [(c.bytes_read, c.lines_read) for c in want]


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
