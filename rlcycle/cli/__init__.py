"""The `rlcycle` command line: thin typer commands over the stage libraries.

In: an argument list. Out: the command's output and an exit code. `run(argv)` is the one way
in: the console script (`main`), `python -m rlcycle` (so also the torchrun children of
`rlcycle train --processes N`) and the tests' `cli` fixture all call it. Each command is a
module-level function of its `<name>_cmd.py` module (`from rlcycle.cli.cycle_cmd import cycle`),
registered in `_register` below; it parses options (rlcycle/cli/options.py), calls a stage's
`STAGE.run(...)` and ends in `output.finish` (save config, print, exit code); stage modules
never import typer. Errors print as `Error: ...` / `Hint: ...` on stderr with the exit codes in
rlcycle.errors; set RLCYCLE_DEBUG=1 for tracebacks.

    rlcycle collect sample_data/events -o runs/demo/trajectories.arrow
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence

import typer

from rlcycle import __version__
from rlcycle.errors import EXIT_FAILURE, EXIT_INTERRUPTED, RlcycleError

# polars' allocator (jemalloc; polars reads `_RJEM_MALLOC_CONF` after its own defaults) gives freed
# pages back to the kernel after 0.5-1 s; a stage that frees and refills hundreds of MB a second
# then takes a page fault per 4 KiB and a TLB shootdown per purge, every time. The CLI keeps
# freed pages for 5 s instead (collect: ~6 % faster, peak RSS ~10 % higher; docs/performance.md).
# Nothing above imports polars (the commands import it when they run); a value the user set wins.
ALLOCATOR = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:5000,muzzy_decay_ms:5000")
if "polars" not in sys.modules:
    os.environ.setdefault(*ALLOCATOR)


def _keep_malloc_heap() -> None:
    """glibc's malloc (Python's large objects, numpy arrays): a fixed 32 MiB mmap threshold and
    a 512 MiB trim threshold, so buffers of a few MiB to 32 MiB freed and allocated again (collect's
    16 MiB blocks, numpy temporaries) reuse heap pages instead of fresh zeroed ones. Its defaults
    move the threshold with each free and trim the heap's top as soon as 2x that is free, so each
    block faulted its pages in again (collect: -20 % page faults, ~6 % less CPU; docs/performance.md).
    An explicit `GLIBC_TUNABLES` malloc setting wins; not glibc (musl, macOS): nothing to do."""
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (its maximum on 64-bit)
        libc.mallopt(-1, 512 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


_keep_malloc_heap()


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
    """The whole command tree, in `rlcycle --help` order. Every command is a module-level function
    of its `<name>_cmd.py` module (its docstring is its help); a group is a module-level
    `typer.Typer` whose sub-commands are declared beside it (`rlcycle registry ...` in deploy_cmd.py)."""
    from rlcycle.cli import (
        collect_cmd,
        cycle_cmd,
        deploy_cmd,
        distill_cmd,
        edits_cmd,
        eval_cmd,
        gateway_cmd,
        inspect_cmd,
        model_cmd,
        report_cmd,
        sandbox_cmd,
        simulate_cmd,
        tasks_cmd,
        train_cmd,
    )

    for name, function in (
        ("collect", collect_cmd.collect),
        ("inspect", inspect_cmd.inspect),
        ("distill", distill_cmd.distill),
        ("train", train_cmd.train),
        ("eval", eval_cmd.eval_),
        ("deploy", deploy_cmd.deploy),
        ("rollback", deploy_cmd.rollback),
        ("deploy-vllm", deploy_cmd.deploy_vllm),
        ("cycle", cycle_cmd.cycle),
        ("report", report_cmd.report),
        ("simulate", simulate_cmd.simulate),
        ("init-model", model_cmd.init_model),
        ("serve", model_cmd.serve),
        ("gateway", gateway_cmd.gateway),
        ("edits", edits_cmd.edits),
    ):
        app.command(name)(function)
    app.add_typer(deploy_cmd.registry_app, name="registry")
    app.add_typer(tasks_cmd.app, name="tasks")
    app.add_typer(sandbox_cmd.app, name="sandbox")


_register()


def _usage_error_types() -> tuple[type[Exception], ...]:
    """click's exception base. typer 0.2x vendors click as typer._click, whose ClickException
    derives from typer.TyperException; older typer raises click's own."""
    types: list[type[Exception]] = []
    if hasattr(typer, "TyperException"):
        types.append(typer.TyperException)
    try:
        import click

        types.append(click.ClickException)
    except ImportError:
        pass
    return tuple(types)


_USAGE_ERRORS = _usage_error_types()


def run(argv: Sequence[str] | None = None) -> int:
    """Run `rlcycle ARGV...` and return its exit code (argv None: sys.argv[1:]).

    Exit codes (rlcycle.errors): an RlcycleError's own code with `Error:`/`Hint:` on stderr;
    click usage errors (unknown command or option, missing argument, bad value) print click's
    usage message, exit 2; Ctrl-C or an abort 130; a closed stdout (`rlcycle inspect X | head`)
    exits 1 quietly; anything else `Error: unexpected ...`, exit 1. RLCYCLE_DEBUG=1 re-raises
    RlcycleErrors and unexpected errors for a traceback.
    """
    return run_app(app, argv, "rlcycle")


def run_app(program: typer.Typer, argv: Sequence[str] | None, prog_name: str) -> int:
    """Run another typer program with the CLI's conventions (`run`'s exit codes and error
    output): what a program built on rlcycle, like experiments/closed_loop/run.py, calls."""
    code = _dispatch(program, argv, prog_name)
    try:
        sys.stdout.flush()  # a closed pipe shows here, not as a warning at interpreter exit
    except BrokenPipeError:
        return _broken_pipe()
    return code


def main() -> None:
    """Console-script entry point (`rlcycle`)."""
    sys.exit(run())


def _dispatch(program: typer.Typer, argv: Sequence[str] | None, prog_name: str) -> int:
    debug = os.environ.get("RLCYCLE_DEBUG") == "1"
    # Explicit arguments run as `prog_name`; from sys.argv click names it as invoked
    # (`rlcycle`, or `python -m rlcycle`).
    where = {} if argv is None else {"args": [str(a) for a in argv], "prog_name": prog_name}
    try:
        # standalone_mode=False: click returns (not exits with) the code of typer.Exit, and
        # raises usage errors for us to print.
        code = program(standalone_mode=False, **where)
        return code if isinstance(code, int) else 0
    except RlcycleError as e:
        if debug:
            raise
        _report_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        return EXIT_INTERRUPTED
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return EXIT_INTERRUPTED
    except SystemExit as e:  # sys.exit(...) in a command, or click after a broken pipe
        return _system_exit_code(e.code)
    except _USAGE_ERRORS as e:
        return _usage_error(e)
    except OSError as e:
        if e.errno == errno.EPIPE:
            return _broken_pipe()
        if debug:
            raise
        return _unexpected(e)
    except Exception as e:
        if debug:
            raise
        return _unexpected(e)


def _report_error(e: RlcycleError) -> None:
    """`Error: <message>` and `Hint: <hint>` on stderr."""
    from rlcycle.console import err

    err.print(f"[red]Error:[/red] {_esc(e.message)}")
    if e.hint:
        err.print(f"[dim]Hint:[/dim] {_esc(e.hint)}")


def _usage_error(e: Exception) -> int:
    """click's own report (usage line, `Try ... -h`, the error), as standalone click prints it."""
    show = getattr(e, "show", None)
    if show is not None:
        show()
    else:
        sys.stderr.write(f"Error: {e}\n")
    return int(getattr(e, "exit_code", EXIT_FAILURE))


def _system_exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return EXIT_FAILURE


def _broken_pipe() -> int:
    """The reader of stdout went away: nothing more to say to it. Point stdout at /dev/null so
    the interpreter's last flush cannot fail again, and exit 1 without a word."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's captured stdout)
        pass
    return EXIT_FAILURE


def _unexpected(e: Exception) -> int:
    sys.stderr.write(f"Error: unexpected {type(e).__name__}: {e}\n")
    sys.stderr.write("Hint: rerun with RLCYCLE_DEBUG=1 for a traceback, and report it.\n")
    return EXIT_FAILURE


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
