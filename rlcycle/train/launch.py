"""Start N training processes on this machine: `rlcycle train ... --processes N`.

It re-runs the same command under `torch.distributed.run` (torchrun), which is what really
gives N processes on CPU as well as on GPUs: each process then builds an Accelerator that joins
the process group (MULTI_CPU on CPU, MULTI_GPU on GPUs), and the stage checks that Accelerate
sees as many processes as the launcher started.

For several nodes, FSDP or a custom Accelerate config, launch the module yourself, e.g.

    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint HOST:29500 -m rlcycle train ...
    accelerate launch --config_file fsdp.yaml -m rlcycle train ...

(`accelerate launch` with a MULTI_CPU config starts a single process unless run under mpirun;
`accelerate launch --multi_gpu --num_processes N` starts N, also on CPU.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def in_launched_process() -> bool:
    """True inside a process started by torchrun/accelerate (it must not launch again)."""
    return "LOCAL_RANK" in os.environ or "RANK" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, module_args: list[str], port: int | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m rlcycle.train.launch <module_args>` here."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()),
        "-m", "rlcycle.train.launch", *module_args,
    ]  # fmt: skip


def spawn(nproc: int, module_args: list[str]) -> int:
    """Run `rlcycle <module_args>` in `nproc` processes; return the launcher's exit code."""
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 per process when unset; keep a user's choice.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.call(torchrun_command(nproc, module_args), env=env)


def main() -> None:
    """Entry point of each launched process: `python -m rlcycle.train.launch train ...`.

    The same `train` command as `rlcycle train` (rlcycle/cli/train_cmd.py), with rlcycle's
    error reporting and exit codes, usable before or without the main CLI wiring.
    """
    import click
    import typer

    from rlcycle.cli import report_error, train_cmd
    from rlcycle.errors import EXIT_INTERRUPTED, RlcycleError

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

    @app.callback()
    def _root() -> None:
        """rlcycle train, one process of a multi-process launch."""

    train_cmd.register(app)
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except RlcycleError as e:
        if os.environ.get("RLCYCLE_DEBUG") == "1":
            raise
        report_error(e)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
