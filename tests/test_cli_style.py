"""One CLI style (rlcycle/cli/__init__.py): every command is a module-level function of its
`*_cmd.py` module, importable by name, and every stage command ends in the one shared tail,
`rlcycle.cli.output.finish` (save the config beside OUT, print JSON or text, summary, exit)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import typer

from rlcycle.cli import app, output
from rlcycle.errors import EXIT_GATE_REFUSED, RlcycleError

CLI = Path(__file__).parent.parent / "rlcycle" / "cli"
# The commands that resolve a config, run a stage and report it: all end in output.finish.
TAILED = ("collect", "distill", "simulate", "train", "eval", "deploy", "rollback", "cycle", "init-model")


def _callbacks(program: typer.Typer, path: tuple[str, ...] = ()) -> dict[str, object]:
    """`rlcycle a b` -> the function it runs, groups walked recursively."""
    found = {" ".join((*path, c.name)): c.callback for c in program.registered_commands}
    for group in program.registered_groups:
        found |= _callbacks(group.typer_instance, (*path, group.name))
    return found


CALLBACKS = _callbacks(app)


def test_every_command_is_a_module_level_function_of_its_module():
    assert {"cycle", "registry ls", "tasks check", "sandbox exec"} <= set(CALLBACKS)
    for name, cb in CALLBACKS.items():
        assert cb.__qualname__ == cb.__name__, f"rlcycle {name}: {cb.__qualname__} is not module-level"
        assert cb.__module__.startswith("rlcycle.cli.") and cb.__module__.endswith("_cmd"), name
        assert getattr(importlib.import_module(cb.__module__), cb.__name__) is cb, name
        if " " not in name:  # a top-level command's docstring is its help (a group's sub-commands pass help=)
            assert (cb.__doc__ or "").strip(), f"rlcycle {name}: no docstring (its help)"


def test_a_command_is_importable_by_name():
    from rlcycle.cli.cycle_cmd import cycle

    assert CALLBACKS["cycle"] is cycle


@pytest.mark.parametrize("command", TAILED)
def test_stage_commands_end_in_the_shared_tail(command):
    cb = CALLBACKS[command]
    tree = ast.parse((CLI / f"{cb.__module__.rsplit('.', 1)[1]}.py").read_text())
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == cb.__name__]
    calls = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    assert "output.finish" in calls, f"rlcycle {command} does not end in output.finish"
    assert "save_resolved" not in calls, f"rlcycle {command} saves its config around the tail"


# --- output.finish --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Config:
    lr: float = 0.5


@dataclasses.dataclass
class _Result:
    rows: int = 3

    def as_dict(self):
        return {"rows": self.rows}


def test_finish_saves_the_config_prints_json_then_the_summary(tmp_path, capsys):
    out = tmp_path / "x.arrow"
    output.finish(_Result(), as_json=True, out=str(out), config=_Config(), summary="3 rows")
    assert json.loads((tmp_path / "x.arrow.config.json").read_text()) == {"lr": 0.5}
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"rows": 3}
    assert captured.err == "3 rows\n"


def test_finish_on_stdout_data_saves_nothing_and_sends_json_to_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output.finish(_Result(), as_json=True, out="-", config=_Config(), summary="3 rows", quiet=True)
    captured = capsys.readouterr()
    assert captured.out == "" and json.loads(captured.err) == {"rows": 3}
    assert list(tmp_path.iterdir()) == []


def test_finish_prints_text_without_json_and_raises_the_error_last(capsys):
    refused = RlcycleError("refused", exit_code=EXIT_GATE_REFUSED)
    with pytest.raises(RlcycleError) as e:
        output.finish(_Result(), as_json=False, text="deployed", data={"unused": 1}, error=refused)
    assert e.value is refused
    assert capsys.readouterr().out == "deployed\n"
    output.finish(_Result(), as_json=True, text="deployed", data={"verdict": "ship"})
    assert json.loads(capsys.readouterr().out) == {"verdict": "ship"}
