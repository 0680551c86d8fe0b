"""Packaging: the wheel and sdist build, and the installed wheel runs from an empty directory.

The slow tests build both with `python -m build` (from a copy of the tree, so the checkout is
not touched), install the wheel with `pip --no-deps --no-index` into a fresh venv whose
site-packages sees the dev venv's dependencies through a plain `.pth` line (no network, no torch
reinstall; the dev venv's editable-install hook is *not* run, so the checkout stays invisible),
then, from an empty directory with no PYTHONPATH and a fresh RLCYCLE_HOME: `rlcycle init-model`
and `rlcycle cycle --until distill` with only the defaults; and (with a Docker engine) `rlcycle
sandbox build` from the packaged build context and the demo cycle to the end, sandboxes
included. The fast test checks that rlcycle/data/ is what scripts/gen_package_data.py makes of
sample_data/ and sandbox_images/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREE = ("pyproject.toml", "README.md", "rlcycle")  # what a build needs
# What a fresh shell outside the checkout would not have.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")


def run(
    cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run `cmd`; it must exit 0. `timeout` only stops a hung command: it is no speed check."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_package_data_agrees_with_sample_data():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_package_data.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """`python -m build` of a copy of the tree: the sdist, and the wheel built from it."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    src.mkdir()
    for name in TREE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path,
                src / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
            )
        else:
            shutil.copy2(path, src / name)
    # --no-isolation: build with the dev venv's setuptools instead of downloading one.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", src], cwd=tmp)
    return tmp / "dist"


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (dependencies seen through a .pth); its bin/."""
    root = tmp_path_factory.mktemp("venv")
    venv.create(root / "env", with_pip=False)
    py = root / "env" / "bin" / "python"
    purelib = Path(
        run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    )
    dev = sysconfig.get_paths()
    # A plain path per line: site appends it to sys.path without running the .pth files in it.
    (purelib / "_rlcycle_dev_deps.pth").write_text("\n".join(dict.fromkeys([dev["purelib"], dev["platlib"]])) + "\n")
    (wheel,) = dist.glob("rlcycle-*.whl")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            wheel,
        ],
        cwd=root,
    )
    return root / "env" / "bin"


@pytest.mark.slow
def test_sdist_and_wheel_hold_the_package_data(dist):
    import tarfile
    import zipfile

    (wheel,) = dist.glob("rlcycle-*.whl")
    (sdist,) = dist.glob("rlcycle-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        snames = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for want in (
        "rlcycle/resources.py",
        "rlcycle/data/tokenizer/tokenizer.json",
        "rlcycle/data/rewards.toml",
        "rlcycle/data/events/events.jsonl",
        "rlcycle/data/tasks/calc/calc-decimals/task.toml",
        "rlcycle/data/sandbox_images/Dockerfile",
        "rlcycle/data/sandbox_images/build_base_offline.sh",
        "rlcycle/sandbox/executor.py",
        "rlcycle/configs/demo.toml",
        "rlcycle/configs/cron.toml",
        "rlcycle/configs/vllm.toml",
    ):
        assert want in names and want in snames, want
    assert not [n for n in names if n.startswith(("tests/", "sample_data/", "scripts/")) or "__pycache__" in n]


def outside(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An empty directory and the environment of a fresh shell there, with its own RLCYCLE_HOME."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(
        RLCYCLE_HOME=str(tmp_path / "home"),
        NO_COLOR="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return empty, env


@pytest.mark.slow
def test_the_installed_wheel_runs_its_defaults_from_an_empty_directory(installed, tmp_path):
    empty, env = outside(tmp_path)
    where = run(
        [
            installed / "python",
            "-c",
            "import rlcycle, rlcycle.resources as r; print(rlcycle.__file__); print(r.tokenizer())",
        ],
        cwd=empty,
        env=env,
    ).stdout.split()
    env_root = installed.parent.resolve()
    for path in where:
        assert Path(path).resolve().is_relative_to(env_root), f"{path} is not inside the fresh venv {env_root}"
        assert not Path(path).resolve().is_relative_to(REPO)

    run([installed / "rlcycle", "init-model", "-o", "model"], cwd=empty, env=env)
    lineage = json.loads((empty / "model" / "rlcycle.json").read_text())
    assert Path(lineage["config"]["init_model"]["tokenizer"]).resolve().is_relative_to(env_root)

    out = run(
        [installed / "rlcycle", "cycle", "--config", "demo", "--source", "logs", "--until", "distill", "--json", "-q"],
        cwd=empty,
        env=env,
    ).stdout
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert stages["collect"]["status"] == stages["distill"]["status"] == "ran"
    for stage in ("collect", "distill"):
        assert (empty / "runs" / "cycle" / stage / "manifest.json").is_file()
    import polars as pl

    examples = pl.read_ipc(next((empty / "runs" / "cycle" / "distill").glob("examples.arrow")))
    assert examples.height > 0


@pytest.mark.slow
@pytest.mark.docker
def test_the_installed_wheel_builds_the_sandbox_and_runs_the_demo_cycle_to_the_end(installed, tmp_path, docker_client):
    from rlcycle.sandbox.images import image_tag

    empty, env = outside(tmp_path)
    built = json.loads(run([installed / "rlcycle", "sandbox", "build", "--json"], cwd=empty, env=env).stdout)
    # the packaged build context is the checkout's: the same content-hashed image
    assert [b["image"] for b in built["images"]] == [image_tag()]
    run_dir = empty / "runs" / "demo"
    # The packaged demo config (rlcycle/configs/demo.toml: the demo's sizes and the empty-registry
    # bootstrap). The whole demo (simulate, train, eval in sandboxes) takes minutes; a shared CPU
    # box, more.
    cmd = [installed / "rlcycle", "cycle", "--config", "demo", "--run-dir", run_dir, "--json", "-q"]
    proc = run(cmd, cwd=empty, env=env, timeout=3600)
    summary = json.loads(proc.stdout)
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert stages == dict.fromkeys(("simulate", "collect", "distill", "train", "eval", "deploy"), "ran"), stages
    assert summary["decision"] == "accept" and summary["deployed"]
    for stage in stages:
        assert (run_dir / stage / "manifest.json").is_file()
    assert not [p for p in run_dir.rglob(".*") if p.name.endswith(".tmp")]
