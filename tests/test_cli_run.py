"""rlcycle.cli.run, the one way into the CLI: exit codes and what goes to stderr for usage
errors, rlcycle errors, unexpected errors, interrupts and a closed stdout, in-process (the `cli`
fixture) and as the installed console script and `python -m rlcycle`; and the `--json` rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from events_factory import many, write_jsonl

from rlcycle import io as rio
from rlcycle.errors import RlcycleError

RLCYCLE = Path(sys.executable).with_name("rlcycle")  # the console script of this venv

# (argv, the command click names, the start of the last line it prints): each is a usage error,
# so click's usage message, `Try ...` and the error, and exit 2.
USAGE_ERRORS = [
    (["nosuchcmd"], "rlcycle", "Error: No such command 'nosuchcmd'."),
    (["collect"], "rlcycle collect", "Error: Missing argument 'events'."),
    (["distill", "--bogus"], "rlcycle distill", "Error: No such option: --bogus"),
    (["inspect", "x.arrow", "--head", "many"], "rlcycle inspect", "Error: Invalid value for '--head' / '-n'"),
]
IDS = [" ".join(argv) for argv, _, _ in USAGE_ERRORS]


def _shell(args, env=None, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", **(env or {})}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=120, **kw)


@pytest.mark.parametrize("argv,command,last", USAGE_ERRORS, ids=IDS)
def test_usage_errors_print_clicks_usage_and_exit_2(cli, argv, command, last):
    r = cli(argv)
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"Usage: {command} [OPTIONS]") and f"Try '{command} -h' for help." in lines
    assert lines[-1].startswith(last) and "unexpected" not in r.stderr


@pytest.mark.parametrize("argv,command,last", USAGE_ERRORS[:3], ids=IDS[:3])
def test_the_console_script_says_the_same(cli, argv, command, last):
    """The installed `rlcycle` (the latest typer/click of the venv) prints what the fixture saw."""
    assert RLCYCLE.exists(), f"{RLCYCLE} is missing: install rlcycle into this venv (scripts/dev.sh setup)"
    p = _shell([RLCYCLE, *argv])
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == cli(argv).stderr
    assert p.stderr.splitlines()[-1].startswith(last)


def test_python_dash_m_goes_through_the_same_entry(tmp_path):
    p = _shell([sys.executable, "-m", "rlcycle", "collect"])
    assert p.returncode == 2 and p.stderr.startswith("Usage: python -m rlcycle collect ")
    p = _shell([sys.executable, "-m", "rlcycle", "inspect", tmp_path / "none.arrow"])
    assert p.returncode == 2 and p.stderr.startswith("Error: ") and "\nHint: " in p.stderr
    # The spelling of earlier releases for torchrun/accelerate still reaches the CLI.
    p = _shell([sys.executable, "-m", "rlcycle.train.launch", "--version"])
    assert (p.returncode, p.stdout.strip()) == (0, "rlcycle 0.1.0")


def test_rlcycle_error_exit_code_and_hint_and_debug_traceback(cli, tmp_path):
    r = cli(["inspect", tmp_path / "none.arrow"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"Error: {tmp_path / 'none.arrow'}") and "\nHint: " in r.stderr
    with pytest.raises(RlcycleError):
        cli(["inspect", tmp_path / "none.arrow"], env={"RLCYCLE_DEBUG": "1"})
    p = _shell([RLCYCLE, "inspect", tmp_path / "none.arrow"], env={"RLCYCLE_DEBUG": "1"})
    assert p.returncode == 1 and "Traceback (most recent call last)" in p.stderr and "InputError" in p.stderr


def test_unexpected_errors_and_interrupts(cli, tmp_path, monkeypatch):
    """A bug (mocked: an inspect that raises) is reported as unexpected, exit 1; Ctrl-C is 130."""
    import rlcycle.inspect

    def boom(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(rlcycle.inspect, "run", boom)
    r = cli(["inspect", tmp_path / "x.arrow"])
    assert r.exit_code == 1
    assert r.stderr == (
        "Error: unexpected ZeroDivisionError: boom\nHint: rerun with RLCYCLE_DEBUG=1 for a traceback, and report it.\n"
    )
    with pytest.raises(ZeroDivisionError):
        cli(["inspect", tmp_path / "x.arrow"], env={"RLCYCLE_DEBUG": "1"})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlcycle.inspect, "run", interrupted)
    r = cli(["inspect", tmp_path / "x.arrow"])
    assert r.exit_code == 130 and "unexpected" not in r.stderr


@pytest.fixture(scope="module")
def big_arrow(tmp_path_factory) -> Path:
    """An artifact whose `inspect` output is far larger than a pipe's buffer."""
    path = tmp_path_factory.mktemp("pipe") / "big.arrow"
    rio.write_table(pa.table({"text": ["x" * 200] * 2000}), path)
    return path


def _closed_stdout(args) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader has already gone (`... | head` after head exited)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(a) for a in args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "{big}", "--head", "2000"],
        ["inspect", "{big}", "--json"],
        ["--help"],
        ["collect", "{events}", "-o", "-", "-q"],
    ],
    ids=["inspect", "inspect-json", "help", "collect-arrow-stream"],
)
def test_a_closed_stdout_exits_quietly(args, big_arrow, tmp_path):
    events = write_jsonl(tmp_path / "ev.jsonl", many(6))
    argv = [a.format(big=big_arrow, events=events) for a in args]
    p = _closed_stdout([RLCYCLE, *argv])
    assert (p.returncode, p.stderr) == (1, "")


def test_json_goes_to_stderr_when_the_data_has_stdout(cli, tmp_path):
    """`-o -`: stdout carries the Arrow stream, so the --json object is one line on stderr."""
    events = write_jsonl(tmp_path / "ev.jsonl", many(6))
    r = cli(["collect", events, "-o", "-", "--json", "-q", "--as-of", "2026-12-02T00:00:00Z"])
    assert r.exit_code == 0, r.stderr
    assert pa.ipc.open_stream(r.stdout_bytes).read_all().num_rows == json.loads(r.stderr)["samples_out"] > 0
    r = cli(["collect", events, "-o", tmp_path / "t.arrow", "--json", "-q", "--as-of", "2026-12-02T00:00:00Z"])
    assert r.exit_code == 0 and r.stderr == "" and json.loads(r.stdout)["output"] == str(tmp_path / "t.arrow")


@pytest.mark.parametrize("user_value", [None, "dirty_decay_ms:0"])
def test_the_cli_sets_polars_allocator_before_polars_loads_and_keeps_a_users_value(user_value):
    """rlcycle.cli keeps freed pages 5 s in polars' jemalloc (`_RJEM_MALLOC_CONF`, read when
    polars loads, which appends it to its own defaults): importing the CLI must not load polars
    first, and a value the user set wins. (This process has loaded polars, which rewrote the
    variable: the child gets an environment without it.)"""
    from rlcycle.cli import ALLOCATOR

    env = {k: v for k, v in os.environ.items() if k != ALLOCATOR[0]}
    if user_value:
        env[ALLOCATOR[0]] = user_value
    code = f"import os, sys, rlcycle.cli; print('polars' in sys.modules, os.environ.get({ALLOCATOR[0]!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", user_value or ALLOCATOR[1]]
