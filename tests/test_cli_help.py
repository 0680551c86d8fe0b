"""Every registered command and sub-command (groups walked recursively) answers `--help`
through the shipped CLI with exit 0, help text, and an example of its use."""

from __future__ import annotations

import pytest
import typer.main

from rlcycle.cli import app


def _walk(cmd, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The command path of `cmd` and of every command under it (groups inside groups too)."""
    paths = [path]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        paths += _walk(sub, (*path, name))
    return paths


COMMANDS = _walk(typer.main.get_command(app))


def test_the_walk_sees_nested_commands():
    """The walk must reach sub-commands (a flat walk would pass with half the CLI unchecked)."""
    assert {("collect",), ("registry", "ls"), ("tasks", "check"), ("sandbox", "exec")} <= set(COMMANDS)
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rlcycle")
def test_help_exits_0_and_shows_an_example(cli, path):
    r = cli([*path, "--help"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"Usage: {' '.join(('rlcycle', *path))} "), r.stdout
    text = r.stdout.split("\n\n", 2)[1] if "\n\n" in r.stdout else ""
    assert len(text.strip()) > 20, f"`rlcycle {' '.join(path)}` has no help text"
    lines = [line.strip() for line in r.stdout.splitlines()]
    assert "Example" in r.stdout or any(line.startswith("rlcycle ") for line in lines), (
        f"`rlcycle {' '.join(path)} --help` shows no example:\n{r.stdout}"
    )
