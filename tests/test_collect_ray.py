"""collect --executor ray on a real two-node Ray cluster on loopback (tests/optional.py
`two_node_ray`, as the rollout's Ray tests start one): any event order, any split into files ->
the local run's trajectories, byte for byte, and the same counts; a bucketed gateway log too.

Both "nodes" are processes of this machine, so the partition files beside the output are
visible to both, as a shared filesystem makes them in a real cluster (docs/collect.md)."""

from __future__ import annotations

import json
import random

import polars as pl
import pytest
from events_factory import episode, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optional import require, two_node_ray

ray = require("ray")

AS_OF = "2026-12-02T00:00:00Z"
NOT_COUNTS = {"output", "quarantine", "executor", "seconds"}


@pytest.fixture(scope="module")
def cluster():
    with two_node_ray() as c:
        yield c


def many_sessions() -> list[dict]:
    evs = []
    for i in range(30):
        evs += episode(f"ep{i}", session=f"sess-{i % 12}", turns=1 + i % 3, feedback=-0.5 if i % 5 == 0 else None)
    evs += [dict(e) for e in evs[:6]]  # duplicates, re-logged later
    evs.append({**evs[3], "event_id": "orphan", "type": "tool_result", "sample_id": "gone", "status": "ok"})
    return evs


def collect(tmp, src, name, *extra):
    from conftest import run_cli

    out = tmp / f"{name}.arrow"
    r = run_cli(["collect", src, "-o", out, "--as-of", AS_OF, "--json", "-q", "--set", "min_partitions=4", *extra])
    assert r.exit_code == 0, r.output
    return out.read_bytes(), json.loads(r.stdout)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), split=st.integers(1, 5))
def test_any_order_any_split_gives_the_local_trajectories_byte_for_byte_on_two_nodes(
    cluster, tmp_path_factory, seed, split
):
    tmp = tmp_path_factory.mktemp("ray")
    evs = many_sessions()
    write_jsonl(tmp / "ref" / "a.jsonl", evs)
    ref_bytes, ref = collect(tmp, tmp / "ref", "ref")
    shuffled = list(evs)
    random.Random(seed).shuffle(shuffled)
    size = len(shuffled) // split + 1
    for i in range(split):
        write_jsonl(tmp / "shuf" / f"{i}.jsonl", shuffled[i * size : (i + 1) * size])
    local_bytes, local = collect(tmp, tmp / "shuf", "local")
    ray_bytes, on_ray = collect(tmp, tmp / "shuf", "ray", "--executor", "ray")
    assert ray_bytes == local_bytes == ref_bytes  # the very same file
    assert on_ray["executor"] == "ray" and on_ray["partitions"] == 4 and on_ray["samples_out"] > 40
    assert {k: v for k, v in on_ray.items() if k not in NOT_COUNTS | {"files"}} == {
        k: v for k, v in ref.items() if k not in NOT_COUNTS | {"files"}
    }
    assert on_ray["duplicates"] == 6 and on_ray["orphans"] == {"tool_result": 1}


def test_a_bucketed_log_joins_on_two_nodes_as_locally(cluster, tmp_path):
    from rlcycle.gateway.logwriter import EventLog

    evs = many_sessions()
    log = EventLog(tmp_path / "bkt", flush_interval_s=60, buckets=4)
    log.append(*evs)
    log.close()
    write_jsonl(tmp_path / "flat" / "a.jsonl", evs)
    _, flat = collect(tmp_path, tmp_path / "flat", "flat")
    local_bytes, local = collect(tmp_path, tmp_path / "bkt", "bkt-local")
    ray_bytes, on_ray = collect(tmp_path, tmp_path / "bkt", "bkt-ray", "--executor", "ray")
    assert ray_bytes == local_bytes and on_ray["repartitioned"] is False
    assert {k: v for k, v in on_ray.items() if k not in NOT_COUNTS} == {
        k: v for k, v in local.items() if k not in NOT_COUNTS
    }
    same = pl.read_ipc(tmp_path / "bkt-ray.arrow").equals(pl.read_ipc(tmp_path / "flat.arrow"))
    assert same and on_ray["samples_out"] == flat["samples_out"]
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the driver ran on a two-node cluster
