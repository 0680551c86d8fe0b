"""`rlcycle train` through the shipped CLI (the shared `cli` fixture), and the sample config."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from train_data import MEMINFO, make_base, make_rows, write_examples

from rlcycle.cli import train_cmd
from rlcycle.config import resolve
from rlcycle.train import checkpoint as C
from rlcycle.train import launch, memory
from rlcycle.train.config import TrainConfig

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "train.toml"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    base = make_base(root / "base")
    ex = write_examples(root / "ex.arrow", base, make_rows(4, seed=2), versions=[C.checkpoint_id(base)] * 4)
    return base, ex


def test_sample_config_is_valid_and_documents_every_key():
    cfg = resolve(TrainConfig, SAMPLE, section="train")
    assert cfg == TrainConfig()  # the sample spells out the defaults
    text = SAMPLE.read_text()
    for name in TrainConfig.__dataclass_fields__:
        assert name in text, f"{name} is not documented in {SAMPLE.name}"


def test_train_json_summary(cli, inputs, tmp_path):
    base, ex = inputs
    r = cli(
        [
            "train",
            ex,
            "--base",
            base,
            "-o",
            tmp_path / "ck",
            "--config",
            SAMPLE,
            "--set",
            "lr=1e-3",
            "--set",
            "objective=cispo",
            "--json",
        ]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["output"] == str(tmp_path / "ck") and doc["steps"] == 1
    # The summary on stderr (train/stage.py format_summary), after the JSON on stdout.
    assert "train: 1 steps (0 skipped) on 1 process(es) in " in r.stderr
    assert "  memory         peak " in r.stderr and " GB (CPU: process RSS" in r.stderr
    assert f"  checkpoint     {tmp_path / 'ck'} (id {doc['checkpoint_id'][:19]}, parent " in r.stderr
    meta = json.loads((tmp_path / "ck" / "rlcycle.json").read_text())
    assert meta["config"]["objective"] == "cispo" and meta["config"]["lr"] == 1e-3


def test_usage_errors_exit_2(cli, inputs, tmp_path):
    base, ex = inputs
    r = cli(["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "objectiv=ppo"])
    assert r.exit_code == 2 and "did you mean 'objective'" in r.error
    r = cli(["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "is_cap=1.1"])
    assert r.exit_code == 2 and "is_cap" in r.error
    r = cli(["train", ex, "--base", tmp_path / "nope", "-o", tmp_path / "ck"])
    assert r.exit_code == 2 and "is not a registry alias (known: none yet), checkpoint id, or directory" in r.error
    r = cli(["train", ex, "-o", tmp_path / "ck"])  # --base missing: click's usage message
    assert r.exit_code == 2 and "Usage: rlcycle train" in r.error and "--base" in r.error
    assert not (tmp_path / "ck").exists()


def test_help_has_examples(cli):
    r = cli(["train", "--help"])
    assert r.exit_code == 0 and "rlcycle train examples.arrow" in r.stdout and "--processes" in r.stdout
    assert "-m rlcycle train" in r.stdout


def test_relaunch_drops_only_the_launch_option():
    params = {
        "examples": ["a.arrow"],
        "base": "b",
        "out": "o",
        "config": None,
        "max_steps": 4,
        "seed": None,
        "metrics": None,
        "set_": ["lr=1"],
        "overwrite": True,
        "no_resume": False,
        "as_json": True,
        "quiet": False,
    }
    args = train_cmd._relaunch_args(params)
    assert args == [
        "train",
        "a.arrow",
        "--base",
        "b",
        "-o",
        "o",
        "--max-steps",
        "4",
        "--set",
        "lr=1",
        "--overwrite",
        "--json",
    ]
    cmd = launch.torchrun_command(2, args, port=29999)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node" in cmd
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2" and cmd[-len(args) - 2 :] == ["-m", "rlcycle", *args]


@pytest.mark.parametrize("avail_kb, warned", [(1_000_000, True), (12_000_000, False)])
def test_train_records_peak_memory_and_warns_once_on_a_full_host(cli, inputs, tmp_path, monkeypatch, avail_kb, warned):
    fake = tmp_path / "meminfo"
    fake.write_text(MEMINFO.format(avail=avail_kb))
    monkeypatch.setattr(memory, "MEMINFO", fake)
    monkeypatch.setattr(memory, "CGROUP", tmp_path / "no-cgroup")  # the host's figures, not a CI container's
    base, ex = inputs
    r = cli(["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "batch_size=1", "--set", "lr=1e-3"])
    assert r.exit_code == 0, r.output
    steps = pl.read_ipc(tmp_path / "ck" / "train_metrics.arrow")
    assert steps.height == 4
    peaks = steps["peak_memory_gb"].to_list()
    assert peaks[0] > 0.01 and peaks == sorted(peaks)  # a process peak only grows
    assert r.stderr.count("is still available") == (1 if warned else 0)
    if warned:
        assert "step 1: only 1.0 of the host's 25.2 GB is still available" in r.stderr
    assert f"  memory         peak {peaks[-1]:.4g} GB" in r.stderr
