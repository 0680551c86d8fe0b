"""One hardened Docker sandbox with a persistent executor: exec, files, reset, close.

    with Sandbox.start() as sb:                       # ~0.5 s: volume, container, executor
        sb.write_files({"test_x.py": "def test_x():\n    assert 1\n"})
        r = sb.exec("pytest -q", timeout=30)          # ~ms: no docker exec per call
        r.status, r.exit_code, r.stdout, r.truncated   # Status.OK / NONZERO / TIMEOUT / OOM / INFRA
        sb.read_files(["out.txt"])                    # {"out.txt": b"..." or None}
        sb.reset()                                    # kill everything, empty the workspace

What goes in: a command (a shell string or an argv list), a timeout, a cwd relative to
/workspace, extra environment. What comes out: an ExecResult that tells apart a command that
failed (NONZERO) from one that ran out of time (TIMEOUT) or memory (OOM) and from a sandbox
that broke (INFRA: the executor died or did not answer; never the model's fault).

The container is created hardened (see `_host_config`; the threat model is in docs/sandbox.md).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import PurePosixPath
from typing import Any

from rlcycle.errors import InputError, RlcycleError
from rlcycle.sandbox import cleanup
from rlcycle.sandbox.channel import Channel, ChannelError
from rlcycle.sandbox.config import SandboxConfig

WORKSPACE = "/workspace"


class Status(str, Enum):
    """How a command ended. `truncated` on the result is separate: any status can be cut."""

    OK = "ok"  # exit code 0
    NONZERO = "nonzero"  # the command failed (exit code != 0, or killed by a signal)
    TIMEOUT = "timeout"  # killed at its timeout (inside the container)
    OOM = "oom"  # the kernel killed a process of it for exceeding the memory limit
    INFRA = "infra_error"  # the sandbox broke (executor dead or silent): not the command's fault


@dataclass
class ExecResult:
    status: Status
    exit_code: int | None  # 128 + signal when killed by one; None for INFRA
    stdout: str = ""  # head and tail, joined by a "[... N bytes truncated ...]" line if cut
    stderr: str = ""
    truncated: bool = False  # True when stdout or stderr were longer than max_output_bytes
    duration_s: float = 0.0
    signal: int | None = None
    stdout_bytes: int = 0  # what the command really printed, before truncation
    stderr_bytes: int = 0
    error: str | None = None  # INFRA only: what broke

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def infra_error(self) -> bool:
        return self.status is Status.INFRA

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


class SandboxError(RlcycleError):
    """A sandbox operation other than `exec` failed (start, files, reset)."""


def check_relpath(path: str) -> str:
    """`path` relative to /workspace, normalised; InputError if it could leave the workspace."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts:
        raise InputError(
            f"sandbox path {path!r} is not inside the workspace",
            hint="give paths relative to /workspace, without '..'",
        )
    return str(p)


class Sandbox:
    """A running sandbox container and the channel to its executor. Thread-safe (serialised)."""

    def __init__(self, client: Any, container_id: str, name: str, channel: Channel, config: SandboxConfig):
        self.client = client
        self.container_id = container_id
        self.name = name  # the container's and its workspace volume's name
        self.config = config
        self.broken: str | None = None  # why the sandbox can no longer be used
        self._channel = channel
        self._lock = threading.Lock()
        self._closed = False
        cleanup.track(self)

    # --- lifecycle ----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        client: Any = None,
        image: str | None = None,
        config: SandboxConfig | None = None,
        run: str | None = None,
    ) -> Sandbox:
        """Create the workspace volume and the hardened container, start the executor.

        `client` defaults to the first of `config.hosts` (or the local engine); `image` to
        `ensure_image()`'s tag. Raises SandboxError (nothing is left
        behind) when the engine refuses or the executor does not answer in time.
        """
        from rlcycle.sandbox.engine import docker_client
        from rlcycle.sandbox.images import ensure_image

        config = config or SandboxConfig()
        client = client or docker_client(config.hosts[0] if config.hosts else None)
        image = image or ensure_image(client, config)
        name = f"rlcycle-{run or cleanup.run_id()}-{uuid.uuid4().hex[:8]}"
        labels = cleanup.labels(config.ttl_s, run)
        created: list[tuple[str, str]] = []
        try:
            _create_volume(client, name, config, labels)
            created.append(("volume", name))
            cid = client.api.create_container(
                image,
                name=name,
                user=config.user,
                labels=labels,
                hostname="sandbox",
                working_dir=WORKSPACE,
                stdin_open=True,
                tty=False,
                # detach=False makes docker-py set StdinOnce: when our attach socket closes
                # (this process died), the executor reads EOF and the container goes away.
                detach=False,
                host_config=_host_config(client, name, config),
            )["Id"]
            created.insert(0, ("container", cid))
            sock = client.api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            channel = Channel(sock)
            client.api.start(cid)
            reply = channel.call({"op": "ping"}, timeout=config.start_timeout_s)
            if not reply.get("ok"):
                raise ChannelError(reply.get("error", "ping failed"))
        except Exception as e:
            for kind, ident in created:
                try:
                    cleanup.remove(client, kind, ident)
                except Exception:
                    pass
            raise SandboxError(
                f"could not start a sandbox from image {image}: {type(e).__name__}: {e}",
                hint="check `docker info`; `rlcycle sandbox build` rebuilds the image",
            ) from None
        return cls(client, cid, name, channel, config)

    def close(self) -> None:
        """Remove the container and its workspace volume; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        cleanup.untrack(self)
        self._channel.close()
        for kind, ident in (("container", self.container_id), ("volume", self.name)):
            try:
                cleanup.remove(self.client, kind, ident)
            except Exception:
                pass  # gc collects it later by its labels

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- operations ---------------------------------------------------------------------

    def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run `cmd` (shell string, or argv list) in /workspace[/cwd]; never raises for the
        command's own failures: see ExecResult.status."""
        timeout = float(timeout or self.config.timeout_s)
        request = {
            "op": "exec",
            "cmd": cmd,
            "timeout": timeout,
            "env": env or {},
            "cwd": check_relpath(cwd) if cwd else None,
            "max_output": self.config.max_output_bytes,
        }
        start = time.monotonic()
        try:
            reply = self._call(request, timeout + self.config.host_grace_s)
        except SandboxError as e:
            return ExecResult(Status.INFRA, None, duration_s=time.monotonic() - start, error=e.message)
        if not reply.get("ok"):
            return ExecResult(Status.INFRA, None, duration_s=time.monotonic() - start, error=reply.get("error"))
        return ExecResult(
            status=Status(reply["status"]),
            exit_code=reply["exit_code"],
            signal=reply["signal"],
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            truncated=reply["truncated"],
            stdout_bytes=reply["stdout_bytes"],
            stderr_bytes=reply["stderr_bytes"],
            duration_s=reply["duration_ms"] / 1000.0,
        )

    def write_files(self, files: dict[str, str | bytes]) -> None:
        """Write {relative path: text or bytes} into /workspace, making parent directories.

        Raises InputError for a path outside the workspace, SandboxError when the write fails
        (e.g. the workspace is full)."""
        payload = {
            check_relpath(path): base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
            for path, data in files.items()
        }
        self._checked({"op": "write", "files": payload})

    def read_files(self, paths: list[str], max_bytes: int = 16 << 20) -> dict[str, bytes | None]:
        """{path: content} for paths relative to /workspace; None for a missing file."""
        rel = {p: check_relpath(p) for p in paths}
        got = self._checked({"op": "read", "paths": list(rel.values()), "max_bytes": max_bytes})["files"]
        return {p: None if got[r] is None else base64.b64decode(got[r]) for p, r in rel.items()}

    def reset(self) -> None:
        """Kill every process and empty /workspace and /tmp (between two users of a pool)."""
        self._checked({"op": "reset"})

    def ping(self) -> bool:
        try:
            return bool(self._call({"op": "ping"}, self.config.host_grace_s + 5).get("ok"))
        except SandboxError:
            return False

    # --- internals ----------------------------------------------------------------------

    def _checked(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = self._call(request, self.config.timeout_s + self.config.host_grace_s)
        if not reply.get("ok"):
            raise SandboxError(f"sandbox {self.name}: {request['op']} failed: {reply.get('error')}")
        return reply

    def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request/reply; on a channel failure the sandbox is marked broken for good."""
        with self._lock:
            if self.broken or self._closed:
                raise SandboxError(f"sandbox {self.name} is unusable: {self.broken or 'closed'}")
            try:
                return self._channel.call(request, timeout)
            except ChannelError as e:
                self.broken = str(e)
                self._kill()
                raise SandboxError(f"sandbox {self.name} broke: {e}") from None

    def _kill(self) -> None:
        # A silent executor may be stuck; kill the container so nothing keeps running.
        try:
            self.client.api.kill(self.container_id)
        except Exception:
            pass


def _create_volume(client: Any, name: str, config: SandboxConfig, labels: dict[str, str]) -> None:
    """The workspace: a docker volume backed by a size-limited tmpfs.

    A plain volume has no size limit on overlay2 without xfs project quotas; a tmpfs-backed
    local volume does (size=), works with put_archive (unlike a --tmpfs mount on a read-only
    rootfs), and its pages count against the container's memory cgroup.
    """
    uid, _, gid = config.user.partition(":")
    opts = f"size={config.workspace_mb}m,uid={uid},gid={gid or uid},mode=0755,nosuid,nodev"
    client.api.create_volume(
        name=name,
        driver="local",
        labels=labels,
        driver_opts={"type": "tmpfs", "device": "tmpfs", "o": opts},
    )


def _host_config(client: Any, volume: str, config: SandboxConfig) -> Any:
    """The hardening, one line per control (docs/sandbox.md explains each)."""
    from docker.types import LogConfig

    mem = f"{config.memory_mb}m"
    return client.api.create_host_config(
        binds={volume: {"bind": WORKSPACE, "mode": "rw"}},
        tmpfs={"/tmp": f"rw,nosuid,nodev,size={config.tmp_mb}m,mode=1777"},
        read_only=True,  # root filesystem: nothing outside /workspace and /tmp is writable
        network_mode=config.network,  # "none": loopback only
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=config.pids_limit,  # fork bombs hit this, not the host
        mem_limit=mem,
        memswap_limit=mem,  # equal to mem_limit: no swap, so OOM is prompt and visible
        nano_cpus=int(config.cpus * 1e9),
        init=True,  # docker-init (tini) as PID 1 reaps orphans and zombies
        auto_remove=True,  # the container disappears when the executor exits
        ipc_mode="private",
        runtime=config.runtime,
        # No log driver: replies stream on stdout and must not pile up in json logs on disk.
        log_config=LogConfig(type=LogConfig.types.NONE),
    )


def run_once(
    cmd: str | list[str],
    config: SandboxConfig | None = None,
    client: Any = None,
    files: dict[str, str | bytes] | None = None,
    env: dict[str, str] | None = None,
) -> ExecResult:
    """Run one command in a fresh sandbox (with `files` written first) and remove it.

    The image is `config.image` or `ensure_image()`'s; the timeout is `config.timeout_s`.
    Raises SandboxError when no sandbox can be started (nothing is left behind either way).
    """
    config = config or SandboxConfig()
    with Sandbox.start(client, None, config) as sb:  # image: config.image, checked, or built
        if files:
            sb.write_files(files)
        return sb.exec(cmd, timeout=config.timeout_s, env=env)
