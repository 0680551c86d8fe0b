"""SandboxConfig: every knob of the Docker sandboxes, with help text and a safe default.

Resolved like every stage config (defaults < TOML `[sandbox]` < `--set` < flags), e.g.

    rlcycle sandbox exec --set memory_mb=1024 --set runtime=runsc -- python3 -c 'print(1)'

The defaults are the hardened ones; docs/sandbox.md says what each limit protects.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcycle.config import cfg, check_range

OFFLINE_MODES = ("auto", "always", "never")


@dataclass
class SandboxConfig:
    image: str | None = cfg(
        None,
        help="image to run; default: rlcycle-sandbox:<content hash>, built from sandbox_images/",
    )
    base_image: str = cfg("python:3.12-slim", help="FROM image of the sandbox image when a registry is reachable")
    offline_base: str = cfg(
        "auto",
        help="auto: build the base with debootstrap when base_image cannot be pulled; "
        "always: never try the registry; never: fail without a registry",
    )
    memory_mb: int = cfg(512, help="memory limit per container (no swap), MiB")
    cpus: float = cfg(1.0, help="CPU limit per container, in CPUs")
    pids_limit: int = cfg(256, help="most processes and threads alive at once per container")
    workspace_mb: int = cfg(256, help="size of the /workspace volume (tmpfs-backed), MiB")
    tmp_mb: int = cfg(64, help="size of the /tmp tmpfs, MiB")
    timeout_s: float = cfg(60.0, help="default per-command timeout, seconds")
    host_grace_s: float = cfg(
        5.0,
        help="the host waits this long past a command's timeout before it declares the "
        "executor dead (an infrastructure error)",
    )
    start_timeout_s: float = cfg(60.0, help="most seconds to create and start one sandbox")
    max_output_bytes: int = cfg(
        65536, help="output kept per stream (half head, half tail); the rest is dropped and flagged"
    )
    runtime: str | None = cfg(None, help="OCI runtime, e.g. runsc (gVisor); default: the engine's")
    network: str = cfg("none", help="docker network mode; 'none' is the only hardened choice")
    user: str = cfg("1000:1000", help="uid:gid the executor and every command run as (non-root)")
    ttl_s: float = cfg(
        6 * 3600.0,
        help="containers and volumes are labelled expired after this many seconds; "
        "`rlcycle sandbox gc` removes expired leftovers of crashed runs",
    )
    pool_size: int = cfg(4, help="warm containers a SandboxPool keeps per image")
    hosts: list[str] = cfg(
        [],
        help="Docker engines to spread sandboxes over (e.g. unix:///var/run/docker.sock, "
        "tcp://10.0.0.2:2375); empty: the local engine from DOCKER_HOST",
    )

    def validate(self) -> list[str]:
        """Every problem at once, as 'key=value: why' lines."""
        problems = []
        check_range(
            problems,
            self,
            (
                "memory_mb",
                "cpus",
                "workspace_mb",
                "tmp_mb",
                "timeout_s",
                "start_timeout_s",
                "max_output_bytes",
                "ttl_s",
                "pool_size",
            ),
            gt=0,
        )
        check_range(problems, self, "host_grace_s", ge=0)
        if self.offline_base not in OFFLINE_MODES:
            problems.append(f"offline_base={self.offline_base!r}: one of {', '.join(OFFLINE_MODES)}")
        uid = self.user.partition(":")[0]
        if uid in ("0", "root", ""):
            problems.append(f"user={self.user!r}: the sandbox never runs as root")
        check_range(problems, self, "pids_limit", ge=16)  # below 16 even git and pytest fail
        return problems
