"""Start N training processes on this machine: `rlcycle train ... --processes N`.

In: the process count and the `train ...` arguments. Out: the launcher's exit code. It re-runs
the same command as `python -m rlcycle train ...` under `torch.distributed.run` (torchrun),
which is what really gives N processes on CPU as well as on GPUs: each process goes through
the CLI's one entry point (rlcycle.cli.run), builds an Accelerator that joins the process group
(MULTI_CPU on CPU, MULTI_GPU on GPUs), and the stage checks that Accelerate sees as many
processes as the launcher started.

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
    """`python -m torch.distributed.run ... -m rlcycle <module_args>` on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port or free_port()),
        "-m",
        "rlcycle",
        *module_args,
    ]


def spawn(nproc: int, module_args: list[str]) -> int:
    """Run `rlcycle <module_args>` in `nproc` processes; return the launcher's exit code."""
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 per process when unset; keep a user's choice.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.call(torchrun_command(nproc, module_args), env=env)


if __name__ == "__main__":
    # `-m rlcycle.train.launch train ...`, the spelling of earlier releases, is `-m rlcycle train
    # ...`: replace this process (torchrun keeps watching the same pid) with the one CLI.
    os.execv(sys.executable, [sys.executable, "-m", "rlcycle", *sys.argv[1:]])
