"""`rlcycle train` through the real typer command (registered on a test app), and the shipped
sample config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from train_data import make_base, make_rows, write_examples
from typer.testing import CliRunner

from rlcycle.cli import train_cmd
from rlcycle.config import resolve
from rlcycle.errors import RlcycleError
from rlcycle.train import checkpoint as C
from rlcycle.train import launch
from rlcycle.train.config import TrainConfig

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "train.toml"


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    train_cmd.register(app)
    return app


def invoke(app, args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    if isinstance(result.exception, RlcycleError):  # as rlcycle.cli.main maps it
        result.exit_code = result.exception.exit_code
    return result


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


def test_train_json_summary(app, inputs, tmp_path):
    base, ex = inputs
    r = invoke(app, ["train", ex, "--base", base, "-o", tmp_path / "ck", "--config", SAMPLE,
                     "--set", "lr=1e-3", "--objective", "cispo", "--json", "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["output"] == str(tmp_path / "ck") and doc["steps"] == 1
    meta = json.loads((tmp_path / "ck" / "rlcycle.json").read_text())
    assert meta["config"]["objective"] == "cispo" and meta["config"]["lr"] == 1e-3


def test_usage_errors_exit_2(app, inputs, tmp_path):
    base, ex = inputs
    r = invoke(app, ["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "objectiv=ppo"])
    assert r.exit_code == 2 and "did you mean 'objective'" in r.exception.message
    r = invoke(app, ["train", ex, "--base", base, "-o", tmp_path / "ck", "--set", "is_cap=1.1"])
    assert r.exit_code == 2 and "is_cap" in r.exception.message
    r = invoke(app, ["train", ex, "--base", tmp_path / "nope", "-o", tmp_path / "ck"])
    assert r.exit_code == 2 and "not a checkpoint directory" in r.exception.message


def test_help_has_examples(app):
    r = CliRunner().invoke(app, ["train", "--help"])
    assert r.exit_code == 0 and "rlcycle train examples.arrow" in r.output and "--processes" in r.output


def test_relaunch_drops_only_the_launch_option():
    params = {"examples": ["a.arrow"], "base": "b", "out": "o", "config": None, "objective": "cispo",
              "lr": None, "epochs": None, "batch_size": 4, "max_steps": None, "seed": None, "metrics": None,
              "set_": ["lr=1"], "overwrite": True, "no_resume": False, "as_json": True, "quiet": False}  # fmt: skip
    args = train_cmd._relaunch_args(params)
    assert args == ["train", "a.arrow", "--base", "b", "-o", "o", "--objective", "cispo", "--batch-size", "4",
                    "--set", "lr=1", "--overwrite", "--json"]  # fmt: skip
    cmd = launch.torchrun_command(2, args, port=29999)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node" in cmd
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2" and cmd[-len(args):] == args
