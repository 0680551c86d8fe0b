"""The cycle's config and contract without running a stage: production defaults, the packaged
demo and cron configs, `--dry-run` writing nothing, an empty registry refused, the stage
objects and the one RunLayout (no Docker, no model: every command here stops before a stage)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from rlcycle import resources
from rlcycle.cycle import STAGE_OBJECTS, STAGES, CycleConfig, load_config
from rlcycle.stage import RunLayout, Stage

REPO = Path(__file__).resolve().parent.parent
DEMO = {  # the sizes the demo used to get from CycleConfig's table defaults
    "simulate": {"episodes": 16, "runner.max_new_tokens": 64},
    "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-5, "max_policy_lag": -1, "save_every": 1},
    "eval": {
        "attempts": 1,
        "max_tasks": 12,
        "runner.max_new_tokens": 48,
        "runner.max_turns": 4,
        "sandboxes": 2,
        "gates.min_paired_tasks": 5,
        "gates.latency_noise_ms": 10000.0,
    },
}


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime: what "wrote nothing" compares."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def test_the_stage_tables_default_to_the_stages_own_production_defaults():
    from rlcycle.collect import CollectConfig
    from rlcycle.deploy import DeployConfig
    from rlcycle.distill import DistillConfig
    from rlcycle.evaluation.stage import EvalConfig
    from rlcycle.simulate import SimulateConfig
    from rlcycle.train import TrainConfig

    c = CycleConfig()
    for name, cls in (
        ("simulate", SimulateConfig),
        ("collect", CollectConfig),
        ("distill", DistillConfig),
        ("train", TrainConfig),
        ("eval", EvalConfig),
        ("deploy", DeployConfig),
    ):
        assert getattr(c, name) == cls(), name
    assert c.bootstrap is False and c.registry_home is None
    # production-sane: no step cap, a staleness cap, GPU-serving latency tolerance
    assert c.train.max_steps is None and c.train.max_policy_lag == 1 and c.train.save_every >= 10
    assert (
        c.eval.gates.latency_noise_ms == 20.0
        and c.eval.max_tasks is None
        and c.simulate.episodes is None
        and c.eval.runner.max_new_tokens == 256
    )


def test_the_packaged_demo_holds_the_demo_sizes_and_the_bootstrap():
    c = load_config("demo", None, {})
    assert c.bootstrap is True and c.source == "simulate"
    for table, keys in DEMO.items():
        for key, value in keys.items():
            obj = getattr(c, table)
            for part in key.split("."):
                obj = getattr(obj, part)
            assert obj == value, f"{table}.{key}"
    assert "demo" in resources.packaged_configs() and "cron" in resources.packaged_configs()


def test_the_reward_specs_distill_table_sits_under_the_cycles(tmp_path):
    spec = tmp_path / "rewards.toml"
    spec.write_text(
        (REPO / "sample_data" / "rewards.toml").read_text().replace("\n[distill]\n", "\n[distill]\nflat_tol = 0.5\n", 1)
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cycle]\nreward_spec = "{spec}"\n')
    assert load_config(cfg, None, {}).distill.flat_tol == 0.5
    assert load_config(cfg, ["distill.flat_tol=0.25"], {}).distill.flat_tol == 0.25
    for data in ({"distill": {"permute_rewards": True}}, {"distill.permute_rewards": True}):
        c = load_config(cfg, None, None, data=data)  # an experiment's table in code, over the spec's
        assert c.distill.permute_rewards is True and c.distill.flat_tol == 0.5


def _cron_block() -> str:
    text = (REPO / "docs" / "cycle.md").read_text()
    m = re.search(r"## Config \(`cycle.toml`\).*?```toml\n(.*?)```", text, re.S)
    assert m, "docs/cycle.md lost its cycle.toml example"
    return m.group(1)


def test_the_cron_example_of_the_docs_is_the_packaged_one_and_resolves_as_documented(cli, tmp_path):
    cron = resources.cycle_config("cron")
    assert _cron_block() == cron.read_text()
    r = cli(["cycle", "--config", "cron", "--plan"])
    assert r.exit_code == 0, r.error
    plan = json.loads(r.stdout)
    assert (plan["source"], plan["base"], plan["tasks"], plan["reward_spec"]) == (
        "logs",
        "production",
        "suites/our-repos",
        "rewards.toml",
    )
    assert plan["events"] == ["/data/agent-logs/2026-12-02T*.jsonl.gz"] and plan["bootstrap"] is False
    assert plan["collect"]["maturity_s"] == 21600
    train, ev = plan["train"], plan["eval"]
    assert (train["batch_size"], train["lr"], train["max_policy_lag"]) == (512, 1e-6, 1)
    assert (ev["attempts"], ev["sandboxes"]) == (4, 16)
    assert plan["deploy"]["hook"] == "http://127.0.0.1:8000/v1/load_lora_adapter"
    # what it does not set is the stage's production default, not the demo's
    assert train["max_steps"] is None and train["save_every"] == 50
    assert ev["gates"]["latency_noise_ms"] == 20.0 and ev["max_tasks"] is None and ev["runner"]["max_new_tokens"] == 256
    # the same file through its path, and a --plan reads nothing else (the paths need not exist)
    assert json.loads(cli(["cycle", "--config", cron, "--plan"]).stdout) == plan


def test_an_unknown_config_name_lists_the_packaged_ones(cli):
    r = cli(["cycle", "--config", "prod", "--dry-run"])
    assert r.exit_code == 2 and "--config prod: no such file" in r.error
    assert "Hint: packaged configs: cron, demo, vllm" in r.error


def test_an_empty_registry_is_an_error_without_bootstrap_and_nothing_is_written(cli, tmp_path, monkeypatch):
    home = tmp_path / "home"  # not there yet: nothing may create it
    monkeypatch.setenv("RLCYCLE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    for extra in ([], ["--dry-run"], ["--source", "logs"]):
        r = cli(["cycle", *extra])
        assert r.exit_code == 2, r.output
        assert f"Error: registry {home / 'registry'} has no production model" in r.error
        assert "Hint: register one" in r.error and "registry_home" in r.error and "--config demo" in r.error
    assert tree(tmp_path) == before


def test_a_dry_run_writes_nothing_anywhere(cli, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("RLCYCLE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    r = cli(["cycle", "--config", "demo", "--dry-run", "--json"])
    assert r.exit_code == 0, r.error
    s = json.loads(r.stdout)
    assert [x["status"] for x in s["stages"]] == ["planned"] * 6
    assert "would create the tiny default model" in r.error
    assert tree(tmp_path) == before  # no home, no registry, no model, no lock, no run.json
    # with a registry and a lock file there (a cycle ran before), still nothing changes
    from rlcycle.cli.options import open_registry
    from rlcycle.cycle import CycleLock

    open_registry()
    with CycleLock(home):
        pass
    before = tree(tmp_path)
    r = cli(["cycle", "--config", "demo", "--dry-run", "--run-dir", tmp_path / "run2"])
    assert r.exit_code == 0, r.error
    assert tree(tmp_path) == before


def test_the_registry_home_of_the_config_wins_over_the_environment(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RLCYCLE_HOME", str(tmp_path / "env-home"))
    r = cli(["cycle", "--set", f"registry_home={tmp_path / 'mine'}", "--dry-run"])
    assert r.exit_code == 2 and str(tmp_path / "mine" / "registry") in r.error


def test_every_stage_declares_the_contract_and_writes_only_inside_the_layout(tmp_path):
    assert tuple(s.name for s in STAGE_OBJECTS) == STAGES == RunLayout.STAGES
    layout = RunLayout(tmp_path / "run")
    files = {layout.file(n) for n in RunLayout.FILES}
    for s in STAGE_OBJECTS:
        assert isinstance(s.cacheable, bool) and isinstance(s.gate, bool) and isinstance(s.publishes, bool)
        assert dataclasses.is_dataclass(s.config_class)
        assert getattr(CycleConfig(), s.name).__class__ is s.config_class  # its [cycle.<name>] table
        for path in s.outputs(layout).values():
            assert path in files and path.is_relative_to(layout.stage_dir(s.name)), (s.name, path)
        assert all(callable(getattr(s, m)) for m in ("inputs", "outputs", "run"))
        _: Stage = s  # the Protocol (checked by type checkers)
    assert [s.name for s in STAGE_OBJECTS if not s.cacheable] == ["deploy"]
    assert [s.name for s in STAGE_OBJECTS if s.gate] == ["eval"]
    assert [s.name for s in STAGE_OBJECTS if s.publishes] == ["deploy"]


def test_the_report_reads_the_paths_the_cycle_writes(tmp_path):
    from rlcycle.report.load import RunDir

    layout = RunLayout(tmp_path)
    layout.write_run({"base": "production", "base_path": "/x", "base_id": "sha256:b"})
    layout.file("verdict").parent.mkdir(parents=True)
    layout.file("verdict").write_text('{"decision": "accept"}')
    layout.write_manifest("eval", {"stage": "eval", "result": {"decision": "accept"}})
    run = RunDir(tmp_path)
    assert run.json("verdict") == {"decision": "accept"} and run.stage_state("eval") == "finished"
    assert run.run_info()["base_id"] == "sha256:b" and run.stage_state("train") == "not run"
