"""`rlcycle <command> --help-config` lists every key of the command's config; docs/config.md is
that list (generated; stale = a failure); every shipped TOML config resolves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlcycle.cli import config_help
from rlcycle.config import describe, load_toml, resolve

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "config.md"


@pytest.mark.parametrize("command", list(config_help.COMMANDS))
def test_help_config_prints_every_key_and_exits_0(cli, command):
    r = cli([command, "--help-config"])  # no required option given: it answers before they are checked
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    cls = config_help.config_class(command)
    assert lines[0].startswith(f"rlcycle {command}: {cls.__name__} keys")
    keys = [line.split("  (", 1)[0] for line in lines if line and not line.startswith((" ", "rlcycle "))]
    assert keys == [row.key for row in describe(cls)]
    for f in dataclasses.fields(cls):  # help text comes along, under its key
        if f.metadata.get("help"):
            i = keys.index(f.name)
            assert f.metadata["help"].split()[0] in r.stdout.split(f"\n{keys[i]}  (", 1)[1]


def test_nested_keys_are_dotted_with_type_default_and_help(cli):
    out = cli(["simulate", "--help-config"]).stdout
    assert "\nrunner.max_new_tokens  (int) = 256\n    Tokens one model call may sample at most.\n" in out
    assert "\nrollout.ray_address  (str | none) = none\n" in out
    out = cli(["train", "--help-config"]).stdout
    assert '\nlora.target_modules  (list[str]) = ["all-linear"]\n' in out
    out = cli(["eval", "--help-config"]).stdout
    assert "\nrunner.top_p  (float) = 1.0\n" in out and "\ngates.latency_noise_ms  (float) = " in out


def test_docs_config_md_is_generated_from_the_help():
    assert DOC.exists() and DOC.read_text(encoding="utf-8") == config_help.render_markdown(), (
        "docs/config.md is stale: regenerate it with `python scripts/gen_config_docs.py` and commit it"
    )
    text = DOC.read_text(encoding="utf-8")
    for command in config_help.COMMANDS:
        assert f"## `rlcycle {command}`" in text
        for row in describe(config_help.config_class(command)):
            assert f"| `{row.key}` |" in text


def test_the_generator_checks_staleness(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "DOC", tmp_path / "config.md")
    assert gen.main(["--check"]) == 1  # missing
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    (tmp_path / "config.md").write_text("old\n")
    assert gen.main(["--check"]) == 1


# --- every shipped config resolves ----------------------------------------------------------------

SHIPPED = sorted(
    p for pattern in ("sample_data/*.toml", "rlcycle/data/*.toml", "rlcycle/configs/*.toml") for p in ROOT.glob(pattern)
)
SECTIONS = {table: command for command, (_, table) in config_help.COMMANDS.items()}


def test_the_shipped_configs_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in SHIPPED}
    assert {"sample_data/train.toml", "sample_data/rewards.toml", "rlcycle/data/rewards.toml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shipped_toml_config_resolves(path):
    data = load_toml(path)
    checked = []
    if "signals" in data:  # a reward spec: its signals and its [distill] table
        from rlcycle.distill.spec import load_spec
        from rlcycle.distill.stage import DistillConfig

        load_spec(path)
        resolve(DistillConfig, path, section="distill")
        checked.append("spec")
    for table in data:
        if table in SECTIONS and table != "distill":
            obj = resolve(config_help.config_class(SECTIONS[table]), path, section=table)
            checked.append(table)
            _resolve_stage_tables(obj)
    assert checked, f"{path}: no table of a known config ({', '.join(SECTIONS)}) and no reward spec"


def _resolve_stage_tables(obj) -> None:
    """A cycle config's stage tables, each into its stage's config (over the cycle's defaults)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in config_help.COMMANDS and isinstance(value, dict):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else {}
            resolve(config_help.config_class(f.name), data={**default, **value})


def test_sample_train_config_spells_out_every_key_and_its_default():
    sample = ROOT / "sample_data" / "train.toml"
    from rlcycle.train.config import TrainConfig

    assert resolve(TrainConfig, sample, section="train") == TrainConfig()
    text = sample.read_text()
    for row in describe(TrainConfig):
        if row.type.startswith("table ("):  # a nested config: its own [train.KEY] table
            assert f"\n[train.{row.key}]" in text, f"[train.{row.key}] is not in {sample.name}"
            continue
        name = row.key.rpartition(".")[2]
        assert f"\n{name} = " in text or f"\n# {name} = " in text, f"{row.key} is not in {sample.name}"
