"""Sandbox pieces that need no Docker engine: config, paths, framing, output capture, labels,
the executor's command runner (on the host, with its kill(-1) sweep disabled), and CLI help."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

from rlcycle.config import resolve
from rlcycle.errors import InputError
from rlcycle.sandbox import cleanup, executor
from rlcycle.sandbox.channel import Demux, encode
from rlcycle.sandbox.config import SandboxConfig
from rlcycle.sandbox.images import _digest, context_files
from rlcycle.sandbox.sandbox import ExecResult, Status, check_relpath


def test_config_defaults_are_valid_and_hardened():
    c = SandboxConfig()
    assert c.validate() == []
    assert c.network == "none" and not c.user.startswith("0")


def test_config_reports_every_problem_at_once():
    with pytest.raises(InputError) as e:
        resolve(SandboxConfig, sets=["memory_mb=0", "user=0:0", "offline_base=maybe", "pids_limit=4"])
    msg = e.value.message
    for key in ("memory_mb", "user", "offline_base", "pids_limit"):
        assert key in msg


def test_config_rejects_unknown_keys():
    with pytest.raises(InputError, match="memory_mbb"):
        resolve(SandboxConfig, sets=["memory_mbb=1"])


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a/.."])
def test_paths_outside_the_workspace_are_refused(bad):
    with pytest.raises(InputError):
        check_relpath(bad)


def test_relative_paths_are_normalised():
    assert check_relpath("a/./b.txt") == "a/b.txt"


def _frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def test_demux_reassembles_replies_split_across_frames_and_reads():
    reply = encode({"id": 1, "ok": True, "stdout": "x" * 1000})
    stream = _frame(1, reply[:10]) + _frame(2, b"warning\n") + _frame(1, reply[10:])
    d = Demux()
    for i in range(0, len(stream), 7):  # arbitrary socket read boundaries
        assert d.message() is None
        d.feed(stream[i : i + 7])
    assert d.message() == {"id": 1, "ok": True, "stdout": "x" * 1000}
    assert d.message() is None
    assert d.stderr_tail == bytearray(b"warning\n")


def test_capture_keeps_head_and_tail_and_flags_truncation():
    cap = executor.Capture(10)
    for _ in range(1000):
        cap.add(b"0123456789")
    assert cap.total == 10_000 and cap.truncated
    text = cap.text()
    assert text.startswith("01234") and text.endswith("56789")
    assert "9990 bytes truncated" in text


def test_capture_small_output_is_exact():
    cap = executor.Capture(100)
    cap.add(b"hello ")
    cap.add(b"world")
    assert cap.text() == "hello world" and not cap.truncated


def test_exec_result_tells_outcomes_apart():
    assert ExecResult(Status.OK, 0).ok
    assert not ExecResult(Status.NONZERO, 1).ok
    r = ExecResult(Status.INFRA, None, error="executor died")
    assert r.infra_error and r.to_dict()["status"] == "infra_error"


def test_context_hash_is_stable_and_content_addressed():
    files = context_files()
    assert set(files) == {"Dockerfile", "executor.py"}
    assert _digest(files) == _digest(dict(files))
    assert _digest({**files, "executor.py": files["executor.py"] + b"#"}) != _digest(files)


def test_labels_and_owner_liveness():
    lab = cleanup.labels(60, run="r1")
    assert lab[cleanup.LABEL_RUN] == "r1"
    assert int(lab[cleanup.LABEL_EXPIRES]) > time.time()
    assert cleanup.owner_alive(lab[cleanup.LABEL_OWNER])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not cleanup.owner_alive(lab[cleanup.LABEL_OWNER].rsplit(":", 1)[0] + f":{dead.pid}")
    assert not cleanup.owner_alive("someone@another-host:1")


# --- the executor's command runner, on the host -----------------------------------------


@pytest.fixture
def host_executor(tmp_path, monkeypatch):
    """The executor module pointed at a temp workspace. Its kill(-1) sweep stays off: that is
    only safe inside a container (sweep_allowed() checks RLCYCLE_SANDBOX and a non-root uid)."""
    monkeypatch.delenv("RLCYCLE_SANDBOX", raising=False)
    monkeypatch.setattr(executor, "WORKSPACE", str(tmp_path))
    monkeypatch.setattr(executor, "CLEAN_DIRS", (str(tmp_path),))
    assert not executor.sweep_allowed()
    return executor


def test_executor_runs_commands_and_reports_status(host_executor):
    ok = host_executor.run_command({"cmd": "echo hi; echo err >&2", "timeout": 10})
    assert (ok["status"], ok["exit_code"], ok["stdout"], ok["stderr"]) == ("ok", 0, "hi\n", "err\n")
    bad = host_executor.run_command({"cmd": ["sh", "-c", "exit 7"], "timeout": 10})
    assert (bad["status"], bad["exit_code"]) == ("nonzero", 7)
    missing = host_executor.run_command({"cmd": ["no-such-binary-xyz"], "timeout": 10})
    assert (missing["status"], missing["exit_code"]) == ("nonzero", 127)


def test_executor_kills_at_the_timeout_including_background_children(host_executor):
    start = time.monotonic()
    r = host_executor.run_command({"cmd": "sleep 60 & sleep 60", "timeout": 0.5})
    assert r["status"] == "timeout" and r["signal"] == 9
    assert time.monotonic() - start < 30  # well before the sleeps' natural end


def test_executor_does_not_wait_for_a_background_child_holding_the_pipes(host_executor):
    start = time.monotonic()
    r = host_executor.run_command({"cmd": "sleep 120 & echo done", "timeout": 90})
    assert r["status"] == "ok" and r["stdout"] == "done\n"
    assert time.monotonic() - start < 45  # well before the timeout, let alone the child's end


def test_executor_files_refuse_symlink_escapes(host_executor, tmp_path):
    import base64

    host_executor.write_files({"files": {"d/a.txt": base64.b64encode(b"A").decode()}})
    assert (tmp_path / "d" / "a.txt").read_bytes() == b"A"
    os.symlink("/etc", tmp_path / "link")
    with pytest.raises(ValueError, match="escapes"):
        host_executor.read_files({"paths": ["link/passwd"]})
    got = host_executor.read_files({"paths": ["d/a.txt", "missing"]})["files"]
    assert base64.b64decode(got["d/a.txt"]) == b"A" and got["missing"] is None
    host_executor.reset({})
    assert os.listdir(tmp_path) == []


def test_executor_protocol_over_pipes(tmp_path):
    """The executor as a process: framed requests in on stdin, framed replies out on stdout."""
    env = {k: v for k, v in os.environ.items() if k != "RLCYCLE_SANDBOX"}
    env["RLCYCLE_WORKSPACE"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, executor.__file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    reqs = [{"op": "ping", "id": 1}, {"op": "exec", "id": 2, "cmd": "echo $((6*7))"}, {"op": "nope", "id": 3}]
    out, _ = proc.communicate(b"".join(encode(r) for r in reqs), timeout=30)
    replies = []
    while out:
        (n,) = struct.unpack(">I", out[:4])
        replies.append(json.loads(out[4 : 4 + n]))
        out = out[4 + n :]
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[1]["stdout"] == "42\n"
    assert not replies[2]["ok"] and "unknown op" in replies[2]["error"]
    assert proc.returncode == 0  # EOF on stdin: a clean exit


# --- CLI help ---------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [[], ["exec"], ["build"], ["ls"], ["gc"]])
def test_every_sandbox_command_has_help_with_an_example(cli, cmd):
    r = cli(["sandbox", *cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output and "rlcycle sandbox" in r.output
