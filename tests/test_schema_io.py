"""Arrow contracts, validation, io formats and atomic writes, inspect, and CLI help."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rlcycle import io as rio
from rlcycle import schema
from rlcycle.errors import InputError


@pytest.mark.parametrize("contract", list(schema.CONTRACTS.values()), ids=lambda c: c.name)
def test_every_contract_is_versioned_and_validates_itself(contract):
    meta = contract.arrow.metadata
    assert meta[b"rlcycle.schema"] == contract.name.encode()
    assert int(meta[b"rlcycle.schema_version"]) >= 1
    empty = pa.table({f.name: pa.array([], f.type) for f in contract.schema}, schema=contract.arrow)
    assert schema.validate(empty, contract, "x") == []


def test_validate_lists_every_problem_at_once_naming_the_file():
    bad = pa.table({"sample_id": [1], "turn": ["x"], "ts": ["2026"], "extra": [1]})
    problems = schema.validate(bad, schema.TRAJECTORIES, "runs/t.arrow")
    assert all(p.startswith("runs/t.arrow: ") for p in problems)
    assert "runs/t.arrow: column 'sample_id' is int64, expected string" in problems
    assert "runs/t.arrow: column 'turn' is string, expected int32" in problems
    assert "runs/t.arrow: missing column 'completion_ids' (list<item: int32>)" in problems
    assert len(problems) > 10
    with pytest.raises(InputError) as e:
        schema.check(bad, schema.TRAJECTORIES, "runs/t.arrow")
    assert e.value.exit_code == 2 and f"{len(problems)} schema problem(s)" in e.value.message


def test_validate_names_a_file_of_another_contract():
    t = pa.table({"task_id": ["a"]}).replace_schema_metadata(schema.EVAL_RESULTS.arrow.metadata)
    assert "is a 'eval_results' file, expected 'trajectories'" in schema.validate(t, schema.TRAJECTORIES, "f")[0]


def test_open_struct_accepts_any_reward_parts():
    t = schema.conform(pa.table({"reward_parts": [{"edit": 1.0, "latency": -0.1}]}), schema.EXAMPLES)
    assert schema.validate(t, schema.EXAMPLES) == []


@pytest.mark.parametrize("name", ["t.arrow", "t.parquet"])
def test_round_trip_and_sniff(tmp_path, name):
    t = schema.conform(pa.table({"task_id": ["a", "b"], "attempt": [0, 1]}), schema.EVAL_RESULTS)
    path = tmp_path / name
    assert rio.write_table(t, path) == 2
    back = rio.read_table(path)
    assert back.equals(t.cast(back.schema)) and schema.contract_of(back.schema).name == "eval_results"
    assert rio.sniff(path.read_bytes()[:8]) in (rio.Format.ARROW_FILE, rio.Format.PARQUET)


def test_sniff_magic_bytes():
    assert rio.sniff(b"ARROW1\x00\x00") is rio.Format.ARROW_FILE
    assert rio.sniff(b"PAR1xxxx") is rio.Format.PARQUET
    assert rio.sniff(b"\xff\xff\xff\xff\x10\x00") is rio.Format.ARROW_STREAM
    assert rio.sniff(b"\x1f\x8b\x08") is rio.Format.GZIP
    assert rio.sniff(b'  {"a"') is rio.Format.JSON
    assert rio.sniff(b"") is rio.Format.EMPTY
    assert rio.sniff(b"hello") is rio.Format.UNKNOWN


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "out.arrow"
    t = pa.table({"a": [1]})
    with pytest.raises(RuntimeError):
        with rio.ArtifactWriter(path, t.schema) as w:
            w.write(t)
            raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []


def test_a_write_reclaims_only_the_temps_its_dead_writers_left(tmp_path):
    """A killed writer's temp (its pid gone) goes when the same target is written again; a live
    writer's, another host's and another target's stay."""
    import os
    import re
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # exited: its pid runs nothing now (reuse in between is vanishingly rare)
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())
    left = tmp_path / f".log.jsonl.{host}-{pid}.k2j4h5g6.tmp"
    keep = [
        f".log.jsonl.{host}-{os.getpid()}.abcdefgh.tmp",  # live: this process
        f".log.jsonl.otherhost-{pid}.abcdefgh.tmp",  # another host of a shared filesystem
        f".log.jsonl.x.{host}-{pid}.abcdefgh.tmp",  # the temp of log.jsonl.x
        f".log.jsonl.{host}-{pid}.abc.tmp",  # not a name mkstemp makes
    ]
    for name in [left.name, *keep]:
        (tmp_path / name).write_text("partial")
    rio.atomic_write_text(tmp_path / "log.jsonl", "whole\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["log.jsonl", *keep])
    assert rio.reclaim_temps(tmp_path / "log.jsonl") == []


def test_unknown_output_extension_is_refused(tmp_path):
    with pytest.raises(InputError, match="unknown extension"):
        rio.format_for_output(tmp_path / "x.csv")


def test_inspect_human_and_json(cli, tmp_path):
    t = schema.conform(pa.table({"task_id": ["a", "b", "c"]}), schema.EVAL_RESULTS)
    rio.write_table(t, tmp_path / "r.arrow")
    r = cli(["inspect", tmp_path / "r.arrow", "-n", "1"])
    assert r.exit_code == 0
    assert "contract: eval_results v1" in r.stdout and "rows: 3" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["task_id"] == "a"
    s = json.loads(cli(["inspect", tmp_path / "r.arrow", "--json"]).stdout)
    assert s["rows"] == 3 and s["contract"] == "eval_results" and s["problems"] == []


def test_inspect_bad_file(cli, tmp_path):
    (tmp_path / "x.arrow").write_text("not arrow")
    r = cli(["inspect", tmp_path / "x.arrow"])
    assert r.exit_code == 2 and "not an Arrow or Parquet file" in r.error


def _commands():
    import typer.main

    from rlcycle.cli import app

    group = typer.main.get_command(app)
    out = []
    for name, cmd in group.commands.items():
        out.append((name, cmd))
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            out.append((f"{name} {sub_name}", sub))
    return out


@pytest.mark.parametrize("name,cmd", _commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_command_has_help_with_an_example(name, cmd):
    assert cmd.help and len(cmd.help) > 40, f"`rlcycle {name}` has no help text"
    assert "rlcycle " in cmd.help, f"`rlcycle {name}` help has no example"
    for param in cmd.params:
        if param.name not in ("help",):
            assert getattr(param, "help", None), f"`rlcycle {name}` option {param.name} has no help"


def test_console_script_and_python_m(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "rlcycle", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("rlcycle ")
    r = subprocess.run(
        [sys.executable, "-m", "rlcycle", "inspect", str(tmp_path / "nope.arrow")], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.startswith("Error:") and "Hint:" in r.stderr
