"""The shared helpers: content hashes and checkpoint ids, the atomic directory swap, the file lock, the TOML reader and the range check of `validate()`."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from rlcycle import digest
from rlcycle import io as rio
from rlcycle.config import check_range, read_toml
from rlcycle.errors import InputError
from rlcycle.policy.registry import checkpoint_id
from rlcycle.train import checkpoint as C

NEW_ID = re.compile(r"sha256:[0-9a-f]{64}")


def fake_ckpt(path, seed: int):
    """A directory the registry accepts (it never loads the weights, so bytes stand in)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "seed": seed}))
    (path / "model.safetensors").write_bytes(hashlib.sha256(str(seed).encode()).digest() * 64)
    (path / "tokenizer.json").write_text("{}")
    return path


# --- hashes and ids -------------------------------------------------------------------------------


def test_file_and_tree_hashes(tmp_path):
    a, b = tmp_path / "d" / "a.bin", tmp_path / "d" / "sub" / "b.txt"
    b.parent.mkdir(parents=True)
    a.write_bytes(b"\x00" * 3_000_000)
    b.write_text("hello")
    assert digest.file_sha256(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    expected = hashlib.sha256(b"a.bin\0" + a.read_bytes() + b"sub/b.txt\0hello").hexdigest()
    assert digest.tree_sha256(tmp_path / "d") == expected
    assert digest.files_sha256([(None, a), (None, b)]) == hashlib.sha256(a.read_bytes() + b"hello").hexdigest()
    b.rename(b.with_name("c.txt"))  # a name is content too
    assert digest.tree_sha256(tmp_path / "d") != expected


def test_one_id_format_for_every_checkpoint(tmp_path):
    foreign = fake_ckpt(tmp_path / "foreign", 0)  # no rlcycle.json, no manifest: hashed now
    cid = checkpoint_id(foreign)
    # sha256 over sha256sum's lines, one per file, sorted by name (rlcycle/policy/manifest.py)
    lines = "".join(f"{digest.file_sha256(foreign / n)}  {n}\n" for n in sorted(os.listdir(foreign)))
    assert NEW_ID.fullmatch(cid) and cid == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    assert C.content_id(foreign) == cid  # what train writes into rlcycle.json: the same function


# --- atomic directories and the lock ------------------------------------------------------------


def test_atomic_dir_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), rio.atomic_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("killed halfway")
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    with rio.atomic_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp or moved-aside copy left
    (tmp_path / "file").write_text("a file in the way")
    with rio.atomic_dir(tmp_path / "file") as tmp:
        (tmp / "x").write_text("x")
    assert (tmp_path / "file" / "x").read_text() == "x"


def test_a_killed_atomic_dir_is_reclaimed_by_the_next_write_of_its_target(tmp_path):
    """kill -9 inside `atomic_dir` (a train saving its checkpoint, a registry copy) leaves the
    temp directory; the next `atomic_dir` of the same target removes it (its pid is dead) and
    no other: a live writer's, another host's, another target's."""
    import re
    import signal
    import socket
    import subprocess
    import sys

    out = tmp_path / "ckpt"
    code = (
        "import os, signal, sys; from rlcycle import io as rio\n"
        "with rio.atomic_dir(sys.argv[1]) as tmp:\n"
        "    (tmp / 'model.safetensors').write_bytes(b'half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    [left] = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".ckpt.") and left.name.endswith(".tmp") and (left / "model.safetensors").exists()
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())
    dead = left.name.split(".")[2].rsplit("-", 1)[1]
    keep = [
        f".ckpt.{host}-{os.getpid()}.abcdefgh.tmp",  # a live writer (this process)
        f".ckpt.elsewhere-{dead}.abcdefgh.tmp",  # another host's
        f".other.{host}-{dead}.abcdefgh.tmp",  # another target's
    ]
    for name in keep:
        (tmp_path / name).mkdir()
    with rio.atomic_dir(out) as tmp:
        (tmp / "model.safetensors").write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", *keep])
    assert (out / "model.safetensors").read_bytes() == b"whole"


def test_a_held_lock_names_its_holder(tmp_path):
    path = tmp_path / "home" / "cycle.lock"
    with rio.FileLock(path, wait=False, holder="pid 1 since noon"):
        with pytest.raises(rio.LockBusy) as busy:  # flock: a second open file is a second locker
            rio.FileLock(path, wait=False).__enter__()
        assert busy.value.holder == "pid 1 since noon"
    with rio.FileLock(path, wait=False):  # released on exit
        pass


# --- TOML and ranges -------------------------------------------------------------------------------


def test_toml_errors_name_the_file_line_and_column(cli, tmp_path):
    bad = tmp_path / "cycle.toml"
    bad.write_text('[cycle]\nsource = "logs"\nrun_dir = \n')
    r = cli(["cycle", "--config", bad, "--dry-run"])
    assert r.exit_code == 2
    assert f"config file {bad}:3:11: not valid TOML (Invalid value)" in r.error
    bad.write_text("[cycle]\nevents = [\n")  # the error is at the end of the document
    with pytest.raises(InputError, match=rf"{re.escape(str(bad))}:\d+:\d+: not valid TOML"):
        read_toml(bad)
    with pytest.raises(InputError, match="reward spec .*nope.toml does not exist"):
        read_toml(tmp_path / "nope.toml", "reward spec")


def test_range_checks_say_the_range(cli, tmp_path):
    class Cfg:
        n, rate, frac, lr, cap = 0, float("nan"), 1.0, float("inf"), None

    p: list[str] = []
    check_range(p, Cfg, ("n", "rate"), ge=1)
    check_range(p, Cfg, "frac", gt=0, lt=1, optional=True)
    check_range(p, Cfg, "lr", ge=0, finite=True)
    check_range(p, Cfg, "cap", ge=1, optional=True)  # None passes
    assert p == [
        "n=0: must be >= 1",
        "rate=nan: must be >= 1",
        "frac=1.0: must be in (0, 1) (or none)",
        "lr=inf: must be a finite number >= 0",
    ]
    r = cli(["deploy", fake_ckpt(tmp_path / "c", 5), "--force", "--canary", "1.5"])
    assert r.exit_code == 2 and "canary_fraction=1.5: must be in (0, 1) (or none)" in r.error
