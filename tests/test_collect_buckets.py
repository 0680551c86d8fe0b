"""The gateway's bucketed log (rlcycle.gateway.logwriter, buckets=N) read by collect without its
repartition pass: the same events written flat and bucketed give the same trajectories and counts."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import polars as pl
from events_factory import episode

from rlcycle.collect.buckets import MARKER, bucket_of
from rlcycle.gateway.logwriter import EventLog

AS_OF = "2026-12-02T00:00:00Z"
# Counts that depend on how the events were laid out, not on what they are.
LAYOUT_KEYS = {"output", "quarantine", "files", "partitions", "repartitioned", "seconds", "skipped", "skipped_files"}


def events(n_sessions: int = 24, seed: int = 0) -> list[dict]:
    out = []
    for i in range(n_sessions * 2):
        out += episode(f"ep{i}", session=f"sess-{i % n_sessions}", turns=1 + i % 3, feedback=0.5 if i % 4 else None)
    out += [dict(e) for e in out[:7]]  # re-logged duplicates
    random.Random(seed).shuffle(out)
    return out


def write_log(root: Path, evs: list[dict], buckets: int) -> Path:
    log = EventLog(root, flush_interval_s=60, rotate_bytes=4096, buckets=buckets)
    for i in range(0, len(evs), 10):  # several batches, several rotations
        log.append(*evs[i : i + 10])
        log.flush()
    log.close()
    return root


def collect(cli, src: Path, out: Path, *extra) -> dict:
    r = cli(["collect", src, "-o", out, "--as-of", AS_OF, "--json", "-q", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_bucketed_and_flat_logs_give_the_same_trajectories_without_a_repartition(cli, tmp_path):
    evs = events()
    flat = collect(cli, write_log(tmp_path / "flat", evs, 0), tmp_path / "flat.arrow")
    bucketed = collect(cli, write_log(tmp_path / "bkt", evs, 4), tmp_path / "bkt.arrow")
    assert pl.read_ipc(tmp_path / "bkt.arrow").equals(pl.read_ipc(tmp_path / "flat.arrow"))
    assert pl.read_ipc(tmp_path / "flat.arrow").height > 40
    assert (flat["repartitioned"], bucketed["repartitioned"], bucketed["partitions"]) == (True, False, 4)
    assert {k: v for k, v in bucketed.items() if k not in LAYOUT_KEYS} == {
        k: v for k, v in flat.items() if k not in LAYOUT_KEYS
    }
    assert bucketed["duplicates"] == 7 and bucketed["skipped_files"] == 0


def test_every_event_sits_in_its_sessions_bucket_under_its_day(tmp_path):
    root = write_log(tmp_path / "bkt", events(), 4)
    meta = json.loads((root / MARKER).read_text())
    assert meta["buckets"] == 4
    days = [p for p in root.iterdir() if p.is_dir()]
    assert len(days) == 1 and len(days[0].name) == 10  # YYYY-MM-DD
    seen = 0
    for sub in days[0].iterdir():
        k = int(sub.name.split("=")[1].split("-of-")[0])
        for f in sub.glob("*.jsonl"):
            sessions = [json.loads(line)["session_id"] for line in f.read_text().splitlines()]
            assert set(bucket_of(sessions, 4)) == {k}, f
            seen += len(sessions)
    assert seen == len(events())


def test_a_file_in_the_wrong_bucket_is_an_error_naming_the_session(cli, tmp_path):
    root = write_log(tmp_path / "bkt", events(), 4)
    day = next(p for p in root.iterdir() if p.is_dir())
    a, b = sorted(day.iterdir())[:2]
    moved = next(a.glob("*.jsonl"))
    shutil.move(moved, b / moved.name)
    r = cli(["collect", root, "-o", tmp_path / "t.arrow", "--as-of", AS_OF, "-q"])
    assert r.exit_code == 2 and "hashes to another bucket" in r.output and "session 'sess-" in r.output
    assert not (tmp_path / "t.arrow").exists()


def test_a_log_bucketed_by_another_hash_is_repartitioned(cli, tmp_path):
    evs = events()
    flat = collect(cli, write_log(tmp_path / "flat", evs, 0), tmp_path / "flat.arrow")
    root = write_log(tmp_path / "bkt", evs, 4)
    meta = json.loads((root / MARKER).read_text())
    (root / MARKER).write_text(json.dumps(meta | {"probe": meta["probe"] + 1}))  # another polars' hash
    r = cli(["collect", root, "-o", tmp_path / "bkt.arrow", "--as-of", AS_OF, "--json"])
    assert r.exit_code == 0 and "repartitioning it" in r.stderr
    assert json.loads(r.stdout)["repartitioned"] is True
    assert pl.read_ipc(tmp_path / "bkt.arrow").equals(pl.read_ipc(tmp_path / "flat.arrow"))
    assert flat["samples_out"] == json.loads(r.stdout)["samples_out"]
