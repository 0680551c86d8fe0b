"""The stage contract (rlcycle/stage.py): `rlcycle <stage>` and `rlcycle cycle` run the same
Stage object, and what the cycle keeps of each run.

The CLI tests replace the stage object's `run` with a spy that records its arguments and stops
there (an `RlcycleError`), so a command that went around its Stage object fails them without
training, evaluating or simulating anything; the AST test catches a bypass in any command.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from rlcycle import cycle
from rlcycle.cli import app
from rlcycle.collect.stage import STAGE as COLLECT
from rlcycle.collect.stage import CollectArgs
from rlcycle.deploy.stage import STAGE as DEPLOY
from rlcycle.deploy.stage import DeployArgs
from rlcycle.distill.stage import STAGE as DISTILL
from rlcycle.distill.stage import DistillArgs
from rlcycle.errors import RlcycleError
from rlcycle.evaluation.stage import STAGE as EVAL
from rlcycle.evaluation.stage import EvalArgs
from rlcycle.simulate.stage import STAGE as SIMULATE
from rlcycle.simulate.stage import SimulateArgs
from rlcycle.stage import RunLayout, Stage, StageContext
from rlcycle.train import STAGE as TRAIN
from rlcycle.train import TrainArgs

CLI = Path(__file__).parent.parent / "rlcycle" / "cli"
SAMPLE = Path(__file__).parent.parent / "sample_data"
# command name -> (the module of its command, its stage object)
COMMANDS = {
    "simulate": ("simulate_cmd.py", SIMULATE),
    "collect": ("collect_cmd.py", COLLECT),
    "distill": ("distill_cmd.py", DISTILL),
    "train": ("train_cmd.py", TRAIN),
    "eval": ("eval_cmd.py", EVAL),
    "deploy": ("deploy_cmd.py", DEPLOY),
}


def test_the_cycle_runs_the_stage_objects_of_the_commands():
    assert [s.name for s in cycle.STAGE_OBJECTS] == list(RunLayout.STAGES)
    by_name = {s.name: s for s in cycle.STAGE_OBJECTS}
    for name, (_, stage) in COMMANDS.items():
        assert by_name[name] is stage
    members = [m for m in vars(Stage) if not m.startswith("_")] + list(Stage.__annotations__)
    for stage in cycle.STAGE_OBJECTS:
        missing = [m for m in members if not hasattr(stage, m)]
        assert not missing, f"{stage.name}: not a Stage (missing {missing})"


# --- no command goes around its stage object ------------------------------------------------------


def _command_function(tree: ast.Module, name: str) -> ast.FunctionDef:
    """The module-level function that `rlcycle <name>` runs (registered in rlcycle/cli/__init__.py)."""
    function = {c.name: c.callback for c in app.registered_commands}[name].__name__
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return node
    raise AssertionError(f"no module-level def {function}() found for rlcycle {name}")


def _run_calls(fn: ast.FunctionDef) -> list[str]:
    """What every `X.run(...)` call in `fn` calls `run` on, as source text."""
    return [
        ast.unparse(n.func.value)
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "run"
    ]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_stage_command_runs_its_stage_object_and_nothing_else(command):
    """`stage.run(...)` (the module-level function) in a command is a second way to run the
    stage that the cycle does not take: only `STAGE.run(...)` is allowed."""
    module, _ = COMMANDS[command]
    fn = _command_function(ast.parse((CLI / module).read_text()), command)
    targets = _run_calls(fn)
    assert targets, f"rlcycle {command} never calls STAGE.run"
    bypass = [t for t in targets if t.split(".")[-1] != "STAGE"]
    assert not bypass, f"rlcycle {command} runs the stage around its Stage object: {bypass}"


def test_the_ast_check_sees_a_bypass():
    src = "def collect(out):\n    from rlcycle.collect import stage\n    stage.run(cfg, ['x'], out)\n"
    assert _run_calls(_command_function(ast.parse(src), "collect")) == ["stage"]


# --- each command builds its Args and hands them to the stage object --------------------------------


class Called(RlcycleError):
    pass


@pytest.fixture
def spy(monkeypatch):
    """spy(stage) -> a list that receives (config, args) when the command runs the stage."""

    def install(stage):
        calls = []

        def run(config, args):
            calls.append((config, args))
            raise Called("stage object called")

        monkeypatch.setattr(stage, "run", run)
        return calls

    return install


def _called(result, calls):
    assert result.exit_code == 1 and "stage object called" in result.error, result.error
    [(config, args)] = calls
    return config, args


def test_collect_command(cli, spy, tmp_path):
    calls = spy(COLLECT)
    r = cli(["collect", SAMPLE / "events", "-o", tmp_path / "t.arrow", "--quarantine", tmp_path / "q", "-q"])
    config, args = _called(r, calls)
    assert args == CollectArgs([str(SAMPLE / "events")], str(tmp_path / "t.arrow"), str(tmp_path / "q"), True)


def test_distill_command(cli, spy, tmp_path):
    calls = spy(DISTILL)
    r = cli(["distill", "t.arrow", "-o", tmp_path / "e.arrow", "--spec", SAMPLE / "rewards.toml"])
    config, args = _called(r, calls)
    assert isinstance(args, DistillArgs) and (args.trajectories, args.out) == ("t.arrow", str(tmp_path / "e.arrow"))
    assert args.spec is not None and args.quiet is False  # reward-hacking warnings print even with -q


def test_train_command(cli, spy, tmp_path, rlcycle_home):
    calls = spy(TRAIN)
    r = cli(["train", "a.arrow", "b.arrow", "--base", "ckpt", "-o", tmp_path / "out", "--set", "max_steps=2"])
    config, args = _called(r, calls)
    assert args == TrainArgs(["a.arrow", "b.arrow"], "ckpt", str(tmp_path / "out"), registry=rlcycle_home / "registry")
    assert config.max_steps == 2


def test_eval_command(cli, spy, tmp_path, rlcycle_home):
    calls = spy(EVAL)
    r = cli(["eval", "--candidate", "scripted:reference", "--baseline", "scripted:nothing", "-o", tmp_path / "e.arrow"])
    config, args = _called(r, calls)
    assert args == EvalArgs(
        "scripted:reference",
        "scripted:nothing",
        Path("sample_data/tasks"),
        tmp_path / "e.arrow",
        rlcycle_home / "registry",
    )


def test_simulate_command(cli, spy, tmp_path, rlcycle_home):
    calls = spy(SIMULATE)
    r = cli(["simulate", "-p", "scripted:reference", "-t", "suite", "-o", "-", "--executor", "ray"])
    config, args = _called(r, calls)
    assert args == SimulateArgs("scripted:reference", Path("suite"), "-", rlcycle_home / "registry")
    assert config.rollout.executor == "ray"


def test_deploy_command(cli, spy, tmp_path, rlcycle_home):
    calls = spy(DEPLOY)
    r = cli(["deploy", tmp_path / "ckpt", "--verdict", tmp_path / "verdict.json"])
    config, args = _called(r, calls)
    assert isinstance(args, DeployArgs) and (args.checkpoint, args.verdict) == (
        tmp_path / "ckpt",
        tmp_path / "verdict.json",
    )
    assert args.registry.root == rlcycle_home / "registry" and args.skip_promoted is False


def test_in_a_cycle_the_args_are_the_layouts_paths(tmp_path):
    layout = RunLayout(tmp_path / "run")
    ctx = StageContext(layout, tmp_path / "base", "base-id", tmp_path / "home" / "registry", "tasks", "spec", ("ev",))
    assert COLLECT.args(ctx) == CollectArgs(["ev"], str(layout.file("trajectories")))
    assert TRAIN.args(ctx) == TrainArgs(
        [str(layout.file("examples"))], tmp_path / "base", layout.file("checkpoint"), overwrite=True
    )
    assert EVAL.args(ctx) == EvalArgs(
        str(layout.file("checkpoint")), str(tmp_path / "base"), "tasks", layout.file("eval_results"), ctx.registry
    )
    assert SIMULATE.args(ctx) == SimulateArgs(str(tmp_path / "base"), "tasks", layout.file("events"), ctx.registry)
    deploy = DEPLOY.args(ctx)
    assert (deploy.checkpoint, deploy.verdict, deploy.skip_promoted) == (
        layout.file("checkpoint"),
        layout.file("verdict"),
        True,
    )


# --- what the cycle keeps ---------------------------------------------------------------------------


def test_the_cycle_keeps_collects_skipped_files(cli, tmp_path):
    """A logs directory holding one of rlcycle's own sidecars: collect passes over it, and the
    cycle's collect result says so (`skipped_files`), as `rlcycle collect --json` does."""
    logs = tmp_path / "logs"
    shutil.copytree(SAMPLE / "events", logs)
    (logs / "old.arrow.config.json").write_text("{}")
    base = tmp_path / "base"  # a checkpoint directory as the base: --until collect never loads it
    base.mkdir()
    (base / "config.json").write_text("{}")
    cfg = tmp_path / "cycle.toml"
    cfg.write_text(f'[cycle]\nsource = "logs"\nevents = ["{logs}"]\nbase = "{base}"\n')
    r = cli(["cycle", "--config", cfg, "--run-dir", tmp_path / "run", "--until", "collect", "--json", "-q"])
    assert r.exit_code == 0, r.error
    [collect] = [s for s in json.loads(r.stdout)["stages"] if s["name"] == "collect"]
    assert collect["status"] == "ran" and collect["result"]["skipped_files"] == 1
    direct = cli(["collect", logs, "-o", tmp_path / "t.arrow", "--json", "-q"])
    assert json.loads(direct.stdout)["samples_out"] == collect["result"]["samples_out"]


def test_a_cycle_without_a_verdict_says_why(cli, tmp_path, monkeypatch):
    """The eval stage gave no verdict: the error is the verdict's own reason and hint, not
    just a path. The loop is stubbed (it stops at eval in a cycle only with real sandboxes,
    tests/test_cycle.py); what is tested is what the command says."""
    run = tmp_path / "run"
    verdict = RunLayout(run).file("verdict")
    verdict.parent.mkdir(parents=True)
    verdict.write_text(
        json.dumps(
            {
                "decision": "no_verdict",
                "reason": "2 paired task(s) < min_paired_tasks=5: the suite has 2 task(s)",
                "hint": "lower eval.gates.min_paired_tasks (--set min_paired_tasks=N) or use a bigger suite",
            }
        )
    )
    stopped = cycle.CycleResult(str(run), [], decision="no_verdict", exit_code=1)
    monkeypatch.setattr(cycle.Cycle, "run", lambda self: stopped)
    r = cli(["cycle", "--run-dir", run, "-q"])
    assert r.exit_code == 1
    assert "Error: the cycle stopped: eval gave no verdict: 2 paired task(s) < min_paired_tasks=5" in r.error
    assert "lower eval.gates.min_paired_tasks" in r.error and str(verdict) in r.error
    verdict.unlink()  # a verdict that is not there: still an error that names where to look
    r = cli(["cycle", "--run-dir", run, "-q"])
    assert r.exit_code == 1 and "eval gave no verdict" in r.error and "sandbox" in r.error


# --- shared options --------------------------------------------------------------------------------


def test_executor_options_are_declared_once(cli):
    """simulate and eval take the rollout's --executor/--ray-address from rlcycle/cli/options.py."""
    for module in ("simulate_cmd.py", "eval_cmd.py"):
        src = (CLI / module).read_text()
        assert '"--executor"' not in src and '"--ray-address"' not in src, module
    helps = [cli([command, "--help"]).stdout for command in ("simulate", "eval")]
    for h in helps:
        assert "--executor" in h and "--ray-address" in h
