"""The `rlcycle` command line: thin typer commands over the stage libraries.

Each command parses options and calls a stage's `run(...)`; stage modules never import typer.
Errors print as `Error: ...` / `Hint: ...` on stderr with the exit codes in rlcycle.errors;
set RLCYCLE_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import os
import sys

import typer

from rlcycle import __version__
from rlcycle.errors import EXIT_INTERRUPTED, RlcycleError

app = typer.Typer(
    name="rlcycle",
    help=(
        "Real-time RL for LLM coding agents: turn production use into a better checkpoint.\n\n"
        "Pipeline: collect | distill | train | eval | deploy, and `cycle` to chain them.\n\n"
        "Example:\n\n"
        "  rlcycle collect sample_data/events -o runs/demo/trajectories.arrow\n\n"
        "  rlcycle inspect runs/demo/trajectories.arrow"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlcycle {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """rlcycle."""


def _register() -> None:
    # Imported here so `rlcycle --help` stays fast and each command lives in its own module.
    from rlcycle.cli import (
        collect_cmd,
        cycle_cmd,
        deploy_cmd,
        distill_cmd,
        eval_cmd,
        inspect_cmd,
        model_cmd,
        report_cmd,
        simulate_cmd,
        tasks_cmd,
        train_cmd,
    )

    collect_cmd.register(app)
    inspect_cmd.register(app)
    distill_cmd.register(app)
    train_cmd.register(app)
    eval_cmd.register(app)
    deploy_cmd.register(app)
    cycle_cmd.register(app)
    report_cmd.register(app)
    simulate_cmd.register(app)
    model_cmd.register(app)
    app.add_typer(tasks_cmd.app, name="tasks")
    try:
        from rlcycle.cli import sandbox_cmd
    except ImportError as e:  # the sandbox command group ships with issue #3
        if "sandbox_cmd" not in str(e):
            raise
    else:
        app.add_typer(sandbox_cmd.app, name="sandbox")


_register()


def report_error(e: RlcycleError) -> None:
    from rlcycle.console import err

    err.print(f"[red]Error:[/red] {_esc(e.message)}")
    if e.hint:
        err.print(f"[dim]Hint:[/dim] {_esc(e.hint)}")


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def main() -> None:
    """Console-script entry point: run the app, map errors to exit codes."""
    debug = os.environ.get("RLCYCLE_DEBUG") == "1"
    try:
        # With standalone_mode=False click returns the code of typer.Exit/ctx.exit instead of
        # exiting; pass it on.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except RlcycleError as e:
        if debug:
            raise
        report_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(EXIT_INTERRUPTED)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # click usage errors and anything unexpected
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if debug:
            raise
        sys.stderr.write(f"Error: unexpected {type(e).__name__}: {e}\n")
        sys.stderr.write("Hint: rerun with RLCYCLE_DEBUG=1 for a traceback, and report it.\n")
        sys.exit(1)
