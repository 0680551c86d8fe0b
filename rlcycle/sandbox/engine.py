"""Docker engines: clients for the local engine or a configured list of hosts.

`docker_client(host)` turns "engine unreachable" into an RlcycleError with the fix as hint,
so every command and stage reports it the same way.
"""

from __future__ import annotations

from typing import Any

from rlcycle.errors import RlcycleError


def docker_client(host: str | None = None, timeout: int = 120) -> Any:
    """A docker client for `host` (e.g. tcp://10.0.0.2:2375), or the one DOCKER_HOST names."""
    import docker

    try:
        client = docker.DockerClient(base_url=host, timeout=timeout) if host else docker.from_env(timeout=timeout)
        client.ping()
    except Exception as e:  # DockerException, connection refused, missing socket
        raise RlcycleError(
            f"no Docker engine answers at {host or 'DOCKER_HOST/the default socket'} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})",
            hint="start one with `bash scripts/ensure_docker.sh` (as root), or fix --set hosts=...",
        ) from None
    return client


def docker_clients(hosts: list[str]) -> list[Any]:
    """One client per configured host; the local engine when the list is empty."""
    return [docker_client(h) for h in hosts] if hosts else [docker_client()]
